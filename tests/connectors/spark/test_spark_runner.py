"""The Spark runner: the same Dataflow programs run embedded and on Spark local mode give
equal committed output, row for row, and equal a plain Python computation; programs Spark
cannot run are refused before anything runs, naming the operator."""

from __future__ import annotations

import collections
import json
import random
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from reactive import (
    AggregateFunction,
    CheckpointConfig,
    Dataflow,
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    ValueStateDescriptor,
)
from reactive.connectors.files import CommittingFileSink
from reactive.connectors.spark import (
    ResultLog,
    SparkJobError,
    SparkRunner,
    TranslationError,
    list_part_files,
)
from tests.support import Count, pickled_by_value


@pytest.fixture(scope="module")
def spark(spark: Any) -> Iterator[Any]:
    """The test session's SparkSession; the workers unpickle this module's functions by value."""
    with pickled_by_value(__name__):
        yield spark


def committed(directory: Path) -> list[Any]:
    """Every committed record of a committing file sink's directory (embedded part files, or
    Spark's file sink through its metadata log), as parsed JSON, sorted."""
    rows = [json.loads(line) for p in list_part_files(directory)
            for line in p.path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return sorted(rows, key=json.dumps)


async def run_both(build: Any, tmp_path: Path, spark: Any, batch: int = 300,
                   one_query: bool = False) -> tuple[Path, Path]:
    """Run the program ``build(name, out_dir)`` embedded and on Spark; returns both output
    directories."""
    embedded, on_spark = tmp_path / "embedded", tmp_path / "spark"
    await build("embedded", embedded).run(
        checkpoints=CheckpointConfig(interval=0.05, directory=tmp_path / "chk"))
    SparkRunner(spark, tmp_path / "spark-chk", max_records_per_batch=batch,
                one_query=one_query).run(build("spark", on_spark))
    return embedded, on_spark


# ---------------------------------------------------------------------------- programs
WORDS = [f"w{int(random.Random(7).paretovariate(1.2)) % 40}" for _ in range(600)]


def keyed_count(name: str, out: Path) -> Dataflow:
    flow = Dataflow(name, parallelism=2)
    (flow.from_collection(WORDS).key_by(lambda w: w).process(Count()).uid("count")
         .sink(CommittingFileSink(out)).uid("out"))
    return flow


async def test_keyed_count_equals_embedded_and_a_python_loop(spark: Any, tmp_path: Path) -> None:
    embedded, on_spark = await run_both(keyed_count, tmp_path, spark)
    expected, seen = [], collections.Counter[str]()
    for w in WORDS:
        seen[w] += 1
        expected.append([w, seen[w]])
    assert committed(on_spark) == committed(embedded) == sorted(expected, key=json.dumps)
    # the bridge reads the Spark runner's output like the embedded one's
    df = ResultLog(spark, on_spark).read()
    assert df.count() == len(WORDS)
    assert {r["checkpoint_id"] for r in df.select("checkpoint_id").collect()} >= {0, 1}


class Profile(KeyedProcessFunction):
    """Every state kind: a value (total), a list (the last three amounts), a map (amount
    per category); emits the key's profile after each record."""

    def open(self, ctx: Any) -> None:
        self.total = ctx.get_state(ValueStateDescriptor("total", default=0))
        self.recent = ctx.get_state(ListStateDescriptor("recent"))
        self.by_category = ctx.get_state(MapStateDescriptor("by-category"))

    def process_element(self, value: Any, ctx: Any) -> Iterable[Any]:
        user, category, amount = value
        self.total.update(self.total.value() + amount)
        recent = [*self.recent.get(), amount][-3:]
        self.recent.update(recent)
        self.by_category.put(category, self.by_category.get(category, 0) + amount)
        if amount % 7 == 0:
            self.by_category.remove(category)
        yield [user, self.total.value(), recent, sorted(self.by_category.items())]


PURCHASES = [(f"u{i % 9}", f"c{(i * 7) % 4}", (i * 13) % 50) for i in range(500)]


def profiles(name: str, out: Path) -> Dataflow:
    flow = Dataflow(name)
    (flow.from_collection(PURCHASES).key_by(lambda p: p[0]).process(Profile()).uid("profile")
         .sink(CommittingFileSink(out)).uid("out"))
    return flow


async def test_value_list_and_map_state_equal_embedded(spark: Any, tmp_path: Path) -> None:
    embedded, on_spark = await run_both(profiles, tmp_path, spark, batch=250)
    # a plain loop computes the same profiles
    totals: dict[str, int] = collections.defaultdict(int)
    recents: dict[str, list[int]] = collections.defaultdict(list)
    cats: dict[str, dict[str, int]] = collections.defaultdict(dict)
    expected = []
    for user, category, amount in PURCHASES:
        totals[user] += amount
        recents[user] = [*recents[user], amount][-3:]
        cats[user][category] = cats[user].get(category, 0) + amount
        if amount % 7 == 0:
            del cats[user][category]
        expected.append([user, totals[user], recents[user],
                         [list(kv) for kv in sorted(cats[user].items())]])
    assert committed(on_spark) == committed(embedded) == sorted(expected, key=json.dumps)


class PerTenSeconds(KeyedProcessFunction):
    """Counts a key's events per 10 s of event time in a map state; an event-time timer at
    the end of each period emits ``[key, end, count]`` once the watermark passes it."""

    def open(self, ctx: Any) -> None:
        self.counts = ctx.get_state(MapStateDescriptor("counts"))

    def process_element(self, value: Any, ctx: Any) -> Iterable[Any]:
        end = (value[1] // 10 + 1) * 10
        self.counts.put(end, self.counts.get(end, 0) + 1)
        ctx.timer_service.register_event_time_timer(end)
        return None

    def on_timer(self, timestamp: float, ctx: Any) -> Iterable[Any]:
        assert ctx.timer_service.current_watermark() >= timestamp
        yield [ctx.current_key, timestamp, self.counts.get(timestamp)]
        self.counts.remove(timestamp)


def _events() -> list[tuple[str, float]]:
    rng = random.Random(3)
    out, t = [], 0.0
    for _ in range(400):
        t += rng.choice([0.5, 1.0, 2.0, 14.0])
        # up to 2 s out of order, within the 3 s bound
        out.append((f"k{rng.randrange(5)}", t - rng.choice([0.0, 0.0, 1.5])))
    return out


EVENTS = _events()


def sessions(name: str, out: Path) -> Dataflow:
    flow = Dataflow(name)
    (flow.from_collection(EVENTS).assign_timestamps(lambda e: e[1], max_out_of_orderness=3)
         .key_by(lambda e: e[0]).process(PerTenSeconds()).uid("per-ten-seconds")
         .sink(CommittingFileSink(out)).uid("out"))
    return flow


async def test_event_time_timers_equal_embedded(spark: Any, tmp_path: Path) -> None:
    embedded, on_spark = await run_both(sessions, tmp_path, spark, batch=200)
    counts = collections.Counter((k, (t // 10 + 1) * 10) for k, t in EVENTS)
    expected = sorted(([k, end, n] for (k, end), n in counts.items()), key=json.dumps)
    assert committed(on_spark) == committed(embedded) == expected


class SumCount(AggregateFunction):
    def create_accumulator(self) -> Any:
        return (0, 0.0)

    def add(self, value: Any, acc: Any) -> Any:
        return (acc[0] + 1, acc[1] + value[2])

    def merge(self, a: Any, b: Any) -> Any:
        return (a[0] + b[0], a[1] + b[1])

    def get_result(self, acc: Any) -> Any:
        return acc


READINGS = [(f"s{i % 4}", i * 0.7 + (i % 5) * 0.3, float(i % 11)) for i in range(700)]


def windows(name: str, out: Path) -> Dataflow:
    flow = Dataflow(name, parallelism=2)
    timed = flow.from_collection(READINGS).assign_timestamps(lambda r: r[1],
                                                             max_out_of_orderness=2)
    (timed.key_by(lambda r: r[0]).window(TumblingEventTimeWindows.of(30))
          .aggregate(SumCount()).uid("tumbling")
          .map(lambda w: ["tumbling", w.key, w.start, w.end, *w.value])
          .sink(CommittingFileSink(out / "tumbling")).uid("tumbling-out"))
    (timed.key_by(lambda r: r[0]).window(SlidingEventTimeWindows.of(40, 10))
          .aggregate(SumCount()).uid("sliding")
          .map(lambda w: ["sliding", w.key, w.start, w.end, *w.value])
          .sink(CommittingFileSink(out / "sliding")).uid("sliding-out"))
    return flow


def _windows_by_loop(size: float, slide: float, kind: str) -> list[Any]:
    acc: dict[tuple[str, float], list[float]] = {}
    for key, ts, v in READINGS:
        start = ts - (ts % slide)
        while start > ts - size:
            a = acc.setdefault((key, start), [0, 0.0])
            a[0] += 1
            a[1] += v
            start -= slide
    return [[kind, k, s, s + size, n, total] for (k, s), (n, total) in acc.items()]


async def test_tumbling_and_sliding_windows_equal_embedded(spark: Any, tmp_path: Path) -> None:
    embedded, on_spark = await run_both(windows, tmp_path, spark, batch=350)
    for kind, size, slide in [("tumbling", 30, 30), ("sliding", 40, 10)]:
        expected = sorted(_windows_by_loop(size, slide, kind), key=json.dumps)
        assert committed(on_spark / kind) == committed(embedded / kind) == expected


def parse(line: str) -> list[Any]:
    """``"user,amount"`` -> ``[user, amount]``; anything else -> a dead letter."""
    try:
        user, amount = line.split(",")
        return [("ok", user, int(amount))]
    except ValueError as exc:
        return [("dead", line, str(exc))]


LINES = [f"u{i % 6},{i % 17}" if i % 23 else f"garbage line {i}" for i in range(450)]


def with_dead_letters(name: str, out: Path) -> Dataflow:
    flow = Dataflow(name)
    parsed = flow.from_collection(LINES).flat_map(parse, name="parse")
    (parsed.filter(lambda r: r[0] == "dead").map(lambda r: {"line": r[1], "reason": r[2]})
           .sink(CommittingFileSink(out / "dead")).uid("dead-letters"))
    (parsed.filter(lambda r: r[0] == "ok").key_by(lambda r: r[1])
           .reduce(lambda a, b: ("ok", a[1], a[2] + b[2])).uid("sum")
           .map(lambda r: [r[1], r[2]]).sink(CommittingFileSink(out / "sums")).uid("sums"))
    return flow


@pytest.mark.parametrize("one_query", [False, True])
async def test_dead_letter_side_path_equals_embedded(
        spark: Any, tmp_path: Path, one_query: bool) -> None:
    # one_query: the parse runs once, the reduce (transformWithState) and the dead letters
    # are two branches of one query
    embedded, on_spark = await run_both(with_dead_letters, tmp_path, spark, batch=225,
                                        one_query=one_query)
    dead = committed(on_spark / "dead")
    assert dead == committed(embedded / "dead")
    assert [d["line"] for d in sorted(dead, key=lambda d: d["line"])] == sorted(
        line for line in LINES if line.startswith("garbage"))
    assert committed(on_spark / "sums") == committed(embedded / "sums")


# ---------------------------------------------------------------------------- refusals
async def _service(x: Any) -> Any:
    return x


@pytest.mark.parametrize("build, operator, why", [
    (lambda f: f.from_collection([1]).map_async(_service, name="enrich").sink(
        CommittingFileSink("/nonexistent")), "enrich", "async operators"),
    (lambda f: f.from_collection([1]).connect(f.from_collection([2])).map(
        str, str, name="both").sink(CommittingFileSink("/nonexistent")), "both", "two inputs"),
    (lambda f: f.from_collection([1]).map(str, name="fmt").sink(print, name="console"),
     "console", "CommittingFileSink"),
    (lambda f: f.from_collection([1]).key_by(str).window(TumblingEventTimeWindows.of(1),
                                                        timestamp=float)
                .aggregate(SumCount(), name="per-second").sink(
                    CommittingFileSink("/nonexistent")), "per-second", "assign_timestamps"),
    (lambda f: f.from_collection([1]).key_by(str).process(Count(), name="first")
                .key_by(str).process(Count(), name="second").sink(
                    CommittingFileSink("/nonexistent")), "second", "one keyed operator"),
])
def test_untranslatable_operators_are_refused_naming_them(
        build: Any, operator: str, why: str, tmp_path: Path) -> None:
    flow = Dataflow("refused")
    build(flow)
    # no session needed: the refusal comes before Spark is touched
    with pytest.raises(TranslationError) as info:
        SparkRunner(None, tmp_path).start(flow)  # type: ignore[arg-type]
    assert info.value.operator == operator
    assert repr(operator) in str(info.value) and why in str(info.value)
    assert not list(tmp_path.iterdir())


def failing(x: int) -> int:
    if x == 37:
        raise ValueError("no 37s")
    return x


def test_a_failing_user_function_fails_the_query_naming_operator_and_record(
        spark: Any, tmp_path: Path) -> None:
    flow = Dataflow("failing")
    (flow.from_collection(range(100)).map(failing, name="strict").key_by(lambda x: x % 3)
         .process(Count()).sink(CommittingFileSink(tmp_path / "out")))
    with pytest.raises(SparkJobError) as info:
        SparkRunner(spark, tmp_path / "chk").run(flow)
    text = str(info.value)
    assert "operator 'strict'" in text and "record 37" in text and "no 37s" in text


def test_reactive_run_runner_spark_refuses_naming_the_operator(
        tmp_path: Path, capsys: Any) -> None:
    from reactive.cli import main

    module = tmp_path / "job.py"
    module.write_text(
        "from reactive import Dataflow\n"
        "from reactive.connectors.files import CommittingFileSink\n"
        "async def call(x):\n    return x\n"
        "flow = Dataflow('cli-job')\n"
        f"flow.from_collection([1]).map_async(call, name='lookup').sink("
        f"CommittingFileSink({str(tmp_path / 'out')!r}))\n")
    code = main(["run", str(module), "--runner", "spark",
                 "--checkpoint-dir", str(tmp_path / "chk")])
    assert code != 0
    assert "operator 'lookup'" in capsys.readouterr().err
