"""Two-phase-commit sinks: output that leaves the pipeline exactly once.

The epoch-commit protocol of Carbone 2018 (PhD thesis: "Scalable and Reliable Data Stream
Processing", KTH), sections 4.1.3-4.1.4 and table 4.1, and of Flink's
``TwoPhaseCommitSinkFunction``: the records of one checkpoint interval (an *epoch*) go into
one transaction, which is

1. begun lazily with the first record of the interval (``begin_transaction``),
2. written to (``write``),
3. *pre-committed* when the checkpoint barrier passes the sink, in the synchronous part of
   its snapshot (``pre_commit``: flush, make durable, but stay invisible), and stored in the
   snapshot as *pending*, keyed by the checkpoint id,
4. *committed* when the coordinator reports the checkpoint complete
   (``notify_checkpoint_complete`` -> ``commit``): made visible, atomically.

A crash between 3 and 4 is repaired on recovery: the restored snapshot lists the pending
transactions, and they are committed before the instance processes anything (Carbone
2018 (PhD thesis), section 4.1.3.1). So ``commit`` must be idempotent: it is retried for a
transaction that may already be committed. A transaction whose checkpoint is aborted stays
pending; the next completed checkpoint commits it with its own (completion of n covers every
pending id <= n), so nothing is lost and nothing is written twice. Transactions that no restored
checkpoint references (begun, or pre-committed for a checkpoint that never completed, before a
crash) are *lingering*; ``abort_lingering`` removes them once, before the instance's first
transaction (Flink's ``KafkaSink`` aborts lingering transactions the same way).

After a change of parallelism every instance restores every pending transaction of the
checkpoint (union redistribution) and commits those that instance ``k % parallelism`` owns,
``k`` being the instance that pre-committed them: so each is committed by exactly one
instance, every instance knows the restored checkpoint's id, and a sink that names its
transactions after ``k`` can leave their lingering leftovers to that same owner.

Write a sink by subclassing :class:`TwoPhaseCommitSink`; every hook may be a plain method or a
coroutine.
"""

from __future__ import annotations

import copy
import inspect
import logging
from abc import abstractmethod
from collections.abc import Awaitable
from typing import Any, Generic, TypeVar

from .awaiting import maybe_await
from .errors import RestoreError
from .sinks import Sink, SinkWriter

__all__ = ["TwoPhaseCommitSink", "TwoPhaseCommitWriter", "without_pending"]

log = logging.getLogger(__name__)

TxnT = TypeVar("TxnT")

# the kinds of the entries a writer keeps as operator state ("sink-state")
# {"kind", "checkpoint_id", "transaction", "subtask"}: pre-committed, not committed; "subtask"
# (the instance that pre-committed it) is missing in checkpoints of older versions
_PENDING = "pending"
_EPOCH = "epoch"  # {"kind", "checkpoint_id", "subtask"}: one per snapshot, names its checkpoint


