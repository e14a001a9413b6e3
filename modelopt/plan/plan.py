"""Decisions and plans: one choice for every decision, frozen, hashable, with a stable key."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from enum import Enum
from functools import cached_property
from typing import Any

from modelopt.compressors.contract import Choice

PLAN_VERSION = 1


@dataclass(frozen=True)
class Decision:
    """One decision of the search space: a compressor's choice for one layer.

    Model-level settings (early exit's shared threshold) are per-layer decisions too; the plan
    file's top-level keys write them in one place (`modelopt.plan.file`).
    """

    name: str  # "<layer>/<compressor>"
    compressor: str
    layer: str
    choices: tuple[Choice, ...]


def decision_name(layer: str, compressor: str) -> str:
    return f"{layer}/{compressor}"


def jsonable(choice: Choice, *, for_key: bool = False) -> Any:
    """A JSON-ready form of a choice (frozen dataclasses of scalars and str enums); `for_key`: the
    form `Plan.key` hashes (fields marked ``omit_default`` left out at their default)."""
    if choice is None or isinstance(choice, (bool, int, float, str)):
        return choice.value if isinstance(choice, Enum) else choice
    if dataclasses.is_dataclass(choice):
        return {f.name: jsonable(getattr(choice, f.name), for_key=for_key) for f in dataclasses.fields(choice)
                if not (for_key and f.metadata.get("key") == "omit_default" and getattr(choice, f.name) == f.default)}
    if isinstance(choice, tuple):
        return [jsonable(c, for_key=for_key) for c in choice]
    raise TypeError(f"choice {choice!r} is not JSON-serialisable")


@dataclass(frozen=True)
class Plan:
    """One choice for every decision of a search space, in the space's order.

    Build plans through `SearchSpace.plan(...)` or `SearchSpace.parse_plan(...)`;
    write them with `SearchSpace.dump_plan` (the hand-writable YAML form).
    """

    choices: tuple[tuple[str, Choice], ...]

    @cached_property
    def _lookup(self) -> dict[str, Choice]:
        return dict(self.choices)

    def __getitem__(self, decision: str) -> Choice:
        return self._lookup[decision]

    def get(self, decision: str, default: Choice = None) -> Choice:
        return self._lookup.get(decision, default)

    def to_flat(self) -> dict[str, Any]:
        """{decision name: JSON form of the choice}: the journal's form."""
        return {name: jsonable(c) for name, c in self.choices}

    @cached_property
    def key(self) -> str:
        """A stable 16-hex-digit key: equal plans have equal keys across processes and versions.

        A choice field added later with `metadata={"key": "omit_default"}` is left out of the key
        while it holds its default, so plans saved before it existed keep their keys.
        """
        flat = {name: jsonable(c, for_key=True) for name, c in self.choices}
        blob = json.dumps(sorted(flat.items()), sort_keys=True, separators=(",", ":"))
        return hashlib.sha1(blob.encode()).hexdigest()[:16]

    def __repr__(self) -> str:
        active = sum(c is not None for _, c in self.choices)
        return f"Plan(key={self.key}, {active}/{len(self.choices)} decisions active)"
