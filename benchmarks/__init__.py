"""Benchmarks: results in benchmarks/results/."""
