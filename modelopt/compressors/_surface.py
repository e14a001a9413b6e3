"""What a compressor shows users, declared in its own class: the settings they may give it (each a
command-line flag, a sweep-file key, a keyword of `modelopt.optimize` and a field of run.json under the
compressor's options; derived from its options record, `modelopt.compressors._options`) and the columns it adds
to the per-layer map of a report.

A compressor written in one file gets all of these from that file (`Compressor.record`,
`Compressor.report_columns`); nothing outside `modelopt/compressors/` names it.

Example:
    >>> class Round(Compressor):
    ...     record = RoundOptions  # decimals: int = option(1, SettingKind.INT, "Decimals weights are rounded to.")
    ...     report_columns = (ReportColumn("rounded", "Greens", lambda raw: Cell("off", None) if raw is None
    ...                                    else Cell(f"{raw['decimals']}dp", 0.5)),)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

from modelopt.errors import ConfigError

__all__ = ["Cell", "ReportColumn", "Setting", "SettingKind", "enum_member"]

E = TypeVar("E", bound=Enum)


def enum_member(enum: type[E], value: object, what: str, where: str) -> E:
    """`value` as a member of `enum`; a ConfigError naming it and the valid values otherwise."""
    try:
        return enum(value)
    except ValueError:
        valid = ", ".join(m.value for m in enum)
        raise ConfigError(f"{where}: {what} {value!r} not offered; valid: {valid}") from None


class SettingKind(str, Enum):
    """How a setting's value is written: on the command line (comma-separated) and in YAML / JSON."""

    INTS = "ints"  # a list of integers: 8,4 / [8, 4]
    FLOATS = "floats"  # a list of numbers: 0.25,0.5 / [0.25, 0.5]
    NAMES = "names"  # a list of names: per_channel,group / [per_channel, group]
    BITS = "bits"  # a list of bit widths or none (float): none,8 / [null, 8]
    INT = "int"  # one integer: 64
    PATH = "path"  # a file (in a sweep file, relative to the file's folder)


_FORMS = {
    SettingKind.INTS: "a list of integers like [8, 4]",
    SettingKind.FLOATS: "a list of numbers like [0.25, 0.5]",
    SettingKind.NAMES: "a list of names like [per_channel, group]",
    SettingKind.BITS: "a list of bit widths or null like [null, 8]",
    SettingKind.INT: "an integer like 64",
    SettingKind.PATH: "a path like ../data/train.npz",
}


_LISTS = (SettingKind.INTS, SettingKind.FLOATS, SettingKind.NAMES, SettingKind.BITS)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _list_of(item: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, list) and bool(v) and all(item(x) for x in v)


def _is_path(v: Any) -> bool:
    return isinstance(v, str) and bool(v.strip()) and "\x00" not in v


# Whether a value (in its JSON form, lists for the list kinds) has the kind's form.
_ACCEPTS: dict[SettingKind, Callable[[Any], bool]] = {
    SettingKind.INTS: _list_of(_is_int),
    # An empty list of numbers is a choice (quantize's rates: none offered); records refuse one where it is not.
    SettingKind.FLOATS: lambda v: isinstance(v, list) and all(_is_number(x) for x in v),
    SettingKind.NAMES: _list_of(lambda x: isinstance(x, str)),
    SettingKind.BITS: _list_of(lambda x: x is None or _is_int(x)),
    SettingKind.INT: _is_int,
    SettingKind.PATH: _is_path,
}


def _bits(text: str) -> int | None:
    return None if text.lower() in ("none", "null", "float") else int(text)


@dataclass(frozen=True)
class Setting:
    """One option of a compressor that users set by name (a field of its options record, `Options.settings`).

    Attributes:
        option: The record's field, also the keyword, the sweep-file key and run.json's field.
        kind: How its value is written (`SettingKind`).
        help: The command line's help text (its default is the record's: `Options.for_objective`).
    """

    option: str
    kind: SettingKind
    help: str

    @property
    def flag(self) -> str:
        """The command-line flag: ``--exit-data`` for option ``exit_data``."""
        return "--" + self.option.replace("_", "-")

    def from_text(self, text: str) -> Any:
        """The value a command-line flag gives, in its JSON form; ConfigError naming the flag otherwise."""
        try:
            if self.kind is SettingKind.INT:
                return int(text)
            if self.kind is SettingKind.PATH:
                return str(text)
            parsers: dict[SettingKind, Callable[[str], Any]] = {SettingKind.INTS: int, SettingKind.FLOATS: float,
                                                                 SettingKind.NAMES: str, SettingKind.BITS: _bits}
            parse = parsers[self.kind]
            items = [parse(v.strip()) for v in text.split(",") if v.strip()]
        except ValueError:
            raise ConfigError(f"{self.flag} expects {_FORMS[self.kind]}; got {text!r}") from None
        if not items:
            raise ConfigError(f"{self.flag} is empty; it expects {_FORMS[self.kind]}")
        return items

    def check(self, value: Any, where: str) -> Any:
        """`value` (from YAML, JSON or a keyword) in its JSON form (lists for tuples, str for paths);
        ConfigError saying that `where` expects this setting's form otherwise."""
        if isinstance(value, Path) and self.kind is SettingKind.PATH:
            return str(value)
        if isinstance(value, tuple):
            value = list(value)
        elif self.kind in _LISTS and not isinstance(value, list):
            value = [value]  # one value where a list is expected: a list of one
        if not _ACCEPTS[self.kind](value):
            raise ConfigError(f"{where} expects {_FORMS[self.kind]}; got {value!r}")
        return [x.value if isinstance(x, Enum) else x for x in value] if isinstance(value, list) else value


@dataclass(frozen=True)
class Cell:
    """What one report column shows for one layer."""

    label: str
    level: float | None  # position on the column's colour scale in [0, 1]; None: the compressor leaves the layer alone


@dataclass(frozen=True)
class ReportColumn:
    """A column a compressor adds to the per-layer map of a report: its header, a matplotlib colormap, and
    how the JSON form of its choice (None when off) becomes a cell."""

    title: str
    cmap: str
    cell: Callable[[Any], Cell]
