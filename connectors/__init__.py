"""Sources and sinks: in-memory collections, files (lines, CSV, the committing file sink),
Kafka, the Nexmark generator, and Spark (the PySpark bridge and the Spark runner)."""
