"""Sources and sinks: collections, files (and later Kafka and the PySpark bridge)."""
