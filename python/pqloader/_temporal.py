"""Typed temporal literals of the string filter syntax (``timestamp('2024-01-01')``,
``date(...)``, ``time(...)``, ``duration(90, 's')``): the pyarrow scalar of the same
``datetime``, ``date``, ``time`` or ``timedelta``, compared as pyarrow compares those
(``_filter.parse_filter`` documents the syntax). A leaf module: imports nothing of pqloader.
"""

from __future__ import annotations

import re
from typing import Any

_DATE = r"(\d{4})-(\d{2})-(\d{2})"
_TIME = r"(\d{2}):(\d{2})(?::(\d{2})(?:\.(\d{1,9}))?)?"
_OFFSET = r"([+-])(\d{2})(?::?(\d{2}))?"
_DATE_RE = re.compile(_DATE, re.ASCII)
_TIME_RE = re.compile(_TIME, re.ASCII)
_TIMESTAMP_RE = re.compile(rf"{_DATE}(?:[Tt ]{_TIME})?(Z|z|{_OFFSET})?", re.ASCII)
_OFFSET_RE = re.compile(_OFFSET, re.ASCII)
_UNITS = ("s", "ms", "us", "ns")
_TIMESTAMP_FORM = "'YYYY-MM-DD[ HH:MM[:SS[.fraction]]][Z|+HH:MM]'"
_TIME_FORM = "'HH:MM[:SS[.fraction]]'"


class Typed:
    """A typed literal of the string syntax: a pyarrow type and its integer value
    (a count of its unit: days, seconds, ... nanoseconds)."""

    __slots__ = ("kind", "unit", "tz", "value")

    def __init__(self, kind: str, unit: str, value: int, tz: str | None = None) -> None:
        self.kind, self.unit, self.value, self.tz = kind, unit, value, tz

    def arrow_type(self) -> Any:
        import pyarrow as pa
        if self.kind == "timestamp":
            return pa.timestamp(self.unit, self.tz)
        if self.kind == "date":
            return pa.date32()
        if self.kind == "time":
            return pa.time64(self.unit)
        return pa.duration(self.unit)

    def scalar(self) -> Any:
        import pyarrow as pa
        return pa.scalar(self.value, self.arrow_type())


def _offset(sign: str, hours: str, minutes: str | None) -> Any:
    import datetime as dt
    delta = dt.timedelta(hours=int(hours), minutes=int(minutes or 0))
    if delta >= dt.timedelta(hours=24) or (minutes is not None and int(minutes) >= 60):
        raise ValueError(f"{sign}{hours}:{minutes or '00'} is no offset (hours below 24, minutes below 60)")
    return dt.timezone(-delta if sign == "-" else delta)


def _zone(name: str) -> tuple[Any, str]:
    """The tzinfo of a zone argument and its name as an Arrow type holds it."""
    m = _OFFSET_RE.fullmatch(name)
    if m:
        sign, hours, minutes = m.groups()
        return _offset(sign, hours, minutes), f"{sign}{hours}:{minutes or '00'}"
    import zoneinfo
    try:
        return zoneinfo.ZoneInfo(name), name
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError):
        raise ValueError(f"no time zone {name!r} (a zone such as 'Europe/Paris' or 'UTC', "
                         "or an offset such as '+02:00')") from None


def _fraction(text: str | None) -> tuple[str, int]:
    """The unit a fraction of a second needs (us, or ns past 6 digits) and its value in it."""
    if not text:
        return "us", 0
    if len(text) > 6:
        return "ns", int(text.ljust(9, "0"))
    return "us", int(text.ljust(6, "0"))


