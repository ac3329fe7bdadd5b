"""The ``reactive`` command line.

```
reactive run MODULE[:ATTR] [--checkpoint-dir D] [--interval S] [--backend heap|rocksdb]
             [--parallelism N] [--resume | --fresh] [--allow-replayed-output]
             [--runner embedded|spark] [--spark-master URL]
reactive checkpoints list D
reactive checkpoints inspect D/<job>/chk-N
reactive checkpoints plot D[/<job>] [--output FILE.png] [--x id|time]   (the plot extra)
reactive savepoint D/<job>[/chk-N] --output P   (a checkpoint -> a self-contained savepoint)
reactive validate ...            (the Spark validation: python -m reactive.connectors.spark validate)
```

Exit codes: 0 success, 1 a failed job or validation, 2 bad usage or input, 128 + the signal
number when a second SIGINT/SIGTERM abandoned the stop (130 for Ctrl-C twice); errors print
one line (``error: ...``) on standard error.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.metadata
import importlib.util
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from .checkpoint.contract import Reconfiguration
from .checkpoint.history_plot import CheckpointHistoryError, plot_checkpoint_history
from .checkpoint.metadata import METADATA, read_metadata
from .checkpoint.savepoints import export_savepoint
from .checkpoint.storage import CheckpointStorage
from .config import CheckpointConfig
from .dataflow import Dataflow
from .defaults import builtin
from .errors import ConfigurationError, JobFailedError, MissingExtraError, ReactiveError
from .runtime.graceful_stop import run_until_stopped
from .runtime.loop import run_coroutine
from .state.backend import StateBackend

__all__ = ["main"]


class CliError(Exception):
    """A usage or input problem: exit code 2 with a one-line message."""


def load_dataflow(spec: str) -> Dataflow:
    """Load ``MODULE[:ATTR]``: a file path or module name, and an attribute (default
    ``flow``) that is a :class:`Dataflow` or a function returning one.

    Raises:
        CliError: when the module or attribute is missing or not a dataflow.
    """
    module_spec, _, attr = spec.partition(":")
    attr = attr or "flow"
    path = Path(module_spec)
    try:
        if path.suffix == ".py" or path.exists():
            if not path.exists():
                raise CliError(f"no such file: {path}")
            sys.path.insert(0, str(path.resolve().parent))
            loader_spec = importlib.util.spec_from_file_location(path.stem, path)
            assert loader_spec is not None and loader_spec.loader is not None
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[path.stem] = module
            loader_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_spec)
    except ImportError as exc:
        raise CliError(f"cannot import {module_spec}: {exc}") from exc
    obj = getattr(module, attr, None)
    if obj is None:
        raise CliError(f"{module_spec} has no attribute {attr!r} (expected a Dataflow or a "
                       "function returning one)")
    if callable(obj) and not isinstance(obj, Dataflow):
        obj = obj()
    if not isinstance(obj, Dataflow):
        raise CliError(f"{spec} is a {type(obj).__name__}, not a Dataflow")
    return obj


def make_backend(name: str, checkpoint_dir: Path) -> StateBackend | None:
    """The state backend named on the command line (None: the default heap backend)."""
    if name == "heap":
        return None
    if name == "rocksdb":
        try:
            factory = builtin("reactive.backends.rocksdb:RocksDBStateBackend")
        except ImportError as exc:
            raise CliError(f"the RocksDB backend is not available: {exc}") from exc
        return cast(StateBackend, factory(path=str(checkpoint_dir / ".rocksdb-work")))
    raise CliError(f"unknown backend {name!r}: use heap or rocksdb")


def cmd_run(args: argparse.Namespace) -> int:
    flow = load_dataflow(args.target)
    if args.parallelism is not None:
        if args.parallelism < 1:
            raise CliError("--parallelism must be >= 1")
        flow.parallelism = args.parallelism
    checkpoint_dir = Path(args.checkpoint_dir)
    if getattr(args, "runner", "embedded") == "spark":
        return _run_on_spark(flow, checkpoint_dir, args.spark_master)
    if not args.resume and not args.fresh:
        storage = CheckpointStorage(checkpoint_dir, flow.name)
        if storage.runs() or storage.completed():
            raise CliError(
                f"{storage.job_dir} holds checkpoints of an earlier run; pass --resume to "
                "continue that run, or --fresh to start a new run from the beginning of the "
                "input")
    options: dict[str, Any] = {
        "checkpoints": CheckpointConfig(interval=args.interval, directory=checkpoint_dir),
        "state_backend": make_backend(args.backend, checkpoint_dir),
        "resume": args.resume,
        "allow_replayed_output": args.allow_replayed_output,
    }
    outcome = run_coroutine(run_until_stopped(flow, **options))
    m = outcome.job.metrics
    if outcome.abandoned_by is not None:
        again = outcome.abandoned_by
        print(f"{again.name} again: savepoint abandoned, job {flow.name!r} cancelled; run "
              "again with --resume to continue from the latest completed checkpoint",
              file=sys.stderr)
        return 128 + int(again)  # the shell's convention for a run ended by a signal
    if outcome.signal_name is not None:
        where = (f" with savepoint {outcome.savepoint.checkpoint_id} at {outcome.savepoint.path}"
                 if outcome.savepoint is not None else "")
        print(f"job {flow.name!r} stopped by {outcome.signal_name}{where}; resume with:\n"
              f"  {_resume_command(args)}")
        return 0
    print(f"job {flow.name!r} finished: {m.totals.completed} checkpoints, "
          f"{m.restarts} restarts")
    names = m.operator_names
    for uid, counts in m.operators.items():
        label = uid if names.get(uid, uid) == uid else f"{names[uid]} ({uid})"
        print(f"  {label}: in {counts['records_in']:,} out {counts['records_out']:,}")
    return 0


def _run_on_spark(flow: Dataflow, checkpoint_dir: Path, master: str) -> int:
    """``reactive run --runner spark``: the dataflow as Spark queries (the spark extra),
    their Spark checkpoints in ``<checkpoint-dir>/spark``; a run continues what an earlier
    one on the same directory committed."""
    try:
        runner_class = builtin("reactive.connectors.spark:SparkRunner")
        session = builtin("reactive.connectors.spark:local_session")
        translate = builtin("reactive.connectors.spark.translation:translate")
    except ImportError as exc:
        raise CliError(f"the Spark runner is not available: {exc}") from exc
    translate(flow)  # refuse an untranslatable program before starting Spark's JVM
    spark = session(master)
    runner = runner_class(spark, checkpoint_dir / "spark")
    # a line per micro-batch of each query while it runs (Spark's progress reports)
    printer = builtin("reactive.connectors.spark.progress:progress_printer")()
    spark.streams.addListener(printer)
    try:
        job = runner.run(flow)
        printer.wait_printed(job.queries.values())
    finally:
        spark.streams.removeListener(printer)
    print(f"job {flow.name!r} finished on Spark ({master}):")
    for uid, q in job.summary().items():
        print(f"  query of sink {uid} ({q['shape']}): {q['micro_batches']} micro-batches, "
              f"{q['input_rows']:,} input rows, {q['rows_per_second']:,.0f} rows/s, state "
              f"{q['state_rows']:,} rows ({q['state_bytes']:,} bytes)")
    return 0


def _resume_command(args: argparse.Namespace) -> str:
    """The ``reactive run`` command that continues the stopped run."""
    parts = ["reactive", "run", shlex.quote(args.target), "--checkpoint-dir",
             shlex.quote(str(args.checkpoint_dir)), "--interval", str(args.interval),
             "--backend", args.backend]
    if args.parallelism is not None:
        parts += ["--parallelism", str(args.parallelism)]
    if args.allow_replayed_output:
        parts.append("--allow-replayed-output")
    return " ".join([*parts, "--resume"])


def _job_dirs(directory: Path) -> list[Path]:
    if not directory.is_dir():
        raise CliError(f"no such directory: {directory}")
    if any(p.name.startswith("chk-") or p.name == "_runs" for p in directory.iterdir()):
        return [directory]
    return sorted(p for p in directory.iterdir() if p.is_dir())


def _reconfigured(entries: tuple[Reconfiguration, ...]) -> str:
    """A checkpoint's reconfigurations in one word: ``rescale(count:1->2)``,
    ``update(m:mod.f)``, comma separated; ``-`` for none."""
    if not entries:
        return "-"
    return ",".join(
        f"rescale({r.operator}:{r.previous_parallelism}->{r.parallelism})"
        if r.kind == "rescale" else f"{r.kind}({r.operator}:{r.function})" for r in entries)


def cmd_checkpoints_list(args: argparse.Namespace) -> int:
    directory = Path(args.directory)
    if (directory / METADATA).exists():
        # one checkpoint or savepoint, not a directory of them: say what it is
        meta = read_metadata(directory)
        kind = "savepoint" if meta.is_savepoint else "checkpoint"
        where = " (self-contained, movable)" if meta.self_contained else ""
        print(f"{directory} is {kind} {meta.checkpoint_id} of job {meta.job!r}{where}: "
              f"{meta.state_size:,} bytes, max parallelism {meta.max_parallelism}; restore it with "
              f"restore_from={str(directory)!r}")
        return 0
    job_dirs = _job_dirs(directory)
    # what the directory is goes to standard error: standard output stays the table
    if job_dirs == [directory]:
        print(f"{directory} holds the checkpoints of job {directory.name!r}:", file=sys.stderr)
    else:
        print(f"{directory} is a checkpoint root with {len(job_dirs)} job(s):", file=sys.stderr)
    rows = []
    for job_dir in job_dirs:
        storage = CheckpointStorage(job_dir.parent, job_dir.name)
        completed = {c.checkpoint_id: c for c in storage.completed()}
        for n, path in storage._dirs():
            chk = completed.get(n)
            if chk is None:
                size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
                rows.append((job_dir.name, n, "-", size, "-", "-", "no"))
                continue
            meta = chk.metadata
            when = datetime.datetime.fromtimestamp(meta.timestamp or 0.0).isoformat(
                " ", "seconds")
            size = int(meta.metrics.size or 0) if meta.metrics is not None else 0
            kind = "savepoint" if meta.is_savepoint else (
                "incremental" if meta.shared_paths() else "full")
            rows.append((job_dir.name, n, when, size, kind,
                         _reconfigured(meta.reconfigurations), "yes"))
    width = max([len("reconfigured")] + [len(r[5]) for r in rows])
    print(f"{'job':<16} {'id':>6}  {'time':<19}  {'bytes':>12}  {'kind':<11}  "
          f"{'reconfigured':<{width}}  completed")
    for job, n, when, size, kind, reconfigured, done in rows:
        print(f"{job:<16} {n:>6}  {when:<19}  {size:>12,}  {kind:<11}  "
              f"{reconfigured:<{width}}  {done}")
    return 0


def cmd_checkpoints_inspect(args: argparse.Namespace) -> int:
    path = Path(args.path)
    if not path.is_dir():
        raise CliError(f"no such checkpoint directory: {path}")
    if not (path / METADATA).exists():
        raise CliError(f"{path} has no {METADATA}: it is an incomplete checkpoint")
    meta = read_metadata(path)
    if args.json:
        print(json.dumps(meta.to_json(), indent=1))
        return 0
    print(f"checkpoint {meta.checkpoint_id} of job {meta.job!r} ({meta.kind}), "
          f"max parallelism {meta.max_parallelism}, mode {meta.mode}")
    for r in meta.reconfigurations:
        print(f"reconfigured at this checkpoint: {r.describe()}")
    for uid, op in meta.operators.items():
        print(f"operator {uid!r} ({op.name}), parallelism {op.parallelism}")
        for i, sub in op.by_index():
            parts = []
            if sub.key_group_range is not None:
                parts.append(f"key groups {sub.key_group_range.start}-{sub.key_group_range.end}")
            if sub.keyed_state is not None:
                h = sub.keyed_state
                parts.append(f"keyed state [{h.backend}] {sum(r.size for r in h.files):,} B in "
                             f"{len(h.files)} file(s)")
            if sub.operator_state is not None:
                o = sub.operator_state
                parts.append(f"operator state {o.size:,} B in {len(o.files)} file(s)")
            print(f"  subtask {i}: " + ("; ".join(parts) or "no state"))
    print(f"referenced files: {meta.state_size:,} bytes")
    return 0


def cmd_checkpoints_plot(args: argparse.Namespace) -> int:
    """Draw the durations and sizes of a job's completed checkpoints into a PNG."""
    try:
        plot = plot_checkpoint_history(args.directory, args.output, x=args.x)
    except (CheckpointHistoryError, MissingExtraError) as exc:
        raise CliError(str(exc)) from exc
    print(f"{len(plot.history.points)} checkpoints of job {plot.history.job!r} drawn to "
          f"{plot.path}")
    return 0


