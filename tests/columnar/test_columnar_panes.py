"""The pane table of the columnar windows: each distinct (key slot, window start) pair gets
one pane, found again by later batches, across compactions, with the hashes in the sorted
array or in the hash table, and when pairs' hashes collide."""

from __future__ import annotations

import numpy as np
import pytest

from reactive.columnar import panes as panes_module
from reactive.columnar.panes import PaneTable


def _table() -> PaneTable:
    arrays = {"_slot": np.zeros(4, np.int64), "_start": np.zeros(4, np.float64),
              "_end": np.zeros(4, np.float64), "n": np.zeros(4, np.int64)}
    return PaneTable(arrays, {"n": 0})


def _check(table: PaneTable, slots: np.ndarray, starts: np.ndarray,
           panes: np.ndarray) -> None:
    # each pane is its pair's, and distinct pairs have distinct panes
    assert (table.arrays["_slot"][panes] == slots).all()
    assert (table.arrays["_start"][panes] == starts).all()
    assert len(set(panes.tolist())) == len(set(zip(slots.tolist(), starts.tolist(),
                                                   strict=True)))


@pytest.mark.parametrize("sorted_max", [1 << 16, 5])
@pytest.mark.parametrize("weak_hash", [False, True])
def test_pairs_keep_their_panes_across_batches_and_compactions(monkeypatch, sorted_max,
                                                               weak_hash):
    monkeypatch.setattr(panes_module, "SORTED_MAX", sorted_max)  # 5: the table's path too
    if weak_hash:  # many pairs share a hash: confirmed by slot and start, never merged
        monkeypatch.setattr(panes_module, "pair_hashes",
                            lambda s, t: (s % 3).astype(np.uint64) * np.uint64(7))
    rng = np.random.default_rng(7)
    table = _table()
    for step in range(30):
        pairs = sorted({(int(s), float(t)) for s, t in zip(
            rng.integers(0, 12, 40), rng.integers(0, 6, 40) * 60.0, strict=True)})
        slots = np.array([p[0] for p in pairs], np.int64)
        starts = np.array([p[1] for p in pairs])
        before = {(int(s), float(t)): i for i, (s, t) in enumerate(zip(
            table.arrays["_slot"][:table.size].tolist(),
            table.arrays["_start"][:table.size].tolist(), strict=True))}
        got = table.lookup(slots, starts, starts + 60.0)
        _check(table, slots, starts, got)
        # a pair known before keeps its pane; a new one gets a pane of its own
        for pair, pane in zip(pairs, got.tolist(), strict=True):
            if pair in before:
                assert pane == before[pair]
            else:
                assert pane >= len(before)
        assert (table.lookup(slots, starts, starts + 60.0) == got).all()  # found again
        if step % 4 == 3:  # drop some windows; the kept ones are renumbered in order
            keep = rng.random(table.size) < 0.5
            kept = list(zip(table.arrays["_slot"][:table.size][keep].tolist(),
                            table.arrays["_start"][:table.size][keep].tolist(), strict=True))
            table.compact(keep)
            assert table.size == len(kept)
            if kept:
                k_slots = np.array([p[0] for p in kept], np.int64)
                k_starts = np.array([p[1] for p in kept])
                again = table.lookup(k_slots, k_starts, k_starts + 60.0)
                assert again.tolist() == list(range(len(kept)))
