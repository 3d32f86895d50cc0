"""Tests of dead-letter records, the SQL table, and ``htmqc dlq``."""
