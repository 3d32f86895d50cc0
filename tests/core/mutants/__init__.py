"""Deliberately wrong functions that the verification layers must reject."""
