"""The one place where ``reactive`` reaches into ``reactive.backends`` and ``reactive.connectors``.

The built-in backends and connectors are loaded by name when first used (as Flink's
``StateBackendLoader`` loads a backend named in the configuration), so ``import reactive``
never imports the packages that depend on it (ARCHITECTURE.md, "Layers and the rules between
them"): the runtime names them, it does not import them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, cast

from .sinks import Sink
from .sources import Source
from .state.backend import StateBackend

__all__ = [
    "builtin",
    "callback_sink",
    "collection_source",
    "default_state_backend",
    "line_file_source",
    "register_builtin_key_group_readers",
]


def builtin(reference: str) -> Any:
    """The object a ``"module:attribute"`` reference names, e.g.
    ``"reactive.backends.heap:HeapStateBackend"``.

    Raises:
        ImportError: the module (or a library it needs, see :mod:`reactive.extras`) is missing.
        AttributeError: the module has no such attribute.
    """
    module, _, attribute = reference.partition(":")
    loaded = importlib.import_module(module)
    return getattr(loaded, attribute) if attribute else loaded


def default_state_backend() -> StateBackend:
    """The heap backend (``reactive.backends.heap.HeapStateBackend``)."""
    return cast(StateBackend, builtin("reactive.backends.heap:HeapStateBackend")())


def register_builtin_key_group_readers() -> None:
    """Register the readers of the built-in snapshot formats (heap, RocksDB) in
    :mod:`reactive.state.key_group_stream`, so that any backend, a third party's included,
    can restore a checkpoint written by a built-in one (importing ``reactive.backends`` does
    it)."""
    builtin("reactive.backends")


def collection_source(items: Iterable[Any]) -> Source:
    """``reactive.connectors.collections.CollectionSource(items)``."""
    return cast(Source, builtin("reactive.connectors.collections:CollectionSource")(items))


def line_file_source(path: Path, with_offsets: bool, errors: str = "fail") -> Source:
    """``reactive.connectors.files.LineFileSource(path, with_offsets=..., errors=...)``."""
    factory = builtin("reactive.connectors.files:LineFileSource")
    return cast(Source, factory(path, with_offsets=with_offsets, errors=errors))


def callback_sink(fn: Callable[[Any], Any]) -> Sink:
    """``reactive.connectors.collections.CallbackSink(fn)``."""
    return cast(Sink, builtin("reactive.connectors.collections:CallbackSink")(fn))
