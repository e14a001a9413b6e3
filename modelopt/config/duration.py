"""A run's time budget as people write it: ``90s``, ``2m``, ``1m30s``, ``1.5h``, or a number of seconds."""

from __future__ import annotations

import math
import re

from modelopt.errors import TOO_LARGE, ConfigError, beyond_float

__all__ = ["format_duration", "parse_duration"]

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([smh])")
MIN_SECONDS = 1.0  # less leaves no time to load a model


def parse_duration(value: object, name: str = "time") -> float:
    """Seconds from ``"90s"``, ``"2m"``, ``"1m30s"``, ``"1.5h"`` or a number (seconds).

    Example:
        >>> parse_duration("1m30s"), parse_duration(45)
        (90.0, 45.0)

    Raises:
        ConfigError: anything else, or a duration under a second, naming the value and the forms that are right.
    """
    seconds: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = math.inf if beyond_float(value) else float(value)
    elif isinstance(value, str):
        text = value.strip().lower()
        try:
            seconds = float(text)
        except ValueError:
            parts = _PART.findall(text)
            if parts and _PART.sub("", text).strip() == "" and len({u for _, u in parts}) == len(parts):
                seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if seconds is None or not math.isfinite(seconds) or seconds < MIN_SECONDS:
        shown = TOO_LARGE if beyond_float(value) else repr(value)
        raise ConfigError(f"{name} {shown} is not a duration of a second or more; give e.g. 90s, 2m, 1m30s, 1h "
                          "or a number of seconds")
    return seconds


def format_duration(seconds: float) -> str:
    """``2m30s``, ``45s``, ``1h05m``: how the CLI says a time budget back."""
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s" if s % 60 else f"{s // 60}m"
    return f"{s}s"
