"""Fitting exit heads on pooled features with the backbone frozen: L-BFGS, full batch, seconds.

A head is fitted label-free, to the full model's softmax (distillation): it learns to say what the
whole network would say, which is what retention and agreement reward, and any unlabeled images
the backbone never trained on can be used.

The loss is the mean cross-entropy plus `l2` times the squared norm of the weights (biases
free). Inputs are standardised with the fitting data's mean and standard deviation, and the
standardisation is folded into the first layer afterwards. The temperature of a fitted head is
fitted separately, on held-out images (`fit_temperature`): a backbone that memorised its
training images makes heads fitted on them over-confident on new ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from modelopt.compressors.early_exit.features import Features
from modelopt.compressors.early_exit.heads import ExitHead, HeadSpec
from modelopt.errors import ConfigError

__all__ = ["FitConfig", "fit_exit_heads", "fit_head", "fit_temperature", "soft_targets"]


@dataclass(frozen=True)
class FitConfig:
    """How a head is fitted.

    Attributes:
        spec: Pooling and hidden width of the head.
        l2: Weight decay on the weights, relative to the mean cross-entropy.
        max_iter: L-BFGS iterations.
        distill_temperature: The full model's logits are divided by this before the softmax
            that serves as the target (1 = its own probabilities).
        seed: Initialises the hidden layer (a linear head starts at zero and needs none).
    """

    spec: HeadSpec = field(default_factory=HeadSpec)
    l2: float = 1e-3
    max_iter: int = 150
    distill_temperature: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.l2 < 0 or self.max_iter < 1 or self.distill_temperature <= 0:
            raise ConfigError(f"fit config needs l2 >= 0, max_iter >= 1, distill_temperature > 0; got {self}")


def soft_targets(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """The full model's class probabilities at a temperature: the label-free fitting target."""
    return torch.softmax(logits.double() / temperature, dim=1).float()


def fit_head(
    feats: torch.Tensor, targets: torch.Tensor, config: FitConfig = FitConfig(), classes: int | None = None
) -> ExitHead:
    """Fits one head on pooled features.

    Args:
        feats: (N, D) pooled features (see `pool_features`; the columns `config.spec` gives).
        targets: (N,) int64 labels, or (N, classes) probabilities (e.g. `soft_targets(logits)`).
        config: Head shape and regularisation.
        classes: Number of classes (inferred from the targets when None).

    Returns:
        The head, with temperature 1 and the standardisation folded into its first layer.

    Example:
        >>> head = fit_head(f.select("layer2.4", spec), soft_targets(f.logits), FitConfig(spec))
    """
    # Fitted on the CPU whatever device the features come from: its parameters start from a CPU generator, and
    # L-BFGS on a few thousand rows is cheap there; a head is the same on a CPU and a CUDA run of the same features.
    x = feats.float().cpu()
    d = x.shape[1]
    if targets.dim() == 1:
        k = int(classes or int(targets.max()) + 1)
        t = F.one_hot(targets.long().cpu(), k).float()
    else:
        t = targets.float().cpu()
        k = int(t.shape[1])
    mean = x.mean(0)
    std = x.std(0).clamp_min(1e-6)
    z = (x - mean) / std
    g = torch.Generator().manual_seed(config.seed)
    h = config.spec.hidden
    params: list[torch.Tensor] = []
    if h:
        w1 = (torch.randn(h, d, generator=g) * math.sqrt(2.0 / d)).requires_grad_()
        b1 = torch.zeros(h, requires_grad=True)
        w2 = (torch.randn(k, h, generator=g) * math.sqrt(1.0 / h)).requires_grad_()
        params = [w1, b1, w2]
    else:
        w2 = torch.zeros(k, d, requires_grad=True)
        params = [w2]
    b2 = torch.zeros(k, requires_grad=True)
    params.append(b2)

    def forward() -> torch.Tensor:
        a = F.relu(F.linear(z, w1, b1)) if h else z
        return F.linear(a, w2, b2)

    opt = torch.optim.LBFGS(params, lr=1, max_iter=config.max_iter, history_size=20,
                            tolerance_grad=1e-6, tolerance_change=1e-9, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = -(t * F.log_softmax(forward(), dim=1)).sum(1).mean()
        reg = (w2 * w2).sum() + ((w1 * w1).sum() if h else 0.0)
        loss = loss + config.l2 * reg
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    with torch.no_grad():
        first = w1 if h else w2
        folded_w = first / std
        folded_b = (b1 if h else b2) - folded_w @ mean
        if h:
            return ExitHead(config.spec, w2.detach().clone(), b2.detach().clone(), folded_w.detach().clone(),
                            folded_b.detach().clone())
        return ExitHead(config.spec, folded_w.detach().clone(), folded_b.detach().clone())


def fit_temperature(head: ExitHead, feats: torch.Tensor, targets: torch.Tensor) -> ExitHead:
    """The head with the temperature that minimises cross-entropy on held-out features.

    Args:
        head: A fitted head.
        feats: (N, D) pooled features of images the head was not fitted on.
        targets: (N,) labels or (N, classes) probabilities (the full model's, label-free).

    Returns:
        The same head with its fitted temperature (searched on a log grid from 0.25 to 8, then refined).
    """
    with torch.no_grad():
        logits = head.logits_from_features(feats.float().cpu())  # on the CPU, where fit_head fitted the head
        targets = targets.cpu()
        t = F.one_hot(targets.long(), head.classes).float() if targets.dim() == 1 else targets.float()

        def nll(log_temp: float) -> float:
            return float(-(t * F.log_softmax(logits / math.exp(log_temp), dim=1)).sum(1).mean())

        grid = [math.log(0.25) + i * (math.log(32.0) / 40) for i in range(41)]
        best = min(grid, key=nll)
        a, b = best - math.log(32.0) / 40, best + math.log(32.0) / 40
        for _ in range(30):  # golden-section search around the best grid point
            c, e = a + 0.382 * (b - a), a + 0.618 * (b - a)
            if nll(c) < nll(e):
                b = e
            else:
                a = c
        best = (a + b) / 2
    return head.with_temperature(math.exp(best))


def fit_exit_heads(
    fit: Features,
    exits: Sequence[str],
    config: FitConfig = FitConfig(),
    calibrate: Features | None = None,
) -> dict[str, ExitHead]:
    """Fits one head per exit on cached features, then (optionally) its temperature.

    Args:
        fit: Features of the fitting images (no labels needed).
        exits: Exit point names to fit heads for.
        config: Head shape and regularisation (the same for every exit).
        calibrate: Features of held-out images the temperature is fitted on, against the full
            model's softmax (label-free); None keeps temperature 1.

    Returns:
        {exit name: head}, in the order of `exits`.

    Example:
        >>> heads = fit_exit_heads(train_features, ["layer2.2", "layer3.0"], FitConfig(), heldout_features)
    """
    targets = soft_targets(fit.logits, config.distill_temperature)
    classes = int(fit.logits.shape[1])
    heads = {}
    for e in exits:
        head = fit_head(fit.select(e, config.spec), targets, config, classes=classes)
        if calibrate is not None:
            head = fit_temperature(head, calibrate.select(e, config.spec), soft_targets(calibrate.logits))
        heads[e] = head
    return heads
