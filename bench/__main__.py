"""``python -m bench``: W1, W2 and W3 in one run, one table, written to bench/README.md.

- W1: keyed count of 2,000,000 Zipf(1.1) keys (``bench.w1``), heap backend, with and without
  checkpoints every second, against a bare Python counting loop.
- W2: the flights job without Spark (``examples/flights.py --no-validate``: RocksDB
  incremental checkpoints every second, parallelism 2), against a bare Python loop that
  parses the same file and computes the same hourly aggregates in a dict.
- W3: the flights job killed with SIGKILL at 50% of its input: duration of the restarted run
  and the records it read again (those after the restored checkpoint's source offset).

Options: ``--records N`` (W1 size), ``--no-write`` (do not update bench/README.md),
``--png PATH`` (the bar chart of the ratios, default ``bench/results/bench.png``; skipped, with
a line saying so, when matplotlib, the ``plot`` extra, is missing), ``--no-png``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import w1
from bench.common import print_table
from bench.figures import RESULTS, write_ratio_png

ROOT = Path(__file__).resolve().parent.parent
FLIGHTS = ROOT / "examples" / "flights.py"
BEGIN, END = "<!-- bench:main:begin -->", "<!-- bench:main:end -->"


def flights_bare_loop(data: Path) -> float:
    """Records/s of plain Python parsing and hourly aggregation of the flights file."""
    sys.path.insert(0, str(ROOT / "examples"))
    from flights_data import MalformedRow, parse_flight

    t = time.perf_counter()
    acc: dict[tuple[str, str, int], list[float]] = {}
    n = 0
    with open(data) as f:
        next(f)
        for line in f:
            n += 1
            try:
                fl = parse_flight(line.rstrip("\n"))
            except MalformedRow:
                continue
            a = acc.setdefault((fl.origin, fl.carrier, int(fl.ts // 3600)), [0, 0, 0.0, 0])
            a[0] += 1
            a[1] += fl.cancelled
            if fl.dep_delay is not None:
                a[2] += fl.dep_delay
                a[3] += 1
    return n / (time.perf_counter() - t)


def run_flights(work: Path, crash: bool) -> tuple[float, dict[str, float]]:
    """Run the flights job (fresh directories); return (wall seconds, last run's figures)."""
    args = [sys.executable, str(FLIGHTS), "--no-validate", "--fresh",
            "--output", str(work / "out"), "--checkpoint-dir", str(work / "chk")]
    if crash:
        args += ["--crash-at", "0.5"]
    t = time.perf_counter()
    subprocess.run(args, check=True, capture_output=True, text=True)
    seconds = time.perf_counter() - t
    return seconds, json.loads((work / "chk" / "_figures.json").read_text())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=2_000_000)
    p.add_argument("--no-write", dest="write", action="store_false")
    p.add_argument("--png", default=str(RESULTS / "bench.png"),
                   help="bar chart of the ratios (default: %(default)s)")
    p.add_argument("--no-png", dest="png", action="store_const", const=None,
                   help="do not write the bar chart")
    args = p.parse_args(argv)

    print("W1 ...", flush=True)
    w1_table = w1.main(["--records", str(args.records), "--no-png"])
    sys.path.insert(0, str(ROOT / "examples"))
    from flights_data import prepare_flights

    data = prepare_flights(ROOT / "data" / "flights.csv")
    with open(data, "rb") as f:
        total = sum(1 for _ in f) - 1
    with tempfile.TemporaryDirectory() as d:
        print("W2 ...", flush=True)
        bare = flights_bare_loop(data)
        _, w2 = run_flights(Path(d) / "w2", crash=False)
        print("W3 ...", flush=True)
        _, w3 = run_flights(Path(d) / "w3", crash=True)
    w2_rate = w2["records"] / w2["seconds"]
    crash_at = total // 2
    reread = int(w3["records"]) - (total - crash_at)
    table = print_table(
        ["workload", "records/s", "baseline records/s", "ratio", "notes"],
        [["W2 flights job, RocksDB incremental, p=2", w2_rate, bare, w2_rate / bare,
          f"{int(w2['checkpoints'])} checkpoints, median sync {w2['median_sync_ms']:.1f} ms, "
          f"async {w2['median_async_ms']:.1f} ms"],
         ["W3 restart after kill -9 at 50%", w3["records"] / w3["seconds"], w2_rate,
          (w3["records"] / w3["seconds"]) / w2_rate,
          f"restarted run {w3['seconds']:.1f} s (W2 full run {w2['seconds']:.1f} s); "
          f"records read again: {reread:,} of {total:,}"]],
    )
    png = None
    if args.png:
        print()
        png = write_ratio_png(f"{w1_table}\n\n{table}", args.png,
                              f"python -m bench: W1 ({args.records:,} records), W2, W3")
    if not args.write:
        return
    readme = ROOT / "bench" / "README.md"
    text = readme.read_text() if readme.exists() else "# Benchmarks\n"
    section = (f"{BEGIN}\n## python -m bench (W1, W2, W3)\n\nCommand: `.venv/bin/python -m bench`"
               f" (run on {time.strftime('%Y-%m-%d')}).\n\n{w1_table}\n\n{table}\n{END}")
    if png is not None and png.resolve().is_relative_to(readme.parent):
        figure = png.resolve().relative_to(readme.parent).as_posix()
        section = section.replace(f"\n{END}", f"\n\n![the ratios as bars]({figure})\n{END}")
    if BEGIN in text:
        text = text[:text.index(BEGIN)] + section + text[text.index(END) + len(END):]
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    readme.write_text(text)
    print(f"\nwritten to {readme}")


if __name__ == "__main__":
    main()
