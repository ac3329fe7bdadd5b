"""Exactly-once validation: compare a stream's committed results with the expected ones.

The expected DataFrame is typically the same computation done in batch by Spark on the same
input. Rows are matched by a key (a list of columns); per key, with ``e`` expected and ``a``
actual rows:

- ``missing``    = sum of ``max(0, e - a)``           (expected rows that never came out);
- ``duplicated`` = sum of ``max(0, a - e)`` where e>0 (extra copies of expected rows);
- ``unexpected`` = sum of ``a`` where ``e == 0``       (rows of keys nobody expected);
- ``mismatched`` = keys present on both sides whose distinct values (the expected frame's
  non-key columns) differ.

So a part file committed twice adds exactly its row count to ``duplicated``, and a lost one
adds exactly its row count to ``missing``. Exactly-once holds when all four are zero.
The comparison runs in Spark (one aggregation per side, a full outer join by key), so it
scales with the cluster, not with the driver.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["ValidationReport", "validate_exactly_once"]

_CATEGORIES = ("missing", "duplicated", "unexpected", "mismatched")


@dataclass(frozen=True)
class ValidationReport:
    """The outcome of :func:`validate_exactly_once` (printable as a table).

    Attributes:
        key: the key columns rows were matched by.
        expected: rows in the expected DataFrame.
        actual: rows in the actual DataFrame.
        missing: expected rows with no actual counterpart.
        duplicated: actual rows beyond the expected number for their key.
        unexpected: actual rows whose key is not expected at all.
        mismatched: keys on both sides whose values differ.
        samples: up to ``sample_size`` example rows per non-zero category, as dicts
            (``key`` columns, ``expected_rows``/``actual_rows`` counts and, for mismatches,
            ``expected_values``/``actual_values``).
    """

    key: tuple[str, ...]
    expected: int
    actual: int
    missing: int
    duplicated: int
    unexpected: int
    mismatched: int
    samples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when nothing is missing, duplicated, unexpected or mismatched."""
        return not (self.missing or self.duplicated or self.unexpected or self.mismatched)

    def reason(self) -> str:
        """One line: ``"exactly-once holds"`` or what failed, with the counts."""
        if self.ok:
            return f"exactly-once holds: {self.actual:,} rows match the {self.expected:,} expected"
        parts = [f"{getattr(self, c):,} {c}" for c in _CATEGORIES if getattr(self, c)]
        return (f"exactly-once violated: {', '.join(parts)} (expected {self.expected:,} rows, "
                f"got {self.actual:,})")

    def __str__(self) -> str:
        rows = [("expected rows", self.expected), ("actual rows", self.actual)]
        rows += [(f"{c} rows" if c != "mismatched" else "mismatched keys", getattr(self, c))
                 for c in _CATEGORIES]
        width = max(len(name) for name, _ in rows)
        numbers = [f"{n:,}" for _, n in rows]
        nwidth = max(len(s) for s in numbers)
        lines = [f"exactly-once validation by key ({', '.join(self.key)})",
                 f"+-{'-' * width}-+-{'-' * nwidth}-+"]
        lines += [f"| {name:<{width}} | {num:>{nwidth}} |"
                  for (name, _), num in zip(rows, numbers, strict=True)]
        lines.append(lines[1])
        for category in _CATEGORIES:
            for sample in self.samples.get(category, []):
                lines.append(f"  {category}: {sample}")
        lines.append(("OK: " if self.ok else "FAILED: ") + self.reason())
        return "\n".join(lines)


