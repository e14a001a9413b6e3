"""The compressor contract stays narrow (issue 34): `Compressor` is its core plus at most `MAX_EXTRAS` members a
plugin may override; what one plugin alone needs is a capability of its own, beside the contract (`Routes`,
`RemovesChannels`, `RemovesBranch`, `UsesAnalyses`: the structural analyses its menus read), that a compressor class
lists next to `Compressor`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from modelopt.compressors import COMPRESSORS
from modelopt.compressors.contract import Compressor, RemovesBranch, RemovesChannels, Routes, UsesAnalyses

# What every compressor is: its name and place in a layer's chain, the menu, a choice's hand-written form,
# apply, the weight's bytes, its part of the stored form for export, and its options for run records.
CORE = frozenset({"name", "order", "menu", "parse", "dump", "apply", "weight_bytes", "pack", "options"})
MAX_EXTRAS = 8
CAPABILITIES = (Routes, RemovesChannels, RemovesBranch, UsesAnalyses)


def _members(cls: type) -> set[str]:
    """Every public name `cls` itself declares: methods, class variables with a value, annotated ones without."""
    return {n for n in (*vars(cls), *vars(cls).get("__annotations__", {})) if not n.startswith("_")}


def test_compressor_is_its_core_and_a_few_overridable_extras() -> None:
    members = _members(Compressor)
    assert members >= CORE, f"core members missing: {sorted(CORE - members)}"
    extras = sorted(members - CORE)
    assert len(extras) <= MAX_EXTRAS, f"{len(extras)} overridable members beyond the core: {extras}"


def test_a_plugin_must_write_only_core_members() -> None:
    assert Compressor.__abstractmethods__ <= CORE


@pytest.mark.parametrize("capability", CAPABILITIES, ids=lambda c: c.__name__)
def test_capabilities_add_nothing_to_the_contract_and_serve_a_registered_compressor(capability: type) -> None:
    assert not issubclass(capability, Compressor)
    assert not _members(capability) & _members(Compressor)
    assert any(issubclass(COMPRESSORS.get(n), capability) for n in COMPRESSORS.names())


def test_a_plugin_is_named_by_registering_it_once() -> None:
    from modelopt._registry import Registry, named

    registry: Registry[type[Compressor]] = Registry("compressor", None, named("compressor"))

    class Round(Compressor):  # abstract members are never called here
        pass

    registry.register("round1")(Round)
    assert Round.name == "round1" and registry.get("round1") is Round
    assert all(COMPRESSORS.get(n).name == n for n in COMPRESSORS.names())

    class Misnamed(Compressor):
        name = "round2"

    with pytest.raises(ValueError, match="says name = 'round2' but is registered as 'round3'"):
        registry.register("round3")(Misnamed)


REPO = Path(__file__).resolve().parents[2]


def test_only_the_package_imports_its_underscore_modules() -> None:
    """Outside modelopt/compressors/, tests, docs and benchmarks import the public contract (`contract.py`, or the
    package) as a plugin does (issue 45): the underscore modules behind it may move."""
    private = re.compile(r"modelopt\.compressors(\._|\s+import\s+_)")
    files = [p for d in ("modelopt", "tests", "docs", "benchmarks") for p in sorted((REPO / d).rglob("*"))
             if p.suffix in (".py", ".md") and not p.relative_to(REPO).parts[:2] == ("modelopt", "compressors")]
    bad = [f"{p.relative_to(REPO)}:{i}" for p in [*files, REPO / "README.md"]
           for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if private.search(line)]
    assert not bad, "underscore modules of modelopt.compressors imported from outside it:\n" + "\n".join(bad)
