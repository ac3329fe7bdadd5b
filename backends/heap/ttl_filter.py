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

from collections.abc import Iterable, Mapping
from typing import Any

from reactive.serialization import Serializer

__all__ = ["DROP", "TtlFilter", "live_value"]

#: :func:`live_value`'s answer for a key left with no live entry
DROP: Any = object()


def live_value(kind: str, value: Any, now: float) -> Any:
    """``value`` (a TTL table's value of ``kind``) without its entries due at ``now``:
    the value itself when nothing in it expired, a new list or dict when some did, and
    :data:`DROP` when nothing is left.

    Args:
        kind: the state's kind (``"value"``, ``"reducing"``, ``"list"``, ``"map"``).
        value: a ``(value, expires_at)`` pair, a list of them, or a dict of them.
        now: the snapshot's TTL time (seconds, in the state's clock).
    """
    if kind == "list":
        live = [p for p in value if p[1] > now]
        if len(live) == len(value):
            return value
        return live if live else DROP
    if kind == "map":
        entries = {uk: p for uk, p in value.items() if p[1] > now}
        if len(entries) == len(value):
            return value
        return entries if entries else DROP
    return value if value[1] > now else DROP


class TtlFilter:
    """The TTL times of one snapshot's TTL states, and the count of entries it left out.

    Args:
        times: state name -> (kind, TTL time in seconds) of every TTL state, read in the
            snapshot's synchronous part; states not named are written as they are.

    Attributes:
        dropped: keys or entries left out so far (a list's elements and a map's entries
            one by one; a value state's value as one).
    """

    __slots__ = ("_earliest", "dropped", "times")

    def __init__(self, times: Mapping[str, tuple[str, float]]) -> None:
        self.times = dict(times)
        self.dropped = 0
        self._earliest: dict[str, float] = {}

    def _note(self, name: str, kind: str, values: Iterable[Any]) -> None:
        """Track the earliest expiry among ``values`` (the live values written)."""
        if kind == "list":
            times = [p[1] for v in values for p in v]
        elif kind == "map":
            times = [p[1] for v in values for p in v.values()]
        else:
            times = [v[1] for v in values]
        if times:
            t = min(times)
            self._earliest[name] = min(t, self._earliest.get(name, t))

    def take_earliest(self) -> tuple[tuple[str, float], ...]:
        """The earliest expiry per state of what was written since the last call (one
        key group's blob: :attr:`.changelog.GroupChain.expires`), and start again."""
        out = tuple(self._earliest.items())
        self._earliest.clear()
        return out

    def due(self, expires: Iterable[tuple[str, float]]) -> bool:
        """Whether a blob holding TTL entries ``expires`` may hold one expired now."""
        times = self.times
        return any(name in times and t <= times[name][1] for name, t in expires)

    def __bool__(self) -> bool:
        return bool(self.times)

    def entries(self, name: str, d: dict[Any, Any]) -> dict[Any, Any]:
        """``d`` (a key group's ``{key: value}`` of state ``name``) without what expired:
        ``d`` itself when nothing did (or ``name`` has no TTL), else a new dict."""
        spec = self.times.get(name)
        if spec is None or not d:
            return d
        kind, now = spec
        if kind == "list" or kind == "map":
            out: dict[Any, Any] = {}
            changed = False
            for k, v in d.items():
                live = live_value(kind, v, now)
                if live is not v:
                    changed = True
                    self.dropped += len(v) - (0 if live is DROP else len(live))
                if live is not DROP:
                    out[k] = live
            if changed:
                d = out
        else:
            out = {k: v for k, v in d.items() if v[1] > now}
            self.dropped += len(d) - len(out)
            if len(out) < len(d):
                d = out
        self._note(name, kind, d.values())
        return d

    def value(self, name: str, value: Any, ser: Serializer | None = None) -> Any:
        """One key's ``value`` of state ``name`` without what expired, or :data:`DROP`;
        with ``ser``, ``value`` is that serializer's bytes (a copy-on-write capture) and so
        is the answer."""
        spec = self.times.get(name)
        if spec is None:
            return value
        kind, now = spec
        plain = value if ser is None else ser.deserialize(value)
        live = live_value(kind, plain, now)
        if live is not DROP:
            self._note(name, kind, (live,))
        if live is plain:
            return value
        self.dropped += len(plain) - (0 if live is DROP else len(live)) \
            if kind == "list" or kind == "map" else 1
        return live if live is DROP or ser is None else ser.serialize(live)