def cmd_savepoint(args: argparse.Namespace) -> int:
    """Copy a completed checkpoint into a self-contained savepoint directory.

    Jobs run inside their application's process, so there is no running job to signal from
    here (a running job takes one with ``await job.savepoint(path)`` or
    ``await job.stop(savepoint=True)``); this turns the latest restorable checkpoint of a job
    directory (or the given ``chk-N``) into a savepoint that can be moved and restored with
    ``restore_from`` at another parallelism or backend.
    """
    path = Path(args.checkpoint)
    if not path.is_dir():
        raise CliError(f"no such directory: {path}")
    if (path / METADATA).exists():
        chk = CheckpointStorage.load(path)
    else:
        found = CheckpointStorage(path.parent, path.name).latest_restorable()
        if found is None:
            raise CliError(f"{path} holds no completed checkpoint (give D/<job> or "
                           "D/<job>/chk-N)")
        chk = found
    sp = export_savepoint(chk, Path(args.output))
    print(f"savepoint of checkpoint {chk.checkpoint_id} of job {sp.metadata.job!r} "
          f"written to {sp.path} ({sp.metadata.state_size:,} bytes)")
    return 0


def cmd_validate(argv: Sequence[str]) -> int:
    try:
        spark_main = builtin("reactive.connectors.spark.__main__:main")
    except ImportError as exc:
        raise CliError(f"the Spark bridge is not available: {exc}") from exc
    return int(spark_main(["validate", *argv], prog="reactive"))


