"""`Compressor.pack`: each compressor's part of the stored form decodes to what `apply` runs, in
exactly the bytes `stored` counts (parametrised over the registry, so a new compressor is checked)."""

from __future__ import annotations

import math

import pytest
import torch

from modelopt.compressors import COMPRESSORS, Granularity, PruneSpec, QuantSpec
from modelopt.compressors.contract import Compressor, RemovesChannels, Storage, WeightForm, sparse_index_bytes
from modelopt.testing.compressors import synthetic_layers, synthetic_weight

LAYERS = synthetic_layers()


def _written_bytes(form: WeightForm) -> int:
    """What the packed export writes for a form: values at their width, scales, the mask's encoding."""
    numel = form.weight.numel()
    values = numel if form.mask is None else int(form.mask.sum())
    index = 0 if form.mask is None else sparse_index_bytes(numel, values)
    if form.integer is None:
        return values * 4 + index
    q = form.integer
    return math.ceil(values * q.bits / 8) + q.scales.numel() * q.scales.element_size() + index


def _decoded(form: WeightForm) -> torch.Tensor:
    return form.weight if form.integer is None else form.integer.dequantize()


@pytest.mark.parametrize("name", COMPRESSORS.names())
@pytest.mark.parametrize("layer", LAYERS, ids=lambda layer: layer.name)
def test_pack_decodes_to_apply_in_the_counted_bytes(name, layer):
    comp = COMPRESSORS.get(name)()
    w = synthetic_weight(layer)
    for choice in comp.menu(layer):
        if isinstance(comp, RemovesChannels) and comp.kept_channels(w, choice) is not None:
            continue  # removed channels: export slices them off before the chain runs (evaluation/layer_weights.py)
        form = comp.pack(WeightForm(w), choice)
        want = comp.apply(w, choice)
        assert torch.equal(_decoded(form), want), (name, layer.name, choice)
        assert torch.equal(form.weight, want), (name, layer.name, choice)
        if form.mask is not None:
            assert not _decoded(form)[~form.mask].any(), (name, layer.name, choice)
        stored = comp.stored(layer, choice, Storage(layer.weight_shape))
        assert _written_bytes(form) == stored.bytes, (name, layer.name, choice)


def test_pruned_then_quantized_keeps_zeros_as_code_zero_and_counts_the_chain():
    prune, quant = COMPRESSORS.get("prune")(), COMPRESSORS.get("quantize")()
    layer = LAYERS[3]
    w = synthetic_weight(layer)
    p, q = PruneSpec(0.5), QuantSpec(4, Granularity.GROUP)
    form = quant.pack(prune.pack(WeightForm(w), p), q)
    assert form.mask is not None and form.integer is not None
    assert not form.integer.codes[~form.mask].any()
    assert torch.equal(form.integer.dequantize(), quant.apply(prune.apply(w, p), q))
    storage = quant.stored(layer, q, prune.stored(layer, p, Storage(layer.weight_shape)))
    assert _written_bytes(form) == storage.bytes


class _Halve(Compressor):
    """A compressor with no `pack` of its own: the base stores what it applies, in float."""

    name = "halve"

    def menu(self, layer):
        return (None, 0.5)

    def parse(self, raw, layer):
        return raw

    def dump(self, choice):
        return choice

    def apply(self, weight, choice):
        return weight if choice is None else weight * choice

    def weight_bytes(self, layer, choice):
        return layer.params * 4


def test_default_pack_stores_a_changed_weight_in_float_and_leaves_an_unchanged_one():
    quant = COMPRESSORS.get("quantize")()
    w = synthetic_weight(LAYERS[0])
    coded = quant.pack(WeightForm(w), QuantSpec(8))
    halved = _Halve().pack(coded, 0.5)
    assert halved.integer is None and torch.equal(halved.weight, coded.weight * 0.5)
    assert _Halve().pack(coded, None) is coded
    exit_ = COMPRESSORS.get("early_exit")(exits=("*",))
    assert exit_.pack(coded, exit_.menu(LAYERS[0])[-1]) is coded  # an exit changes no weight
