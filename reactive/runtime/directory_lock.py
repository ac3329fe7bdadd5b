"""Exclusive ownership of a directory for the lifetime of a run: one process at a time.

Two processes of one job on one checkpoint directory (a supervisor restarting a job whose
old process still runs, a double ``reactive run --resume``) would take checkpoints with the
same ids into the same directories, delete each other's files, and commit into the same
output. A run therefore holds an exclusive ``flock`` on a lock file in its job's checkpoint
directory (``<dir>/<job>/_lock``) and one in each committing sink's output directory
(``.reactive-lock``, hidden from readers) from its start to its end. The operating system
releases the lock when the process dies, however it dies, so a crashed run never blocks the
next one. The holder writes its pid, host and start time into the file; a second process
fails at start with an error naming them.

``flock`` locks are advisory and per open file description: two runs in one process
exclude each other as two processes do. On network file systems without ``flock`` support
the lock cannot be taken and the run fails with the reason (rather than running unguarded).
"""

from __future__ import annotations

import datetime
import json
import os
import socket
from pathlib import Path

from ..checkpoint.durable_files import create_dirs
from ..errors import ConfigurationError

__all__ = ["DirectoryLock", "DirectoryLockedError"]

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no flock; runs are not guarded there
    fcntl = None  # type: ignore[assignment]


class DirectoryLockedError(ConfigurationError):
    """Another run (in this or another process) holds the directory; raised at start.

    Attributes:
        path: the lock file.
        holder: what the holder wrote into it (``pid``, ``host``, ``started``, ``job``,
            ``run_id``), empty when unreadable.
    """

    def __init__(self, message: str, path: Path, holder: dict[str, object]) -> None:
        super().__init__(message)
        self.path = path
        self.holder = holder


class DirectoryLock:
    """An exclusive, process-lifetime lock on a directory (see the module docstring).

    Args:
        directory: the directory to own (created, durably, when missing).
        name: the lock file's name in it.
        what: how messages name the directory ("checkpoint directory of job 'x'").
    """

    def __init__(self, directory: str | os.PathLike[str], name: str, what: str) -> None:
        self.directory = Path(directory)
        self.path = self.directory / name
        self.what = what
        self._fd: int | None = None
        #: the directories :meth:`acquire` created (to be made durable, ``sync_created``)
        self.created: list[Path] = []

    def acquire(self, job: str, run_id: str) -> None:
        """Take the lock without waiting and write this process's identity into it.

        Args:
            job: the job's name (written for the holder's description).
            run_id: the run's id (written likewise).

        Raises:
            DirectoryLockedError: when another run holds it, naming that run's pid, host
                and start time.
            OSError: when the directory or the lock file cannot be created or locked.
        """
        if fcntl is None or self._fd is not None:
            return
        # created now, made durable later off the loop (Job._main: the run takes its locks
        # on the loop's thread at start); the lock itself needs no durability, the OS
        # releases it with the process
        self.created = create_dirs(self.directory)
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(self.path, flags, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            who = (f"pid {holder.get('pid')} on host {holder.get('host')}, started "
                   f"{holder.get('started')} (job {holder.get('job')!r}, run "
                   f"{holder.get('run_id')})") if holder else "a process that wrote no details"
            raise DirectoryLockedError(
                f"the {self.what} ({self.directory}) is in use by another run: {who}. Two "
                "runs on one directory would overwrite each other's checkpoints and output; "
                f"stop that run first (the lock {self.path} is released when its process "
                "ends)", self.path, holder) from None
        except BaseException:
            os.close(fd)
            raise
        info = {"pid": os.getpid(), "host": socket.gethostname(), "job": job, "run_id": run_id,
                "started": datetime.datetime.now(datetime.UTC).isoformat(
                    timespec="seconds")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Release the lock (idempotent). The file stays: removing it would race with a
        process that opened it and waits to lock it."""
        fd, self._fd = self._fd, None
        if fd is None or fcntl is None:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


def _read_holder(fd: int) -> dict[str, object]:
    try:
        data = os.pread(fd, 4096, 0)
        holder = json.loads(data) if data else {}
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}
