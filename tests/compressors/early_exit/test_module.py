"""The deployable module: its exits and predictions equal the exit rule applied to the heads on pooled
features (the evaluator's way); its state is tensors only."""

from __future__ import annotations

import torch

from modelopt.compressors.early_exit.features import extract_features
from modelopt.compressors.early_exit.fit import FitConfig, fit_exit_heads
from modelopt.compressors.early_exit.heads import HeadSpec
from modelopt.compressors.early_exit.module import EarlyExitNet
from modelopt.compressors.early_exit.policy import ExitPolicy, first_confident

EXITS = ["layer1.2", "layer2.1", "layer3.0"]


def _heads_and_policy(r20):
    _, bb, calib, val, _ = r20
    heads = fit_exit_heads(calib, EXITS, FitConfig(HeadSpec((1, 2), (1,)), l2=1e-2))
    logits = {e: heads[e].logits_from_features(val.select(e, heads[e].spec)) for e in EXITS}
    conf = {e: heads[e].confidence(x) for e, x in logits.items()}
    # Thresholds at each exit's median confidence among the samples that reach it: all exits fire.
    # Each threshold halfway between two samples' confidences, so none sits on one.
    thr = [_between(conf[e], 0.5) for e in EXITS]
    thr[0] = _between(conf[EXITS[0]], 0.9)
    exit_at, pred = first_confident([conf[e] for e in EXITS], [logits[e].argmax(1) for e in EXITS],
                                    val.logits.argmax(1), thr)
    return bb, heads, conf, ExitPolicy(tuple(EXITS), tuple(thr)), exit_at, pred


def _between(conf: torch.Tensor, q: float) -> float:
    c = conf.sort().values
    k = int(q * (len(c) - 1))
    return float((c[k] + c[k + 1]) / 2)


# A confidence (or a top-2 logit gap) within TOL of its threshold (tie) may round to either side in
# another kernel: batch 1 against batched, one CPU against another. TOL is far above that rounding
# (~1e-7 for a float32 softmax) and far below the gaps between the samples' confidences.
TOL = 1e-4


def _fragile(conf, policy, exit_at: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Samples whose exit or prediction float rounding may decide: a confidence near a threshold
    it is compared with, or a near tie between the top two logits it returns."""
    near = torch.zeros(len(exit_at), dtype=torch.bool)
    for j, (name, thr) in enumerate(zip(policy.exits, policy.thresholds, strict=True)):
        reached = exit_at >= j
        near |= reached & ((conf[name] - thr).abs() < TOL)
    top2 = logits.topk(2, dim=1).values
    return near | (top2[:, 0] - top2[:, 1] < TOL)


def test_batch1_and_batched_module_equal_the_evaluator(r20):
    *_, x_val = r20
    bb, heads, conf, policy, exit_at, pred = _heads_and_policy(r20)
    assert len(set(exit_at.tolist())) == 4  # samples leave at every exit and some run it all
    net = EarlyExitNet(bb, heads, policy).eval()
    with torch.inference_mode():
        one = torch.cat([net(x_val[i : i + 1]) for i in range(len(x_val))]).argmax(1)
        batched, where = net.forward_with_exits(x_val)
    # What is guaranteed: every sample that rounding cannot decide exits and predicts the same in
    # all three; the thresholds sit between samples, so (almost) every sample is such a one.
    sure = ~_fragile(conf, policy, exit_at, batched)
    assert int(sure.sum()) >= len(x_val) - 1, int((~sure).sum())
    assert torch.equal(one[sure], pred[sure])
    assert torch.equal(batched.argmax(1)[sure], pred[sure])
    assert torch.equal(where[sure], exit_at[sure])


def test_samples_that_never_exit_get_the_models_logits(r20):
    lm, bb, _, _, x_val = r20
    _, heads, *_ = _heads_and_policy(r20)
    net = EarlyExitNet(bb, heads, ExitPolicy(tuple(EXITS), (1.0, 1.0, 1.0))).eval()  # softmax never reaches 1.0 here
    with torch.inference_mode():
        assert torch.allclose(net(x_val[:8]), lm.module(x_val[:8]), atol=1e-5)
        assert torch.allclose(net(x_val[:1]), lm.module(x_val[:1]), atol=1e-5)


def test_the_module_state_loads_with_weights_only(r20, tmp_path):
    bb, heads, _, policy, *_ = _heads_and_policy(r20)
    state = EarlyExitNet(bb, heads, policy).state_dict()
    torch.save(state, tmp_path / "net.pt")
    assert set(torch.load(tmp_path / "net.pt", weights_only=True)) == set(state)


def test_features_of_a_subset_of_points(r20):
    _, bb, _, _, x_val = r20
    f = extract_features(bb, x_val[:4], HeadSpec((1,), ()), points=["layer3.2"])
    assert f.points == ("layer3.2",) and f.feats[0].shape == (4, 64)
    # Global average of the last block is exactly what the model's linear layer reads.
    assert torch.allclose(f.logits, bb.tail.linear(f.feats[0]), atol=1e-5)
