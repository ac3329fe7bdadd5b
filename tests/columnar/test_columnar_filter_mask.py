"""``filter`` on a boolean column alone takes the column as the selection mask (Arrow's
filter kernel, no Acero plan): the same rows as the equivalent expression, nulls dropped as
SQL's WHERE drops them, and the batches' source positions kept."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from reactive import Dataflow
from reactive.columnar.operators import ColumnarFilterOperator
from reactive.columnar.schema import position_of
from reactive.connectors.collections import ListSink


async def test_filter_by_a_boolean_column_equals_the_expression() -> None:
    table = pa.table({"x": list(range(10)),
                      "flag": [True, False, None, True, True, None, False, True, False, True]})
    results = []
    for predicate in (pc.field("flag"), pc.field("flag") == pa.scalar(True)):
        flow = Dataflow("filter-mask")
        out = ListSink()
        flow.from_arrow(table, batch_size=4).filter(predicate).sink(out)
        await flow.run()
        assert all(position_of(b) is not None for b in out.records)
        results.append([r["x"] for b in out.records for r in b.to_pylist()])
    assert results[0] == results[1] == [0, 3, 4, 7, 9]


def test_only_a_boolean_column_alone_is_a_mask() -> None:
    flow = Dataflow("filter-mask-plan")
    stream = flow.from_arrow(pa.table({"x": [1], "flag": [True]}))
    masks = {}
    for label, predicate in {"column": pc.field("flag"), "expression": pc.field("x") > 0,
                             "negated": ~pc.field("flag")}.items():
        t = stream.filter(predicate).transformation
        op = t.factory()
        assert isinstance(op, ColumnarFilterOperator)
        masks[label] = op.mask
    assert masks == {"column": "flag", "expression": None, "negated": None}
