"""What one evaluation measured: the record every trial, journal line and report reads."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from modelopt.confidence import PairedCounts

__all__ = ["Metrics"]


@dataclass(frozen=True)
class Metrics:
    """What one evaluation measured; every field means what docs/certification.md (Numbers) says."""

    split: str
    n_samples: int
    accuracy: float
    baseline_accuracy: float
    retention: float
    agreement: float
    size_bytes: int
    float_size_bytes: int
    compression: float
    bitops: int
    macs: int
    eval_seconds: float
    float_bitops: int = 0  # the uncompressed model's, for reduction factors
    float_macs: int = 0
    latency_ms: float | None = None  # measured (modelopt.latency.plan), backend named in latency_backend
    latency_backend: str | None = None
    float_latency_ms: float | None = None  # the uncompressed model's, same backend
    # Multi-fidelity: why scoring stopped on a subset ("infeasible": below the floor beyond
    # doubt; "dominated": it cannot beat the best plan, so its retention only informs the
    # search). None: scored on the whole split. A stopped plan is never feasible or best.
    stopped: str | None = None
    # Budget spent preparing the plan before scoring it (batch-norm re-estimation after pruning),
    # in full-evaluation equivalents; 0 when the preparation was cached. Trials are charged it.
    prep_cost: float = 0.0
    # Early exit: the share of samples that left at an exit (None: the plan has no exit). With
    # exits, macs and bitops are means over the samples, heads included (docs/certification.md).
    exited: float | None = None
    # Paired with the float model on the same images (modelopt.confidence): images the float model
    # gets right, and those only it (lost) or only the plan (gained) gets right. They carry all the
    # uncertainty of the accuracy drop. None in records written before they were kept.
    base_right: int | None = None
    lost: int | None = None
    gained: int | None = None
    # {layer: bytes its stored values (codes, masks, sparse floats) take coded in the packed file}, measured on
    # the plan's codes: with the cost model's fixed parts they give each layer's share of size_bytes. None in
    # records written before the file was entropy coded.
    coded: dict[str, int] | None = field(default=None, hash=False)  # a dict: left out of the record's hash
    # The weights' bytes once decoded into their fixed-rate containers (int8 codes, INT4 two to a byte), the float
    # tensors as stored: what a runtime holds after `modelopt.load`, where size_bytes is what the file holds.
    # 0 in records written before it was kept.
    decoded_bytes: int = field(default=0, hash=False, compare=False)

    def counts(self) -> PairedCounts | None:
        """The paired counts, or None for a record that lacks them."""
        if self.base_right is None or self.lost is None or self.gained is None:
            return None
        return PairedCounts(self.n_samples, self.base_right, self.lost, self.gained)

    def retention_bounds(self, confidence: float) -> tuple[float, float]:
        """One-sided (lower, upper) bounds on retention at `confidence`; the point estimate when
        `confidence` is 0 or the record has no paired counts."""
        c = self.counts()
        if c is None or confidence <= 0.0:
            return self.retention, self.retention
        return c.retention_bounds(confidence)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (NaN becomes None)."""
        return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Metrics:
        fields = {f.name: f for f in dataclasses.fields(cls)}
        values = {k: v for k, v in d.items() if k in fields}
        for k in ("accuracy", "baseline_accuracy", "retention", "agreement", "compression"):
            if values.get(k) is None:
                values[k] = math.nan
        return cls(**values)
