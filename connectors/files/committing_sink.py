"""The exactly-once committing file sink: two-phase commit of part files (JSON lines or
Parquet), commits verified against the size and SHA-256 recorded at pre-commit, never
replacing a file, and lingering files of unfinished transactions removed on recovery."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from reactive.checkpoint.durable_files import fsync_dir, make_dirs
from reactive.errors import CheckpointError, ConfigurationError, ReactiveError
from reactive.extras import require
from reactive.sinks import SinkWriter
from reactive.two_phase_commit import TwoPhaseCommitSink

from .encoders import _json_lines_encoder
from .hashing import _file_digest, _HashingFile
from .parquet_buffer import ParquetRowBuffer
from .transaction import FileTransaction

__all__ = ["CommittingFileSink", "PartFileError"]

log = logging.getLogger(__name__)

_FORMATS = {"jsonl": "jsonl", "parquet": "parquet"}

# errors of os.link on file systems without hard links (FAT, some network and FUSE mounts)
_NO_HARD_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK}


def _publish_no_clobber(src: Path, dst: Path) -> None:
    """Rename the file ``src`` to ``dst``, failing if ``dst`` exists.

    A hard link then the removal of ``src``: the link is atomic and never replaces an
    existing file (``os.replace`` would, silently). A crash between the two leaves both
    names on one file, which a retried commit recognizes. Where the file system has no hard
    links, falls back to a rename after an existence check: not atomic against another
    writer, but every committed name has one owner (the subtask that commits it), so nothing
    else creates ``dst`` meanwhile.

    Raises:
        FileExistsError: if ``dst`` exists (``src`` is left as it is).
        FileNotFoundError: if ``src`` does not exist.
    """
    try:
        os.link(src, dst)
    except FileExistsError:
        raise
    except OSError as exc:
        if exc.errno not in _NO_HARD_LINKS:
            raise
        if os.path.lexists(dst):
            raise FileExistsError(errno.EEXIST, "file exists", str(dst)) from None
        os.rename(src, dst)
        return
    os.unlink(src)


class PartFileError(ReactiveError):
    """A part file of a :class:`CommittingFileSink` cannot be committed as pre-committed: its
    pending file is not what pre-commit wrote (truncated or changed since), or its committed
    name is taken by a file with other content (a commit never overwrites one).

    Retrying cannot help: the job fails with this error after its restarts, and the records
    of the transaction are not published. The message names the file, the checkpoint and
    what differs.

    Attributes:
        path: the file whose content does not match.
        checkpoint_id: the checkpoint whose transaction it belongs to.
    """

    def __init__(self, message: str, path: Path, checkpoint_id: int | None) -> None:
        super().__init__(message)
        self.path = path
        self.checkpoint_id = checkpoint_id


_HIDDEN = re.compile(r"^\.part-(\d+)-([0-9a-f]+)\.(\w+)\.(inprogress|pending)$")
_COMMITTED = re.compile(r"^part-\d+-\d+\.\w+$")
_MODES = ("error", "append")


def _is_record_batch(value: Any) -> bool:
    """Whether ``value`` is a ``pyarrow.RecordBatch`` (without importing pyarrow)."""
    t = type(value)
    return t.__name__ == "RecordBatch" and t.__module__.startswith("pyarrow")


def _committed_parts(directory: Path) -> list[str]:
    """The committed part files (``part-<subtask>-<checkpoint>.<ext>``) in ``directory``,
    sorted ([] when it does not exist)."""
    try:
        with os.scandir(directory) as it:
            return sorted(e.name for e in it if _COMMITTED.match(e.name) and e.is_file())
    except FileNotFoundError:
        return []


class CommittingFileSink(ParquetRowBuffer, TwoPhaseCommitSink[FileTransaction]):
    """Exactly-once part files: the two-phase-commit file sink of Carbone 2018 (PhD thesis),
    section 4.1.4, and of Flink's ``FileSink``.

    Each subtask writes the records of one checkpoint interval to a hidden in-progress file
    (``.part-<subtask>-<random>.<ext>.inprogress``: names starting with '.' are skipped by
    Spark, pyarrow datasets and most readers), hashing what it writes. Pre-commit (the
    checkpoint's synchronous part) closes it, fsyncs it, records its size and SHA-256 in the
    transaction (stored in the checkpoint) and renames it to a hidden pending name carrying
    the checkpoint id; commit (the checkpoint completed) checks the pending file against
    the recorded size and digest and links it atomically to ``part-<subtask>-<checkpoint>.
    <ext>`` in ``directory``, never replacing an existing file. Commit is idempotent: a part
    already committed with the recorded content is done. On recovery, pending files of the
    restored checkpoint are committed first, then in-progress files and pending files of
    checkpoints after the restored one (they never completed) are removed. Intervals
    without records write no file. The job's final checkpoint commits the last interval at
    end of input. So readers only ever see committed files, and each record is in exactly
    one of them.

    ``directory`` belongs to this sink: do not point two sinks (or two jobs) at it. A run
    locks it (``.reactive-lock``) from start to end, so a second process fails at start. A run
    that starts fresh (nothing restored for this sink) into a directory that already holds
    committed parts fails at once in mode ``"error"`` (its output would be added to theirs,
    doubling records that both runs produce); mode ``"append"`` adds it on purpose.

    Args:
        directory: the committed directory (created when missing).
        format: ``"jsonl"`` (one compact JSON text per line, UTF-8; tuples become arrays)
            or ``"parquet"`` (needs pyarrow).
        schema: parquet only: a ``pyarrow.Schema``. Records are dicts (by field name: a
            missing field is null, other keys are ignored), or tuples/lists (by position),
            or scalars (a one-field schema), all of one kind. Without it the field names
            come from the first record (``f0, f1, ...`` for tuples, ``value`` for scalars)
            and the types from each subtask's first row group; declare it when a column may
            start with nulls.
        row_group_size: parquet only: rows per row group (rows are buffered until then;
            a row that does not fit the schema is reported when its row group is written).
        mode: what a fresh start does when ``directory`` already holds committed parts
            (Spark's ``DataFrameWriter`` modes): ``"error"`` (the default) fails the job
            before any record is written, ``"append"`` adds this run's parts to them. A
            restore (resuming the run that wrote them) never refuses.

    Raises:
        ConfigurationError: on an unknown format or mode, a schema for jsonl, a schema that
            is not a ``pyarrow.Schema``, a row_group_size < 1, or parquet without pyarrow
            installed.
    """

    #: a part's name carries its subtask and checkpoint id: the new instances of a rescale
    #: that switched at its barrier write and clean up other names than the pending parts
    #: the old instances commit once its checkpoint completes
    overlapping_instances = True

    def __init__(self, directory: str | Path, format: Literal["jsonl", "parquet"] = "jsonl",
                 schema: Any = None, row_group_size: int = 1 << 16,
                 mode: Literal["error", "append"] = "error") -> None:
        if format not in _FORMATS:
            raise ConfigurationError(f"CommittingFileSink format must be 'jsonl' or 'parquet', "
                                     f"got {format!r}")
        if mode not in _MODES:
            raise ConfigurationError(f"CommittingFileSink mode must be 'error' or 'append', "
                                     f"got {mode!r}")
        if row_group_size < 1:
            raise ConfigurationError(f"row_group_size must be >= 1, got {row_group_size}")
        if format == "jsonl" and schema is not None:
            raise ConfigurationError("a schema applies to format='parquet' only")
        if format == "parquet":
            # fail here, not in the first checkpoint
            pa = require("pyarrow", "parquet", "CommittingFileSink(format='parquet')")
            require("pyarrow.parquet", "parquet", "CommittingFileSink(format='parquet')")
            if schema is not None and not isinstance(schema, pa.Schema):
                raise ConfigurationError(f"schema must be a pyarrow.Schema, got {schema!r}")
        self.directory = Path(directory)
        self.format = format
        self.ext = _FORMATS[format]
        self.schema = schema
        self.row_group_size = row_group_size
        self.mode = mode
        self._encode: Callable[[list[Any]], str] | None = None
        self._kind: str | None = None  # parquet: "tuple", "dict" or "scalar" records
        self._columns: list[str] = []
        # committed parts found when this instance was created (None: not created by
        # create_writer; abort_lingering then looks at the directory itself)
        self._parts_at_start: list[str] | None = None

    def exclusive_directories(self) -> list[Path]:
        """The committed directory: one run at a time commits into it (the runtime locks it
        for the run's lifetime, see ``reactive.runtime.directory_lock``)."""
        return [self.directory]

    def create_writer(self, subtask: int, parallelism: int) -> SinkWriter:
        """Create instance ``subtask`` of ``parallelism``, noting the committed parts the
        directory holds now.

        The runtime creates every instance of an attempt before any of them runs, so the
        note holds only parts of earlier runs: a fresh start compares against it, and does
        not mistake the parts that other instances of this very run commit meanwhile for
        an earlier run's output.
        """
        writer = super().create_writer(subtask, parallelism)
        instance = getattr(writer, "sink", None)
        if isinstance(instance, CommittingFileSink) and self.mode == "error":
            instance._parts_at_start = _committed_parts(self.directory)
        return writer

    # ------------------------------------------------------------------ transactions
    def begin_transaction(self) -> FileTransaction:
        """Open a new hidden in-progress file."""
        name = f".part-{self.subtask}-{uuid.uuid4().hex[:16]}.{self.ext}.inprogress"
        txn = FileTransaction(self.subtask, name)
        txn.file = _HashingFile(self.directory / name)
        return txn

    def write(self, txn: FileTransaction, batch: list[Any]) -> None:
        """Append ``batch`` to the in-progress file (parquet: to the row buffer, written as a
        row group every ``row_group_size`` rows). A batch of ``pyarrow.RecordBatch`` es (a
        columnar stream's) goes to parquet as it is, and to JSON lines row by row.

        Raises:
            TypeError: a record JSON cannot encode (jsonl).
            ValueError: a record that does not fit the schema, or records of another shape
                than the earlier ones (parquet).
            CheckpointError: if ``txn`` is unusable after a failed pre-commit.
        """
        if txn.failure is not None:
            raise CheckpointError(
                f"in-progress file {self.directory / txn.name} is unusable after its pre-commit "
                f"failed ({txn.failure!r}); failing the task so the job restarts from the last "
                "completed checkpoint"
            ) from txn.failure
        if batch and _is_record_batch(batch[0]):
            # a columnar stream's record batches: parquet takes them as they are
            if self.format == "parquet":
                self._buffer_record_batches(txn, batch)
                if txn.buffered >= self.row_group_size:
                    self._write_row_group(txn)
                txn.records += sum(b.num_rows for b in batch)
                return
            batch = [row for b in batch for row in b.to_pylist()]
            if not batch:
                return
        if self.format == "jsonl":
            encode = self._encode
            if encode is None:
                encode = self._encode = _json_lines_encoder()
            txn.file.write(encode(batch).encode("utf-8"))
            txn.file.write(b"\n")
        else:
            self._buffer(txn, batch)
            if txn.buffered >= self.row_group_size:
                self._write_row_group(txn)
        txn.records += len(batch)

    def pre_commit(self, txn: FileTransaction, checkpoint_id: int) -> None:
        """Close and fsync the in-progress file, record its size and SHA-256 in ``txn``,
        rename it to its pending name.

        Raises:
            OSError: when closing, syncing or renaming fails, and ValueError when buffered
                parquet rows do not fit the schema (the transaction is then unusable: the
                checkpoint is declined and the next write fails the task).
            CheckpointError: if ``txn`` is already unusable, or the file on disk does not
                have the size written through it.
        """
        if txn.failure is not None:
            raise CheckpointError(f"in-progress file {self.directory / txn.name} is unusable "
                                  f"after its pre-commit failed ({txn.failure!r})") from txn.failure
        try:
            if self.format == "parquet":
                self._write_row_group(txn)
                if txn.writer is not None:
                    txn.writer.close()  # writes the footer; the file object stays open
                    txn.writer = None
            f = txn.file
            f.flush()
            os.fsync(f.fileno())
            on_disk = os.fstat(f.fileno()).st_size
            f.close()
            txn.file = None
            if on_disk != f.size:
                raise CheckpointError(f"in-progress file {self.directory / txn.name} holds "
                                      f"{on_disk} bytes after fsync, {f.size} were written")
            pending = f".part-{txn.subtask}-{checkpoint_id}.{self.ext}.pending"
            os.replace(self.directory / txn.name, self.directory / pending)
            # the rename must survive a machine crash, or recovery misses a pending file
            fsync_dir(self.directory)
        except BaseException as exc:
            txn.failure = exc
            raise
        txn.name = pending
        txn.checkpoint_id = checkpoint_id
        txn.final = f"part-{txn.subtask}-{checkpoint_id}.{self.ext}"
        txn.size = f.size
        txn.sha256 = f.sha256.hexdigest()

    def commit(self, txn: FileTransaction) -> None:
        """Publish the pending file under its committed name: checked against the size and
        SHA-256 pre-commit recorded, then hard-linked (atomic, and it fails instead of
        replacing an existing file), then the pending name removed.

        Idempotent: when the committed name already holds the recorded content (a commit
        retried after a recovery), the commit is done (a leftover pending name is removed).
        Transactions of checkpoints taken before sizes and digests were recorded are
        published without the content checks.

        Raises:
            PartFileError: if the pending file is not what pre-commit wrote (truncated or
                changed), or the committed name is taken by a file with other content (of
                an earlier run, say): naming the file, the checkpoint and what differs.
            FileNotFoundError: when neither the pending nor the committed file exists (the
                output of that interval is lost: someone removed files of the directory).
        """
        assert txn.final is not None, "commit of a transaction that was not pre-committed"
        src, dst = self.directory / txn.name, self.directory / txn.final
        try:
            self._verify(src, txn, "its pending file")
        except FileNotFoundError:
            # committed (and the pending name removed) before a crash: commit is retried
            # after recovery; the committed file must hold what pre-commit wrote
            try:
                self._verify(dst, txn, "the committed file")
            except FileNotFoundError:
                raise FileNotFoundError(
                    f"cannot commit {dst}: neither it nor its pending file {src} exists, so "
                    f"the records of checkpoint {txn.checkpoint_id} of subtask {txn.subtask} "
                    "are lost (were files removed from the directory? A savepoint restored "
                    "on another machine needs the pending part files it lists copied into "
                    "this directory)"
                ) from None
            return
        try:
            _publish_no_clobber(src, dst)
        except FileExistsError:
            # a retried commit (linked before a crash, the pending name not yet removed:
            # one file under both names), or a file of an earlier run under the same name,
            # which is never replaced
            if not os.path.samefile(src, dst):
                self._verify(dst, txn, "the committed file", conflict=True)
            os.unlink(src)
        fsync_dir(self.directory)

    def _verify(self, path: Path, txn: FileTransaction, what: str,
                conflict: bool = False) -> None:
        """Check that ``path`` holds the size and SHA-256 pre-commit recorded in ``txn``.

        Args:
            path: the pending or the committed file.
            txn: the pre-committed transaction.
            what: how the message names ``path`` ("its pending file", ...).
            conflict: ``path`` is the committed name found taken when linking: a mismatch
                is another file there, not damage.

        Raises:
            FileNotFoundError: if ``path`` does not exist.
            PartFileError: on a mismatch.
        """
        size = os.stat(path).st_size
        if txn.size is None or txn.sha256 is None:
            if conflict:  # nothing recorded to compare with: never take a foreign file
                raise PartFileError(
                    f"cannot commit {path} for checkpoint {txn.checkpoint_id}: the file "
                    f"exists already ({size} bytes), and this transaction recorded no digest "
                    "to show it is its own; a commit never replaces a file", path,
                    txn.checkpoint_id)
            return
        digest = _file_digest(path)[1] if size == txn.size else None
        if size == txn.size and digest == txn.sha256:
            return
        differs = (f"{size} bytes, pre-commit wrote {txn.size}" if size != txn.size else
                   f"SHA-256 {digest}, pre-commit wrote {txn.sha256} (same size, {size} bytes)")
        if conflict:
            raise PartFileError(
                f"cannot commit checkpoint {txn.checkpoint_id} of subtask {txn.subtask}: "
                f"{path} exists already with other content ({differs}); a commit never "
                "replaces a committed file. Is it the output of an earlier run into this "
                "directory? Move it away and resume, or write to another directory",
                path, txn.checkpoint_id)
        raise PartFileError(
            f"cannot commit checkpoint {txn.checkpoint_id} of subtask {txn.subtask}: {what} "
            f"{path} is not what pre-commit wrote ({differs}): it was truncated or changed "
            f"after the checkpoint, so its {txn.records} records cannot be published as "
            "they were written", path, txn.checkpoint_id)

    def abort(self, txn: FileTransaction) -> None:
        """Close and remove the in-progress file."""
        with contextlib.suppress(Exception):
            if txn.writer is not None:
                txn.writer.close()
        with contextlib.suppress(OSError):
            if txn.file is not None:
                txn.file.close()
        txn.writer = txn.file = None
        txn.columns = []
        (self.directory / txn.name).unlink(missing_ok=True)

    def abort_lingering(self, restored_checkpoint_id: int | None) -> None:
        """Remove this subtask's in-progress files, and its pending files of checkpoints after
        ``restored_checkpoint_id`` that never completed: those above
        ``highest_completed_checkpoint_id`` too (a savepoint's, or a retained checkpoint's,
        stays until a restore of it commits it).

        Files of subtasks that no longer exist (``k >= parallelism``) are handled by subtask
        ``k % parallelism``, so every name prefix has exactly one owner and no instance
        removes a file that another live instance writes. Pending files of checkpoints up
        to the restored one are kept: the restored checkpoint lists them, and the same
        owner ``k % parallelism`` commits them (see ``TwoPhaseCommitWriter.restore_state``).

        Raises:
            ConfigurationError: on a fresh start (``restored_checkpoint_id`` None) in mode
                ``"error"`` when the directory already held committed parts when the run
                started, naming the directory, how many, and the ways out.
        """
        if restored_checkpoint_id is None and self.mode == "error":
            parts = self._parts_at_start
            if parts is None:
                parts = _committed_parts(self.directory)
            if parts:
                raise ConfigurationError(
                    f"output directory {self.directory} already holds {len(parts)} committed "
                    f"part file(s) ({', '.join(parts[:3])}{', ...' if len(parts) > 3 else ''}) "
                    "and this run starts fresh, so its output would be added to theirs "
                    "(doubling what both runs write). Resume the run that wrote them "
                    "(resume=True, CLI --resume), delete them, or pass mode='append' to "
                    "CommittingFileSink to add this run's output on purpose"
                )
        make_dirs(self.directory)  # durable: committed parts live in it
        # pending files a retained checkpoint or a savepoint may list stay: restoring that
        # checkpoint or savepoint commits them
        keep = max(restored_checkpoint_id or 0, self.highest_completed_checkpoint_id)
        removed = 0
        with os.scandir(self.directory) as it:
            for entry in it:
                m = _HIDDEN.match(entry.name)
                if m is None or m.group(3) != self.ext:
                    continue
                if int(m.group(1)) % self.parallelism != self.subtask:
                    continue
                if m.group(4) == "pending" and int(m.group(2)) <= keep:
                    continue
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                    removed += 1
        if removed:
            fsync_dir(self.directory)
            log.info("subtask %d removed %d lingering part file(s) in %s", self.subtask, removed,
                     self.directory)