class TwoPhaseCommitSink(Sink, Generic[TxnT]):
    """Base class of exactly-once sinks (Carbone 2018 (PhD thesis), table 4.1; Flink's
    ``TwoPhaseCommitSinkFunction``).

    Subclasses implement the five transaction hooks; each may be synchronous or a coroutine.
    Every parallel instance works on its own shallow copy of the sink (``copy.copy``), with
    :attr:`subtask` and :attr:`parallelism` set, so per-instance attributes set in the hooks
    are private to the instance while shared helpers passed to ``__init__`` stay shared.

    Transactions (``TxnT``) are stored in checkpoints once pre-committed, so they must be
    picklable then (keep only names and ids in them; drop open handles in ``__getstate__``),
    and they must name their data absolutely (any instance may commit a restored
    transaction after a change of parallelism).

    Attributes:
        subtask: index of this instance (set on the per-instance copy).
        parallelism: number of instances (set on the per-instance copy).
        highest_completed_checkpoint_id: the highest id of a checkpoint or savepoint that
            completed in the job's checkpoint directory, set by the runtime before each
            attempt (0 without checkpoint storage). A transaction pre-committed for an id up
            to it may still be listed by a retained checkpoint or a savepoint (an
            intermediate savepoint pre-commits and commits nothing): ``abort_lingering``
            keeps those.
        overlapping_instances: a rescale may start the new instances at its barrier while
            the old ones still hold the transactions they pre-committed for it (the old
            ones commit them once its checkpoint completes; the new ones start without
            them, ``abort_lingering`` included). True only where a new instance's start
            cannot touch another instance's pre-committed transaction (the file sink's
            names carry the checkpoint id); False (a Kafka sink fences the transactional
            ids it takes over) makes the rescale wait for the checkpoint instead.
    """

    subtask: int = 0
    parallelism: int = 1
    exactly_once = True
    highest_completed_checkpoint_id: int = 0
    overlapping_instances = False

    # ------------------------------------------------------------------ the protocol
    @abstractmethod
    def begin_transaction(self) -> TxnT | Awaitable[TxnT]:
        """Start the transaction of a new checkpoint interval (called with its first batch).

        Returns:
            the transaction handle passed to the other hooks.
        """

    @abstractmethod
    def write(self, txn: TxnT, batch: list[Any]) -> Awaitable[None] | None:
        """Add ``batch`` (a list of records) to ``txn``; nothing may become visible yet."""

    @abstractmethod
    def pre_commit(self, txn: TxnT, checkpoint_id: int) -> Awaitable[None] | None:
        """Make ``txn`` durable but still invisible: checkpoint ``checkpoint_id`` passes.

        Called in the synchronous part of the snapshot (the task pauses meanwhile). If it
        raises, the checkpoint is declined (aborted) and ``txn`` stays the open transaction:
        later records go on into it and the next checkpoint calls ``pre_commit`` again, so
        a failing ``pre_commit`` must leave ``txn`` writable or raise again.
        """

    @abstractmethod
    def commit(self, txn: TxnT) -> Awaitable[None] | None:
        """Make the pre-committed ``txn`` visible, atomically.

        Must be idempotent: after a recovery it is called again for transactions that may
        already be committed. An exception fails the task; the job then restarts from the
        latest completed checkpoint and commits again.
        """

    @abstractmethod
    def abort(self, txn: TxnT) -> Awaitable[None] | None:
        """Discard ``txn`` (never pre-committed): its records must never become visible.

        Called when the instance closes with an open transaction (after a failure). A
        coroutine cannot run there (closing is synchronous), so an asynchronous ``abort``
        is left to :meth:`abort_lingering` of the next start.
        """

    def abort_lingering(self, restored_checkpoint_id: int | None) -> Awaitable[None] | None:
        """Discard this instance's transactions that no restored checkpoint references.

        Called once per instance before its first transaction: after the restored pending
        transactions were committed, or at a fresh start (``restored_checkpoint_id`` None).
        Lingering are transactions begun before a crash, and those pre-committed for a
        checkpoint with an id above both ``restored_checkpoint_id`` and
        :attr:`highest_completed_checkpoint_id` (it never completed: one at or below the
        latter may be listed by a retained checkpoint or a savepoint, which a later restore
        commits, so it must stay). The default does nothing (for systems whose transactions
        expire by themselves).

        Args:
            restored_checkpoint_id: the checkpoint restored, or None on a fresh start.
        """
        return None

    # ------------------------------------------------------------------ the factory
    def create_writer(self, subtask: int, parallelism: int) -> SinkWriter:
        """Create instance ``subtask`` of ``parallelism`` (on a shallow copy of the sink)."""
        instance = copy.copy(self)
        instance.subtask = subtask
        instance.parallelism = parallelism
        return TwoPhaseCommitWriter(instance)


def without_pending(entries: list[Any]) -> list[Any]:
    """The state entries a :class:`TwoPhaseCommitWriter` snapshot, minus its pre-committed
    transactions: what the new instances of a rescale that switched at its barrier restore
    (the old instances commit those transactions themselves once the rescale's checkpoint
    completes; see :attr:`TwoPhaseCommitSink.overlapping_instances`). Other entries are
    kept as they are."""
    return [e for e in entries if not (isinstance(e, dict) and e.get("kind") == _PENDING)]


