"""htmqc on Spark (the ``spark`` extra: ``pyspark>=4.0``).

* :mod:`htmqc.spark.session` - a SparkSession that works on this kind of box;
* :mod:`htmqc.spark.audit_job` - the audit checker as a Spark job.
"""
