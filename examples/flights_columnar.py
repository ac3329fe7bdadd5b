"""The flights job on the columnar API (the default of ``examples/flights.py``): the same
results and dead letters as the per-record pipeline, computed over Arrow record batches.

    CSV file --CsvFileSource(columnar=True, batch_factory=flights_table)--> record batches
      (origin, carrier, ts, dep_delay, cancelled); bad rows -> dead letters (byte offsets)
    -> assign_timestamps("ts", 600 s) -> key_by("origin", "carrier")
    -> 1-hour tumbling windows on "ts" -> count, sum(cancelled), mean and max(dep_delay)
    -> committing parquet sink (the batches as they are)

The CSV source parses each block of rows with pyarrow and :func:`flights_table` validates and
converts it with ``pyarrow.compute`` (no Python call per row); a block with a bad row is
bisected by the source until the bad rows stand alone, each a dead letter with its offset,
as in the per-record variant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from flights_data import CSV_COLUMN_TYPES, CSV_COLUMNS, departure_columns

from reactive import Dataflow, TumblingEventTimeWindows

__all__ = ["FLIGHT_SCHEMA", "build_columnar", "flights_table"]


#: origin and carrier as the CSV reader's dictionary arrays: 3 origins and 16 carriers, so
#: the exchange and the windows group a batch by its small integer codes (no string hashing
#: per row) and the exchange's split moves 4-byte codes instead of strings
KEY_TYPE = pa.dictionary(pa.int32(), pa.string())

FLIGHT_SCHEMA = pa.schema([("origin", KEY_TYPE), ("carrier", KEY_TYPE),
                           ("ts", pa.int64()), ("dep_delay", pa.float64()),
                           ("cancelled", pa.int64())])
"""A flight as a row (origin and carrier dictionary-encoded): scheduled departure ``ts`` (UTC
epoch seconds), departure delay in minutes (null when cancelled or unknown), ``cancelled`` 0
or 1."""


def flights_table(table: Any) -> Any:
    """The flights of a block of CSV rows (:data:`flights_data.CSV_COLUMNS` read with
    :data:`flights_data.CSV_COLUMN_TYPES`, no null values) as a table of
    :data:`FLIGHT_SCHEMA`, row for row: :func:`flights_data.parse_flight`'s rules over
    columns.

    Raises:
        MalformedRow: when a row of the block is malformed (empty origin or carrier, an
            unparsable scheduled departure or delay): the CSV source then bisects the block
            to make each bad row a dead letter.
    """
    origin, carrier, ts, delay, cancelled = departure_columns(table)
    return pa.Table.from_arrays([origin, carrier, ts, delay, pc.cast(cancelled, pa.int64())],
                                schema=FLIGHT_SCHEMA)


def csv_source(data: Path, block_size: int = 1 << 22) -> Any:
    """The columnar CSV source of the flights file: record batches of
    :data:`FLIGHT_SCHEMA`, bad rows as dead letters. Blocks of 4 MB (about 45,000 rows):
    each batch costs a fixed number of calls through the pipeline, so larger batches
    amortize them (``bench.w2 --block-size``: 1.0 of the plain loop with 256 KB blocks,
    1.4 with 1 MB, 1.6 with 4 MB, single runs on the loaded machine). The departure hour
    is read as a dictionary too: a block spans a few hundred distinct hours, which
    :func:`flights_table` parses once each (the reader's dictionary spares it a hashing
    pass over the block's strings)."""
    from reactive.connectors.files import CsvFileSource

    return CsvFileSource(data, columns=CSV_COLUMNS,
                         column_types={**CSV_COLUMN_TYPES, "origin": KEY_TYPE,
                                       "carrier": KEY_TYPE, "time_hour": KEY_TYPE},
                         null_values=[], batch_factory=flights_table, schema=FLIGHT_SCHEMA,
                         block_size=block_size, errors="dead_letter", columnar=True)


def build_columnar(flow: Dataflow, data: Path, output: Path, tick: Any, hour: float,
                   max_disorder: float, result_schema: Any, dead_letter_row: Any) -> None:
    """Add the columnar flights pipeline to ``flow``.

    Args:
        flow: the dataflow (its name, parallelism and max parallelism set).
        data: the flights CSV.
        output: the committed results' directory (dead letters in ``_dead_letters``).
        tick: record batch -> record batch, called once per batch (the crash injector).
        hour: the window size (seconds).
        max_disorder: the watermark's bounded out-of-orderness (seconds).
        result_schema: the parquet schema of the results.
        dead_letter_row: dead letter -> the row of the dead-letter output.
    """
    from reactive.connectors.files import CommittingFileSink

    flights = flow.columnar_source(csv_source(data), name="flights-csv", uid="flights-file") \
        .set_parallelism(1)
    (flights.dead_letters(name="malformed")
            .map(dead_letter_row, name="dead-letter")
            .sink(CommittingFileSink(output / "_dead_letters", format="jsonl"),
                  name="dead-letters").uid("dead-letter-sink"))
    (flights.map_batches(tick, name="crash-injector").set_parallelism(1)
            .assign_timestamps("ts", max_disorder).set_parallelism(1)
            .key_by("origin", "carrier")
            .window(TumblingEventTimeWindows.of(hour), timestamp="ts")
            .agg(flights=("ts", "count"), cancelled=("cancelled", "sum"),
                 mean_dep_delay=("dep_delay", "mean"), max_dep_delay=("dep_delay", "max"),
                 name="hourly-delays").uid("hourly-delays")
            .map_batches(lambda b: b.cast(result_schema), schema=result_schema,
                         name="to-row")
            .sink(CommittingFileSink(output, format="parquet", schema=result_schema),
                  name="results").uid("results-sink"))
