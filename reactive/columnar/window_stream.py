"""The windowed columnar stream: ``key_by(*columns).window(assigner, timestamp="column")``,
then ``.allowed_lateness(seconds)`` and ``.agg(...)``; ``late_data()`` after ``agg`` is the
stream of late rows.

```python
windowed = (flow.from_arrow(table)
                .assign_timestamps("ts", max_out_of_orderness=10)
                .key_by("origin", "carrier")
                .window(TumblingEventTimeWindows.of(3600), timestamp="ts")
                .allowed_lateness(60))
hourly = windowed.agg(flights=("ts", "count"), worst=("delay", "max"))
late = windowed.late_data()          # the late rows, with the input's schema
```

Late rows travel in band from the window operator, marked in their schema metadata: the
stream ``agg`` returns drops them (a chained filter) and ``late_data()`` is a second
consumer of the window operator that keeps only them, as the per-record windows do.
"""

from __future__ import annotations

from typing import Any, Protocol

from ..errors import ConfigurationError
from ..graph import Edge, Transformation
from ..runtime.operators import StreamOperator
from ..windowing.assigners import WindowAssigner
from .aggregates import parse_aggregates
from .windows import LATE_KEY, check_assigner, is_late_batch, window_schema

__all__ = ["ColumnarWindowedStream", "KeyedColumnarInput"]


class KeyedColumnarInput(Protocol):
    """What a windowed stream needs of the keyed columnar stream it cuts into windows
    (``KeyedColumnarStream``), so that this module does not import the stream module: the
    columnar stream it keys (whose class makes the result streams), its key columns and
    its exchange edge."""

    @property
    def stream(self) -> Any: ...

    @property
    def columns(self) -> list[str]: ...

    def _edge(self) -> Edge: ...


class ColumnarWindowedStream:
    """A keyed columnar stream cut into event-time windows; end it with :meth:`agg`.

    Args:
        keyed: the keyed columnar stream.
        assigner: ``TumblingEventTimeWindows``, ``SlidingEventTimeWindows`` or
            ``EventTimeSessionWindows.with_gap(...)``.
        timestamp: the event-time column (seconds as a number, or an Arrow timestamp).

    Raises:
        ConfigurationError: for another assigner, or an unknown or non-time column.
    """

    def __init__(self, keyed: KeyedColumnarInput, assigner: WindowAssigner,
                 timestamp: str) -> None:
        check_assigner(assigner)
        schema = keyed.stream.schema
        if schema.get_field_index(timestamp) < 0:
            raise ConfigurationError(f"window: no timestamp column {timestamp!r} in "
                                     f"{schema.names}")
        from .schema import pa

        t = schema.field(timestamp).type
        if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_timestamp(t)):
            raise ConfigurationError(f"window: timestamp column {timestamp!r} is {t}: give "
                                     "seconds (a number) or an Arrow timestamp")
        self.keyed = keyed
        self.assigner = assigner
        self.timestamp = timestamp
        self.lateness = 0.0
        self.window_transformation: Transformation | None = None
        self._late_enabled = False
        self._late_stream: Any = None

    def allowed_lateness(self, seconds: float) -> ColumnarWindowedStream:
        """Keep each window ``seconds`` after its end: late rows in that time update it and
        fire it again (one output row per late row, accumulating).

        Raises:
            ConfigurationError: if negative.
        """
        if not seconds >= 0:
            raise ConfigurationError(f"allowed lateness must be >= 0 seconds, got {seconds}")
        self.lateness = float(seconds)
        return self

    def agg(self, name: str | None = None, **aggregates: tuple[str, Any]) -> Any:
        """Aggregate each window: ``agg(count=("ts", "count"), worst=("delay", "max"))``
        with the built-in functions of ``KeyedColumnarStream.agg`` (sessions: all but
        ``first`` and ``last``).

        Returns:
            A ``ColumnarStream`` of the key columns, ``window_start``, ``window_end`` and one
            column per aggregate: a row per window when the watermark reaches its end, and
            a row per late row within the allowed lateness.

        Raises:
            ConfigurationError: for an unknown function or column, no aggregate, or when
                the windowed stream was already aggregated.
        """
        from .window_operator import ColumnarWindowOperator

        if self.window_transformation is not None:
            raise ConfigurationError("a windowed stream can be aggregated only once")
        stream = self.keyed.stream
        specs = parse_aggregates(stream.schema, aggregates)
        check_assigner(self.assigner, specs)
        columns = self.keyed.columns
        schema = window_schema(stream.schema, columns, self.timestamp, self.assigner, specs)
        assigner, timestamp, lateness = self.assigner, self.timestamp, self.lateness

        def late_enabled() -> bool:
            return self._late_enabled

        flow = stream.flow
        t = flow._add("columnar_window", name or "columnar-window",
                      lambda t: ColumnarWindowOperator(t.name, t.resolved_uid, columns,
                                                       timestamp, assigner, specs, lateness,
                                                       schema, late_enabled),
                      [self.keyed._edge()])
        t.batch_size = 1
        self.window_transformation = t
        main = flow._add("window_results", f"{t.name}-results",
                         lambda mt: _SplitLate(mt.name, mt.resolved_uid, late=False),
                         [Edge(t, "forward")])
        return type(stream)(flow, main, schema, stream.stream_of, primary=t)

    def late_data(self) -> Any:
        """The late rows (beyond the allowed lateness), a ``ColumnarStream`` of the input's
        schema (after :meth:`agg`).

        Raises:
            ConfigurationError: before :meth:`agg`.
        """
        t = self.window_transformation
        if t is None:
            raise ConfigurationError("late_data() comes after agg()")
        if self._late_stream is None:
            self._late_enabled = True
            stream = self.keyed.stream
            late = stream.flow._add("late", f"{t.name}-late",
                                    lambda lt: _SplitLate(lt.name, lt.resolved_uid, late=True),
                                    [Edge(t, "forward")])
            self._late_stream = type(stream)(stream.flow, late, stream.schema,
                                             stream.stream_of)
        return self._late_stream


class _SplitLate(StreamOperator):
    """Keeps the window results (``late=False``) or the late rows (``late=True``, without
    their mark) of a window operator's output."""

    def __init__(self, name: str, uid: str, late: bool) -> None:
        super().__init__(name, uid)
        self.late = late

    def process_batch(self, batch: list[Any]) -> list[Any]:
        if not self.late:
            return [b for b in batch if not is_late_batch(b)]
        out = []
        for b in batch:
            if is_late_batch(b):
                meta = {k: v for k, v in (b.schema.metadata or {}).items() if k != LATE_KEY}
                out.append(b.replace_schema_metadata(meta or None))
        return out
