"""Point lookups of keyed state for the application (queryable state, Carbone 2018 (PhD
thesis), section 4.3.1): read committed, from the latest completed checkpoint, or live, from
the operator instance that owns the key's key group (asked in its task's mailbox, between two
batches, so the lookup never sees a half-processed batch's key). No network server: the
application and the job share the process."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from ..checkpoint.metadata import CompletedCheckpoint
from ..checkpoint.off_loop import in_thread
from ..errors import StateQueryError
from ..keygroups import KeyGroupRange, assign_to_key_group, operator_index_for_key_group
from ..state.api import ListState, MapState, ReducingState, State, ValueState
from ..state.key_group_stream import read_key_groups

__all__ = ["CommittedStateCache", "StateQueryError", "query_live"]


def _read(state: State) -> Any:
    if isinstance(state, ValueState):
        return state.value()
    if isinstance(state, ReducingState):
        return state.get()
    if isinstance(state, ListState):
        return list(state.get())
    if isinstance(state, MapState):
        return dict(state.items())
    raise StateQueryError(f"cannot read state of type {type(state).__name__}")


async def query_live(tasks: Iterable[Any], uid: str, state_name: str, key: Any,
                     max_parallelism: int,
                     waiting: set[asyncio.Future[Any]] | None = None) -> Any:
    """The current value of ``state_name`` for ``key`` in the running instance of operator
    ``uid`` that owns the key (read uncommitted: a failure may take it back).

    Returns:
        the value (a list for list state, a dict for map state), or None when the key has
        none.

    Args:
        waiting: where the pending lookup is kept while it waits, so that the job fails it
            when the attempt ends before the instance answered.

    Raises:
        StateQueryError: no keyed operator ``uid`` runs, it has no state ``state_name``, or
            its instance stopped before answering.
    """
    instances = [(task, op) for task in tasks for op in task.operators if op.uid == uid]
    if not instances:
        raise StateQueryError(f"no running operator has uid {uid!r}")
    parallelism = instances[0][1].parallelism
    owner = operator_index_for_key_group(assign_to_key_group(key, max_parallelism),
                                         parallelism, max_parallelism)
    task, op = next((t, o) for t, o in instances if o.subtask == owner)
    if op.keyed_backend is None:
        raise StateQueryError(f"operator {uid!r} is not keyed: it has no keyed state")
    if getattr(task, "_closed", False):
        raise StateQueryError(f"the instance of {uid!r} that owns the key has stopped "
                              "(the attempt ended); ask again after the restart")
    answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def lookup() -> None:
        try:
            state = op.ctx.keyed_states.get(state_name)
            if state is None:
                raise StateQueryError(
                    f"operator {uid!r} has no keyed state {state_name!r} (it has "
                    f"{sorted(op.ctx.keyed_states)})")
            backend = op.keyed_backend
            previous = getattr(backend, "current_key", None)
            backend.set_current_key(key)
            try:
                value = _read(state)
            finally:
                if previous is not None:
                    backend.set_current_key(previous)
        except BaseException as exc:
            if not answer.done():
                answer.set_exception(exc)
            return
        if not answer.done():
            answer.set_result(value)

    task.post(lookup)
    if waiting is None:
        return await answer
    # the job fails the lookups still waiting when the attempt ends (its tasks answer no more)
    waiting.add(answer)
    try:
        return await answer
    finally:
        waiting.discard(answer)


# the states of one key group: {state name: {key: value}}
_KeyGroupStates = dict[str, dict[Any, Any]]


def _read_key_group(handle: Any, job_dir: Any, key_group: int) -> _KeyGroupStates:
    """Blocking: every state's entries in one key group of a keyed-state snapshot handle."""
    from ..defaults import register_builtin_key_group_readers

    register_builtin_key_group_readers()
    states: _KeyGroupStates = {}
    with read_key_groups(handle, job_dir,
                         key_group_range=KeyGroupRange(key_group, key_group)) as stream:
        for _, _, found in stream:
            for name, entries in found.items():
                states.setdefault(name, {}).update(entries)
    return states


class CommittedStateCache:
    """Point lookups in completed checkpoints, keeping the last ``size`` key groups read.

    A key group not in the cache is read from the snapshot's files in a worker thread
    (:func:`~reactive.checkpoint.off_loop.in_thread`: opening a RocksDB snapshot or decoding
    a heap file takes 10-100 ms, which the event loop, the application's too, must not
    wait); the cache itself is only touched on the event loop.

    Args:
        size: key groups kept in memory.
    """

    def __init__(self, size: int = 64) -> None:
        self.size = size
        self._key_groups: OrderedDict[tuple[str, int, str, int], _KeyGroupStates] = (
            OrderedDict())

    async def lookup(self, checkpoint: CompletedCheckpoint, uid: str, state_name: str,
                     key: Any) -> Any:
        """The value of ``state_name`` for ``key`` in operator ``uid``'s state in
        ``checkpoint``.

        Returns:
            the value as the snapshot holds it, or None when the key has none.

        Raises:
            StateQueryError: the checkpoint has no operator ``uid``.
            RestoreError: the snapshot cannot be read.
        """
        metadata = checkpoint.metadata
        operator = metadata.operators.get(uid)
        if operator is None:
            raise StateQueryError(f"checkpoint {checkpoint.checkpoint_id} has no operator "
                                  f"{uid!r} (it has {sorted(metadata.operators)})")
        max_parallelism = metadata.max_parallelism
        key_group = assign_to_key_group(key, max_parallelism)
        owner = operator_index_for_key_group(key_group, operator.parallelism, max_parallelism)
        cache_key = (str(checkpoint.path), checkpoint.checkpoint_id, uid, key_group)
        states = self._key_groups.get(cache_key)
        if states is None:
            sub = operator.subtasks.get(owner)
            handle = None if sub is None else sub.keyed_state
            states = ({} if handle is None else await in_thread(
                _read_key_group, handle.to_json(), checkpoint.job_dir, key_group))
            self._key_groups[cache_key] = states
            while len(self._key_groups) > self.size:
                self._key_groups.popitem(last=False)
        else:
            self._key_groups.move_to_end(cache_key)
        return states.get(state_name, {}).get(key)
