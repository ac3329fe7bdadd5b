"""Pipeline pieces and checks the tests share (conftest.py holds the fixtures only).

- :class:`Count`: the keyed count most jobs run; :func:`final_counts` reads its result.
- :class:`FailureInjector` and :func:`failing_count`: a count that fails at given global
  record numbers; :func:`paced`: a source that waits for completed checkpoints between them;
  :class:`HoldThenFail`: a reader that fails once a checkpoint completed, mid-input.
- :func:`checkpoint_state`, :func:`operator_state_entry`: state read from a checkpoint.
- :func:`zipf_words`: skewed, seeded input; :func:`load_example`: an ``examples/`` module.
- :func:`pickled_by_value`: a test module whose functions Spark's workers unpickle by value.
- :class:`TaskClock`: a fake clock for the tasks' time slices.
- :data:`ON_THE_SPARK_SESSION`: the mark of a test that runs on the tests' Spark session
  without asking for the ``spark`` fixture by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import random
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from reactive import KeyedProcessFunction, ValueStateDescriptor
from reactive.sources import SourceReader
from reactive.testing import TestingSource


class Count(KeyedProcessFunction):
    """Keyed count: emits ``(key, n)`` after each record of ``key``."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", default=0))

    def process_element(self, value: Any, ctx: Any) -> Iterable[Any]:
        n = self.count.value() + 1
        self.count.update(n)
        yield (ctx.current_key, n)


class FailureInjector:
    """Raises once at each of the given global record numbers (shared by all instances and
    all attempts: the job copies functions per instance, not this object's owner class)."""

    def __init__(self, fail_at: Iterable[int]) -> None:
        self.fail_at = sorted(fail_at)
        self.seen = 0
        self.failures = 0

    def tick(self) -> None:
        self.seen += 1
        if self.fail_at and self.seen >= self.fail_at[0]:
            self.fail_at.pop(0)
            self.failures += 1
            raise RuntimeError(f"injected failure #{self.failures} at record {self.seen}")


def paced(items: Iterable[Any], every: int) -> TestingSource:
    """A :class:`TestingSource` over ``items`` that waits for a completed checkpoint every
    ``every`` records (:data:`TestingSource.CHECKPOINT` markers).

    Failure-injection tests need checkpoints to complete *between* their injected failures.
    With a plain collection source that depended on how long checkpoints took compared with
    how fast the records flowed (a job could fail at record 150,000 before its first
    checkpoint completed, then find nothing to restore); pacing the source by completed
    checkpoints makes it hold on any machine.
    """
    out: list[Any] = []
    for i, item in enumerate(items):
        if i and i % every == 0:
            out.append(TestingSource.CHECKPOINT)
        out.append(item)
    return TestingSource(out)


class HoldThenFail(SourceReader):
    """Wraps a connector's reader for a failure test: reads through ``reader`` until a record
    (or record batch) satisfies ``past``; from then on it reads nothing more until
    ``ready()`` is true (a checkpoint completed, its output committed...), then raises.

    A test whose failure must come after a completed checkpoint and before the end of the
    input gets it on any machine: the input waits for the checkpoint (as at a
    :data:`TestingSource.CHECKPOINT` marker), instead of racing it to the end. Meanwhile
    the reader returns empty batches every millisecond, so the task serves barriers.

    Args:
        reader: the connector's reader (its position is snapshotted and restored as is).
        past: whether a record read is past the failure point.
        ready: whether the failure may come now.
    """

    def __init__(self, reader: SourceReader, past: Callable[[Any], bool],
                 ready: Callable[[], bool]) -> None:
        self.reader, self.past, self.ready = reader, past, ready
        self.passed = False

    async def read_batch(self, max_records: int) -> list[Any] | None:
        if self.passed:
            if self.ready():
                raise RuntimeError(f"injected failure at {self.reader.describe_position()}")
            await asyncio.sleep(0.001)
            return []
        batch = await self.reader.read_batch(max_records)
        self.passed = any(self.past(r) for r in batch or ())
        return batch

    def open(self, checkpointing: bool) -> None:
        self.reader.open(checkpointing)

    def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        return self.reader.snapshot_state(checkpoint_id)

    def restore_state(self, entries: list[Any]) -> None:
        self.reader.restore_state(entries)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> Any:
        return self.reader.notify_checkpoint_complete(checkpoint_id)

    def describe_position(self) -> Any:
        return self.reader.describe_position()

    def current_watermark(self) -> float | None:
        return self.reader.current_watermark()

    def is_idle(self) -> bool:
        return self.reader.is_idle()

    def close(self) -> Any:
        return self.reader.close()


