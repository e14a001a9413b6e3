"""Conformance checks every registered compressor must pass, on synthetic layers.

Each check takes a compressor instance and the layers to try it on, and raises
AssertionError naming the compressor, layer and choice that broke the contract.

Example:
    >>> from modelopt.compressors import Quantize
    >>> check_compressor(Quantize(), synthetic_layers())
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import torch
import yaml

from modelopt.compressors.contract import BranchAnalysis, Choice, Compressor
from modelopt.model.layers import Layer, LayerKind
from modelopt.plan.plan import jsonable

__all__ = [
    "check_apply",
    "check_compressor",
    "check_menu",
    "check_round_trip",
    "check_weight_bytes",
    "synthetic_layers",
    "synthetic_weight",
]


def synthetic_layers() -> tuple[Layer, ...]:
    """Small layers covering the shapes compressors trip on: fan_in below, at and above common group sizes."""
    return (
        Layer("conv", LayerKind.CONV, (16, 16, 3, 3), 16 * 144 * 64, False),
        Layer("stem", LayerKind.CONV, (16, 3, 3, 3), 16 * 27 * 1024, False),  # fan_in 27 < a group
        Layer("fc", LayerKind.LINEAR, (10, 64), 640, True),  # fan_in exactly one group of 64
        Layer("wide", LayerKind.CONV, (64, 32, 3, 3), 64 * 288 * 16, False),  # 288 = 4.5 groups of 64
        # The last layer of a residual branch (depth removes the branch).
        Layer("block.conv2", LayerKind.CONV, (16, 16, 3, 3), 16 * 144 * 64, False).noted(
            {BranchAnalysis.name: ("block.conv1", "block.conv2")}),
    )


def synthetic_weight(layer: Layer, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A seeded Kaiming-scaled Gaussian weight of `layer`'s shape."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(layer.weight_shape, generator=g, dtype=torch.float64) * (2.0 / layer.fan_in) ** 0.5
    return w.to(dtype)


def _where(comp: Compressor, layer: Layer, choice: Choice = None) -> str:
    return f"{comp.name} on {layer.name} {tuple(layer.weight_shape)}" + ("" if choice is None else f", {choice!r}")


def check_menu(comp: Compressor, layer: Layer) -> tuple[Choice, ...]:
    """The menu is a tuple of hashable choices, None (off) first, no duplicates, stable across calls."""
    menu = comp.menu(layer)
    assert isinstance(menu, tuple), f"{_where(comp, layer)}: menu must be a tuple, got {type(menu).__name__}"
    if not menu:
        return menu  # the compressor does not handle this layer
    assert menu[0] is None, f"{_where(comp, layer)}: menu must start with None (off), got {menu[0]!r}"
    for c in menu:
        try:
            hash(c)
        except TypeError:
            raise AssertionError(f"{_where(comp, layer, c)}: choice is not hashable") from None
    assert len(set(menu)) == len(menu), f"{_where(comp, layer)}: menu has duplicates: {menu!r}"
    assert sum(c is None for c in menu) == 1, f"{_where(comp, layer)}: None appears more than once"
    assert comp.menu(layer) == menu, f"{_where(comp, layer)}: menu differs between two calls"
    return menu


def check_round_trip(comp: Compressor, layer: Layer) -> None:
    """`parse` inverts `dump` (the YAML form) and the journal's JSON form of every choice."""
    assert comp.dump(None) is None, f"{comp.name}: dump(None) must be None, got {comp.dump(None)!r}"
    assert comp.parse(None, layer) is None, f"{_where(comp, layer)}: parse(None) must be None (off)"
    for c in comp.menu(layer):
        raw = comp.dump(c)
        # The hand-writable form must survive YAML, the plan file format.
        assert yaml.safe_load(yaml.safe_dump(raw)) == raw, f"{_where(comp, layer, c)}: dump {raw!r} is not plain YAML"
        back = comp.parse(raw, layer)
        assert back == c, f"{_where(comp, layer, c)}: parse(dump(c)) gave {back!r}"
        assert hash(back) == hash(c), f"{_where(comp, layer, c)}: equal choices hash differently"
        # SearchSpace.plan_from_flat parses the journal's JSON form with the same `parse`.
        flat = json.loads(json.dumps(jsonable(c)))
        back = comp.parse(flat, layer)
        assert back == c, f"{_where(comp, layer, c)}: parse(jsonable(c)) gave {back!r}"


def check_apply(comp: Compressor, layer: Layer, seed: int = 0) -> None:
    """`apply` keeps shape and dtype, is deterministic, leaves its input alone; None is the identity."""
    for dtype in (torch.float32, torch.float64):
        w = synthetic_weight(layer, seed, dtype)
        before = w.clone()
        out = comp.apply(w, None)
        assert out.dtype == w.dtype and torch.equal(out, before), f"{_where(comp, layer)}: apply(w, None) changed w"
        for c in comp.menu(layer)[1:]:
            a = comp.apply(w, c)
            assert isinstance(a, torch.Tensor), f"{_where(comp, layer, c)}: apply returned {type(a).__name__}"
            assert a.shape == w.shape, f"{_where(comp, layer, c)}: shape {tuple(a.shape)} != {tuple(w.shape)}"
            assert a.dtype == w.dtype, f"{_where(comp, layer, c)}: dtype {a.dtype} != {w.dtype}"
            assert torch.isfinite(a).all(), f"{_where(comp, layer, c)}: apply gave non-finite values"
            assert torch.equal(w, before), f"{_where(comp, layer, c)}: apply modified its input in place"
            b = comp.apply(w.clone(), c)
            assert torch.equal(a, b), f"{_where(comp, layer, c)}: apply is not deterministic"


def check_weight_bytes(comp: Compressor, layer: Layer) -> None:
    """Off costs float32 bytes; every choice is an int no larger; bits are 32 when off."""
    float_bytes = layer.params * 4
    got = comp.weight_bytes(layer, None)
    assert got == float_bytes, f"{_where(comp, layer)}: weight_bytes(None) = {got}, float32 is {float_bytes}"
    off = comp.precision(None)
    assert off.weight == 32 and off.activation == 32, f"{comp.name}: precision(None) must be float (32, 32), got {off}"
    for c in comp.menu(layer)[1:]:
        n = comp.weight_bytes(layer, c)
        assert isinstance(n, int) and not isinstance(n, bool), f"{_where(comp, layer, c)}: weight_bytes {n!r} not int"
        assert 0 < n <= float_bytes, f"{_where(comp, layer, c)}: weight_bytes {n} not in (0, {float_bytes}]"
        bits = comp.precision(c).weight
        assert isinstance(bits, int) and 1 <= bits <= 32, f"{_where(comp, layer, c)}: precision(c).weight {bits!r}"


def check_compressor(comp: Compressor, layers: Sequence[Layer] | None = None) -> None:
    """Runs every check on every layer (the synthetic ones when `layers` is None).

    Args:
        comp: an instance of the compressor under test.
        layers: layers to try it on.
    """
    assert isinstance(comp, Compressor), f"{comp!r} is not a Compressor"
    assert isinstance(comp.name, str) and comp.name, f"{type(comp).__name__}.name must be a non-empty string"
    json.dumps(comp.options())  # run records store the options
    for layer in synthetic_layers() if layers is None else layers:
        check_menu(comp, layer)
        check_round_trip(comp, layer)
        check_apply(comp, layer)
        check_weight_bytes(comp, layer)
