"""A restored RocksDB instance runs with the backend's options, not with the ones rocksdict
reads back from the snapshot's OPTIONS file: its column family keeps the Bloom filter and what
``options_factory`` set. Without this, a job restarted from a RocksDB checkpoint wrote SST
files without filters and every cache miss read a data block of each of them (it ran at about
half the speed of a fresh job)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

from rocksdict import Options

from reactive import KeyGroupRange, ValueStateDescriptor
from reactive.backends.rocksdb import RocksDBKeyedStateBackend, RocksDBStateBackend
from reactive.state.backend import SnapshotContext

MAX_PARALLELISM = 128
TRIGGER = 7


def tune(opts: Options) -> None:
    opts.set_level_zero_file_num_compaction_trigger(TRIGGER)
    opts.enable_statistics()


def make_backend(path: Path, key_group_range: KeyGroupRange) -> RocksDBKeyedStateBackend:
    kb = RocksDBStateBackend(path=path, options_factory=tune).create_keyed_backend(
        job_name="opts", operator_uid="op", subtask=0, key_group_range=key_group_range,
        max_parallelism=MAX_PARALLELISM)
    assert isinstance(kb, RocksDBKeyedStateBackend)
    return kb


def live_options(kb: RocksDBKeyedStateBackend) -> dict[str, str]:
    """The default column family's options of the open database (its newest OPTIONS file)."""
    newest = max(kb._db_dir.glob("OPTIONS-*"), key=lambda p: int(p.name.split("-")[1]))
    text = newest.read_text()
    return dict(re.findall(r"^\s*(\w+)=(.*)$", text, flags=re.M))


def bloom_useful(kb: RocksDBKeyedStateBackend) -> int:
    stats = kb._opts.get_statistics() or ""
    m = re.search(r"rocksdb\.bloom\.filter\.useful COUNT : (\d+)", stats)
    return int(m.group(1)) if m else 0


def snapshot_of(tmp_path: Path, n: int) -> dict[str, Any]:
    kb = make_backend(tmp_path / "a", KeyGroupRange(0, MAX_PARALLELISM - 1))
    try:
        count = kb.get_state(ValueStateDescriptor("count", default=0))
        for i in range(n):
            kb.set_current_key(i)
            count.update(i)
        job_dir = tmp_path / "chk" / "opts"
        ctx = SnapshotContext(1, job_dir, job_dir / "chk-1", job_dir / "shared", "op", 0)
        return asyncio.run(kb.snapshot(ctx).write())
    finally:
        kb.dispose()


def test_restored_database_keeps_the_bloom_filter_and_factory_options(tmp_path: Path) -> None:
    handle = snapshot_of(tmp_path, 20_000)
    kb = make_backend(tmp_path / "b", KeyGroupRange(0, MAX_PARALLELISM - 1))
    try:
        kb.restore([handle], tmp_path / "chk" / "opts")
        opts = live_options(kb)
        assert opts["filter_policy"].startswith("bloomfilter")
        assert opts["level0_file_num_compaction_trigger"] == str(TRIGGER)

        # and the filters are used: new keys written after the restore, then misses
        count = kb.get_state(ValueStateDescriptor("count", default=0))
        for i in range(20_000, 30_000):
            kb.set_current_key(i)
            count.update(i)
        kb._flush_dirty()
        kb._db.flush()
        before = bloom_useful(kb)
        for i in range(100_000, 101_000):
            assert kb._db.get(b"\x00\x00" + b"none" + str(i).encode()) is None
        assert bloom_useful(kb) - before >= 900
    finally:
        kb.dispose()


def test_rescaled_restore_keeps_the_options(tmp_path: Path) -> None:
    handle = snapshot_of(tmp_path, 5_000)
    kb = make_backend(tmp_path / "b", KeyGroupRange(0, MAX_PARALLELISM // 2 - 1))
    try:
        kb.restore([handle], tmp_path / "chk" / "opts")  # installs and clips the range
        opts = live_options(kb)
        assert opts["filter_policy"].startswith("bloomfilter")
        assert opts["level0_file_num_compaction_trigger"] == str(TRIGGER)
    finally:
        kb.dispose()