def failing_count(injector: FailureInjector) -> KeyedProcessFunction:
    """A :class:`Count` that calls ``injector.tick()`` before each record."""

    class FailingCount(Count):
        inj = injector  # a class attribute: shared, not deep-copied per instance

        def process_element(self, value: Any, ctx: Any) -> Iterable[Any]:
            self.inj.tick()
            return super().process_element(value, ctx)

    return FailingCount()


def final_counts(records: Iterable[tuple[Any, int]]) -> dict[Any, int]:
    """The largest count emitted per key (what the keyed state ended with)."""
    out: dict[Any, int] = {}
    for key, n in records:
        if n > out.get(key, 0):
            out[key] = n
    return out


def checkpoint_state(directory: Any, job: str, uid: str, state: str) -> dict[Any, Any]:
    """The keyed state ``state`` of operator ``uid`` in the job's latest completed checkpoint
    (heap backend), merged over all instances."""
    from reactive import CheckpointStorage
    from reactive.backends.heap import read_heap_snapshot

    chk = CheckpointStorage(directory, job).completed()[-1]
    out: dict[Any, Any] = {}
    for sub in chk.metadata.operators[uid].subtasks.values():
        if sub.keyed_state is not None:
            out.update(read_heap_snapshot(sub.keyed_state.to_json(), chk.job_dir)
                       .get(state, {}))
    return out


def operator_state_entry(chk: Any, uid: str, name: str, default: Any) -> Any:
    """Entry ``name`` of operator ``uid``'s state (subtask 0) in completed checkpoint
    ``chk`` (``default`` when the checkpoint holds no state for the operator)."""
    import pickle

    operator = chk.metadata.operators.get(uid)
    if operator is None:
        return default
    handle = operator.subtasks[0].operator_state
    states = pickle.loads((chk.job_dir / handle.files[0].path).read_bytes())
    return states[name][1] if name in states else default


def zipf_words(n: int, vocabulary: int, seed: int) -> list[str]:
    """``n`` words drawn with a skewed (Zipf-like) distribution, deterministic per seed."""
    rnd = random.Random(seed)
    weights = [1.0 / (i + 1) ** 1.1 for i in range(vocabulary)]
    return [f"w{i}" for i in rnd.choices(range(vocabulary), weights=weights, k=n)]


@contextlib.contextmanager
def pickled_by_value(module_name: str) -> Iterator[None]:
    """Let Spark's Python workers unpickle the functions of test module ``module_name`` by
    value (they cannot import the tests package by name wherever they run)."""
    from pyspark import cloudpickle

    module = sys.modules[module_name]
    cloudpickle.register_pickle_by_value(module)
    try:
        yield
    finally:
        cloudpickle.unregister_pickle_by_value(module)


class TaskClock:
    """A fake clock for the tasks' time slices: stands in for the ``time`` module of
    :mod:`reactive.runtime.task`, whose ``monotonic()`` then returns the seconds of work the
    user functions reported with :meth:`work` (nothing else moves it). A test of how a task
    shares the loop then checks the same thing on a busy machine as on an idle one."""

    def __init__(self) -> None:
        self.now = 0.0
        self.reads = 0

    def monotonic(self) -> float:
        self.reads += 1
        return self.now

    def work(self, seconds: float) -> None:
        """A user function computed (or a remote call took) ``seconds``."""
        self.now += seconds

    @contextlib.contextmanager
    def installed(self, monkeypatch: Any) -> Iterator[TaskClock]:
        """Be the tasks' clock (from 0) inside the block; at its end, check that the tasks
        read it (a fake nobody read would prove nothing).

        Raises:
            AssertionError: if no task read the clock.
        """
        from reactive.runtime import task

        self.now, self.reads = 0.0, 0
        monkeypatch.setattr(task, "time", self)
        yield self
        assert self.reads > 0, "the tasks did not read reactive.runtime.task.time.monotonic()"


#: the xdist group of the tests that run on the tests' one Spark session (the ``spark``
#: fixture): they run on one xdist worker, so a run starts one session JVM (~10 CPU s, and
#: its first queries' JIT compilation) rather than one per worker
SPARK_GROUP = "spark"
#: the mark of a test that gets the ``spark`` fixture through ``request.getfixturevalue``
#: (tests that name it are in the group already, see tests/conftest.py)
ON_THE_SPARK_SESSION = pytest.mark.xdist_group(SPARK_GROUP)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load_example(name: str) -> ModuleType:
    """Import ``examples/<name>.py`` (once per process; registered under ``name`` so that
    pickled objects of its classes can be loaded again, and with ``examples/`` on the path
    for the examples' imports of each other)."""
    if name in sys.modules:
        return sys.modules[name]
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
