"""Turning Kafka's bytes into values and back: the named (de)serializers a Kafka source and
sink accept, or any callable."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from reactive.errors import ConfigurationError
from reactive.extras import require

__all__ = ["Deserializer", "Serializer", "SerializerName", "deserializer", "serializer"]

Deserializer = Callable[[bytes], Any]
Serializer = Callable[[Any], bytes]


def _utf8(data: bytes) -> str:
    return data.decode("utf-8")


def _bytes(data: bytes) -> bytes:
    return data


def _str_to_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    raise TypeError(f"the 'str' serializer takes str or bytes, not {type(value).__name__}")


def _orjson() -> Any:
    return require("orjson", "kafka", "JSON records of Kafka")


SerializerName = Literal["bytes", "str", "json"]
"""The built-in (de)serializers of Kafka keys and values, by name."""

_DESERIALIZERS: dict[str, Callable[[], Deserializer]] = {
    "bytes": lambda: _bytes, "str": lambda: _utf8, "json": lambda: _orjson().loads}
_SERIALIZERS: dict[str, Callable[[], Serializer]] = {
    "bytes": lambda: _str_to_bytes, "str": lambda: _str_to_bytes,
    "json": lambda: _orjson().dumps}


def deserializer(spec: SerializerName | Deserializer) -> Deserializer:
    """``"bytes"``, ``"str"`` (UTF-8), ``"json"`` (orjson) or a callable ``bytes -> value``.

    Raises:
        ConfigurationError: on an unknown name.
    """
    if callable(spec):
        return spec
    try:
        make = _DESERIALIZERS[spec]
    except KeyError:
        raise ConfigurationError(f"unknown Kafka deserializer {spec!r}: use one of "
                                 f"{sorted(_DESERIALIZERS)} or a callable") from None
    return make()


def serializer(spec: SerializerName | Serializer) -> Serializer:
    """``"bytes"``/``"str"`` (bytes as they are, str as UTF-8), ``"json"`` (orjson) or a
    callable ``value -> bytes``.

    Raises:
        ConfigurationError: on an unknown name.
    """
    if callable(spec):
        return spec
    try:
        make = _SERIALIZERS[spec]
    except KeyError:
        raise ConfigurationError(f"unknown Kafka serializer {spec!r}: use one of "
                                 f"{sorted(_SERIALIZERS)} or a callable") from None
    return make()
