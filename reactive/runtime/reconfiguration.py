"""Updating an operator's function in a running job (Carbone 2018 (PhD thesis), section
4.5.5: a reconfiguration carried by the epoch marker).

``job.update(uid, new_function)`` checks the new function against the running one here
(:func:`check_update`) before anything is sent, then triggers a checkpoint whose barrier
carries a :class:`FunctionUpdate`. Each instance of the operator switches at that barrier's
snapshot instant, right after the synchronous part of its snapshot (:func:`switch_function`):
records before the barrier saw the old version, records after it the new one, and the state
the snapshot captured is the state the new version continues from. A restart that restores
that checkpoint (or a later one) installs the new version before the operator opens
(:func:`install_function`).

The check runs each version's ``open`` against a probe context that records the state
descriptors it asks for and touches no state: a state of the same name must keep its kind
(value, list, map, reducing...) and its serializer's type, else the update is refused with
:class:`~reactive.errors.IncompatibleUpdateError` (Flink's state schema compatibility, in
its simplest form: the same serializer or none).

A barrier may carry a :class:`RescalePlan` instead (``job.rescale``, see
:mod:`reactive.runtime.rescale`): a source task quiesces at its snapshot instant.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..checkpoint.contract import Reconfiguration
from ..errors import IncompatibleUpdateError
from ..functions import RuntimeContext
from ..state.descriptors import StateDescriptor
from .handover import StateHandOver
from .operators import StreamOperator
from .operators.base import instance_copy
from .operators.per_record import FilterOperator, FlatMapOperator, MapOperator, ReduceOperator
from .operators.process import ProcessOperator, TimedKeyedProcessOperator
from .operators.record_calls import output_convention
from .task_mailbox import Suspension, TaskMailbox

__all__ = ["FunctionUpdate", "OperatorChange", "RescalePlan", "apply_updates", "check_update",
           "function_name", "install_function", "switch_function", "updatable"]

# operators whose user function is a plain callable held in ``fn``
_CALLABLE_OPERATORS = (MapOperator, FilterOperator, FlatMapOperator, ReduceOperator)


@dataclass(frozen=True, slots=True)
class FunctionUpdate:
    """A new version of one operator's function, carried by a checkpoint barrier.

    Attributes:
        uid: the operator's uid.
        function: the new function (a callable for map/filter/flat_map/reduce, a
            ``ProcessFunction`` for process).
        name: the function's qualified name, recorded in the checkpoint's metadata.
    """

    uid: str
    function: Any
    name: str


@dataclass(frozen=True, eq=False)
class RescalePlan:
    """The new parallelism of a job, carried by a checkpoint barrier.

    Attributes:
        parallelism: the parallelism of every operator after the rescale, by uid.
        changed: the :class:`~reactive.checkpoint.Reconfiguration` entries recorded in the
            checkpoint's metadata, one per operator whose parallelism changes.
        quiesced: the suspensions of the source tasks that injected the barrier; resumed
            when the rescale's checkpoint fails.
        handover: where every instance's state is captured at its snapshot instant for
            the in-memory hand-over (:mod:`.handover`); None: the new instances restore
            the checkpoint.
    """

    parallelism: Mapping[str, int]
    changed: tuple[Reconfiguration, ...]
    quiesced: list[Suspension] = field(default_factory=list)
    handover: StateHandOver | None = None

    def quiesce(self, mailbox: TaskMailbox) -> None:
        """At a source task's snapshot instant: it reads no more input (it runs its mail)
        until :meth:`resume` or the end of the attempt."""
        self.quiesced.append(mailbox.suspend_default_action())

    def resume(self) -> None:
        """The rescale failed: every quiesced task reads input again."""
        for suspension in self.quiesced:
            suspension.resume()


def function_name(fn: Any) -> str:
    """``module.qualname`` of a function or of a function object's class."""
    target = fn if hasattr(fn, "__qualname__") else type(fn)
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', '?')}"


def updatable(op: StreamOperator) -> bool:
    """Whether ``op``'s function can be replaced (map, filter, flat_map, reduce, process)."""
    return isinstance(op, (*_CALLABLE_OPERATORS, ProcessOperator))


class _Unusable:
    """What the probe context hands out: a state that cannot be used outside ``open``."""

    def __getattr__(self, name: str) -> Any:
        raise IncompatibleUpdateError(
            "the function used its state in open() while it was checked for an update; "
            "state is only readable while processing")


class _ProbeContext(RuntimeContext):
    """A runtime context that records the state a function's ``open`` asks for."""

    def __init__(self, live: RuntimeContext) -> None:
        super().__init__(live.operator_name, live.uid, live.subtask_index, live.parallelism,
                         live.max_parallelism, None, live._operator_state)
        self._timer_service = live._timer_service
        self.keyed_descriptors: dict[str, StateDescriptor] = {}
        self.operator_states: dict[str, str] = {}

    def get_state(self, descriptor: StateDescriptor) -> Any:
        self.keyed_descriptors[descriptor.name] = descriptor
        return _Unusable()

    def get_operator_state(self, name: str, mode: Any = "split") -> Any:
        self.operator_states[name] = str(mode)
        return _Unusable()


