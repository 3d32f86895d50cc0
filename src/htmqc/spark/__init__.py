"""htmqc on Spark (the ``spark`` extra: ``pyspark>=4.0``).

* :mod:`htmqc.spark.session` - a SparkSession that works on this kind of box;
* :mod:`htmqc.spark.audit_job` - the audit checker as a Spark job;
* :mod:`htmqc.spark.sinks` - exactly-once ``foreachBatch`` sinks (SQL, Parquet);
* :mod:`htmqc.spark.topic_guard` - a recreated topic under Spark's own Kafka
  connector fails the batch instead of being skipped silently;
* :mod:`htmqc.spark.kafka_source` - the ``htmqc-kafka`` data source.
"""
