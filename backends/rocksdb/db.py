"""Opening RocksDB databases (rocksdict): the options every instance uses, the working
database, and a snapshot handle's files laid out as a database directory.

Also the identity of this backend's snapshot handles (``backend``/``format``), which every
module that opens them checks.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rocksdict import AccessType, BlockBasedOptions, Options, Rdict, WriteOptions

from reactive.checkpoint.paths import check_name, resolve_under
from reactive.errors import RestoreError

__all__ = [
    "BACKEND",
    "FORMAT",
    "check_handle",
    "materialize",
    "open_db",
    "options",
]

#: the ``"backend"`` of RocksDB snapshot handles
BACKEND = "rocksdb"
#: the ``"format"`` of RocksDB snapshot handles
FORMAT = "rocksdb-v1"


def options(write_buffer_size: int, factory: Callable[[Options], None] | None) -> Options:
    """Return the RocksDB options of an instance.

    Args:
        write_buffer_size: memtable size, bytes.
        factory: called last with the options, to tune them (``options_factory``).
    """
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    # small memtables: RocksDB flushes full ones in its background threads (no GIL), so the
    # synchronous part of a snapshot only flushes what changed since the last full memtable
    opts.set_write_buffer_size(write_buffer_size)
    opts.set_max_write_buffer_number(4)
    opts.set_max_background_jobs(2)
    table = BlockBasedOptions()
    # a Bloom filter per SST: a cache miss on a new key then costs ~1 us instead of a block
    # read in every L0 file (measured 5 us per get without it)
    table.set_bloom_filter(10, False)
    opts.set_block_based_table_factory(table)
    if factory is not None:
        factory(opts)
    return opts


def _write_options() -> WriteOptions:
    wo = WriteOptions()
    # no write-ahead log: durability comes from checkpoints (as in Flink's RocksDB backend);
    # the working directory is thrown away on failure
    wo.disable_wal = True  # type: ignore[method-assign,assignment]  # a property at runtime
    return wo


def open_db(path: Path, opts: Options, read_only: bool = False) -> Rdict:
    """Open the database at ``path`` with ``opts`` (writable: without write-ahead log).

    ``opts`` apply to the database *and* its default column family also when ``path``
    already holds a database (a restored or reopened one): given options but no column
    families, rocksdict opens an existing database with the column-family options it reads
    back from the directory's OPTIONS file, and that file cannot describe the Bloom filter
    (it reloads as ``filter_policy=nullptr``) nor anything ``options_factory`` set on the
    live object. A restored instance then wrote SST files without filters, and every cache
    miss read a data block of each of them (the restarted job ran at about half speed).
    """
    cfs = {"default": opts}
    if read_only:
        db = Rdict(str(path), opts, column_families=cfs,
                   access_type=AccessType.read_only())
    else:
        db = Rdict(str(path), opts, column_families=cfs)
        db.set_write_options(_write_options())
    return db


def check_handle(handle: dict[str, Any]) -> None:
    """Check that ``handle`` is a snapshot of this backend's format.

    Raises:
        RestoreError: if it is not.
    """
    if handle.get("backend") != BACKEND or handle.get("format") != FORMAT:
        raise RestoreError(
            f"cannot restore a {handle.get('backend')!r} snapshot ({handle.get('format')}) "
            "into the RocksDB backend"
        )


def _link_or_copy(src: Path, dest: Path) -> None:
    """Hard-link an immutable SST file (RocksDB never writes to one), else copy it."""
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)


def materialize(handle: dict[str, Any], job_dir: Path, dest: Path) -> None:
    """Lay the files of ``handle`` out in ``dest`` (created; must not exist) under their
    RocksDB names, so that ``dest`` opens as the snapshot's database.

    Raises:
        RestoreError: if a file is missing or unreadable.
        UnsafePathError: if a ``db_files`` name is not a plain file name, or its path leaves
            ``job_dir``.
    """
    dest.mkdir(parents=True)
    try:
        for name, rel in handle["db_files"].items():
            # names and paths come from the (possibly crafted) metadata: a RocksDB file name
            # is one component, its path stays under the job directory
            check_name(name, f"RocksDB snapshot handle (db_files of {job_dir})")
            src = resolve_under(job_dir, rel, "RocksDB snapshot handle (db_files)")
            if name.endswith(".sst"):
                _link_or_copy(src, dest / name)
            else:
                # MANIFEST and friends are appended to when the DB opens: never share them
                shutil.copyfile(src, dest / name)
    except (OSError, KeyError) as exc:
        raise RestoreError(f"cannot read RocksDB snapshot files from {job_dir}: {exc}") from exc
