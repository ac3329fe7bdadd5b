"""The state-backend contract (reactive/testing/backend_contract.py) run for the built-in
backends."""

from __future__ import annotations

from pathlib import Path

import pytest

from reactive import StateBackend
from reactive.backends.heap import HeapStateBackend
from reactive.backends.rocksdb import RocksDBStateBackend
from reactive.testing.backend_contract import StateBackendContract


class TestHeapStateBackend(StateBackendContract):
    def create_state_backend(self, tmp_path: Path) -> StateBackend:
        return HeapStateBackend()


class TestHeapIncrementalStateBackend(StateBackendContract):
    """Snapshots chain deltas onto the last completed checkpoint's files (heap-v2)."""

    def create_state_backend(self, tmp_path: Path) -> StateBackend:
        return HeapStateBackend(incremental=True)


class TestRocksDBFullSnapshots(StateBackendContract):
    def create_state_backend(self, tmp_path: Path) -> StateBackend:
        return RocksDBStateBackend(path=tmp_path / "state", incremental=False)


class TestRocksDBIncrementalSnapshots(StateBackendContract):
    def create_state_backend(self, tmp_path: Path) -> StateBackend:
        return RocksDBStateBackend(path=tmp_path / "state", incremental=True)


class TestRocksDBTinyCache(StateBackendContract):
    """Every access misses the write-back cache and every write is its own batch."""

    def create_state_backend(self, tmp_path: Path) -> StateBackend:
        return RocksDBStateBackend(path=tmp_path / "state", cache_entries=1,
                                   write_batch_entries=1)


@pytest.mark.e2e
class TestHeapForkedSnapshots(StateBackendContract):
    """Snapshots written by a forked child process (``snapshot="fork"``)."""

    def create_state_backend(self, tmp_path: Path) -> StateBackend:
        return HeapStateBackend(snapshot="fork")


@pytest.mark.e2e
class TestHeapForkedIncrementalSnapshots(StateBackendContract):
    """Forked children chaining deltas onto the last completed checkpoint's files."""

    def create_state_backend(self, tmp_path: Path) -> StateBackend:
        return HeapStateBackend(incremental=True, snapshot="fork")
