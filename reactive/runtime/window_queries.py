"""Window queries added to and removed from a running shared window aggregation (Cutty's
queries changed "incrementally at runtime by reconfiguration": Carbone 2018 (PhD thesis),
section 5.5, carried by the epoch marker as in section 4.5.5).

``job.add_window_query(uid, assigner, name=...)`` and ``job.remove_window_query(uid, name)``
check the change against one running instance of the operator (:func:`check_change`), then
trigger a checkpoint whose barrier carries a :class:`WindowQueryChange`. Each instance applies
it at that barrier's snapshot instant, right after the synchronous part of its snapshot (the
barrier's ``updates``, like a function update): a query added starts at its first window
begin after every record the instance received before the barrier (and after its
watermark), so it needs no slice that exists already and shares every later one; a query
removed emits nothing after the barrier. A restart that restores that checkpoint or a later
one of the run restores the queries in force there.

The runtime does not import the window library (it sits above the runtime); the operator
that can take such changes implements :class:`WindowQueryHost`.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from ..checkpoint.contract import Reconfiguration
from ..checkpoint.coordinator import CheckpointCoordinator
from ..checkpoint.metadata import CompletedCheckpoint
from ..errors import CheckpointError, IncompatibleUpdateError, ReconfigurationError
from .job_runner import JobRunner
from .operators import StreamOperator

__all__ = ["WindowQueryChange", "WindowQueryHost", "check_change", "reconfiguration_of",
           "send_change"]

log = logging.getLogger(__name__)

# one window query change of a job at a time: a change is checked (name, id, version)
# against the queries the previous one left
_locks: weakref.WeakKeyDictionary[JobRunner, asyncio.Lock] = weakref.WeakKeyDictionary()


@dataclass(frozen=True, slots=True)
class WindowQueryChange:
    """A window query added to or removed from one shared window aggregation, carried by a
    checkpoint barrier.

    Attributes:
        uid: the window operator's uid.
        action: ``"add"`` or ``"remove"``.
        name: the query's name (unique among the operator's queries).
        query: the id its results carry as ``WindowResult.query`` (a new id for an added
            query: ids are never reused).
        version: the number of changes of the operator's queries once this one applies (an
            instance applies it only from version ``version - 1``: a restored state that
            holds it already skips it).
        assigner: the window definition added (a periodic event-time assigner), None for a
            removal.
    """

    uid: str
    action: Literal["add", "remove"]
    name: str
    query: int
    version: int
    assigner: Any = None

    def apply(self, op: StreamOperator, opened: bool) -> None:
        """Apply the change to ``op`` (an instance of operator ``uid``): at the barrier's
        snapshot instant (``opened``), or before ``open`` on a restore."""
        assert isinstance(op, WindowQueryHost)
        op.change_window_queries(self, opened)


@runtime_checkable
class WindowQueryHost(Protocol):
    """A window operator whose window queries can change while it runs (the shared
    event-time window aggregation)."""

    def window_queries(self) -> dict[str, tuple[int, Any]]:
        """The queries in force: ``{name: (query id, assigner)}``."""
        ...

    def next_query_id(self) -> int:
        """The id the next query added gets."""
        ...

    def window_query_version(self) -> int:
        """How many changes of its queries this instance applied."""
        ...

    def check_window_query(self, assigner: Any) -> None:
        """Refuse a window definition this operator cannot add.

        Raises:
            IncompatibleUpdateError: with the reason.
        """
        ...

    def change_window_queries(self, change: WindowQueryChange, opened: bool) -> None:
        """Apply ``change`` at the snapshot instant (``opened``) or before ``open``."""
        ...


def check_change(op: StreamOperator, action: Literal["add", "remove"], name: str | None,
                 assigner: Any = None) -> WindowQueryChange:
    """The change ``action`` of query ``name`` of ``op``'s operator, checked against one
    running instance.

    Args:
        op: a running instance of the operator.
        action: ``"add"`` or ``"remove"``.
        name: the query's name (None: an added query is named by its id).
        assigner: the window definition to add (None for a removal).

    Returns:
        the change to send.

    Raises:
        IncompatibleUpdateError: ``op`` is not a shared window aggregation, the name is
            taken (add) or unknown (remove), the last query would be removed, or the
            operator cannot take the assigner (the message says which).
    """
    if not isinstance(op, WindowQueryHost):
        raise IncompatibleUpdateError(
            f"operator {op.name!r} (uid {op.uid!r}) is a {type(op).__name__}, not a shared "
            "window aggregation: window queries are added to and removed from "
            "KeyedStream.windows([...]) with two or more event-time definitions")
    queries = op.window_queries()
    if name is None:
        if action == "remove":
            raise IncompatibleUpdateError("remove_window_query needs the query's name")
        name = str(op.next_query_id())
    if action == "add":
        if name in queries:
            raise IncompatibleUpdateError(
                f"operator {op.uid!r} has a window query named {name!r} already (query "
                f"{queries[name][0]}: {queries[name][1]!r}); its queries: {sorted(queries)}")
        op.check_window_query(assigner)
        return WindowQueryChange(op.uid, "add", name, op.next_query_id(),
                                 op.window_query_version() + 1, assigner)
    if name not in queries:
        raise IncompatibleUpdateError(
            f"operator {op.uid!r} has no window query named {name!r}; its queries: "
            f"{sorted(queries)}")
    if len(queries) == 1:
        raise IncompatibleUpdateError(
            f"operator {op.uid!r}: {name!r} is its last window query; a shared window "
            "aggregation keeps at least one")
    return WindowQueryChange(op.uid, "remove", name, queries[name][0],
                             op.window_query_version() + 1)


def reconfiguration_of(change: WindowQueryChange) -> Reconfiguration:
    """How a checkpoint's metadata records ``change``: kind ``"add_window_query"`` or
    ``"remove_window_query"``, the operator's uid, as ``function`` the window definition
    added (its repr; empty for a removal), and the query's ``name`` and ``query`` id."""
    return Reconfiguration(
        f"{change.action}_window_query", change.uid,
        "" if change.assigner is None else repr(change.assigner),
        extra={"name": change.name, "query": change.query})


