"""Measured latency of a plan, once per distinct plan, on a named backend.

- ``torch``: the module the plan deploys as (`Evaluator.deployable`: structurally pruned
  channels physically removed, an `EarlyExitNet` that returns at the first confident exit).
  Weight-only quantization is simulated there (dequantized float weights, float kernels), so
  this backend shows what pruning or early exit change, not integer kernels.
- ``onnxruntime``: the plan exported to ONNX with QuantizeLinear/DequantizeLinear
  (modelopt.exporters.onnx), run by ONNX Runtime's CPU integer kernels.

The metric's name carries the backend and device (`latency_backend`, e.g.
``onnxruntime/cpu/b1``), so numbers from different runtimes are never compared as one.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from modelopt.errors import ConfigError
from modelopt.evaluation.evaluator import Evaluator
from modelopt.exporters.onnx import export_onnx
from modelopt.latency.measure import Latency, onnx_latency, torch_latency
from modelopt.latency.spec import LatencySpec
from modelopt.plan.plan import Plan


class PlanLatency:
    """Measures and caches plan latencies for one evaluator.

    Example:
        >>> lat = PlanLatency(evaluator, LatencySpec("torch", batch_size=64))
        >>> lat.measure(plan).median_ms, lat.reference().median_ms
    """

    def __init__(self, evaluator: Evaluator, spec: LatencySpec | None = None) -> None:
        self.evaluator = evaluator
        self.spec = spec or LatencySpec()
        self._cache: dict[str, Latency] = {}
        wl = evaluator.workload
        if self.spec.backend == "onnxruntime" and wl.device.type != "cpu":
            raise ConfigError(f"latency backend 'onnxruntime' runs on the cpu; the workload is on {wl.device}")
        self.device = "cpu" if self.spec.backend == "onnxruntime" else str(wl.device)

    @property
    def name(self) -> str:
        return self.spec.name(self.device)

    def reference(self) -> Latency:
        """The uncompressed model's latency, measured the same way."""
        return self.measure(self.evaluator.space.plan())

    def measure(self, plan: Plan) -> Latency:
        if plan.key not in self._cache:
            self._cache[plan.key] = self._measure(plan)
        return self._cache[plan.key]

    def _measure(self, plan: Plan) -> Latency:
        s, wl = self.spec, self.evaluator.workload
        x = wl.split("val").x
        if s.backend == "torch":
            # What the plan deploys as: structurally pruned channels removed, exits that really return.
            model = self.evaluator.states.deployable(plan)
            return torch_latency(model, x, batch_size=s.batch_size, device=wl.device, threads=s.threads,
                                 warmup=s.warmup, repeats=s.repeats,
                                 varying=self.evaluator.routes.route(plan) is not None)
        self.evaluator.routes.refuse_static(plan, "latency backend 'onnxruntime'", "use the torch backend")
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "plan.onnx"
            export_onnx(self.evaluator, plan, path)
            return onnx_latency(path, x.cpu(), batch_size=s.batch_size, threads=s.threads, warmup=s.warmup,
                                repeats=s.repeats)
