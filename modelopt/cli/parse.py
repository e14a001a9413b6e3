"""Flag values the command line parses itself: comma-separated lists and on / off."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from modelopt.errors import ConfigError

__all__ = ["csv", "on_off"]

_EXAMPLES = {"mean": "0.485,0.456,0.406", "std": "0.229,0.224,0.225", "compressors": "prune,quantize",
             "floors": "0.995,0.99,0.98,0.97"}


def csv(value: str, cast: Callable[[str], Any], what: str) -> list[Any]:
    """`value` split at commas, each item `cast`; one ConfigError naming --`what` with an example otherwise."""
    try:
        items = [cast(v.strip()) for v in value.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"--{what} expects a comma-separated list like {_EXAMPLES.get(what, '8,4')}; "
                          f"got {value!r}") from None
    if not items:
        raise ConfigError(f"--{what} is empty")
    return items


def on_off(value: str, flag: str) -> bool:
    """`on` / `off` (or true / false) as a bool; one ConfigError naming the flag otherwise."""
    word = value.strip().lower()
    if word in ("on", "true", "yes", "1"):
        return True
    if word in ("off", "false", "no", "0"):
        return False
    raise ConfigError(f"{flag} takes on or off, got {value!r}")
