"""Batch-norm statistics re-estimated for a compressed plan, by shifting them with what changed.

Each norm's input is measured on the same calibration images in the compressed and in the original
model (in eval mode, one norm after another, earlier norms already corrected), and its statistics
are moved by the difference: mean + (mean_c - mean_0), var * var_c / var_0. Replacing them outright
(AdaBN) loses accuracy on the CIFAR checkpoints, whose statistics come from augmented training
images (measured: docs/compressors.md#measured); the shift keeps that calibration and is the
identity for an unchanged model.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from modelopt.data.split import Split
from modelopt.evaluation.prep_costs import OneTimeCosts
from modelopt.model.layers import feed_inputs
from modelopt.model.workload import Workload

Moments = dict[str, tuple[torch.Tensor, torch.Tensor]]  # norm -> (mean, variance) of its input, float64
# The images are one batch (each norm is shifted before the next one runs): at most this much prepared input in it.
# a batch of large images makes a pass's peak memory large, and a few hundred images already give each channel's
# statistics many positions (measured: docs/compressors.md#measured).
BATCH_BYTES = 64 * 2**20


class NormStats:
    """Re-estimated statistics per plan key (cached), over the workload's first calib images.

    Example:
        >>> stats, cost = NormStats(workload, one_time).recalibrated(plan.key, 64, state)
    """

    def __init__(self, workload: Workload, one_time: OneTimeCosts) -> None:
        self.workload = workload
        self.one_time = one_time
        self.norms = {n: m for n, m in workload.model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)}
        self._cache: dict[str, dict[str, torch.Tensor]] = {}  # plan key -> re-estimated statistics
        self._reference: tuple[int, Moments] | None = None  # (images, the original model's moments)

    def recalibrated(self, key: str, images: int, state: Mapping[str, torch.Tensor]
                     ) -> tuple[dict[str, torch.Tensor], float]:
        """Statistics for the plan `key` whose changed tensors are `state`, re-estimated on `images`
        calib images, and the budget that cost (0 when cached; the original model's pass is charged
        once, to the first plan of the run that needs it)."""
        if images == 0 or not self.norms:
            return {}, 0.0
        if key in self._cache:
            return self._cache[key], 0.0
        calib = self.workload.split(Split.CALIB).x
        images = min(images, max(1, BATCH_BYTES // (4 * calib.shape[1:].numel())))
        x = self.workload.laid_out(calib[:images])
        cost = x.shape[0] / len(self.workload.split(Split.VAL))
        if self._reference is None or self._reference[0] != x.shape[0]:
            self._reference = (x.shape[0], self._moments(x, None))
        cost += self.one_time.charge(f"norm_reference:{x.shape[0]}", cost)
        stats: dict[str, torch.Tensor] = {}
        for name, m in self.norms.items():
            if m.track_running_stats:
                assert m.running_mean is not None and m.running_var is not None
                stats[f"{name}.running_mean"] = m.running_mean.clone()
                stats[f"{name}.running_var"] = m.running_var.clone()
        with self.workload.state({**state, **stats}):
            self._moments(x, self._reference[1])
        self._cache[key] = stats
        return stats, cost

    def _moments(self, x: torch.Tensor, reference: Moments | None) -> Moments:
        """Per norm, mean and variance of its input over `x` (one batch); with `reference`, each
        norm's running statistics are shifted in place before it runs."""
        seen: Moments = {}

        def hook(name: str, _: nn.Module, a: torch.Tensor) -> None:
            # (N, C, ...): statistics per channel over every other dim, in place (no copy).
            var, mu = torch.var_mean(a.float(), dim=[d for d in range(a.dim()) if d != 1], correction=0)
            mu, var = mu.double(), var.double()
            seen[name] = (mu, var)
            m = self.norms[name]  # the module the hook runs for, typed as a batch norm
            if reference is None or name not in reference or m.running_mean is None or m.running_var is None:
                return  # (a norm tracks both running statistics or neither)
            mu0, var0 = reference[name]
            ratio = torch.where(var0 > 1e-12, var / var0.clamp(min=1e-12), torch.ones_like(var))
            m.running_mean.copy_(m.running_mean.double() + (mu - mu0))
            m.running_var.copy_(m.running_var.double() * ratio)

        feed_inputs(self.workload.model, self.norms, x, max(1, x.shape[0]), hook)
        return seen
