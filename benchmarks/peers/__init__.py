"""Benchmarks of htmqc against peer Kafka consumers (issue 9).

One module per contender (:mod:`raw`, :mod:`aio`, :mod:`quix`,
:mod:`faust_peer`, :mod:`htmqc_peer`), each exposing
``run(bootstrap, topic, count, *, group, mode=..., latency=..., store=...,
kill_at=..., journal=..., out_topic=..., idle_exit=..., timeout=...) -> dict``
with the figures of :class:`benchmarks.peers.common.Meter`;
:mod:`worker` runs one of them in its own process; :mod:`kill` measures stored
duplicates after a SIGKILL; :mod:`runner` drives them all
(``python -m benchmarks.peers``); :mod:`table` renders the README table.
"""
