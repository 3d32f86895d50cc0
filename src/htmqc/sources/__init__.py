"""Sources other than Kafka behind the same :class:`~htmqc.ports.ConsumerPort`.

The core decides every offset; an adapter here only maps its log's positions to
dense, 0-based, increasing offsets per partition and carries out what the
runtime asks (fetch from a position, pause, seek, store a commit). NATS
JetStream: :mod:`htmqc.sources.nats` (the adapter) and
:mod:`htmqc.sources.nats_server` (a private server for tests and benchmarks).
Apache Pulsar: :mod:`htmqc.sources.pulsar` (offsets from the broker-entry index; the
consumer is not written yet) and :mod:`htmqc.sources.pulsar_server` (a private
standalone broker).
"""
