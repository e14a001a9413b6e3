"""Exit heads: multi-resolution pooling of a block's output, then a linear layer or a small MLP.

A head reads the feature map (N, C, H, W) after its block, pools it to a vector (average pooling
over several grids, max pooling over several grids), and maps that vector to class logits with
one linear layer, or with a hidden ReLU layer first. Input standardisation is folded into the
first layer when the head is fitted, so a deployed head is pool -> linear [-> relu -> linear].
Its confidence is the largest softmax probability of logits / temperature.

All parameters are plain tensors: `ExitHead.state_dict()` saves with `torch.save` and loads back
with `torch.load(..., weights_only=True)` and `ExitHead.from_state_dict`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from modelopt.errors import ConfigError

__all__ = ["ExitHead", "HeadSpec", "pool_features"]


@dataclass(frozen=True)
class HeadSpec:
    """What a head pools and how deep it is.

    Attributes:
        avg_grids: Average-pool the feature map to each g x g grid (1 = global average).
        max_grids: Max-pool to each g x g grid.
        hidden: Units of one hidden ReLU layer; 0 for a linear head.
    """

    avg_grids: tuple[int, ...] = (1, 2, 4)
    max_grids: tuple[int, ...] = (1, 2)
    hidden: int = 0

    def __post_init__(self) -> None:
        if not self.avg_grids and not self.max_grids:
            raise ConfigError("a head spec needs at least one pooling grid (avg_grids or max_grids)")
        if any(g < 1 for g in (*self.avg_grids, *self.max_grids)) or self.hidden < 0:
            raise ConfigError(f"pooling grids must be >= 1 and hidden >= 0; got {self}")

    def features(self, channels: int) -> int:
        """Length of the pooled vector for a feature map with `channels` channels."""
        return channels * sum(g * g for g in (*self.avg_grids, *self.max_grids))

    def params(self, channels: int, classes: int) -> int:
        """Parameters a fitted head stores: its layers' weights and biases, and the temperature."""
        d, h, k = self.features(channels), self.hidden, classes
        return (d * h + h + h * k + k + 1) if h else (d * k + k + 1)

    def macs(self, channels: int, classes: int) -> int:
        """Multiply-accumulates per sample of the head's linear layers (pooling is not counted,
        as batch norms, ReLUs and residual additions are not counted for the backbone)."""
        d = self.features(channels)
        return d * self.hidden + self.hidden * classes if self.hidden else d * classes


def pool_features(fmap: torch.Tensor, spec: HeadSpec) -> torch.Tensor:
    """The pooled vector of each sample: average grids, then max grids, each flattened channel-major.

    Args:
        fmap: (N, C, H, W) block output.
        spec: Which grids.

    Returns:
        (N, spec.features(C)) float tensor.

    Example:
        >>> pool_features(torch.ones(2, 16, 8, 8), HeadSpec((1, 2), (1,))).shape
        torch.Size([2, 96])
    """
    parts = [F.adaptive_avg_pool2d(fmap, g).flatten(1) for g in spec.avg_grids]
    parts += [F.adaptive_max_pool2d(fmap, g).flatten(1) for g in spec.max_grids]
    return torch.cat(parts, dim=1)


@dataclass(frozen=True, eq=False)
class ExitHead:
    """A fitted exit head (frozen; tensors are not modified after fitting).

    Attributes:
        spec: Pooling and depth.
        weight: (classes, D) or, with a hidden layer, (classes, hidden).
        bias: (classes,).
        hidden_weight: (hidden, D) or None.
        hidden_bias: (hidden,) or None.
        temperature: Scalar tensor; confidence is max softmax(logits / temperature).
    """

    spec: HeadSpec
    weight: torch.Tensor
    bias: torch.Tensor
    hidden_weight: torch.Tensor | None = None
    hidden_bias: torch.Tensor | None = None
    temperature: torch.Tensor = field(default_factory=lambda: torch.tensor(1.0))

    @property
    def classes(self) -> int:
        return int(self.weight.shape[0])

    @property
    def in_features(self) -> int:
        w = self.hidden_weight if self.hidden_weight is not None else self.weight
        return int(w.shape[1])

    @property
    def macs(self) -> int:
        """Multiply-accumulates per sample of this head (its linear layers; see `HeadSpec.macs`)."""
        n = self.weight.numel()
        return n + (self.hidden_weight.numel() if self.hidden_weight is not None else 0)

    @property
    def params(self) -> int:
        return sum(t.numel() for t in self._tensors().values())

    def logits_from_features(self, feats: torch.Tensor) -> torch.Tensor:
        """Logits (before temperature) from pooled features (N, D)."""
        h = feats
        if self.hidden_weight is not None:
            h = F.relu(F.linear(h, self.hidden_weight, self.hidden_bias))
        return F.linear(h, self.weight, self.bias)

    def __call__(self, fmap: torch.Tensor) -> torch.Tensor:
        """Logits (before temperature) from a block output (N, C, H, W)."""
        return self.logits_from_features(pool_features(fmap, self.spec))

    def confidence(self, logits: torch.Tensor) -> torch.Tensor:
        """Max softmax probability of logits / temperature, per sample."""
        return torch.softmax(logits / self.temperature, dim=-1).amax(dim=-1)

    def with_temperature(self, temperature: float) -> ExitHead:
        return ExitHead(self.spec, self.weight, self.bias, self.hidden_weight, self.hidden_bias,
                        torch.tensor(float(temperature)))

    def _tensors(self) -> dict[str, torch.Tensor]:
        out = {"weight": self.weight, "bias": self.bias, "temperature": self.temperature}
        if self.hidden_weight is not None and self.hidden_bias is not None:
            out.update(hidden_weight=self.hidden_weight, hidden_bias=self.hidden_bias)
        return out

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Plain tensors only (the spec as int tensors), loadable with `weights_only=True`.

        Example:
            >>> torch.save(head.state_dict(), "h.pt")
            >>> ExitHead.from_state_dict(torch.load("h.pt", weights_only=True))
        """
        out = {k: v.detach().clone() for k, v in self._tensors().items()}
        out["avg_grids"] = torch.tensor(self.spec.avg_grids, dtype=torch.int64)
        out["max_grids"] = torch.tensor(self.spec.max_grids, dtype=torch.int64)
        out["hidden"] = torch.tensor(self.spec.hidden, dtype=torch.int64)
        return out

    @classmethod
    def from_state_dict(cls, state: dict[str, torch.Tensor]) -> ExitHead:
        spec = HeadSpec(tuple(int(g) for g in state["avg_grids"]), tuple(int(g) for g in state["max_grids"]),
                        int(state["hidden"]))
        return cls(spec, state["weight"], state["bias"], state.get("hidden_weight"), state.get("hidden_bias"),
                   state["temperature"])
