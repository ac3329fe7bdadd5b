"""The one place where ``reactive`` reaches into ``backends`` and ``connectors``.

Imports happen inside the functions, at call time, so that ``import reactive`` never imports
the packages that depend on it (DESIGN.md, dependency direction).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .sinks import Sink
from .sources import Source
from .state.backend import StateBackend

__all__ = [
    "callback_sink",
    "collection_source",
    "default_state_backend",
    "line_file_source",
    "register_builtin_key_group_readers",
]


def default_state_backend() -> StateBackend:
    """The heap backend (``backends.heap.HeapStateBackend``)."""
    from backends.heap import HeapStateBackend

    return HeapStateBackend()


def register_builtin_key_group_readers() -> None:
    """Register the readers of the built-in snapshot formats (heap, RocksDB) in
    :mod:`reactive.state.key_group_stream`, so that any backend, a third party's included,
    can restore a checkpoint written by a built-in one (importing ``backends`` does it)."""
    import backends  # noqa: F401 - registers the readers as a side effect of the import


def collection_source(items: Iterable[Any]) -> Source:
    """``connectors.collections.CollectionSource(items)``."""
    from connectors.collections import CollectionSource

    return CollectionSource(items)


def line_file_source(path: Path, with_offsets: bool, errors: str = "fail") -> Source:
    """``connectors.files.LineFileSource(path, with_offsets=..., errors=...)``."""
    from connectors.files import LineFileSource

    return LineFileSource(path, with_offsets=with_offsets, errors=errors)


def callback_sink(fn: Callable[[Any], Any]) -> Sink:
    """``connectors.collections.CallbackSink(fn)``."""
    from connectors.collections import CallbackSink

    return CallbackSink(fn)
