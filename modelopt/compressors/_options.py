"""A compressor's options as one typed, versioned record (torchao's `AOBaseConfig`): a frozen dataclass whose
fields each have one default, the tool's. The command-line flags, sweep-file keys and `optimize` keywords
(`Options.settings`), the compressor's keywords and run.json's `options` (`to_json`, `from_json`) all come
from it.

A record saved before a default changed still rebuilds as it ran: run.json holds the record's `version`, and
`from_json` reads an older version's left-out fields as that version meant them (`left_out`).

Example:
    >>> @dataclass(frozen=True)
    ... class RoundOptions(Options):
    ...     version: ClassVar[int] = 1
    ...     decimals: int = option(1, SettingKind.INT, "Decimals weights are rounded to.")
    >>> RoundOptions.from_json({"decimals": 2}).to_json()
    {'decimals': 2, 'version': 1}
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from modelopt.compressors._surface import Setting, SettingKind
from modelopt.errors import ConfigError

__all__ = ["Options", "option"]

R = TypeVar("R", bound="Options")


def option(default: Any, kind: SettingKind | None = None, help: str = "",
           by_objective: Mapping[str, Any] | None = None) -> Any:
    """A record field with its one default; with `kind` (and `help`) it is also a user-facing setting (a flag, a
    sweep-file key, an `optimize` keyword), whose default under some objectives is `by_objective`'s instead."""
    meta = {"kind": kind, "help": help, "by_objective": dict(by_objective or {})}
    return dataclasses.field(default=default, metadata=meta)


def _plain(value: Any) -> Any:
    """A value in the record's hashable form: tuples for sequences, strings for enum members and paths."""
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    if isinstance(value, Enum):
        return value.value
    return str(value) if isinstance(value, Path) else value


def _json(value: Any) -> Any:
    return [_json(v) for v in value] if isinstance(value, tuple) else value


@dataclass(frozen=True)
class Options:
    """Base of every compressor's options record; a compressor with nothing to set uses it as it is."""

    # The record's layout; raised when a field's default changes, so older records keep their meaning.
    version: ClassVar[int] = 1
    # {version: {field: value}}: what a record of that version meant by a field it left out, a full snapshot of
    # that version's defaults (version 1: records without a version, written before records had them).
    # A version not listed means today's defaults.
    left_out: ClassVar[Mapping[int, Mapping[str, Any]]] = {}

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, _plain(getattr(self, f.name)))
        self.check()

    def check(self) -> None:
        """Refuses, when the record is built, a value its compressor cannot use: ConfigError naming the field, the
        value and what is right. Each record checks its own fields (nothing to check here)."""

    @classmethod
    def settings(cls) -> tuple[Setting, ...]:
        """The fields users set by name."""
        return tuple(Setting(f.name, f.metadata["kind"], f.metadata["help"])
                     for f in dataclasses.fields(cls) if f.metadata.get("kind") is not None)

    @classmethod
    def for_objective(cls: type[R], objective: str) -> R:
        """The tool's defaults under `objective`."""
        return cls(**{f.name: f.metadata["by_objective"][objective] for f in dataclasses.fields(cls)
                      if objective in f.metadata.get("by_objective", {})})

    def to_json(self) -> dict[str, Any]:
        """Every field in its JSON form, and the record's version."""
        return {**{f.name: _json(getattr(self, f.name)) for f in dataclasses.fields(self)}, "version": self.version}

    @classmethod
    def from_json(cls: type[R], raw: Mapping[str, Any], where: str = "options") -> R:
        """The record `raw` holds: without a `version` it is version 1; a field it leaves out means what its
        version meant (`left_out`), else the field's default.

        Raises:
            ConfigError: a field the record does not have, or a version newer than this modelopt's.
        """
        version = raw.get("version", 1)
        if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= cls.version:
            why = ("it was written by a newer modelopt" if isinstance(version, int) and not isinstance(version, bool)
                   and version > cls.version else "no modelopt writes it: the file was changed by hand")
            raise ConfigError(f"{where}: version {version!r} is not one this modelopt reads (1 to {cls.version}); "
                              f"{why}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - names - {"version"})
        if unknown:
            raise ConfigError(f"{where}: unknown option {unknown[0]!r}; valid: {', '.join(sorted(names))}")
        for f in dataclasses.fields(cls):  # a list field given one value ("bits: 4", "kind: structured")
            if isinstance(f.default, tuple) and f.name in raw and not isinstance(raw[f.name], (list, tuple)):
                raise ConfigError(f"{where}: {f.name} must be a list, e.g. [{json.dumps(raw[f.name])}]; got "
                                  f"{json.dumps(raw[f.name])}")
        values = {k: v for k, v in cls.left_out.get(version, {}).items() if k not in raw}
        return cls(**values, **{k: v for k, v in raw.items() if k != "version"})

    def replace(self: R, **changes: Any) -> R:
        """This record with some fields changed; ConfigError naming a field it does not have."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise ConfigError(f"{type(self).__name__}: unknown option {unknown[0]!r}; valid: "
                              f"{', '.join(sorted(names)) or 'none'}")
        return dataclasses.replace(self, **changes)
