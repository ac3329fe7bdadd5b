"""Optional dependencies: importing one, or failing with the extra that installs it.

The core (the runtime, the heap backend, collections and JSON-lines files) needs only msgpack
and mmh3; each other feature names its extra in ``pyproject.toml`` (``rocksdb``, ``parquet``,
``spark``, ``examples`` ...), and :func:`require` turns a missing package into an error that
says which one to install.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from .errors import MissingExtraError

__all__ = ["require"]


def require(module: str, extra: str, feature: str) -> ModuleType:
    """Import ``module`` for ``feature``.

    Args:
        module: the module to import (``"rocksdict"``, ``"pyspark.sql"`` ...).
        extra: the extra of the distribution that installs it.
        feature: what needs it, for the message (``"the RocksDB state backend"``).

    Returns:
        the module.

    Raises:
        MissingExtraError: when it cannot be imported, naming ``pip install 'reactive[extra]'``.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(feature, module.split(".")[0], extra) from exc