def _probe(op: StreamOperator, fn: Any) -> _ProbeContext:
    """Run a copy of ``fn``'s ``open`` against a probe context of ``op``."""
    probe = _ProbeContext(op.ctx)
    target = copy.copy(fn)
    opener = getattr(target, "open", None)
    if callable(opener):
        try:
            opener(probe)
        except IncompatibleUpdateError:
            raise
        except Exception as exc:
            raise IncompatibleUpdateError(
                f"operator {op.uid!r}: open() of {function_name(fn)} failed while it was "
                f"checked: {type(exc).__name__}: {exc}") from exc
    return probe


def _serializer_type(descriptor: StateDescriptor) -> str:
    serializer = getattr(descriptor, "serializer", None)
    return "pickle (default)" if serializer is None else function_name(serializer)


def check_update(op: StreamOperator, new: Any) -> None:
    """Refuse ``new`` as ``op``'s function unless it fits the running one.

    Args:
        op: one running instance of the operator.
        new: the new function.

    Raises:
        IncompatibleUpdateError: the operator's function cannot be replaced, ``new`` is not
            of the operator's kind of function, or a state both versions use differs in
            kind or serializer type (the reason names the state).
    """
    if not updatable(op):
        raise IncompatibleUpdateError(
            f"operator {op.name!r} (uid {op.uid!r}) is a {type(op).__name__}: only map, "
            "filter, flat_map, reduce and process functions can be updated")
    if isinstance(op, ProcessOperator):
        if not callable(getattr(new, "process_element", None)):
            raise IncompatibleUpdateError(
                f"operator {op.uid!r} runs a ProcessFunction; {function_name(new)} has no "
                "process_element")
    elif not callable(new):
        raise IncompatibleUpdateError(f"operator {op.uid!r} needs a callable, got {new!r}")
    old_ctx = _probe(op, op.fn)  # type: ignore[attr-defined]
    new_ctx = _probe(op, new)
    for name, descriptor in new_ctx.keyed_descriptors.items():
        before = old_ctx.keyed_descriptors.get(name)
        if before is None:
            continue  # a new state starts empty
        if before.kind != descriptor.kind:
            raise IncompatibleUpdateError(
                f"operator {op.uid!r}: state {name!r} is {before.kind} state in the running "
                f"version and {descriptor.kind} state in {function_name(new)}")
        if _serializer_type(before) != _serializer_type(descriptor):
            raise IncompatibleUpdateError(
                f"operator {op.uid!r}: state {name!r} is written with "
                f"{_serializer_type(before)} in the running version and read with "
                f"{_serializer_type(descriptor)} in {function_name(new)}")
    for name, mode in new_ctx.operator_states.items():
        before_mode = old_ctx.operator_states.get(name)
        if before_mode is not None and before_mode != mode:
            raise IncompatibleUpdateError(
                f"operator {op.uid!r}: operator state {name!r} is redistributed as "
                f"{before_mode!r} in the running version and as {mode!r} in "
                f"{function_name(new)}")


def install_function(op: StreamOperator, fn: Any) -> None:
    """Give ``op`` (not opened yet) the function ``fn`` in place of the one it was built
    with (a restore of a checkpoint that recorded an update)."""
    if isinstance(op, ProcessOperator):
        op.fn = instance_copy(fn)
        op.conventions = op._output_conventions()
    else:
        op.fn = fn  # type: ignore[attr-defined]


def switch_function(op: StreamOperator, fn: Any) -> None:
    """At the snapshot instant: close ``op``'s running function, then open ``fn`` with the
    same runtime context (and so the same keyed and operator state, and timers).

    Raises:
        UserFunctionError: ``close`` of the old version or ``open`` of the new one raised
            (the task fails, and the restart restores the last completed checkpoint).
    """
    if isinstance(op, ProcessOperator):
        try:
            op.fn.close()
            install_function(op, fn)
            op.fn.open(op.ctx)
            op.conventions = op._output_conventions()
            if isinstance(op, TimedKeyedProcessOperator):
                op._timer_convention = output_convention(
                    getattr(op.fn, "on_timer", None), 2, "on_timer")
        except Exception as exc:
            raise op.fail(f"update to {function_name(fn)}", exc) from exc
    else:
        install_function(op, fn)


class OperatorChange(Protocol):
    """A reconfiguration of one operator other than a new function (a window query added
    or removed: :mod:`.window_queries`), carried by a barrier's ``updates``."""

    @property
    def uid(self) -> str: ...

    def apply(self, op: StreamOperator, opened: bool) -> None:
        """Apply the change to an instance of operator ``uid``: at the snapshot instant
        (``opened``) or before ``open`` (a restore)."""
        ...


def apply_updates(operators: Iterable[StreamOperator],
                  updates: Iterable[FunctionUpdate | OperatorChange | RescalePlan],
                  opened: bool = True) -> None:
    """Give each operator of ``operators`` that an update names its new function:
    :func:`switch_function` on opened operators (at a barrier's snapshot instant),
    :func:`install_function` before ``open`` (a restore); an :class:`OperatorChange` is
    applied by its own ``apply``, in the order of ``updates``. A :class:`RescalePlan` the
    barrier may carry beside them is not an operator's change: the runner acts on it."""
    by_uid: dict[str, Any] = {}
    changes: list[OperatorChange] = []
    for u in updates:
        if isinstance(u, FunctionUpdate):
            by_uid[u.uid] = u.function
        elif not isinstance(u, RescalePlan):
            changes.append(u)
    for op in operators:
        fn = by_uid.get(op.uid)
        if fn is not None:
            (switch_function if opened else install_function)(op, fn)
        for change in changes:
            if change.uid == op.uid:
                change.apply(op, opened)
