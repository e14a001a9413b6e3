"""Measured latency, with the device, engine, precision and batch named (docs/export-and-latency.md).

- `measure`: one module's or ONNX file's median batch latency (`torch_latency`, `onnx_latency`).
- `engine`: the engines a plan deploys in, as plugins (`ENGINES`: ``torch``, ``onnxruntime``, ``openvino``),
  each building, running and timing a plan, and building it as a user deploys it (`Engine.deployed`, which
  certification checks the reported plan in) (`engine_torch`, `engine_onnx`).
- `spec`: `LatencySpec`, how a run measures (engine, batch size, threads, repeats).
- `plan`: `PlanLatency`, a run's plans built in its engine, scored there when its answers can differ from
  the PyTorch simulation, and timed once per distinct graph (import it from `modelopt.latency.plan`).
- `cost_model`: the latency cost model the strategies' priors read (per layer and choice, refined by trials).
"""

from modelopt.latency import engine_onnx, engine_torch  # noqa: F401 -- they register the engines
from modelopt.latency.engine import ENGINES, ArrayDeployment, Compiled, Deployment, Engine, structure_key
from modelopt.latency.measure import Latency, onnx_latency, torch_latency
from modelopt.latency.spec import LatencySpec

__all__ = ["ENGINES", "ArrayDeployment", "Compiled", "Deployment", "Engine", "Latency", "LatencySpec",
           "onnx_latency", "structure_key", "torch_latency"]
