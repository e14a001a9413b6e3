"""One family of exceptions whose messages are meant for the user.

The CLI prints a `ModeloptError` as one line and exits non-zero; anything else
is a bug and keeps its traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

TOO_LARGE = "an integer too large for a float"  # how a message names such a value instead of its digits


def beyond_float(value: object) -> bool:
    """An int no float holds (`float()` raises OverflowError: a YAML integer of 400 digits, `10**400` in the API): a
    check that converts it must refuse it, and a message name it as `TOO_LARGE`, not print its digits."""
    if not isinstance(value, int) or isinstance(value, bool):
        return False
    try:
        float(value)
    except OverflowError:
        return True
    return False


class ModeloptError(Exception):
    """Base class: an error the user caused and can fix; the message says how."""


class LoadError(ModeloptError):
    """A model, weights file or data source could not be loaded."""


class ConfigError(ModeloptError):
    """A plan, sweep file or option is malformed or names something that does not exist."""


class UnknownNameError(ConfigError):
    """A registry lookup by name failed."""

    def __init__(self, kind: str, name: object, valid: Iterable[str]) -> None:
        valid = sorted(valid)
        self.kind, self.name, self.valid = kind, name, valid
        hint = difflib.get_close_matches(str(name), valid, n=1)
        near = f" (did you mean {hint[0]!r}?)" if hint else ""
        shown = ", ".join(valid[:40]) + (", ..." if len(valid) > 40 else "")
        super().__init__(f"unknown {kind} {name!r}{near}; valid: {shown}")


class StorageError(ModeloptError):
    """A file could not be written (a full disk, a read-only folder); what was written before stays valid."""


class TrialError(ModeloptError):
    """A trial could not be evaluated (crash or non-finite output); the run records it and goes on."""


class NameClashWarning(UserWarning):
    """Another installed distribution (NVIDIA's nvidia-modelopt) also provides the import name `modelopt`."""
