"""Operators that call one user function per record: ``map``, ``filter``, ``flat_map``
and the keyed ``reduce`` (Flink's StreamMap, StreamFilter, StreamFlatMap,
StreamGroupedReduceOperator)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ...state.descriptors import ValueStateDescriptor
from .base import EXACT_TEXT_TYPES, StreamOperator, refuse_text

__all__ = ["FilterOperator", "FlatMapOperator", "MapOperator", "ReduceOperator",
           "flat_map_records", "map_records"]


def map_records(op: StreamOperator, fn: Callable[[Any], Any], batch: list[Any],
                where: str | None = None) -> list[Any]:
    """``[fn(r) for r in batch]``, failing with the record that raised.

    Raises:
        UserFunctionError: naming ``op``, the record and ``where`` (e.g. the input of a
            two-input operator) when ``fn`` raises.
    """
    out: list[Any] = []
    append = out.append
    r = None
    try:
        for r in batch:
            append(fn(r))
    except Exception as exc:
        raise op.fail(r, exc, where) from exc
    return out


def flat_map_records(op: StreamOperator, fn: Callable[[Any], Iterable[Any] | None],
                     batch: list[Any], where: str | None = None,
                     method: str = "the flat_map function") -> list[Any]:
    """The items of every ``fn(r)`` (None: no items), in order, failing with the record
    that raised.

    Raises:
        UserFunctionError: naming ``op``, the record and ``where`` when ``fn`` raises or
            returns something that cannot be iterated, or a string or bytes (which would
            be taken apart into characters: :func:`~.base.refuse_text`).
    """
    out: list[Any] = []
    extend = out.extend
    r = None
    try:
        for r in batch:
            res = fn(r)
            if type(res) is list:  # the usual result first: no further check
                extend(res)
            elif res is not None:
                if type(res) in EXACT_TEXT_TYPES:  # (a subclass of str is iterated)
                    refuse_text(res, method)  # raises
                extend(res)
    except Exception as exc:
        raise op.fail(r, exc, where) from exc
    return out


class MapOperator(StreamOperator):
    """``map(fn)``: one output per input."""

    def __init__(self, name: str, uid: str, fn: Callable[[Any], Any]):
        super().__init__(name, uid)
        self.fn = fn

    def process_batch(self, batch: list[Any]) -> list[Any]:
        return map_records(self, self.fn, batch)


class FilterOperator(StreamOperator):
    """``filter(pred)``: keep records for which ``pred`` is true."""

    def __init__(self, name: str, uid: str, fn: Callable[[Any], Any]):
        super().__init__(name, uid)
        self.fn = fn

    def process_batch(self, batch: list[Any]) -> list[Any]:
        fn = self.fn
        out: list[Any] = []
        append = out.append
        r = None
        try:
            for r in batch:
                if fn(r):
                    append(r)
        except Exception as exc:
            raise self.fail(r, exc) from exc
        return out


class FlatMapOperator(StreamOperator):
    """``flat_map(fn)``: ``fn`` returns an iterable of outputs (or None)."""

    def __init__(self, name: str, uid: str, fn: Callable[[Any], Iterable[Any] | None]):
        super().__init__(name, uid)
        self.fn = fn

    def process_batch(self, batch: list[Any]) -> list[Any]:
        return flat_map_records(self, self.fn, batch)


class ReduceOperator(StreamOperator):
    """``key_by(k).reduce(fn)``: emits the running ``fn(accumulated, record)`` per key."""

    keyed = True

    def __init__(self, name: str, uid: str, key_selector: Callable[[Any], Any],
                 fn: Callable[[Any, Any], Any]):
        super().__init__(name, uid, key_selector)
        self.fn = fn

    def open(self) -> None:
        self.state = self.ctx.get_state(ValueStateDescriptor("reduce"))

    def process_batch(self, batch: list[Any]) -> list[Any]:
        fn = self.fn
        key_of = self.key_selector
        assert key_of is not None and self.keyed_backend is not None
        set_key = self.keyed_backend.set_current_key
        value = self.state.value
        update = self.state.update
        out: list[Any] = []
        append = out.append
        r = None
        try:
            for r in batch:
                set_key(key_of(r))
                acc = value()
                acc = r if acc is None else fn(acc, r)
                update(acc)
                append(acc)
        except Exception as exc:
            raise self.fail(r, exc) from exc
        return out
