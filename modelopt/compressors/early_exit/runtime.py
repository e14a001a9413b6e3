"""Early exit inside the evaluator: heads fitted once per workload, each plan's exits applied in its pass.

The `early_exit` compressor's decisions sit on the last conv of each candidate block (see
`modelopt.compressors.early_exit.compressor`); a plan's active ones are its `ExitPolicy`. For the evaluator:

- `exit_layout` says where the candidate exits sit and what their heads cost in MACs without
  fitting anything; `fit_heads` fits one head per candidate exit, once per workload, on the *float* model:
  label-free (to the full model's softmax) on the calib images and their mirror images, with
  each head's temperature fitted, label-free, on the val images (the calib images of the
  bundled sample are training images the backbone memorised, which makes heads over-confident;
  val is the split the search scores on anyway, and test stays untouched). A compressed plan's
  backbone feeds these same heads: when quantization erodes their confidence, it shows.
- `ExitProbe` hooks the active exits' blocks of the resident model while a plan's predictions
  are computed, so the heads read the plan's own (compressed) features in the same pass;
  `decide` then gives each sample its exit and prediction, as the deployable `EarlyExitNet` does:
  the first active exit whose confidence reaches its threshold (`policy.first_confident`).
- `reach` says, per sample, which blocks ran; the evaluator turns it into mean MACs and bitops
  with the plan's own per-layer MACs (structured pruning included), heads counted (docs/certification.md, Numbers).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from modelopt.compressors.early_exit.features import Features, extract_features
from modelopt.compressors.early_exit.fit import FitConfig, fit_exit_heads
from modelopt.compressors.early_exit.heads import ExitHead, HeadSpec
from modelopt.compressors.early_exit.policy import ExitPolicy, first_confident
from modelopt.errors import ConfigError
from modelopt.model.backbone import Backbone, exit_layers, split_backbone
from modelopt.model.images import Images

__all__ = ["ExitLayout", "ExitProbe", "RuntimeConfig", "decide", "exit_layout", "fit_heads"]


@dataclass(frozen=True)
class RuntimeConfig:
    """How the evaluator's exit heads are fitted.

    Attributes:
        spec: Pooling and depth of every head (the standalone benchmark's best linear head).
        flip: Also fit on the mirror images of the calib split (twice the fitting data, no labels).
        l2: Weight decay of the fit.
    """

    spec: HeadSpec = field(default_factory=lambda: HeadSpec(avg_grids=(1, 2, 4), max_grids=(1, 2)))
    flip: bool = True
    l2: float = 1e-3


@dataclass(frozen=True, eq=False)
class ExitLayout:
    """Where a model's candidate exits sit and what their heads cost in MACs, known before any fitting.

    Attributes:
        backbone: The model cut into blocks (shares the resident model's modules).
        point_of: {decision layer (a block's last conv): exit point name}.
        block_of: {compressible layer: index of its block}; -1 for the stem, len(blocks) for the tail.
        spec: Pooling and depth of every head.
        classes: Outputs of the model (and of each head).
    """

    backbone: Backbone
    point_of: Mapping[str, str]
    block_of: Mapping[str, int]
    spec: HeadSpec
    classes: int

    def policy(self, choices: Mapping[str, Any]) -> ExitPolicy:
        """The policy of a plan's early_exit choices {decision layer: ExitChoice or None}."""
        active = {self.point_of[layer]: c.threshold for layer, c in choices.items() if c is not None}
        order = [p.name for p in self.backbone.points if p.name in active]
        return ExitPolicy(tuple(order), tuple(active[p] for p in order))

    def block_index(self, point: str) -> int:
        return self.backbone.point(point).index

    def head_macs(self, point: str) -> int:
        return self.spec.macs(self.backbone.point(point).channels, self.classes)


def exit_layout(model: nn.Module, input_size: tuple[int, int], decisions: Sequence[str], layers: Sequence[str],
                config: RuntimeConfig = RuntimeConfig()) -> ExitLayout:
    """The layout of `model`'s candidate exits, one per decision layer (the last conv of a block).

    Raises:
        ConfigError: the model cannot be cut into blocks, or a decision layer ends no block.
    """
    backbone = split_backbone(model, input_size)
    ends = exit_layers(backbone)
    wrong = [d for d in decisions if d not in ends]
    if wrong:
        raise ConfigError(f"early_exit decisions on {wrong}, which end no block; valid: {sorted(ends)}")
    block_of = {}
    for name in layers:
        idx = -1 if name in backbone.stem_layers else len(backbone.blocks)  # stem, or the tail's layers
        for i, (bname, _) in enumerate(backbone.blocks):
            if name.startswith(bname + "."):
                idx = i
        block_of[name] = idx
    return ExitLayout(backbone, {d: ends[d] for d in decisions}, block_of, config.spec, backbone.classes)


def _joined(a: Features, b: Features) -> Features:
    """`a`'s images then `b`'s, at the same points, unlabeled (what the heads are fitted on)."""
    feats = tuple(torch.cat([x, y]) for x, y in zip(a.feats, b.feats, strict=True))
    return Features(a.spec, a.points, feats, torch.cat([a.logits, b.logits]), None)


def fit_heads(layout: ExitLayout, calib: torch.Tensor | Images, val: torch.Tensor | Images,
              config: RuntimeConfig = RuntimeConfig(),
              extra: torch.Tensor | None = None) -> tuple[dict[str, ExitHead], int]:
    """Fits a head per candidate exit on the resident (float) model; also the images it ran.

    Args:
        layout: Where the exits sit.
        calib: Normalised calibration images: the heads are fitted on their features.
        val: Normalised val images: each head's temperature is fitted on them, without labels.
        extra: More normalised images to fit on (unlabeled; never val or test images).

    Example:
        >>> heads, images = fit_heads(layout, wl.split("calib").x, wl.split("val").x)
    """
    backbone = layout.backbone
    points = tuple(p.name for p in backbone.points if p.name in set(layout.point_of.values()))
    fit = extract_features(backbone, calib, config.spec, points)
    n = calib.shape[0]
    if config.flip:
        mirrored = extract_features(backbone, calib, config.spec, points, flip=True)
        fit = _joined(fit, mirrored)
        n *= 2
    if extra is not None and len(extra):
        more = extract_features(backbone, extra, config.spec, points)
        fit = _joined(fit, more)
        n += int(extra.shape[0])
    held = extract_features(backbone, val, config.spec, points)
    heads = fit_exit_heads(fit, points, FitConfig(spec=config.spec, l2=config.l2), calibrate=held)
    return {e: _on(h, calib.device) for e, h in heads.items()}, n + int(val.shape[0])


def _on(head: ExitHead, device: torch.device) -> ExitHead:
    def mv(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.to(device)

    return ExitHead(head.spec, head.weight.to(device), head.bias.to(device), mv(head.hidden_weight),
                    mv(head.hidden_bias), head.temperature.to(device))


class ExitProbe:
    """Collects the active heads' logits from the resident model's blocks while it runs.

    Example:
        >>> with ExitProbe(layout, heads, policy) as probe:
        ...     logits = wl.logits(x)
        >>> exit_at, pred = decide(probe.logits(), logits, heads, policy)
    """

    def __init__(self, layout: ExitLayout, heads: Mapping[str, ExitHead], policy: ExitPolicy) -> None:
        self.layout, self.heads, self.policy = layout, heads, policy
        self._seen: dict[str, list[torch.Tensor]] = {e: [] for e in policy.exits}
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> ExitProbe:
        blocks = dict(self.layout.backbone.blocks)
        for e in self.policy.exits:
            head = self.heads[e]

            def hook(_m: nn.Module, _i: object, out: torch.Tensor, e: str = e, head: ExitHead = head) -> None:
                self._seen[e].append(head(out))

            handle = blocks[e].register_forward_hook(hook)
            self._stack.callback(handle.remove)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def logits(self) -> dict[str, torch.Tensor]:
        return {e: torch.cat(v) for e, v in self._seen.items() if v}


def decide(head_logits: Mapping[str, torch.Tensor], full_logits: torch.Tensor, heads: Mapping[str, ExitHead],
           policy: ExitPolicy) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sample: the position in `policy.exits` it leaves at (len(exits): it ran the whole
    network) and its prediction (`first_confident` on the heads' logits)."""
    logits = [head_logits[e] for e in policy.exits]
    return first_confident([heads[e].confidence(x) for e, x in zip(policy.exits, logits, strict=True)],
                           [x.argmax(1) for x in logits], full_logits.argmax(1), policy.thresholds)