def validate_exactly_once(
    actual: DataFrame,
    expected: DataFrame,
    key: Sequence[str],
    sample_size: int = 5,
) -> ValidationReport:
    """Compare committed results with the expected ones, by key (exact counts).

    Only the expected DataFrame's columns are compared; extra actual columns (such as the
    ``checkpoint_id`` and ``subtask`` a :class:`~reactive.connectors.spark.ResultLog` adds) are
    ignored. Actual columns are cast to the expected columns' types first (Spark's cast:
    under ANSI mode a value that does not convert fails the comparison).

    Args:
        actual: the stream's committed output.
        expected: the reference output.
        key: the columns that identify a row (at least one).
        sample_size: example rows kept per failing category.

    Returns:
        the report (``report.ok``; ``print(report)`` for the table).

    Raises:
        ValueError: if ``key`` is empty, or a key or expected column is missing from either
            DataFrame.
    """
    from pyspark.sql import functions as F

    key = list(key)
    if not key:
        raise ValueError("key must name at least one column")
    missing_cols = [c for c in key if c not in expected.columns]
    if missing_cols:
        raise ValueError(f"key columns {missing_cols} are not in the expected DataFrame "
                         f"(columns: {expected.columns})")
    absent = [c for c in expected.columns if c not in actual.columns]
    if absent:
        raise ValueError(f"columns {absent} of the expected DataFrame are not in the actual one "
                         f"(columns: {actual.columns})")
    values = [c for c in expected.columns if c not in key]
    types = dict(expected.dtypes)
    actual = actual.select(*(F.col(c).cast(types[c]).alias(c) for c in expected.columns))

    def per_key(df: DataFrame, side: str) -> DataFrame:
        aggs = [F.count(F.lit(1)).alias(f"{side}_n")]
        if values:
            aggs.append(F.collect_set(F.struct(*values)).alias(f"{side}_v"))
        return df.groupBy(*key).agg(*aggs)

    e, a = per_key(expected, "e"), per_key(actual, "a")
    # null-safe key equality: a null key is a key like any other
    cond = [e[c].eqNullSafe(a[c]) for c in key]
    joined = e.join(a, cond, "full_outer").select(
        *(F.coalesce(e[c], a[c]).alias(c) for c in key),
        F.coalesce(F.col("e_n"), F.lit(0)).alias("e_n"),
        F.coalesce(F.col("a_n"), F.lit(0)).alias("a_n"),
        *([F.col("e_v"), F.col("a_v")] if values else []),
    )
    if values:
        differs = (F.size(F.array_except("e_v", "a_v")) > 0) | \
                  (F.size(F.array_except("a_v", "e_v")) > 0)
        mismatch = F.when((F.col("e_n") > 0) & (F.col("a_n") > 0) & differs, 1).otherwise(0)
    else:
        mismatch = F.lit(0)
    joined = joined.select(
        "*",
        F.greatest(F.col("e_n") - F.col("a_n"), F.lit(0)).alias("missing"),
        F.when(F.col("e_n") > 0, F.greatest(F.col("a_n") - F.col("e_n"), F.lit(0)))
         .otherwise(0).alias("duplicated"),
        F.when(F.col("e_n") == 0, F.col("a_n")).otherwise(0).alias("unexpected"),
        mismatch.alias("mismatched"),
    ).persist()
    try:
        totals = joined.agg(
            F.sum("e_n").alias("expected"), F.sum("a_n").alias("actual"),
            *(F.sum(c).alias(c) for c in _CATEGORIES),
        ).collect()[0]
        counts = {name: int(totals[name] or 0) for name in ("expected", "actual", *_CATEGORIES)}
        samples: dict[str, list[dict[str, Any]]] = {}
        for category in _CATEGORIES:
            if counts[category] and sample_size > 0:
                cols: list[Column | str] = [*key, F.col("e_n").alias("expected_rows"),
                                            F.col("a_n").alias("actual_rows")]
                if category == "mismatched":
                    cols += [F.col("e_v").alias("expected_values"),
                             F.col("a_v").alias("actual_values")]
                rows = (joined.where(F.col(category) > 0).select(*cols)
                        .orderBy(*key).limit(sample_size).collect())
                samples[category] = [r.asDict(recursive=True) for r in rows]
    finally:
        joined.unpersist()
    return ValidationReport(key=tuple(key), samples=samples, **counts)
