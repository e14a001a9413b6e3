"""The prune compressor: conformance, sparsity reached, channels removed, composition with quantize."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from modelopt.api import build_compressors
from modelopt.compressors import (
    Prune,
    PruneKind,
    PruneSpec,
    Quantize,
    QuantSpec,
    Storage,
)
from modelopt.compressors.contract import (
    CalibrationNeed,
    ChannelAnalysis,
    ChannelGroup,
    WeightForm,
    decode_mask,
    encode_mask,
    sparse_encoding,
    sparse_index_bytes,
)
from modelopt.compressors.prune import Criterion, PruneOptions, magnitude_mask, n_kept
from modelopt.compressors.quantize import quantize
from modelopt.errors import ConfigError
from modelopt.model.layers import Layer, LayerKind
from modelopt.plan.space import SearchSpace
from modelopt.testing.compressors import (
    check_compressor,
    synthetic_layers,
    synthetic_weight,
)

BLOCK = Layer("block.conv1", LayerKind.CONV, (32, 16, 3, 3), 1000, False).noted(
    {ChannelAnalysis.name: ChannelGroup((("block.conv1", True), ("block.conv2", False)), 2)})
STEM = Layer("stem", LayerKind.CONV, (16, 3, 3, 3), 1, False)


def test_conformance_with_structured_choices():
    # The registry-wide suite runs on synthetic layers with no internal channels; this adds one.
    p = Prune(sparse_images=0, repair_images=0)
    check_compressor(p, [*synthetic_layers(), BLOCK])
    kinds = {c.kind for c in p.menu(BLOCK)[1:]}
    assert kinds == {PruneKind.UNSTRUCTURED, PruneKind.STRUCTURED}
    assert p.menu(STEM) == ()  # the stem reading the image is left alone
    assert all(c.kind is PruneKind.UNSTRUCTURED for c in p.menu(synthetic_layers()[2])[1:])  # fc: no channels


@pytest.mark.parametrize("sparsity", [0.25, 0.5, 0.75, 0.9])
def test_unstructured_reaches_its_sparsity_on_the_smallest_weights(sparsity):
    w = synthetic_weight(BLOCK, seed=3)
    out = Prune(sparse_images=0, repair_images=0).apply(w, PruneSpec(sparsity))
    zeros = int((out == 0).sum())
    assert zeros == w.numel() - n_kept(w.numel(), sparsity) == round(sparsity * w.numel())
    kept = out != 0
    assert torch.equal(out[kept], w[kept])
    assert w[~kept].abs().max() <= w[kept].abs().min()  # magnitude: every pruned weight is the smaller


@pytest.mark.parametrize("criterion", ["l1", "l2"])
def test_structured_zeroes_the_weakest_filters(criterion):
    w = synthetic_weight(BLOCK, seed=4)
    p = Prune(criterion=criterion, sparse_images=0, repair_images=0)
    out = p.apply(w, PruneSpec(0.25, PruneKind.STRUCTURED))
    keep = p.kept_channels(w, PruneSpec(0.25, PruneKind.STRUCTURED))
    assert keep is not None and keep.numel() == 24 and torch.equal(keep, keep.sort().values)
    dropped = sorted(set(range(32)) - set(keep.tolist()))
    assert torch.all(out[dropped] == 0) and torch.equal(out[keep], w[keep])
    norm = w.reshape(32, -1).abs().sum(1) if criterion == "l1" else w.reshape(32, -1).pow(2).sum(1)
    assert norm[dropped].max() <= norm[keep].min()
    assert p.kept_channels(w, PruneSpec(0.25)) is None  # unstructured removes no channel


def test_bytes_count_the_sparse_encoding():
    p, q = Prune(sparse_images=0, repair_images=0), Quantize(bits=(8, 4), rounding=("nearest",), norm_images=0)
    n = BLOCK.params  # 4608 weights: a bitmask (576 bytes) beats 2-byte positions until ~88 % sparse
    assert p.weight_bytes(BLOCK, PruneSpec(0.5)) == math.ceil(n / 8) + (n // 2) * 4
    assert p.weight_bytes(BLOCK, PruneSpec(0.95)) == n_kept(n, 0.95) * 2 + n_kept(n, 0.95) * 4
    assert p.weight_bytes(BLOCK, PruneSpec(0.5, PruneKind.STRUCTURED)) == 16 * 144 * 4
    # Pruned then INT4: the kept values as 4-bit codes, the mask, one float16 scale per channel.
    st = q.stored(BLOCK, QuantSpec(4), p.stored(BLOCK, PruneSpec(0.5), Storage(BLOCK.weight_shape)))
    assert st.bytes == math.ceil(n / 2 * 4 / 8) + math.ceil(n / 8) + 32 * 2
    assert sparse_index_bytes(100, 3) == 3 and sparse_index_bytes(100, 50) == 13


@pytest.mark.parametrize("numel,sparsity", [(4608, 0.5), (4608, 0.97), (200, 0.99), (70000, 0.999)])
def test_mask_encoding_round_trips_at_its_accounted_size(numel, sparsity):
    w = torch.randn(numel, generator=torch.Generator().manual_seed(0))
    mask = magnitude_mask(w, sparsity)
    kept = int(mask.sum())
    buf = encode_mask(mask)
    assert buf.dtype == np.uint8 and buf.size == sparse_index_bytes(numel, kept)
    assert torch.equal(decode_mask(np.concatenate([buf, np.zeros(7, np.uint8)]), (numel,), kept), mask)
    assert sparse_encoding(numel, kept) == ("index" if sparsity > 0.95 else "mask")


def test_quantizer_sees_the_pruned_weight_and_keeps_zeros():
    w = synthetic_weight(BLOCK, seed=5)
    spec = QuantSpec(4)
    pruned = Prune(sparse_images=0, repair_images=0).apply(w, PruneSpec(0.5))
    chained = Quantize(bits=(8, 4), rounding=("nearest",), norm_images=0).apply(pruned, spec)
    assert torch.all(chained[pruned == 0] == 0)  # every pruned weight stays exactly 0
    _, scales_pruned = quantize(pruned, spec)
    _, scales_dense = quantize(w, spec)
    assert not torch.equal(scales_pruned, scales_dense)  # scales searched on what is kept


def test_chain_order_does_not_depend_on_the_order_given():
    layers = [BLOCK, synthetic_layers()[2]]
    a = SearchSpace(layers, build_compressors(["quantize", "prune"]))
    b = SearchSpace(layers, build_compressors(["prune", "quantize"]))
    assert list(a.compressors) == list(b.compressors) == ["prune", "quantize"]
    assert [d.name for d in a.decisions] == [d.name for d in b.decisions]


def test_plan_yaml_round_trip_and_errors():
    space = SearchSpace([STEM, BLOCK, synthetic_layers()[2]], build_compressors(["quantize", "prune"]))
    doc = {"default": {"quantize": {"bits": 4}},
           "layers": {"block.conv1": {"prune": {"sparsity": 0.5, "kind": "structured"}},
                      "fc": {"prune": {"sparsity": 0.25}}}}
    plan = space.parse_plan(doc)
    assert plan["block.conv1/prune"] == PruneSpec(0.5, PruneKind.STRUCTURED)
    assert plan["fc/prune"] == PruneSpec(0.25)
    assert space.parse_plan(space.dump_plan(plan)) == plan
    with pytest.raises(ConfigError, match="kind 'structured' needs a layer whose output channels a checked"):
        space.parse_plan({"layers": {"fc": {"prune": {"sparsity": 0.5, "kind": "structured"}}}})
    with pytest.raises(ConfigError, match=r"sparsity 1\.5 is not a share in \(0, 1\)"):
        space.parse_plan({"layers": {"fc": {"prune": {"sparsity": 1.5}}}})
    with pytest.raises(ConfigError, match="kind 'channels' not offered; valid: unstructured, structured"):
        space.parse_plan({"layers": {"fc": {"prune": {"sparsity": 0.5, "kind": "channels"}}}})
    with pytest.raises(ConfigError, match="cannot be compressed by 'prune'"):
        space.parse_plan({"layers": {"stem": {"prune": {"sparsity": 0.5}}}})
    with pytest.raises(ConfigError, match="criterion 'l3' not offered"):
        Prune(criterion="l3", sparse_images=0, repair_images=0)



@pytest.mark.slow
def test_structured_choices_keep_a_multiple_of_channel_multiple(resnet20_workload):
    """Integer kernels ran a 16-channel stage cut to 12, 8 or 4 channels slower than whole: with
    channel_multiple 16 (the latency objective's default) only counts like 16, 32 and 48 are offered."""
    from modelopt.config.run_config import RunConfig

    wl = resnet20_workload
    options = {"prune": {"kind": ["structured"], "channel_multiple": 16, "sparse_images": 0, "repair_images": 0}}
    space = SearchSpace(wl.layers, build_compressors(["prune"], options, model=wl.model))
    offered = {d.layer: sorted(c.sparsity for c in d.choices if c is not None) for d in space.decisions}
    assert "layer1.0.conv1" not in offered  # 16 channels: 12, 8 and 4 are no multiple of 16
    assert offered["layer2.0.conv1"] == [0.5] and offered["layer3.0.conv1"] == [0.25, 0.5, 0.75]
    assert RunConfig(objective="latency", latency="onnxruntime").options["prune"].channel_multiple == 16
    assert RunConfig().options["prune"].channel_multiple == 1
    with pytest.raises(ConfigError, match="channel_multiple must be an integer >= 1, got 0"):
        build_compressors(["prune"], {"prune": {"channel_multiple": 0}})


def test_two_of_four_is_offered_where_rows_split_into_fours_and_stored_as_half():
    p = Prune(kind=("2:4",), sparse_images=0, repair_images=0)
    check_compressor(p, [*synthetic_layers(), BLOCK])
    assert p.menu(BLOCK) == (None, PruneSpec(0.5, PruneKind.SEMI))
    odd = Layer("odd", LayerKind.CONV, (8, 5, 1, 1), 1, False)  # rows of 5 weights
    assert p.menu(odd) == ()
    w = synthetic_weight(BLOCK, seed=1)
    out = p.apply(w, PruneSpec(0.5, PruneKind.SEMI))
    kept = (out != 0).reshape(32, -1, 4).sum(2)
    assert torch.equal(kept, torch.full_like(kept, 2))
    assert p.weight_bytes(BLOCK, PruneSpec(0.5, PruneKind.SEMI)) == p.weight_bytes(BLOCK, PruneSpec(0.5))
    space = SearchSpace([odd, BLOCK], [p])
    assert space.parse_plan({"layers": {"block.conv1": {"prune": {"sparsity": 0.5, "kind": "2:4"}}}})[
        "block.conv1/prune"] == PruneSpec(0.5, PruneKind.SEMI)
    with pytest.raises(ConfigError, match=r"sparsity 0\.25 is not what kind '2:4' prunes"):
        space.parse_plan({"layers": {"block.conv1": {"prune": {"sparsity": 0.25, "kind": "2:4"}}}})


def test_a_two_of_four_entry_at_another_sparsity_is_named_with_what_2_4_means():
    """Sparsity 0.75 with kind 2:4 was refused without naming 0.75, advising "use kind: unstructured" (which
    changes the pattern, not the figure): the line names the value and says 2:4 is sparsity 0.5."""
    p = Prune(kind=("2:4", "unstructured"), sparse_images=0, repair_images=0)
    odd = Layer("odd", LayerKind.CONV, (8, 5, 1, 1), 1, False)  # rows of 5 weights
    space = SearchSpace([odd, BLOCK], [p])

    def refusal(layer: str, sparsity: float) -> str:
        with pytest.raises(ConfigError) as info:
            space.parse_plan({"layers": {layer: {"prune": {"sparsity": sparsity, "kind": "2:4"}}}})
        assert "\n" not in str(info.value)
        return str(info.value)

    assert refusal("block.conv1", 0.75) == (
        "prune for block.conv1: sparsity 0.75 is not what kind '2:4' prunes: 2:4 keeps two of every four weights of "
        "a row, which is sparsity 0.5; write sparsity: 0.5, or kind: unstructured for sparsity 0.75")
    assert refusal("odd", 0.5).endswith("rows are a multiple of 4 weights long; use kind: unstructured here")


def test_sparse_images_choose_the_mask_on_the_layer_inputs():
    """With calibration inputs, unstructured pruning keeps the weights whose loss costs the output most and refits
    the rest (SparseGPT); without, magnitude; `calibration` asks for them only when sparse_images > 0."""
    from modelopt.model.layer_inputs import LayerInputs

    g = torch.Generator().manual_seed(0)
    x = torch.randn(500, 144, generator=g, dtype=torch.float64) @ torch.randn(144, 144, generator=g,
                                                                               dtype=torch.float64) / 12
    w = synthetic_weight(BLOCK, seed=2)[:, :16]
    inputs = LayerInputs(x.T @ x, 500)
    spec = PruneSpec(0.5)
    magnitude, sparsegpt = Prune(sparse_images=0, repair_images=0), Prune(sparse_images=64, repair_images=0)
    assert magnitude.calibration(spec).layer_inputs == 0 and sparsegpt.calibration(spec).layer_inputs == 64
    assert magnitude.calibration(None) == CalibrationNeed()  # off: nothing to calibrate, no norms re-estimated
    plain, repaired = magnitude.apply_calibrated(w, spec, None), sparsegpt.apply_calibrated(w, spec, inputs)
    assert int((repaired == 0).sum()) == int((plain == 0).sum()) == w.numel() // 2

    def err(q: torch.Tensor) -> float:
        return float(((q - w).reshape(32, -1).double() @ x.T).pow(2).sum())

    assert err(repaired) < 0.9 * err(plain)
    form = Prune(sparse_images=64, repair_images=0).pack(WeightForm(w), spec, inputs)
    assert torch.equal(form.weight, repaired) and torch.equal(form.mask, repaired != 0)
    with pytest.raises(ConfigError, match="sparse_images must be an integer >= 0"):
        Prune(sparse_images=-1, repair_images=0)


def test_the_magnitude_mask_keeps_what_a_stable_descending_sort_keeps_ties_by_position():
    """The mask is computed by selection, not a sort; the oracle is the sort it replaced."""
    g = torch.Generator().manual_seed(0)
    for k, shape in enumerate([(7,), (16, 3, 3, 3), (64, 33), (5, 1)] * 20):
        w = torch.randn(*shape, generator=g)
        if k % 3 == 0:
            w = torch.round(w * 2) / 2  # many equal magnitudes
        if k % 7 == 0:
            w[..., 0] = 0
        for sparsity in (0.0, 0.1, 0.25, 0.5, 0.75, 0.99, 1.0):
            flat = w.reshape(-1).abs()
            want = torch.zeros(flat.numel(), dtype=torch.bool)
            want[torch.argsort(flat, descending=True, stable=True)[: n_kept(flat.numel(), sparsity)]] = True
            assert torch.equal(magnitude_mask(w, sparsity), want.reshape(shape)), (shape, sparsity)


@pytest.mark.parametrize("changes, message", [
    ({"sparsity": ()}, "prune: sparsity is empty; offer shares in (0, 1) such as 0.25,0.5,0.75"),
    ({"sparsity": (0.5, 1.5)}, "prune: sparsity 1.5 is not a share in (0, 1); e.g. 0.5 removes half"),
    ({"sparsity": (True,)}, "prune: sparsity True is not a share in (0, 1); e.g. 0.5 removes half"),
    ({"kind": ("structured", "channels")}, "prune: kind 'channels' not offered; valid: unstructured, structured, 2:4"),
    ({"kind": ()}, "prune: kind is empty; valid: unstructured, structured, 2:4"),
    ({"criterion": "l3"}, "prune: criterion 'l3' not offered; valid: output, l1, l2"),
    ({"bn_samples": -1}, "prune: bn_samples must be an integer >= 0 (0: no re-estimation), got -1"),
    ({"repair_images": 1.5}, "prune: repair_images must be an integer >= 0 (0: no repair), got 1.5"),
    ({"sparse_images": True}, "prune: sparse_images must be an integer >= 0 (0: magnitude), got True"),
    ({"channel_multiple": 0}, "prune: channel_multiple must be an integer >= 1, got 0"),
])
def test_the_options_record_refuses_a_bad_value_when_it_is_built(changes, message, monkeypatch):
    """The record checks its own fields however it is built (a keyword, `replace`, a run.json read back, a run's
    options), in one line; no Prune is built to find out (building one here fails the test)."""
    from modelopt.config.run_config import RunConfig

    def built(*args: object, **kwargs: object) -> None:
        raise AssertionError("a Prune was built to check its options")

    monkeypatch.setattr(Prune, "__init__", built)
    for make in (lambda: PruneOptions(**changes), lambda: PruneOptions().replace(**changes),
                 lambda: PruneOptions.from_json({**PruneOptions().to_json(), **changes}),
                 lambda: RunConfig(options={"prune": changes})):
        with pytest.raises(ConfigError) as err:
            make()
        assert str(err.value) == message
    RunConfig(options={"prune": {"channel_multiple": 16}})  # a good one passes, still without building a Prune


def test_the_record_offers_each_value_once_as_plans_type_it_and_writes_what_was_given():
    """`shares`, `kinds` and `ranking` are what Prune offers (each once, in the order given, as enum members); the
    fields, which run.json writes, keep the values as given."""
    o = PruneOptions(sparsity=(0.5, 0.25, 0.5), kind=("structured", "2:4", "structured"), criterion="output")
    assert o.shares == (0.5, 0.25) and o.kinds == (PruneKind.STRUCTURED, PruneKind.SEMI)
    assert o.ranking is Criterion.OUTPUT
    assert o.to_json() == {"sparsity": [0.5, 0.25, 0.5], "channel_multiple": 1, "sparse_images": 256,
                           "repair_images": 256, "kind": ["structured", "2:4", "structured"], "criterion": "output",
                           "bn_samples": 512, "version": 2}
    p = Prune(o, sparse_images=0, repair_images=0)
    assert p.menu(BLOCK) == (None, PruneSpec(0.5, PruneKind.SEMI), PruneSpec(0.5, PruneKind.STRUCTURED),
                             PruneSpec(0.25, PruneKind.STRUCTURED))