class TwoPhaseCommitWriter(SinkWriter, Generic[TxnT]):
    """Drives a :class:`TwoPhaseCommitSink` instance through the checkpoint lifecycle.

    State: the open transaction (records since the last pre-commit) and the pending ones,
    ``[(checkpoint_id, txn)]`` in checkpoint order. Every method runs in the sink's task
    (data path or mailbox), never concurrently.

    Args:
        sink: the per-instance copy of the sink.

    Attributes:
        state_redistribution: how the sink operator redistributes the entries of
            :meth:`snapshot_state` on a restore: ``"union"``, every instance gets all of
            them (see :meth:`restore_state`).
    """

    state_redistribution = "union"

    def __init__(self, sink: TwoPhaseCommitSink[TxnT]) -> None:
        self.sink = sink
        self.current: TxnT | None = None
        self.pending: list[tuple[int, TxnT]] = []
        self.last_checkpoint_id = 0
        self._started = False

    async def _start(self, restored_checkpoint_id: int | None) -> None:
        await maybe_await(self.sink.abort_lingering(restored_checkpoint_id))
        # only now: a sink whose abort_lingering refuses to start keeps refusing every write
        self._started = True

    async def start_fresh(self) -> None:
        """Fresh start (nothing restored for this sink): abort lingering transactions now,
        before the first record, rather than lazily with the first batch or snapshot.

        The sink operator calls it when it has no state to restore, so a sink that refuses
        to start (``abort_lingering`` raises) fails the task before anything is written.

        Raises:
            Exception: whatever ``abort_lingering(None)`` raises.
        """
        if not self._started:
            await self._start(None)

    async def write(self, batch: list[Any]) -> None:
        """Write ``batch`` into the open transaction (begun on the interval's first batch)."""
        if not batch:
            return
        if not self._started:
            await self._start(None)
        txn = self.current
        if txn is None:
            txn = self.current = await maybe_await(self.sink.begin_transaction())
        await maybe_await(self.sink.write(txn, batch))

    async def snapshot_state(self, checkpoint_id: int) -> list[Any]:
        """Pre-commit the open transaction for ``checkpoint_id``; return the pending ones.

        Returns:
            the operator-state entries: an epoch marker naming the checkpoint, and every
            pre-committed transaction not yet committed, keyed by its checkpoint id.

        Raises:
            Exception: whatever ``pre_commit`` raises (the checkpoint is then declined, and
                the transaction stays open for the next checkpoint).
        """
        if not self._started:
            await self._start(None)
        self.last_checkpoint_id = max(self.last_checkpoint_id, checkpoint_id)
        txn = self.current
        if txn is not None:
            await maybe_await(self.sink.pre_commit(txn, checkpoint_id))
            # only now is it pending: a failed pre-commit leaves it open (see pre_commit)
            self.pending.append((checkpoint_id, txn))
            self.current = None
        entries: list[Any] = [
            {"kind": _EPOCH, "checkpoint_id": checkpoint_id, "subtask": self.sink.subtask}
        ]
        # every pending transaction was pre-committed by this instance: restored ones (of
        # other instances, possibly) are all committed in restore_state before a snapshot
        entries += [{"kind": _PENDING, "checkpoint_id": cid, "transaction": t,
                     "subtask": self.sink.subtask} for cid, t in self.pending]
        return entries

    async def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Commit every pending transaction of a checkpoint <= ``checkpoint_id``.

        Raises:
            Exception: whatever ``commit`` raises (the task fails; recovery commits again).
        """
        await self._commit_up_to(checkpoint_id)

    async def _commit_up_to(self, checkpoint_id: int) -> None:
        while self.pending and self.pending[0][0] <= checkpoint_id:
            cid, txn = self.pending[0]
            await maybe_await(self.sink.commit(txn))
            # dropped after the commit succeeded: a failed commit stays pending (and in the
            # next snapshot), so it is retried after the recovery the failure causes
            self.pending.pop(0)
            log.debug("subtask %d committed the transaction of checkpoint %d",
                      self.sink.subtask, cid)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Nothing to do: pre-committed transactions stay pending until a later checkpoint
        completes, and the completion of that checkpoint commits them (Carbone 2018 (PhD thesis),
        section 4.1.3)."""
        log.debug("checkpoint %d aborted; subtask %d keeps %d transaction(s) pending",
                  checkpoint_id, self.sink.subtask, len(self.pending))

    async def restore_state(self, entries: list[Any]) -> None:
        """Commit the pending transactions of the restored checkpoint that this instance
        owns, then abort lingering ones; runs before the instance processes anything (Carbone
        2018 (PhD thesis), section 4.1.3.1).

        ``entries`` are those of every old instance (union redistribution, see
        :attr:`state_redistribution`): the restored checkpoint's id is the largest id among
        them, the same at every instance, and the pending transaction that old instance
        ``k`` pre-committed is committed here only when ``k % parallelism`` is this
        instance. (A subset dealt round robin, as checkpoints of older versions were
        redistributed, can hold only the older of two pending checkpoints of an instance:
        its id then looked like the restored one, and ``abort_lingering`` removed the newer
        transaction that another instance was dealt to commit.) Pending entries without the
        pre-committing instance (older checkpoints) are committed by whichever instance
        received them.

        Raises:
            RestoreError: if ``entries`` were not written by a two-phase-commit writer.
            Exception: whatever ``commit`` or ``abort_lingering`` raises.
        """
        restored: list[tuple[int, Any]] = []
        checkpoint_id = 0
        subtask, parallelism = self.sink.subtask, self.sink.parallelism
        for e in entries:
            if not isinstance(e, dict) or e.get("kind") not in (_PENDING, _EPOCH):
                raise RestoreError(
                    f"sink state entry {e!r} was not written by a TwoPhaseCommitSink; was the "
                    "sink of this uid replaced? give the new sink a new uid"
                )
            checkpoint_id = max(checkpoint_id, int(e["checkpoint_id"]))
            owner = e.get("subtask")
            if e["kind"] == _PENDING and (owner is None or int(owner) % parallelism == subtask):
                restored.append((int(e["checkpoint_id"]), e["transaction"]))
        restored.sort(key=lambda p: p[0])
        self.pending = restored
        self.last_checkpoint_id = checkpoint_id
        # the restored checkpoint completed: everything it lists as pending is committed now
        await self._commit_up_to(checkpoint_id)
        await self._start(checkpoint_id)

    async def finish(self) -> None:
        """End of input: commit what no checkpoint will commit any more.

        The job's final checkpoint has already committed every interval (it completes
        before end-of-input flows, Flink FLIP-147). Records that operators emit at end of
        input come after it; they are committed here directly, so they are exactly-once only
        as long as the job is not restored from its final checkpoint afterwards. Without
        checkpointing, this is the only commit.
        """
        if not self._started:
            await self._start(None)
        await self._commit_up_to(self.last_checkpoint_id)
        txn = self.current
        if txn is not None:
            if self.last_checkpoint_id:
                log.warning("subtask %d: records after the final checkpoint %d are committed at "
                            "end of input, outside any checkpoint", self.sink.subtask,
                            self.last_checkpoint_id)
            await maybe_await(self.sink.pre_commit(txn, self.last_checkpoint_id + 1))
            self.current = None
            self.pending.append((self.last_checkpoint_id + 1, txn))
            await self._commit_up_to(self.last_checkpoint_id + 1)

    def close(self) -> Awaitable[None] | None:
        """Abort the open transaction (after a failure; pending ones stay for recovery)."""
        txn, self.current = self.current, None
        if txn is None:
            return None
        try:
            result = self.sink.abort(txn)
        except Exception as exc:  # closing after a failure: the first error is the news
            log.warning("subtask %d: aborting the open transaction failed: %r",
                        self.sink.subtask, exc)
            return None
        if inspect.iscoroutine(result):
            # closing is synchronous: the next start's abort_lingering removes the transaction
            result.close()
        return None
