"""Measured latency, with the device and backend named (DESIGN.md, latency_ms).

- `measure`: one module's median batch latency on a backend (`torch_latency`, `onnx_latency`).
- `spec`: `LatencySpec`, how a run measures (backend, batch size, threads, repeats).
- `plan`: `PlanLatency`, the latency of a plan as it deploys, measured once per distinct plan
  (import it from `modelopt.latency.plan`: it exports plans to ONNX, so this package does not load it).
"""

from modelopt.latency.measure import BACKENDS, Latency, measure_latency, onnx_latency, torch_latency
from modelopt.latency.spec import LatencySpec

__all__ = ["BACKENDS", "Latency", "LatencySpec", "measure_latency", "onnx_latency", "torch_latency"]