def _timestamp(text: str, zone: str | None) -> Typed:
    import datetime as dt
    m = _TIMESTAMP_RE.fullmatch(text)
    if m is None:
        raise ValueError(f"not a timestamp: write {_TIMESTAMP_FORM}")
    y, mo, d, hh, mm, ss, frac, offset, sign, oh, om = m.groups()
    wall = dt.datetime(int(y), int(mo), int(d), int(hh or 0), int(mm or 0), int(ss or 0))
    unit, sub = _fraction(frac)
    tz = None
    if offset is not None:  # an instant: its zone (UTC, or the one named) does not move it
        at = wall.replace(tzinfo=dt.timezone.utc if offset in "Zz" else _offset(sign, oh, om))
        tz = _zone(zone)[1] if zone is not None else "UTC"
    elif zone is not None:  # a wall-clock time in that zone
        info, tz = _zone(zone)
        at = wall.replace(tzinfo=info)
        try:
            back = at.astimezone(dt.timezone.utc).astimezone(info).replace(tzinfo=None)
        except OverflowError:  # (0001-01-01 00:00 in Europe/Paris is in year 0 in UTC)
            raise ValueError(f"{wall} in {tz} is past the years 1 to 9999 in UTC (write it with an "
                             "offset instead: 'YYYY-MM-DDTHH:MM+HH:MM')") from None
        if back != wall:
            raise ValueError(f"{wall} does not exist in {tz} (its clocks skip it)")
        if at.utcoffset() != wall.replace(tzinfo=info, fold=1).utcoffset():
            raise ValueError(f"{wall} is ambiguous in {tz} (its clocks pass it twice): write its "
                             "offset, e.g. '2024-10-27 02:30+01:00'")
    else:
        at = wall
    epoch = dt.datetime(1970, 1, 1, tzinfo=None if at.tzinfo is None else dt.timezone.utc)
    seconds = (at - epoch) // dt.timedelta(seconds=1)
    value = seconds * (10**9 if unit == "ns" else 10**6) + sub
    if unit == "ns" and not -2**63 <= value < 2**63:
        raise ValueError("past the range of a timestamp in nanoseconds (1677-09-21 to 2262-04-11): "
                         "give at most 6 digits of a second")
    return Typed("timestamp", unit, value, tz)


def _date(text: str) -> Typed:
    import datetime as dt
    if _DATE_RE.fullmatch(text) is None:
        raise ValueError("not a date: write 'YYYY-MM-DD'")
    return Typed("date", "day", (dt.date.fromisoformat(text) - dt.date(1970, 1, 1)).days)


def _time(text: str) -> Typed:
    import datetime as dt
    m = _TIME_RE.fullmatch(text)
    if m is None:
        raise ValueError(f"not a time of day: write {_TIME_FORM}")
    hh, mm, ss, frac = m.groups()
    dt.time(int(hh), int(mm), int(ss or 0))  # checks the ranges (hour 24, second 60)
    unit, sub = _fraction(frac)
    seconds = int(hh) * 3600 + int(mm) * 60 + int(ss or 0)
    return Typed("time", unit, seconds * (10**9 if unit == "ns" else 10**6) + sub)


def _duration(count: Any, unit: Any) -> Typed:
    if not isinstance(count, int) or isinstance(count, bool):
        raise ValueError(f"the count is {type(count).__name__} {count!r}, not an integer")
    if unit not in _UNITS:
        raise ValueError(f"the unit is {unit!r}, not one of {', '.join(map(repr, _UNITS))}")
    if not -2**63 <= count < 2**63:
        raise ValueError(f"{count} is past the range of a duration (64 bits)")
    return Typed("duration", unit, count)


# name: (the function, its text arguments' count bounds, the form shown in errors)
TYPED = {
    "timestamp": (lambda text, zone=None: _timestamp(text, zone), (1, 2), f"timestamp({_TIMESTAMP_FORM}[, zone])"),
    "date": (_date, (1, 1), "date('YYYY-MM-DD')"),
    "time": (_time, (1, 1), f"time({_TIME_FORM})"),
    "duration": (_duration, (2, 2), "duration(count, 's'|'ms'|'us'|'ns')"),
}


def same_type(values: list[Typed]) -> list[Typed]:
    """The typed literals of one list in one type (the finest unit of theirs), or an error."""
    kinds = {v.kind for v in values}
    if len(kinds) > 1:
        raise ValueError(f"the list mixes {' and '.join(sorted(kinds))} values")
    zones = {v.tz for v in values}
    if len(zones) > 1:
        shown = sorted("no time zone" if z is None else z for z in zones)
        raise ValueError(f"the list mixes timestamps of {' and '.join(shown)}")
    order = {u: i for i, u in enumerate(_UNITS)}
    finest = max((v.unit for v in values), key=lambda u: order.get(u, 0))
    out = []
    for v in values:
        if v.unit == finest:
            out.append(v)
            continue
        value = v.value * 1000 ** (order[finest] - order[v.unit])
        if not -2**63 <= value < 2**63:
            raise ValueError(f"{v.scalar()} is past the range of {finest} the list's other values need")
        out.append(Typed(v.kind, finest, value, v.tz))
    return out
