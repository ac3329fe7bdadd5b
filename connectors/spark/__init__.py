"""The PySpark bridge: hand a pipeline's committed output and checkpointed state to Spark.

```python
from reactive.connectors.spark import ResultLog, CheckpointReader, validate_exactly_once, local_session
spark = local_session()
df = ResultLog(spark, "out/").read()                 # committed parts + checkpoint_id, subtask
report = validate_exactly_once(df, expected_df, key=["word", "count"])
state = CheckpointReader(spark, "chk/job/chk-42").keyed_state("count", "count")
SavepointWriter(128, "job").with_keyed_state("count", "count", df, "word", "n").write("sp/")
SparkRunner(spark, checkpoint_location="chk/spark").run(flow)   # the same Dataflow on Spark
```

See DESIGN.md, "The PySpark bridge". ``pyspark`` is imported lazily: importing this package
does not start a JVM.
"""

from .checkpoint_reader import CheckpointReader, OperatorSummary, reconfiguration_history
from .errors import (
    JavaNotFoundError,
    ResultLogError,
    SavepointWriteError,
    SparkBridgeError,
    SparkJobError,
    TranslationError,
)
from .result_log import PartFile, ResultLog, list_part_files
from .runner import SparkJob, SparkRunner
from .savepoint_writer import SavepointWriter
from .session import find_java, local_session
from .state_readers import read_keyed_state, register_state_reader, supported_backends
from .validation import ValidationReport, validate_exactly_once

__all__ = [
    "CheckpointReader",
    "JavaNotFoundError",
    "OperatorSummary",
    "PartFile",
    "ResultLog",
    "ResultLogError",
    "SavepointWriteError",
    "SavepointWriter",
    "SparkBridgeError",
    "SparkJob",
    "SparkJobError",
    "SparkRunner",
    "TranslationError",
    "ValidationReport",
    "find_java",
    "list_part_files",
    "local_session",
    "read_keyed_state",
    "reconfiguration_history",
    "register_state_reader",
    "supported_backends",
    "validate_exactly_once",
]
