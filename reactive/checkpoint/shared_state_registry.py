"""Reference counts of the files incremental checkpoints share (Flink's
``SharedStateRegistry``).

An incremental snapshot (RocksDB) uploads an SST file under ``<job>/shared/`` once and later
checkpoints reference it again instead of copying it. The registry counts, per shared file,
the completed checkpoints that reference it: a checkpoint's files are registered when it
completes and unregistered when it is subsumed (dropped by retention); a file whose count
falls to zero is no longer needed. The counts are derived from the metadata of the retained
checkpoints when a job attempt starts, so they survive restarts without a file of their own.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["SharedStateRegistry"]


class SharedStateRegistry:
    """Which completed checkpoints reference each shared file (paths relative to the job
    directory, as handles store them)."""

    def __init__(self) -> None:
        self._users: dict[str, set[int]] = {}
        self._by_checkpoint: dict[int, set[str]] = {}

    def register(self, checkpoint_id: int, paths: Iterable[str]) -> None:
        """Checkpoint ``checkpoint_id`` completed and references ``paths``."""
        own = self._by_checkpoint.setdefault(checkpoint_id, set())
        for path in paths:
            own.add(path)
            self._users.setdefault(path, set()).add(checkpoint_id)

    def unregister(self, checkpoint_id: int) -> list[str]:
        """Checkpoint ``checkpoint_id`` is gone; return the files nobody references now."""
        freed = []
        for path in self._by_checkpoint.pop(checkpoint_id, set()):
            users = self._users.get(path)
            if users is None:
                continue
            users.discard(checkpoint_id)
            if not users:
                del self._users[path]
                freed.append(path)
        return sorted(freed)

    def is_referenced(self, path: str) -> bool:
        """True while a registered checkpoint references ``path``."""
        return path in self._users

    def reference_count(self, path: str) -> int:
        """How many registered checkpoints reference ``path``."""
        return len(self._users.get(path, ()))
