"""How latency is measured: backend, batch size, threads and repeats (a run setting, in run.json)."""

from __future__ import annotations

from dataclasses import dataclass

from modelopt.errors import ConfigError
from modelopt.latency.measure import BACKENDS


@dataclass(frozen=True)
class LatencySpec:
    """How latency is measured: backend, batch size, threads and repeats.

    Example:
        >>> LatencySpec("onnxruntime", batch_size=1).name("cpu")
        'onnxruntime/cpu/b1'
    """

    backend: str = "torch"
    batch_size: int = 1
    threads: int = 1
    warmup: int = 5
    repeats: int = 30

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"unknown latency backend {self.backend!r}; valid: {', '.join(BACKENDS)}")

    def name(self, device: str) -> str:
        return f"{self.backend}/{device}/b{self.batch_size}"
