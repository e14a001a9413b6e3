"""How latency is measured: engine, batch size, threads and repeats (a run setting, in run.json)."""

from __future__ import annotations

from dataclasses import dataclass

from modelopt.errors import ConfigError
from modelopt.latency.engine import ENGINES
from modelopt.latency.measure import check_protocol


@dataclass(frozen=True)
class LatencySpec:
    """How latency is measured: the engine (`modelopt.latency.engine.ENGINES`: torch, onnxruntime, openvino),
    batch size, threads and repeats.

    Example:
        >>> LatencySpec("onnxruntime", batch_size=1).name("cpu", "fp32")
        'onnxruntime/cpu/fp32/b1'
    """

    backend: str = "torch"
    batch_size: int = 1
    threads: int = 1
    warmup: int = 5
    repeats: int = 30
    # Deployed equals certified: the reported plan, built afresh as deployed (the exported file in a new engine
    # session), must give the scored top-1 on at least this share of the test images (`modelopt.certify.deployed`).
    min_agreement: float = 0.995

    def __post_init__(self) -> None:
        if self.backend not in ENGINES:
            raise ConfigError(f"unknown latency backend {self.backend!r}; valid: {', '.join(ENGINES.names())}")
        # Checked here, where a run's settings are read, not when the first plan is timed after loading.
        check_protocol(self.batch_size, self.threads, self.warmup, self.repeats)
        if not isinstance(self.min_agreement, (int, float)) or not 0.0 <= self.min_agreement <= 1.0:
            raise ConfigError(f"min_agreement must be a share in [0, 1] like 0.995, got {self.min_agreement!r}")

    def name(self, device: str, precision: str) -> str:
        """The figure's name: engine, device, precision and batch (figures of different names never compare)."""
        return f"{self.backend}/{device}/{precision}/b{self.batch_size}"
