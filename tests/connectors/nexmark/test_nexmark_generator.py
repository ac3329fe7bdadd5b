"""The Nexmark generator from a user's side: the specification's proportions and id ranges,
the same events whichever split of the sequence generates them, a source whose position is
the event number (exactly once across a stop-with-savepoint and a restore at another
parallelism), watermarks no event falls behind, and Arrow batches and files holding the same
events as the records."""

from __future__ import annotations

import asyncio
import collections
import datetime as dt
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from reactive import CheckpointConfig, Dataflow, RestartStrategy
from reactive.connectors.nexmark import (
    Auction,
    Bid,
    NexmarkConfig,
    NexmarkSource,
    Person,
    event_time,
)
from reactive.connectors.nexmark.arrow import record_batches
from reactive.connectors.nexmark.files import write_events
from reactive.connectors.nexmark.generator import generate_columns, to_records
from tests.checkpoint.test_rescaling import WaitableSink

EPOCH = dt.datetime(1970, 1, 1)
CONFIG = NexmarkConfig(num_events=20_000, first_event_rate=1_000, seed=3)


def all_events(config: NexmarkConfig) -> list[Any]:
    assert config.num_events is not None
    return to_records(generate_columns(config, np.arange(config.num_events)))


def test_proportions_ids_and_times_follow_the_specification() -> None:
    events = all_events(CONFIG)
    kinds = [type(e) for e in events]
    # every run of 50 events: 1 person, 3 auctions, 46 bids, in that order
    for run in range(0, len(events), 50):
        assert kinds[run:run + 50] == [Person] + [Auction] * 3 + [Bid] * 46
    persons = [e for e in events if type(e) is Person]
    auctions = [e for e in events if type(e) is Auction]
    assert [p.id for p in persons] == list(range(1000, 1000 + len(persons)))
    assert [a.id for a in auctions] == list(range(1000, 1000 + len(auctions)))
    # event time from the rate: one event per millisecond at 1,000 events/s
    assert [e.date_time for e in events] == [CONFIG.base_time_ms + n for n in range(len(events))]
    last_auction, last_person = 999, 999
    for e in events:
        if type(e) is Person:
            last_person = e.id
        elif type(e) is Auction:
            last_auction = e.id
            assert e.expires > e.date_time
            assert 10 <= e.category < 15
            assert e.reserve >= e.initial_bid > 0
            assert last_person - 1000 <= e.seller <= last_person + 10
        else:
            # one of the last 100 in-flight auctions, or up to 10 ids ahead
            assert last_auction - 100 <= e.auction <= last_auction + 10
            # one of the 1,000 active people, or up to 10 ids ahead
            assert last_person - 1000 <= e.bidder <= last_person + 10
    # an auction lasts about as long as generating 100 more auctions (1,667 events: 1.7 s)
    mean = sum(a.expires - a.date_time for a in auctions) / len(auctions)
    assert 1_200 < mean < 2_200
    # the hot auction gets about half of the bids (hot_auction_ratio 2)
    bids = [e for e in events if type(e) is Bid]
    hot = sum(1 for b in bids if (b.auction - 1000) % 100 == 0)
    assert 0.45 < hot / len(bids) < 0.6


def test_events_depend_only_on_seed_and_event_number() -> None:
    events = all_events(CONFIG)
    rng = np.random.default_rng(1)
    picked = rng.choice(len(events), 500, replace=False)
    assert to_records(generate_columns(CONFIG, picked)) == [events[i] for i in picked]
    other = all_events(NexmarkConfig(num_events=20_000, first_event_rate=1_000, seed=4))
    assert [type(e) for e in other] == [type(e) for e in events]
    assert sum(a != b for a, b in zip(other, events, strict=True)) > 19_000


def test_out_of_order_groups_stay_behind_the_source_watermark() -> None:
    config = NexmarkConfig(num_events=5_000, first_event_rate=1_000,
                           out_of_order_group_size=20)
    events = all_events(config)
    times = [e.date_time for e in events]
    assert times != sorted(times)  # shuffled within groups of 20 ...
    assert sorted(times) == [config.base_time_ms + n for n in range(5_000)]  # ... same times

    reader = NexmarkSource(config, splits=3, chunk=100).create_reader(0, 1)
    seen: list[Any] = []
    watermark = float("-inf")

    async def drain() -> None:
        nonlocal watermark
        while (batch := await reader.read_batch(37)) is not None:
            assert all(event_time(e) >= watermark for e in batch)
            seen.extend(batch)
            wm = reader.current_watermark()
            assert wm is not None and wm >= watermark
            watermark = wm

    asyncio.run(drain())
    assert collections.Counter(seen) == collections.Counter(events)


async def _run(source: NexmarkSource, parallelism: int, tmp: Path, step: int,
               restore: Path | None, stop_after: int | None) -> tuple[list[Any], Any]:
    sink = WaitableSink()
    flow = Dataflow("nexmark-source", parallelism=parallelism, batch_size=256)
    flow.source(source, uid="nexmark").sink(sink)
    job = await flow.start(checkpoints=CheckpointConfig(interval=None, directory=tmp / f"c{step}"),
                           restore_from=restore, restart=RestartStrategy.none())
    if stop_after is None:
        await job.wait()
        return sink.records, None
    await sink.wait_for(stop_after)
    sp = await job.stop(savepoint=True, path=tmp / f"sp{step}")
    await job.wait()
    return sink.records, sp


@pytest.mark.parametrize("parallelisms", [[2, 3], [3, 1, 4]])
async def test_source_position_is_exact_across_savepoints_and_rescaling(
        tmp_path: Path, parallelisms: list[int]) -> None:
    config = NexmarkConfig(num_events=30_000, first_event_rate=1_000)
    source = NexmarkSource(config, splits=6, chunk=512)
    outputs: list[Any] = []
    restore = None
    for step, p in enumerate(parallelisms):
        last = step == len(parallelisms) - 1
        records, sp = await _run(source, p, tmp_path, step, restore,
                                 None if last else 5_000 * (step + 1))
        outputs.extend(records)
        if not last:
            assert sp is not None
            restore = sp.path
            assert len(outputs) < config.num_events
    # every event exactly once over the runs, none skipped
    assert collections.Counter(outputs) == collections.Counter(all_events(config))


def test_arrow_batches_and_files_hold_the_same_events(tmp_path: Path) -> None:
    config = NexmarkConfig(num_events=3_000, first_event_rate=1_000, seed=9)
    events = all_events(config)
    rows = [r for batch in record_batches(config, batch_size=700) for r in batch.to_pylist()]
    table = pq.read_table(write_events(config, tmp_path / "events.parquet", "parquet"))
    assert table.num_rows == len(events)
    assert table.to_pylist() == rows
    lines = write_events(config, tmp_path / "events.jsonl").read_text().splitlines()
    assert len(lines) == len(events)
    for event, row, line in zip(events, rows, lines, strict=True):
        kind = {Person: "person", Auction: "auction", Bid: "bid"}[type(event)]
        assert row["event_type"] == json.loads(line)["event_type"] == \
            {"person": 0, "auction": 1, "bid": 2}[kind]
        # Arrow timestamps come back as naive UTC datetimes
        as_ms = [round((v - EPOCH).total_seconds() * 1000) if isinstance(v, dt.datetime) else v
                 for v in row[kind].values()]
        assert tuple(as_ms) == tuple(event)
        body = json.loads(line)[kind]
        assert body["dateTime"] == (EPOCH + dt.timedelta(milliseconds=event.date_time)
                                    ).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
