"""Tests of the runtime engine, the run command and the demo."""
