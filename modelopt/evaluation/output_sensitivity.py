"""Label-free sensitivities: what each choice does to the model's answers, priced from one probe per layer.

What decides whether a plan is certified is how many answers it changes, and on realistic images
(JPEG CIFAR-10: many answers sit near a decision boundary) that follows the perturbation of the
logits, not of the weights. A choice's effect on the logits is its layer's output error carried
through the rest of the network, so it factors as

    KL(float || plan with choice c at layer l)  ~=  gain_l x error(l, c),

with error(l, c) the choice's relative output error |(Q - W) X|^2 / |W X|^2 on calib inputs
(`modelopt.evaluation.priors.measure_errors`, computed anyway) and gain_l how much of a layer's output error
reaches the answers. gain_l differs widely between layers (a skip connection dilutes the error of the
last conv of a residual stage; the stem's and the classifier's reach the answers whole), while within a
layer it moves little between bit widths and granularities (measured: docs/search.md#measured). So one
probe per layer prices every choice there: the KL of the float model's answers against the probe choice's
(mean over `images` unlabeled calib images, batch norms re-estimated as the plan would have them),
divided by that choice's error.

KL divergences of small independent perturbations add up, so the estimates sum over a plan's layers;
`modelopt.search.mcts` fits how accuracy follows that sum. The probes cost one forward pass over
`images` calib images per layer (plus each probe's batch-norm re-estimation), charged to the run's
budget as one pre-pass. No label is read.
"""

from __future__ import annotations

import math
import time

import torch
from torch.nn import functional as F

from modelopt.data.split import Split
from modelopt.evaluation.evaluator import Evaluator
from modelopt.plan.plan import Decision

__all__ = ["DEFAULT_IMAGES", "PROBE_ERROR", "PROBE_TIME_SHARE", "output_losses", "probe_images"]

DEFAULT_IMAGES = 256
MIN_IMAGES = 32  # fewer and a layer's KL is mostly the noise of the few answers near a boundary
BUDGET_SHARE = 0.08  # at most this share of a run's budget goes to the probes
# At most this share of a timed run's time (their budget charge undercounts their seconds: 20-29 s on the default
# run, for 5.5 evals charged; the default's 2m20s affords them, a minute does not).
PROBE_TIME_SHARE = 0.25
# The probe is the choice whose error is nearest this (in log scale): large enough to stand above
# float rounding, small enough that the network still responds linearly (INT4 per channel, typically).
PROBE_ERROR = 1e-2


def _probe(decisions: list[Decision], errors: dict[tuple[str, int], float]) -> tuple[Decision, int] | None:
    """The (decision, choice index) of a layer whose error is nearest PROBE_ERROR; None without one."""
    options = [(abs(math.log(e / PROBE_ERROR)), d.name, j, d) for d in decisions for j, c in enumerate(d.choices)
               if c is not None and math.isfinite(e := errors.get((d.name, j), math.nan)) and e > 0]
    if not options:
        return None
    _, _, j, d = min(options, key=lambda o: o[:3])
    return d, j


def probe_images(budget: float, val_images: int, layers: int, calib_images: int) -> int:
    """How many calib images the probes read within `BUDGET_SHARE` of `budget` (each layer's probe costs
    its images / `val_images`): DEFAULT_IMAGES on the default run, 0 when fewer than MIN_IMAGES would do
    (a small split, a small budget: the search then keeps its data-free prior).

    Example:
        >>> probe_images(100, 2000, 20, 1000), probe_images(18, 169, 20, 169)
        (256, 0)
    """
    n = min(DEFAULT_IMAGES, calib_images, int(BUDGET_SHARE * budget * val_images / max(layers, 1)))
    return n if n >= MIN_IMAGES else 0


def output_losses(evaluator: Evaluator, images: int = DEFAULT_IMAGES, seconds: float | None = None
                  ) -> dict[tuple[str, int], float]:
    """{(decision, choice index): estimated KL of the plan's answers from the float model's (nats per
    image)} for every choice that changes its layer's weight; one probe per layer on unlabeled calib
    images, charged once to the run's budget with the first plan scored after it.

    Call after `Evaluator.measure_errors` (the per-choice output errors it scales). `seconds`: what a timed run
    gives the probes (a share of its time); once the probes so far project past it, they stop and none is used
    (an empty result: the search keeps its data-free prior, and the probes made are charged).

    Example:
        >>> est = output_losses(evaluator)
        >>> est[("layer3.2.conv2/quantize", 3)]  # INT3 on a late layer: small
    """
    space, wl = evaluator.space, evaluator.workload
    t0 = time.perf_counter()
    x = wl.split(Split.CALIB).x[:images]
    n, val = x.shape[0], len(wl.split(Split.VAL))
    errors = {(d.name, j): float(f.error) for d in space.decisions
              for j, f in enumerate(space.features[d.name])}
    with torch.inference_mode():
        reference = F.log_softmax(wl.logits(x).float(), dim=1)
    by_layer: dict[str, list[Decision]] = {}
    for d in space.decisions:
        by_layer.setdefault(d.layer, []).append(d)
    cost = n / val  # the float pass above
    out: dict[tuple[str, int], float] = {}
    for done, decisions in enumerate(by_layer.values()):
        if seconds is not None and done and (time.perf_counter() - t0) * len(by_layer) / done > seconds:
            out = {}
            break
        probe = _probe(decisions, errors)
        if probe is None:
            continue
        d, j = probe
        plan = space.plan({d.name: d.choices[j]})
        try:
            state, prep = evaluator.states.compressed_state(plan)
            with torch.inference_mode(), wl.state(state), evaluator.states.activation_quant(plan):
                logp = F.log_softmax(wl.logits(x).float(), dim=1)
        except Exception:  # noqa: BLE001 - a probe that crashes prices nothing; the trials will say why
            continue
        cost += n / val + prep
        kl = float(F.kl_div(logp, reference, log_target=True, reduction="batchmean"))
        if not math.isfinite(kl):
            continue
        gain = max(kl, 0.0) / errors[(d.name, j)]
        for dd in decisions:
            for jj, c in enumerate(dd.choices):
                e = errors.get((dd.name, jj), math.nan)
                if c is not None and math.isfinite(e) and e > 0:
                    out[(dd.name, jj)] = gain * e
    evaluator.states.add_pre_pass(f"output_kl:{n}", cost)
    evaluator.one_time.timed(f"output_kl:{n}", time.perf_counter() - t0)
    return out
