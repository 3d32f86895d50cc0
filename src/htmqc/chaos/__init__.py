"""Fault-injected runs (``htmqc chaos``): Jepsen-style evidence that exactly-once holds.

* :mod:`htmqc.chaos.proxy` - a loopback TCP proxy between the consumers and the
  broker that can pass, drop, delay, half-close or reset traffic at runtime;
* :mod:`htmqc.chaos.schedule` - the fault schedule, a pure function of a seed;
* :mod:`htmqc.chaos.handler` - the handler the consumers run: one effect row per
  message, with switchable slowdowns, sink errors, exceptions and poison ids;
* :mod:`htmqc.chaos.store` - the run's tables and what the checker reads back;
* :mod:`htmqc.chaos.harness` - broker, topic, consumers, producer, injection,
  then the audit (:mod:`htmqc.audit`) and the report.
"""
