"""Benchmarks of htmqc against peer Kafka consumers (issue 9).

One module per contender (:mod:`raw`, :mod:`aio`, :mod:`quix`,
:mod:`faust_peer`, :mod:`htmqc_peer`), each exposing
``run(bootstrap, topic, count, *, group, mode=..., latency=..., ids_path=...) -> dict``
with the figures of :class:`benchmarks.peers.common.Meter`;
:mod:`worker` runs one of them in its own process; :mod:`runner` drives them
all (``python -m benchmarks.peers``); :mod:`table` renders the README table.
"""
