"""Tests of the fault-injection harness: proxy, schedule, handler, chaos runs."""
