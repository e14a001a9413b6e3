"""The evaluator: applies a plan to the resident model and scores it on a split."""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from modelopt.errors import TrialError
from modelopt.fidelity import Fidelity, max_correct
from modelopt.plan import Plan
from modelopt.space import SearchSpace
from modelopt.workload import Workload


@dataclass(frozen=True)
class Metrics:
    """What one evaluation measured; every field means what DESIGN.md says."""

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
    latency_ms: float | None = None
    latency_backend: str | None = None
    # Multi-fidelity: why scoring stopped on a subset ("infeasible": below the floor beyond
    # doubt; "dominated": it cannot beat the best plan, so its retention only informs the
    # search). None: scored on the whole split. A stopped plan is never feasible or best.
    stopped: str | None = None

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


class Evaluator:
    """Scores plans: cached compressed tensors per (layer, choices), results cached by plan key.

    Example:
        >>> ev = Evaluator(workload, space)
        >>> ev.evaluate(space.uniform("quantize", QuantSpec(8)), split="val").retention
    """

    def __init__(self, workload: Workload, space: SearchSpace) -> None:
        self.workload = workload
        self.space = space
        # Compressed tensors live on the workload, so runs that share it (a sweep) share them too.
        self._tensors: dict[tuple[Any, ...], torch.Tensor] = workload.tensor_cache
        self._results: dict[tuple[str, str, int], Metrics] = {}
        # Cached tensors are keyed by each compressor's name and options, so runs that share a
        # workload with differently configured compressors never read each other's tensors.
        self._compressor_keys = {
            name: (name, repr(sorted(c.options().items()))) for name, c in space.compressors.items()
        }
        self._layer_decisions = {
            layer.name: [d for d in space.decisions if d.layer == layer.name] for layer in workload.layers
        }

    # ---- static accounting ----------------------------------------------------------------

    def size_bytes(self, plan: Plan) -> int:
        total = self.workload.other_bytes
        for layer in self.workload.layers:
            decs = self._layer_decisions[layer.name]
            # The last compressor to touch the weight decides how it is stored.
            owner = next((d for d in reversed(decs) if plan.get(d.name) is not None), None)
            if owner is None:
                total += layer.params * 4
            else:
                total += self.space.compressors[owner.compressor].weight_bytes(layer, plan.get(owner.name))
        return total

    def weight_bits(self, plan: Plan, layer: str) -> int:
        bits = 32
        for d in self._layer_decisions[layer]:
            bits = min(bits, self.space.compressors[d.compressor].weight_bits(plan.get(d.name)))
        return bits

    def bitops(self, plan: Plan) -> int:
        return sum(layer.macs * self.weight_bits(plan, layer.name) * 32 for layer in self.workload.layers)

    def float_bitops(self) -> int:
        return self.workload.macs * 32 * 32

    def measure_errors(self) -> None:
        """Replaces the space's estimated per-choice weight errors by measured ones (no data needed)."""
        for d in self.space.decisions:
            w = self.workload.original[d.layer].float()  # type: ignore[index]
            norm = float((w**2).sum()) or 1.0
            feats = []
            for c, f in zip(d.choices, self.space.features[d.name]):
                if c is None:
                    feats.append(dataclasses.replace(f, error=0.0))
                    continue
                plan = self.space.plan({d.name: c})
                q = self.compressed_weights(plan)[d.layer].float()  # type: ignore[index]
                err = float(((q - w) ** 2).sum()) / norm
                # A choice that breaks the weight (non-finite) is as bad as losing it entirely.
                feats.append(dataclasses.replace(f, error=err if math.isfinite(err) else 1.0))
            self.space.features[d.name] = tuple(feats)

    # ---- evaluation -----------------------------------------------------------------------

    def cost(self, split: str = "val", n: int | None = None) -> float:
        """Budget charged for scoring one plan on n samples of a split: n / len(val)."""
        total = len(self.workload.split("val"))
        return min(n or total, len(self.workload.split(split))) / total

    def compressed_weights(self, plan: Plan) -> dict[str, torch.Tensor]:
        weights = {}
        for layer in self.workload.layers:
            decs = self._layer_decisions[layer.name]
            choices = tuple(plan.get(d.name) for d in decs)
            if all(c is None for c in choices):
                continue
            key = (layer.name, tuple(self._compressor_keys[d.compressor] for d in decs), choices)
            w = self._tensors.get(key)
            if w is None:
                w = self.workload.original[layer.name]
                for d, c in zip(decs, choices):
                    w = self.space.compressors[d.compressor].apply(w, c)
                self._tensors[key] = w = w.contiguous()
            weights[layer.name] = w
        return weights

    def evaluate(self, plan: Plan, split: str = "val", n: int | None = None) -> Metrics:
        """Scores `plan` on the first `n` samples of `split` (all when None).

        Raises:
            TrialError: when the compressed model yields non-finite outputs.
        """
        data = self.workload.split(split)
        n = len(data) if n is None else max(1, min(n, len(data)))
        key = (plan.key, split, n)
        if key in self._results:
            return self._results[key]
        t0 = time.perf_counter()
        with self.workload.weights(self.compressed_weights(plan)):
            pred = self._predict(plan, data.x[:n])
        metrics = self._metrics(plan, split, pred, time.perf_counter() - t0)
        self._results[key] = metrics
        return metrics

    def evaluate_staged(self, plan: Plan, min_retention: float, fidelity: Fidelity, *, finish: bool = True) -> Metrics:
        """Scores `plan` on the val split in stages, stopping once the rest cannot matter.

        After each stage of `fidelity`, the plan stops if an upper confidence bound on its
        retention over the whole split is below `min_retention` (see `modelopt.fidelity`).
        With `finish=False` (the plan cannot beat the best one found, whatever its accuracy)
        it stops after the first stage: its retention there only informs the search.
        """
        data = self.workload.split("val")
        full = (plan.key, "val", len(data))
        if full in self._results:
            return self._results[full]
        t0 = time.perf_counter()
        cuts = fidelity.cuts(len(data))
        base_right = data.base_correct
        preds: list[torch.Tensor] = []
        with self.workload.weights(self.compressed_weights(plan)):
            start = 0
            for stop in cuts:
                preds.append(self._predict(plan, data.x[start:stop]))
                start = stop
                if stop == len(data):
                    break
                pred = torch.cat(preds)
                if not finish:
                    return self._metrics(plan, "val", pred, time.perf_counter() - t0, stopped="dominated")
                right = pred == data.y[:stop]
                br, bw = base_right[:stop], ~base_right[:stop]
                bound = max_correct(
                    plan_correct=int(right.sum()),
                    base_right=int(br.sum()), lost=int((br & ~right).sum()),
                    base_wrong=int(bw.sum()), gained=int((bw & right).sum()),
                    base_right_rest=int(base_right[stop:].sum()), base_wrong_rest=int((~base_right[stop:]).sum()),
                    delta=fidelity.delta,
                )
                if bound < min_retention * int(base_right.sum()):
                    return self._metrics(plan, "val", pred, time.perf_counter() - t0, stopped="infeasible")
        metrics = self._metrics(plan, "val", torch.cat(preds), time.perf_counter() - t0)
        self._results[full] = metrics
        return metrics

    def _predict(self, plan: Plan, x: torch.Tensor) -> torch.Tensor:
        logits = self.workload.logits(x)
        if not torch.isfinite(logits).all():
            raise TrialError(f"plan {plan.key} gives non-finite outputs")
        return logits.argmax(dim=1)

    def _metrics(self, plan: Plan, split: str, pred: torch.Tensor, seconds: float, stopped: str | None = None
                 ) -> Metrics:
        """Metrics of predictions `pred` for the first len(pred) samples of `split`."""
        data = self.workload.split(split)
        n = int(pred.shape[0])
        y, base = data.y[:n], data.base_pred[:n]
        acc = float((pred == y).float().mean())
        base_acc = float((base == y).float().mean())
        size = self.size_bytes(plan)
        return Metrics(
            split=split,
            n_samples=n,
            accuracy=acc,
            baseline_accuracy=base_acc,
            retention=acc / base_acc if base_acc > 0 else math.nan,
            agreement=float((pred == base).float().mean()),
            size_bytes=size,
            float_size_bytes=self.workload.float_size_bytes,
            compression=self.workload.float_size_bytes / size,
            bitops=self.bitops(plan),
            macs=self.workload.macs,
            eval_seconds=seconds,
            float_bitops=self.float_bitops(),
            float_macs=self.workload.macs,
            stopped=stopped,
        )
