"""The names of a run's splits, written once.

A member is its name as a string (``Split.VAL == "val"``, the same hash, format and JSON), so run
folders, journals and user input keep reading and writing the plain names.

Example:
    >>> Split("confirm") is Split.CONFIRM, f"{Split.TEST}", Split.VAL in {"val": 1}
    (True, 'test', True)
"""

from __future__ import annotations

from enum import Enum

from modelopt.errors import ConfigError

__all__ = ["Split", "check_split"]


class Split(str, Enum):
    """One part of a run's data, by what it is for."""

    CALIB = "calib"  # calibration and fitting (labels not needed)
    VAL = "val"  # scores the search's plans: its figures are search-time estimates
    CONFIRM = "confirm"  # vouches for the reported plan (`modelopt.certify.confirm`)
    TEST = "test"  # held out for the final report
    ALL = "all"  # val and test together, in source order

    # A plain string in every use: dict keys, f-strings, error messages and JSON (3.10's Enum would hash the
    # member's name and print "Split.VAL").
    __hash__ = str.__hash__
    __str__ = str.__str__
    __repr__ = str.__repr__


def check_split(name: str) -> Split:
    """`name` as a `Split`; one ConfigError naming the valid names otherwise (checkable before any loading)."""
    try:
        return Split(name)
    except ValueError:
        raise ConfigError(f"unknown split {name!r}; valid: {', '.join(Split)}") from None
