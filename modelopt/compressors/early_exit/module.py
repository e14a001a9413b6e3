"""The deployable early-exit network: it really stops at the first exit that is confident enough.

`EarlyExitNet` wraps a model's blocks (shared, not copied) and the heads of the active exits.
Each sample runs block by block; at an active exit the head is evaluated and, if its confidence
reaches the exit's threshold, the sample's logits are the head's and the rest of the network is
skipped. At batch size 1 that is a real early return, the deployment case; larger batches drop
the samples that have left and run on with the rest. The rule, and hence every prediction,
equals the evaluator's (`policy.first_confident`).

The heads' parameters are buffers, so `state_dict()` holds only tensors (`torch.load(..., weights_only=True)`).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from modelopt.compressors.early_exit.heads import ExitHead, HeadSpec, pool_features
from modelopt.compressors.early_exit.policy import ExitPolicy
from modelopt.errors import ConfigError
from modelopt.model.backbone import Backbone

__all__ = ["EarlyExitNet", "HeadModule"]


class HeadModule(nn.Module):
    """An exit head as a module: a block's output -> (logits, confidence).

    With `size` (the block output's height and width, known when the model is cut), pooling is written with fixed
    windows, as a graph export needs (ONNX has no adaptive pooling): the same bins as adaptive pooling."""

    # Buffers, registered from the head's tensors (hidden_* only when the head has a hidden layer).
    weight: torch.Tensor
    bias: torch.Tensor
    temperature: torch.Tensor
    hidden_weight: torch.Tensor
    hidden_bias: torch.Tensor

    def __init__(self, head: ExitHead, size: tuple[int, int] | None = None) -> None:
        super().__init__()
        self.spec = head.spec
        for name, t in head._tensors().items():
            self.register_buffer(name, t.detach().clone().float())
        self.hidden = head.hidden_weight is not None
        self.size = size

    def forward(self, fmap: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = pool_features(fmap, self.spec) if self.size is None else _fixed_pools(fmap, self.spec, self.size)
        if self.hidden:
            h = F.relu(F.linear(h, self.hidden_weight, self.hidden_bias))
        logits = F.linear(h, self.weight, self.bias)
        conf = torch.softmax(logits / self.temperature, dim=-1).amax(dim=-1)
        return logits, conf


def _fixed_pools(fmap: torch.Tensor, spec: HeadSpec, size: tuple[int, int]) -> torch.Tensor:
    """`pool_features` with every window fixed by `size`: one pooling op per grid that divides the map, else each
    adaptive bin ([floor(i H / g), ceil((i + 1) H / g))) reduced on its own."""
    height, width = size
    parts = []
    for grids, pool, reduce in ((spec.avg_grids, F.avg_pool2d, torch.mean), (spec.max_grids, F.max_pool2d, torch.amax)):
        for g in grids:
            if height % g == 0 and width % g == 0:
                parts.append(pool(fmap, (height // g, width // g)).flatten(1))
                continue
            rows = [(i * height // g, -(-(i + 1) * height // g)) for i in range(g)]
            cols = [(j * width // g, -(-(j + 1) * width // g)) for j in range(g)]
            bins = [reduce(fmap[:, :, r0:r1, c0:c1], dim=(2, 3)) for r0, r1 in rows for c0, c1 in cols]
            parts.append(torch.stack(bins, dim=2).flatten(1))
    return torch.cat(parts, dim=1)


class EarlyExitNet(nn.Module):
    """A model with exit heads that returns at the first confident exit.

    Args:
        backbone: The cut model (`split_backbone`); its modules are shared.
        heads: Fitted head per exit name (at least those in `policy`).
        policy: Active exits and thresholds.

    Example:
        >>> net = EarlyExitNet(split_backbone(model), heads, policy).eval()
        >>> logits = net(x[:1])                    # stops at the first exit that is sure enough
        >>> logits, exit_at = net.forward_with_exits(x)
    """

    def __init__(self, backbone: Backbone, heads: Mapping[str, ExitHead], policy: ExitPolicy) -> None:
        super().__init__()
        policy = policy.active()
        missing = [e for e in policy.exits if e not in heads]
        if missing:
            raise ConfigError(f"policy exits {missing} have no fitted head; heads: {sorted(heads)}")
        names = [n for n, _ in backbone.blocks]
        pos = [names.index(backbone.point(e).name) for e in policy.exits]
        if pos != sorted(pos):
            raise ConfigError(f"policy exits must be in backbone order; got {list(policy.exits)}")
        self.policy = policy
        self.stem = backbone.stem
        self.blocks = nn.ModuleList([m for _, m in backbone.blocks])
        self.tail = backbone.tail
        self.heads = nn.ModuleList([HeadModule(heads[e]) for e in policy.exits])
        self._exit_after = {p: k for k, p in enumerate(pos)}  # block position -> head position
        self.register_buffer("thresholds", torch.tensor(policy.thresholds, dtype=torch.float32))
        self._thr = tuple(float(t) for t in policy.thresholds)  # python floats: no tensor compare per call

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of each sample from the exit it left at (or the full network)."""
        if x.shape[0] == 1:
            return self._forward_one(x)
        return self.forward_with_exits(x)[0]

    def _forward_one(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for i, block in enumerate(self.blocks):
            h = block(h)
            k = self._exit_after.get(i)
            if k is not None:
                logits, conf = self.heads[k](h)
                if float(conf) >= self._thr[k]:
                    return logits
        return self.tail(h)

    def forward_with_exits(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits and, per sample, the position in `policy.exits` it left at (len = ran it all)."""
        n = x.shape[0]
        out: torch.Tensor | None = None
        exit_at = torch.full((n,), len(self.heads), dtype=torch.long, device=x.device)
        alive = torch.arange(n, device=x.device)
        h = self.stem(x)
        for i, block in enumerate(self.blocks):
            h = block(h)
            k = self._exit_after.get(i)
            if k is None:
                continue
            logits, conf = self.heads[k](h)
            if out is None:
                out = torch.empty(n, logits.shape[1], dtype=logits.dtype, device=x.device)
            fire = conf >= self._thr[k]
            out[alive[fire]] = logits[fire]
            exit_at[alive[fire]] = k
            alive, h = alive[~fire], h[~fire]
            if alive.numel() == 0:
                return out, exit_at
        final = self.tail(h)
        if out is None:
            return final, exit_at
        out[alive] = final
        return out, exit_at