async def send_change(runner: JobRunner, coordinator: CheckpointCoordinator, uid: str,
                      action: Literal["add", "remove"], name: str | None,
                      assigner: Any = None) -> WindowQueryChange:
    """Check the change against a running instance of ``uid``, then carry it with a
    checkpoint's barrier and wait for that checkpoint to complete.

    Returns:
        the change applied (its ``query`` is the id the query's results carry).

    Raises:
        IncompatibleUpdateError: refused before anything was sent (see :func:`check_change`).
        ReconfigurationError: no running instance of ``uid``, or the checkpoint carrying the
            change failed (its reason is the ``__cause__``): the attempt is then failed, so
            the restart restores the last completed checkpoint and its queries.
    """
    lock = _locks.setdefault(runner, asyncio.Lock())
    async with lock:
        tasks = runner.tasks
        running = [op for task in tasks for op in task.operators if op.uid == uid]
        if not running:
            raise ReconfigurationError(f"cannot change the window queries of operator "
                                       f"{uid!r}: the job has no running instance of it")
        change = check_change(running[0], action, name, assigner)
        try:
            completed: CompletedCheckpoint = await coordinator.checkpoint(
                updates=(change,), reconfigurations=(reconfiguration_of(change),))
        except CheckpointError as exc:
            error = ReconfigurationError(
                f"{action} of window query {change.name!r} of operator {uid!r} failed: the "
                f"checkpoint carrying it did not complete ({exc}); the job returns to the "
                "queries of the last completed checkpoint")
            if runner.tasks is tasks:
                # instances that applied it must not commit output no completed
                # checkpoint's history contains
                runner.fail_attempt(error)
            raise error from exc
        runner.updates.append((completed.checkpoint_id, change))
        log.info("operator %r: window query %r (%d) %s at checkpoint %d", uid, change.name,
                 change.query, "added" if action == "add" else "removed",
                 completed.checkpoint_id)
        return change
