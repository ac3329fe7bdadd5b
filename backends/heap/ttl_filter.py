"""Leaving expired time-to-live entries out of heap snapshots (Flink's "cleanup in full
snapshot", ``StateTtlConfig.cleanupFullSnapshot``).

A TTL state's table holds ``(value, expires_at)`` pairs (:func:`reactive.state.ttl.
backend_descriptor`): a value or reducing state one pair per key, a list state a list of
pairs, a map state a dict of pairs. The snapshot's *TTL time* of a state is its clock's time
read once in the synchronous part (:class:`TtlFilter`), so which entries a checkpoint holds
is decided per checkpoint, however long its asynchronous part runs: an entry with
``expires_at <= `` that time is not written (list and map state: per element or entry; a
key left with none is not written at all, or written as a tombstone in a delta).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from functools import partial
from itertools import chain, compress
from operator import itemgetter
from typing import Any

from reactive.serialization import Serializer
from reactive.state.ttl import DROP, live_value

__all__ = ["DROP", "TtlFilter", "live_value"]

_second = itemgetter(1)
Bounds = tuple[tuple[str, float], ...]  # (state name, seconds) per TTL state
_min_pair = partial(min, key=_second)  # a list's or map's pair that expires first


def _expiries(kind: str, values: Iterable[Any]) -> Iterator[float]:
    """The expiry times in ``values`` (a TTL table's values of ``kind``), at C speed."""
    if kind == "list":
        return map(_second, chain.from_iterable(values))
    if kind == "map":
        return map(_second, chain.from_iterable(map(dict.values, values)))
    return map(_second, values)


class TtlFilter:
    """The TTL times of one snapshot's TTL states, the bounds that spare it a pass over key
    groups where nothing can have expired, and the count of entries it left out.

    Bounds, per key group and TTL state, recorded in the group's chain: the earliest expiry
    the chain's blobs hold (:attr:`.changelog.GroupChain.expires`: the blobs may hold an
    expired entry once it passed), and ``min(earliest expiry among the group's entries at
    the barrier, expired ones included, the TTL time + ttl)``
    (:attr:`.changelog.GroupChain.ttl_bound`): a lower bound of every expiry in the group's
    table until the next snapshot, since an entry written after the barrier expires at least
    ``ttl`` after it (the clock does not go back: a wall clock that does can only make a
    snapshot keep an expired entry, never drop a live one). A snapshot whose TTL time is
    below its base's bound skips the group (checking costs a pass over the entries, as
    much as pickling them: a cache miss per entry); else it checks and computes the exact
    minimum. Without a base (the first checkpoint, savepoints) every group is checked.

    A state's *floor* (:attr:`reactive.state.ttl._Ttl.floor`, read in the synchronous
    part: a lower bound of every expiry in its table, kept in memory by the state's writes)
    spares every key group the pass while the TTL time is before it, with or without a
    base (a savepoint, a first checkpoint): a TTL of an hour costs no pass at all in the
    hour after its oldest entry was written.

    Args:
        times: state name -> (kind, TTL time, ttl), both in seconds, of every TTL state,
            read in the snapshot's synchronous part; states not named are written as they
            are.
        floors: state name -> the state's floor (seconds); a state not named has none.

    Attributes:
        dropped: keys or entries left out so far (a list's elements and a map's entries
            one by one; a value state's value as one).
    """

    __slots__ = ("_earliest", "_floors", "_full", "_prior", "_table", "dropped", "times")

    def __init__(self, times: Mapping[str, tuple[str, float, float]],
                 floors: Mapping[str, float] | None = None) -> None:
        self.times = dict(times)
        self._floors = dict(floors or {})
        self.dropped = 0
        self._earliest: dict[str, float] = {}  # of the entries written
        self._table: dict[str, float] = {}  # of the table's entries, expired ones included
        self._prior: dict[str, float] = {}
        self._full = True

    def _note(self, name: str, table: float, written: float) -> None:
        if table < self._table.get(name, math.inf):
            self._table[name] = table
        if written < self._earliest.get(name, math.inf):
            self._earliest[name] = written

    def group(self, prior: Iterable[tuple[str, float]], full: bool) -> None:
        """Start a key group: ``prior`` is its base chain's bound (empty: none), ``full``
        whether it is written in full (else a delta of its changed keys, or not at all)."""
        self._prior = dict(prior)
        self._full = full
        self._earliest.clear()
        self._table.clear()

    def take_earliest(self) -> tuple[Bounds, Bounds]:
        """The key group's bounds (see the class): the earliest expiry per TTL state of
        what was written, and the table's bound (a state left out of it has none known:
        the next snapshot checks it)."""
        bounds: list[tuple[str, float]] = []
        for name, (_, now, ttl) in self.times.items():
            if self._full:
                bound = self._table.get(name, math.inf)
            else:
                prior = self._prior.get(name)
                if prior is None:
                    continue
                bound = prior
            bounds.append((name, min(bound, now + ttl)))
        written = tuple(self._earliest.items())
        self._earliest.clear()
        self._table.clear()
        return written, tuple(bounds)

    def due(self, expires: Iterable[tuple[str, float]]) -> bool:
        """Whether a key group of bound ``expires`` may hold an entry expired now."""
        times = self.times
        return any(name in times and t <= times[name][1] for name, t in expires)

    def __bool__(self) -> bool:
        return bool(self.times)

    def entries(self, name: str, d: dict[Any, Any]) -> dict[Any, Any]:
        """``d`` (a key group's ``{key: value}`` of state ``name``) without what expired:
        ``d`` itself when nothing did (or ``name`` has no TTL), else a new dict.

        The check is one C-level pass over the expiries (the minimum), skipped where the
        group's bound is later than the TTL time; only a key group holding an expired
        entry is filtered key by key."""
        spec = self.times.get(name)
        if spec is None or not d:
            return d
        kind, now, _ = spec
        prior = max(self._prior.get(name, -math.inf), self._floors.get(name, -math.inf))
        if prior > now:  # nothing in the group can have expired: no pass
            self._note(name, prior, prior)
            return d
        earliest = table = min(_expiries(kind, d.values()), default=math.inf)
        if earliest <= now:
            if kind == "list" or kind == "map":
                # the keys holding an expired element or entry, at C speed; only they are
                # filtered one by one
                values: Iterable[Any] = d.values()
                if kind == "map":
                    values = map(dict.values, values)
                firsts = map(_second, map(_min_pair, values))
                out = d.copy()
                for k in compress(d, map(now.__ge__, firsts)):
                    v = d[k]
                    live = live_value(kind, v, now)
                    self.dropped += len(v) - (0 if live is DROP else len(live))
                    if live is DROP:
                        del out[k]
                    else:
                        out[k] = live
            else:  # the pairs whose expiry is after now, at C speed
                out = dict(compress(d.items(), map(now.__lt__, map(_second, d.values()))))
                self.dropped += len(d) - len(out)
            d = out
            earliest = min(_expiries(kind, d.values()), default=math.inf)
        self._note(name, table, earliest)
        return d

    def value(self, name: str, value: Any, ser: Serializer | None = None) -> Any:
        """One key's ``value`` of state ``name`` without what expired, or :data:`DROP`;
        with ``ser``, ``value`` is that serializer's bytes (a copy-on-write capture) and so
        is the answer."""
        spec = self.times.get(name)
        if spec is None:
            return value
        kind, now, _ = spec
        plain = value if ser is None else ser.deserialize(value)
        live = live_value(kind, plain, now)
        self._note(name, min(_expiries(kind, (plain,)), default=math.inf),
                   math.inf if live is DROP else min(_expiries(kind, (live,))))
        if live is plain:
            return value
        self.dropped += len(plain) - (0 if live is DROP else len(live)) \
            if kind == "list" or kind == "map" else 1
        return live if live is DROP or ser is None else ser.serialize(live)