def _version() -> str:
    try:
        return importlib.metadata.version("reactive")
    except importlib.metadata.PackageNotFoundError:  # running from a checkout, not installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="reactive", description="Run and inspect dataflows.",
        epilog="exit codes: 0 success; 1 the job or the validation failed; 2 bad usage or "
               "input (errors print one line on standard error); 130 a second Ctrl-C "
               "abandoned the stop (128 + the signal's number)")
    p.add_argument("--version", action="version", version=f"reactive {_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a dataflow defined in a module")
    run.add_argument("target", help="MODULE[:ATTR], a file path or module name; ATTR "
                     "(default 'flow') is a Dataflow or a function returning one")
    run.add_argument("--checkpoint-dir", default="checkpoints",
                     help="checkpoint storage root; the job's checkpoints go to DIR/<job> "
                     "(default: %(default)s)")
    run.add_argument("--interval", type=float, default=1.0,
                     help="seconds between checkpoints (default: %(default)s)")
    run.add_argument("--backend", choices=["heap", "rocksdb"], default="heap",
                     help="keyed state backend: heap (dicts in memory) or rocksdb (on disk, "
                     "incremental checkpoints; the rocksdb extra) (default: %(default)s)")
    run.add_argument("--parallelism", type=int, default=None,
                     help="default parallelism of the operators (default: the dataflow's)")
    start = run.add_mutually_exclusive_group()
    start.add_argument("--resume", action="store_true",
                       help="continue the most recent run of the job in the checkpoint "
                       "directory: from its newest completed checkpoint, else from what it "
                       "started from")
    start.add_argument("--fresh", action="store_true",
                       help="start a new run from the beginning of the input even though the "
                       "directory holds checkpoints of an earlier run (they are left alone; "
                       "new checkpoint ids continue after theirs)")
    run.add_argument("--allow-replayed-output", action="store_true",
                     help="with --resume: accept restoring an older checkpoint when a newer "
                     "one is damaged although it had committed output (that output is then "
                     "published again)")
    run.add_argument("--runner", choices=["embedded", "spark"], default="embedded",
                     help="run in this process (embedded) or as Spark Structured Streaming "
                     "queries (spark: the spark extra) (default: %(default)s)")
    run.add_argument("--spark-master", default="local[2]",
                     help="with --runner spark: the Spark master URL (default: %(default)s)")
    run.set_defaults(func=cmd_run)
    chk = sub.add_parser("checkpoints", help="list, inspect or plot checkpoints")
    chk_sub = chk.add_subparsers(dest="action", required=True)
    ls = chk_sub.add_parser("list", help="list the checkpoints of a directory")
    ls.add_argument("directory", help="a checkpoint root (every job in it), a job directory "
                    "DIR/<job>, or one checkpoint or savepoint directory")
    ls.set_defaults(func=cmd_checkpoints_list)
    insp = chk_sub.add_parser("inspect", help="show a checkpoint's operators and state")
    insp.add_argument("path", help="a checkpoint directory DIR/<job>/chk-N or a savepoint "
                      "directory")
    insp.add_argument("--json", action="store_true", help="print the raw metadata")
    insp.set_defaults(func=cmd_checkpoints_inspect)
    plot = chk_sub.add_parser("plot", help="draw the durations and sizes of a job's completed "
                              "checkpoints into a PNG (the plot extra: matplotlib)")
    plot.add_argument("directory", help="a job directory DIR/<job>, or a checkpoint root "
                      "that holds one job")
    plot.add_argument("--output", default=None, help="the PNG file to write (default: "
                      "DIRECTORY/checkpoints.png)")
    plot.add_argument("--x", choices=["id", "time"], default="id", help="draw over the "
                      "checkpoint id or the completion time (default: %(default)s)")
    plot.set_defaults(func=cmd_checkpoints_plot)
    sp = sub.add_parser("savepoint", help="copy a completed checkpoint into a "
                        "self-contained savepoint (restore it with restore_from=...)")
    sp.add_argument("checkpoint", help="a job directory D/<job> (its latest restorable "
                    "checkpoint) or a checkpoint directory D/<job>/chk-N")
    sp.add_argument("--output", required=True, help="the savepoint directory to create "
                    "(must not exist or be empty)")
    sp.set_defaults(func=cmd_savepoint)
    sub.add_parser("validate", help="validate committed results with Spark "
                   "(see python -m reactive.connectors.spark validate --help)", add_help=False)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``reactive`` command; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["validate"]:
            return cmd_validate(argv[1:])
        args = build_parser().parse_args(argv)
        return int(args.func(args))
    except CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except JobFailedError as exc:
        # the job's message names the API's options; here the command line's flags apply
        print(f"error: {str(exc).replace('resume=True', '--resume')}", file=sys.stderr)
        return 1
    except (ConfigurationError, ReactiveError, OSError) as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
