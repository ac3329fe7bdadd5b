"""Run options: checkpointing and restart strategies, and the typed keyword arguments of
starting a job (:class:`StartOptions`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypedDict

from .errors import ConfigurationError

if TYPE_CHECKING:
    from .state.backend import StateBackend

__all__ = ["CheckpointConfig", "CheckpointingMode", "RestartStrategy", "StartOptions"]

CheckpointingMode = Literal["exactly_once", "at_least_once", "synchronous"]


@dataclass(frozen=True)
class CheckpointConfig:
    """How and where the job takes checkpoints (Flink's ``CheckpointConfig``).

    Args:
        interval: seconds between periodic checkpoint triggers (> 0); ``None`` takes only
            the checkpoints asked for with ``job.checkpoint()`` and the final one.
        directory: checkpoint storage root; checkpoints go to ``<directory>/<job>/chk-<n>``.
        mode: ``"exactly_once"`` aligns barriers (Algorithm 1 of the ABS paper);
            ``"at_least_once"`` does not block channels, so state may count replayed records;
            ``"synchronous"`` is the baseline the ABS paper compares against (a Naiad-style
            global synchronous snapshot, Carbone 2018 (PhD thesis), section 3.4.2): the sources
            are halted from the trigger until the checkpoint completes, in-flight records drain,
            and every task writes its whole snapshot before it processes anything else. It is
            exactly once like ``"exactly_once"`` and meant for comparisons, not for use:
            the job stops for the drain and the writes of every checkpoint
            (``reactive.checkpoint.synchronous_snapshots``).
        timeout: seconds after which a pending checkpoint is aborted.
        max_concurrent: how many checkpoints may be pending at once (>= 1).
        retained: how many completed checkpoints are kept on disk (>= 1).
        tolerable_failed_checkpoints: consecutive failed checkpoints after which the job fails.
        unaligned: take periodic and on-demand checkpoints *unaligned* (Flink's
            ``execution.checkpointing.unaligned``, FLIP-76): a task snapshots at the first
            barrier, the barrier overtakes the records queued in the channels, and those
            in-flight records are stored with the snapshot and replayed into the operator
            on restore (re-partitioned by key group at another parallelism). A checkpoint
            then takes about as long under backpressure as without it; it stores the queued
            records too. Savepoints and the job's final checkpoint stay aligned. Needs
            ``mode="exactly_once"``; a dataflow with an iteration cannot use it.
        history: how many checkpoints' statistics ``job.metrics.checkpoints`` keeps (>= 1;
            Flink's ``web.checkpoints.history``); ``job.metrics.totals`` counts them all.

    Raises:
        ConfigurationError: on a non-positive interval, timeout, max_concurrent, retained
            or history, an unknown mode, or ``max_concurrent > 1`` with ``mode="synchronous"`` (the
            sources stay halted until the one pending checkpoint completes), or
            ``unaligned`` with another mode than ``"exactly_once"``.
    """

    interval: float | None = 1.0
    directory: str | Path = "checkpoints"
    mode: CheckpointingMode = "exactly_once"
    timeout: float = 60.0
    max_concurrent: int = 1
    retained: int = 3
    tolerable_failed_checkpoints: int = 3
    unaligned: bool = False
    history: int = 10

    def __post_init__(self) -> None:
        if self.interval is not None and not self.interval > 0:
            raise ConfigurationError(f"checkpoint interval must be > 0 seconds, got {self.interval}")
        if self.mode not in ("exactly_once", "at_least_once", "synchronous"):
            raise ConfigurationError(
                "checkpointing mode must be 'exactly_once', 'at_least_once' or 'synchronous', "
                f"got {self.mode!r}"
            )
        if not self.timeout > 0:
            raise ConfigurationError(f"checkpoint timeout must be > 0 seconds, got {self.timeout}")
        if self.max_concurrent < 1:
            raise ConfigurationError(f"max_concurrent must be >= 1, got {self.max_concurrent}")
        if self.mode == "synchronous" and self.max_concurrent != 1:
            raise ConfigurationError(
                "mode='synchronous' takes one checkpoint at a time (the sources stay halted "
                f"until it completes): max_concurrent must be 1, got {self.max_concurrent}")
        if self.retained < 1:
            raise ConfigurationError(f"retained must be >= 1, got {self.retained}")
        if self.history < 1:
            raise ConfigurationError(f"history must be >= 1, got {self.history}")
        if self.tolerable_failed_checkpoints < 0:
            raise ConfigurationError("tolerable_failed_checkpoints must be >= 0")
        if self.unaligned and self.mode != "exactly_once":
            raise ConfigurationError(
                f"unaligned checkpoints are exactly once: mode must be 'exactly_once', got "
                f"{self.mode!r}")


@dataclass(frozen=True)
class RestartStrategy:
    """What to do when a task fails (Flink's fixed-delay restart strategy).

    Use :meth:`fixed` or :meth:`none`. After a failure the whole job restarts from the latest
    completed checkpoint, up to ``attempts`` times, waiting ``delay`` seconds before each.
    """

    attempts: int = 0
    delay: float = 0.0

    @staticmethod
    def fixed(attempts: int, delay: float = 1.0) -> RestartStrategy:
        """Restart at most ``attempts`` times, ``delay`` seconds apart.

        Raises:
            ConfigurationError: if attempts < 0 or delay < 0.
        """
        if attempts < 0 or delay < 0:
            raise ConfigurationError("restart attempts and delay must be >= 0")
        return RestartStrategy(attempts, delay)

    @staticmethod
    def none() -> RestartStrategy:
        """Never restart: the first failure fails the job."""
        return RestartStrategy(0, 0.0)

    @staticmethod
    def default(checkpointing: bool) -> RestartStrategy:
        """Three restarts one second apart with checkpointing on, none without."""
        return RestartStrategy(3, 1.0) if checkpointing else RestartStrategy(0, 0.0)


class StartOptions(TypedDict, total=False):
    """The keyword arguments of ``Dataflow.start``, which ``Dataflow.run`` and
    ``Dataflow.execute`` take as ``**options``: each one described there, every one optional.

    Attributes:
        checkpoints: checkpointing configuration; None disables checkpoints.
        restart: restart strategy.
        state_backend: keyed state backend (default: heap).
        resume: restore the newest completed checkpoint of the job's directory.
        restore_from: restore exactly this checkpoint or savepoint directory.
        allow_non_restored_state: accept state of operators the program no longer has.
        allow_replayed_output: accept restoring past a damaged checkpoint that had
            committed output.
    """

    checkpoints: CheckpointConfig | None
    restart: RestartStrategy | None
    state_backend: StateBackend | None
    resume: bool
    restore_from: str | os.PathLike[str] | None
    allow_non_restored_state: bool
    allow_replayed_output: bool
