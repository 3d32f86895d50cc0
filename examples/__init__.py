"""Example handlers for ``htmqc run`` (the demo, the tests, the docs)."""
