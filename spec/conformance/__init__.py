"""Conformance vectors: event sequences with the expected core state after each step."""
