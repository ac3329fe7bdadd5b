"""The time-to-live configuration of a state descriptor (Flink's ``StateTtlConfig``); the
TTL states themselves are in :mod:`reactive.state.ttl`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, Protocol

from ..errors import ConfigurationError

__all__ = ["StateTtlConfig", "TtlTimeCharacteristic", "TtlTimeProvider", "TtlUpdateType",
           "TtlVisibility"]

TtlUpdateType = Literal["on_create_and_write", "on_read_and_write"]
TtlVisibility = Literal["never_return_expired", "return_expired_if_not_cleaned_up"]
TtlTimeCharacteristic = Literal["processing_time", "event_time"]


class TtlTimeProvider(Protocol):
    """Where a state's time to live reads processing time (Flink's ``TtlTimeProvider``):
    every processing-time clock is one (:class:`reactive.time.clock.ProcessingClock`)."""

    def now(self) -> float:
        """Current processing time (seconds since the epoch)."""
        ...


@dataclass(frozen=True)
class StateTtlConfig:
    """How a state's entries expire (Flink's ``StateTtlConfig``).

    Attributes:
        ttl: seconds an entry lives after its last write (or access, see ``update_type``);
            > 0.
        update_type: ``"on_create_and_write"`` (Flink's ``OnCreateAndWrite``, the default):
            writes restart an entry's time to live; ``"on_read_and_write"``: reads that
            return it do too.
        visibility: ``"never_return_expired"`` (the default) or
            ``"return_expired_if_not_cleaned_up"`` (an expired entry still present is
            returned once, by the access that removes it).
        time_characteristic: ``"processing_time"`` (the default) or ``"event_time"`` (the
            operator's watermark; keyed process functions only).
        clock: the processing-time clock to read (None: the operator's, else the system's);
            tests pass a :class:`reactive.time.clock.ManualClock`.

    Raises:
        ConfigurationError: if ``ttl`` is not a positive finite number of seconds or an
            option is unknown.
    """

    ttl: float
    update_type: TtlUpdateType = "on_create_and_write"
    visibility: TtlVisibility = "never_return_expired"
    time_characteristic: TtlTimeCharacteristic = "processing_time"
    clock: TtlTimeProvider | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.ttl, bool) or not isinstance(self.ttl, int | float) or \
                not (self.ttl > 0 and math.isfinite(self.ttl)):
            raise ConfigurationError(
                f"a state's ttl must be a positive number of seconds, got {self.ttl!r}")
        for name, value, allowed in (
                ("update_type", self.update_type, ("on_create_and_write", "on_read_and_write")),
                ("visibility", self.visibility,
                 ("never_return_expired", "return_expired_if_not_cleaned_up")),
                ("time_characteristic", self.time_characteristic,
                 ("processing_time", "event_time"))):
            if value not in allowed:
                raise ConfigurationError(f"StateTtlConfig.{name} must be one of {allowed}, "
                                         f"got {value!r}")
