"""The per-record loop of process functions: how ``process_element(value, ctx[, out])`` is
called for each record of a batch and how its outputs are collected.

A process function hands back its outputs in one of three ways, told apart once (when the
operator opens) from the method itself, not per record:

* it *yields* them (a generator function): the loop extends the output batch with the
  generator;
* it *returns* them (a list, None, or another iterator; see :func:`checked_outputs`);
* it *collects* them: a method with one more parameter, ``out``, gets the output batch (a
  plain ``list``) and calls ``out.append(x)``. This is Flink's ``Collector`` argument of
  ``processElement(value, ctx, out)``; here the collector is the list itself, so emitting is
  one C call and no list or generator is built per record (measured in ``bench/w1.py``).

The same loop serves one-input and two-input process functions and their keyed variants;
for a keyed input each record's key becomes the state backend's current key first.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from enum import Enum
from typing import Any

from .base import GENERATOR, StreamOperator, checked_outputs

__all__ = ["OutputConvention", "call_once", "call_per_record", "output_convention"]


class OutputConvention(Enum):
    """How a process function hands back its outputs (see the module docstring)."""

    YIELDS = "yields"
    RETURNS = "returns"
    COLLECTS = "collects"


def _positional_parameters(method: Callable[..., Any]) -> int | None:
    """The number of positional parameters of a bound method (None if unknown or
    ``*args``)."""
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):  # builtins and some callables have no signature
        return None
    n = 0
    for p in parameters:
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            return None
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY,
                      inspect.Parameter.POSITIONAL_OR_KEYWORD) and p.default is p.empty:
            n += 1
    return n


def output_convention(method: Callable[..., Any] | None, arity: int,
                      name: str) -> OutputConvention:
    """How ``method`` hands back its outputs.

    Args:
        method: the bound user method (``fn.process_element``, ``fn.on_timer``, ...).
        arity: its parameters without the collector (2 for ``(value, ctx)``).
        name: the method's name, for the error.

    Returns:
        ``COLLECTS`` when it takes one required positional parameter more than ``arity``
        (``out``), ``YIELDS`` for a generator function, else ``RETURNS``.

    Raises:
        TypeError: for a generator function that also takes ``out`` (its outputs would
            be split between the two).
    """
    if method is None:
        return OutputConvention.RETURNS
    collects = _positional_parameters(method) == arity + 1
    if inspect.isgeneratorfunction(method):
        if collects:
            raise TypeError(f"{name} both takes an 'out' collector and yields: append every "
                            "output to out, or yield them all and drop the parameter")
        return OutputConvention.YIELDS
    return OutputConvention.COLLECTS if collects else OutputConvention.RETURNS


def _returned_with_collector(res: Any, method: str) -> TypeError:
    text = repr(res)
    text = text if len(text) <= 80 else text[:77] + "..."
    return TypeError(f"{method} takes an 'out' collector, so it must append its outputs "
                     f"to out and return None, but it returned a {type(res).__name__}: "
                     f"{text}")


def call_once(fn: Callable[..., Any], convention: OutputConvention, args: tuple[Any, ...],
              method: str) -> list[Any]:
    """The outputs of one call ``fn(*args)`` (``fn(*args, out)`` when it collects), for the
    calls that are not per record (``on_timer``).

    Raises:
        TypeError: when ``fn`` hands back something that is not outputs (the caller wraps it
            in a :class:`~reactive.errors.UserFunctionError`).
    """
    if convention is OutputConvention.COLLECTS:
        out: list[Any] = []
        res = fn(*args, out)
        if res is not None:
            raise _returned_with_collector(res, method)
        return out
    res = fn(*args)
    return list(checked_outputs(res, method)) if res is not None else []


def call_per_record(
    op: StreamOperator,
    fn: Callable[..., Any],
    convention: OutputConvention,
    batch: list[Any],
    ctx: Any,
    method: str,
    key_of: Callable[[Any], Any] | None = None,
    side: int | None = None,
) -> list[Any]:
    """Call ``fn`` for each record of ``batch`` and collect its outputs, in order.

    Args:
        op: the operator (errors name it).
        fn: the user method, called as ``fn(record, ctx)`` or, when ``convention`` is
            ``COLLECTS``, ``fn(record, ctx, out)``.
        convention: from :func:`output_convention`.
        batch: the input records.
        ctx: the context passed to ``fn``.
        method: the method's name, for errors about what it returned.
        key_of: the input's key selector on keyed streams; each record's key becomes the
            keyed state backend's current key before the call.
        side: 0 or 1 for the input of a two-input operator (errors name it), None for a
            one-input operator.

    Returns:
        The output batch.

    Raises:
        UserFunctionError: naming the operator, the record (and the input), when ``fn``
            raises or hands back something that is not outputs.
    """
    out: list[Any] = []
    extend = out.extend
    r = None
    try:
        if key_of is None:
            if convention is OutputConvention.COLLECTS:
                for r in batch:
                    res = fn(r, ctx, out)
                    if res is not None:
                        raise _returned_with_collector(res, method)
            elif convention is OutputConvention.YIELDS:
                for r in batch:
                    extend(fn(r, ctx))
            else:
                generator = GENERATOR
                for r in batch:
                    res = fn(r, ctx)
                    # identity checks for the common cases (a list; a generator from a
                    # wrapped generator function); anything else but None is checked
                    # before it is taken apart into records
                    t = type(res)
                    if t is list or t is generator:
                        extend(res)
                    elif res is not None:
                        extend(checked_outputs(res, method))
        else:
            assert op.keyed_backend is not None
            set_key = op.keyed_backend.set_current_key
            clocks = op.ctx.ttl_clocks
            for clock in clocks:
                clock.freeze()
            if convention is OutputConvention.COLLECTS:
                for r in batch:
                    set_key(key_of(r))
                    res = fn(r, ctx, out)
                    if res is not None:
                        raise _returned_with_collector(res, method)
            elif convention is OutputConvention.YIELDS:
                for r in batch:
                    set_key(key_of(r))
                    extend(fn(r, ctx))
            else:
                generator = GENERATOR
                for r in batch:
                    set_key(key_of(r))
                    res = fn(r, ctx)
                    t = type(res)
                    if t is list or t is generator:
                        extend(res)
                    elif res is not None:
                        extend(checked_outputs(res, method))
            cleanup = op.ctx.ttl_cleanup
            if cleanup is not None:
                # the incremental TTL cleanup's share of the batch, at the batch's time
                cleanup.advance(len(batch))
    except Exception as exc:
        where = None if side is None else f"input {side + 1} ({method})"
        raise op.fail(r, exc, where) from exc
    finally:
        if key_of is not None:
            for clock in op.ctx.ttl_clocks:
                clock.thaw()
    return out
