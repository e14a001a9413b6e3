"""Every registered compressor passes the conformance suite (parametrised over the registry)."""

from __future__ import annotations

import pytest
import torch

from modelopt.compressors import COMPRESSORS
from modelopt.testing.compressors import (
    check_apply,
    check_compressor,
    check_menu,
    check_round_trip,
    check_weight_bytes,
    synthetic_layers,
)

LAYERS = synthetic_layers()


def test_registry_is_not_empty():
    assert "quantize" in COMPRESSORS.names()


@pytest.mark.parametrize("name", COMPRESSORS.names())
@pytest.mark.parametrize("layer", LAYERS, ids=lambda layer: layer.name)
def test_compressor_conformance(name, layer):
    comp = COMPRESSORS.get(name)()
    check_compressor(comp, [layer])


@pytest.mark.parametrize("name", COMPRESSORS.names())
def test_handles_some_synthetic_layer(name):
    # A compressor whose menu is empty everywhere would pass every other check vacuously.
    comp = COMPRESSORS.get(name)()
    assert any(len(comp.menu(layer)) > 1 for layer in LAYERS), f"{name} offers nothing on the synthetic layers"


# ---- the suite itself must catch broken compressors ---------------------------------------

Q = COMPRESSORS.get("quantize")()
BROKEN = {
    "none-not-first": (check_menu, "menu", lambda layer: Q.menu(layer)[1:]),
    "duplicate-choice": (check_menu, "menu", lambda layer: (*Q.menu(layer), Q.menu(layer)[1])),
    "unhashable-choice": (check_menu, "menu", lambda layer: (None, [4])),
    "dump-loses-granularity": (check_round_trip, "dump", lambda c: None if c is None else {"bits": c.bits}),
    "dump-none-not-none": (check_round_trip, "dump", lambda c: {} if c is None else Q.dump(c)),
    "apply-reshapes": (check_apply, "apply", lambda w, c: w if c is None else w.reshape(-1)),
    "apply-changes-dtype": (check_apply, "apply", lambda w, c: w if c is None else w.half()),
    "apply-random": (check_apply, "apply", lambda w, c: w if c is None else w + torch.rand_like(w)),
    "apply-in-place": (check_apply, "apply", lambda w, c: w if c is None else w.mul_(0.5)),
    "apply-none-not-identity": (check_apply, "apply", lambda w, c: Q.apply(w, c) * 1.001),
    "bytes-above-float": (check_weight_bytes, "weight_bytes", lambda layer, c: layer.params * (4 if c is None else 5)),
    "bytes-none-not-float": (check_weight_bytes, "weight_bytes", lambda layer, c: layer.params * 2),
}


@pytest.mark.parametrize("case", BROKEN)
def test_suite_rejects_broken_compressor(case):
    check, attr, fn = BROKEN[case]
    comp = COMPRESSORS.get("quantize")()
    check(comp, LAYERS[0])  # the unbroken one passes
    setattr(comp, attr, fn)
    with pytest.raises(AssertionError):
        check(comp, LAYERS[0])
