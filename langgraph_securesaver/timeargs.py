"""Time arguments: every ``now=``/``since=``/``until=`` takes epoch seconds or an aware datetime.

A naive ``datetime`` is refused: it names no instant (is it UTC? the server's zone?), and
guessing would move a retention deadline or an audit window by hours.
"""

from __future__ import annotations

import math
import time
from datetime import date, datetime, timezone
from typing import Any

from .errors import ConfigurationError


def to_epoch(value: Any, what: str = "a time") -> float | None:
    """Epoch seconds for ``value`` (None stays None): an int/float or an aware datetime."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ConfigurationError(f"{what} must be epoch seconds or an aware datetime, got a bool")
    if isinstance(value, (int, float)):
        seconds = float(value)
        if not math.isfinite(seconds):
            raise ConfigurationError(f"{what} must be a finite number of epoch seconds")
        return seconds
    if isinstance(value, datetime):
        if value.tzinfo is None or value.tzinfo.utcoffset(value) is None:
            raise ConfigurationError(
                f"{what} is a naive datetime: give it a timezone "
                "(datetime(..., tzinfo=timezone.utc)) or pass epoch seconds")
        return value.timestamp()
    if isinstance(value, date):
        raise ConfigurationError(
            f"{what} is a date without a time and zone: pass an aware datetime or epoch seconds")
    raise ConfigurationError(
        f"{what} must be epoch seconds or an aware datetime, got {type(value).__name__}")


def iso(ts: float | None) -> str | None:
    """Epoch seconds as the reports print them: ISO 8601 in UTC to the second."""
    if ts is None:
        return None
    try:  # the same text as datetime.isoformat(timespec="seconds") in UTC, 4x faster
        return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(ts))
    except (OverflowError, OSError, ValueError):
        try:
            return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat(timespec="seconds")
        except (OverflowError, OSError, ValueError):
            return repr(ts)   # no date (a registry row edited to 1e20 or NaN): its number
