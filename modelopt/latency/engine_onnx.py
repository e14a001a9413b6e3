"""The ONNX engines: ONNX Runtime and OpenVINO, each running the plan as `modelopt export --format onnx`
writes it (integer weights behind DequantizeLinear, uint8 QDQ around the layers whose inputs the plan
quantizes: integer kernels there, `modelopt.exporters.onnx`). Both run on the CPU, in float32 elsewhere.
"""

from __future__ import annotations

import re
import tempfile
import time
from abc import abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from modelopt.errors import ConfigError, LoadError
from modelopt.evaluation.evaluator import Evaluator
from modelopt.exporters.onnx import onnx_model, ort_session
from modelopt.latency.engine import ENGINES, Compiled, Engine, structure_key
from modelopt.latency.measure import Latency, batch_of, check_protocol, onnx_latency, record, time_runs
from modelopt.plan.plan import Plan

if TYPE_CHECKING:
    from modelopt.latency.spec import LatencySpec

__all__ = ["OnnxRuntime", "OpenVino", "graph_key"]

_SCORE_BATCH = 256  # rows per engine call when a plan is scored


def graph_key(model: Any) -> str:
    """What an ONNX model runs, without weight values: nodes (ops, wiring, attributes) and initializer types."""
    nodes = [(n.op_type, tuple(n.input), tuple(n.output), tuple(str(a) for a in n.attribute)) for n in model.graph.node]
    inits = [(t.name, t.data_type, tuple(t.dims)) for t in model.graph.initializer]
    return structure_key(nodes, inits)


class _OnnxEngine(Engine):
    """Exports the plan to ONNX, then hands the bytes to `_build`."""

    def compile(self, evaluator: Evaluator, plan: Plan, spec: LatencySpec) -> Compiled:
        t0 = time.perf_counter()
        model, _ = onnx_model(evaluator, plan)
        data = model.SerializeToString()
        try:
            return self._build(data, graph_key(model), spec, t0)
        except (ConfigError, LoadError):
            raise
        except Exception as exc:  # noqa: BLE001 -- the engine's own failure: one line naming the layer it names
            raise ConfigError(_cannot_build(self.name, str(exc))) from None

    @abstractmethod
    def _build(self, data: bytes, key: str, spec: LatencySpec, t0: float) -> Compiled:
        """The engine's build of the serialized model."""


def _cannot_build(engine: str, message: str) -> str:
    """One line: the layer the engine's message names (by its weight, as the exporter names it) and the limit
    it states (its most specific line), e.g. "openvino cannot build layer 'layer2.1.conv1': DequantizeLinear
    doesn't support ... block_size (64)"."""
    layer = re.search(r"([A-Za-z_][\w.]*?)\.weight", message)
    noise = ("--", "Summary", "Check ", "FrontEnd", "Exception", "While validating", "Model wasn't",
             "[ONNXRuntimeError]")
    lines = [ln.strip() for ln in message.splitlines() if ln.strip() and not ln.strip().startswith(noise)]
    limit = " ".join((lines[-1] if lines else message).split())[:240]
    return f"{engine} cannot build {f'layer {layer.group(1)!r}' if layer else 'this plan'}: {limit}"


@ENGINES.register("onnxruntime")
class OnnxRuntime(_OnnxEngine):
    """ONNX Runtime's CPU provider, every graph optimisation on (QDQ fused into integer kernels)."""

    name = "onnxruntime"

    def _build(self, data: bytes, key: str, spec: LatencySpec, t0: float) -> Compiled:
        with tempfile.TemporaryDirectory() as tmp:  # built once here: a plan ORT cannot build fails now
            path = Path(tmp) / "plan.onnx"
            path.write_bytes(data)
            session = ort_session(path, torch.get_num_threads())
        return _OrtCompiled(data, key, spec, session, time.perf_counter() - t0)


class _OrtCompiled(Compiled):
    def __init__(self, data: bytes, key: str, spec: LatencySpec, session: Any, seconds: float) -> None:
        self.data, self.key, self.spec, self.session, self.seconds = data, key, spec, session, seconds
        self.name = spec.name("cpu", "fp32")

    def run(self, x: torch.Tensor) -> torch.Tensor:
        name = self.session.get_inputs()[0].name
        rows = np.ascontiguousarray(x.detach().cpu().numpy(), dtype=np.float32)
        out = [self.session.run(None, {name: rows[i : i + _SCORE_BATCH]})[0] for i in range(0, len(rows), _SCORE_BATCH)]
        return torch.from_numpy(np.concatenate(out))

    def time(self, x: torch.Tensor) -> Latency:
        s = self.spec
        return onnx_latency(self.data, x, batch_size=s.batch_size, threads=s.threads, warmup=s.warmup,
                            repeats=s.repeats)


@ENGINES.register("openvino")
class OpenVino(_OnnxEngine):
    """OpenVINO's CPU plugin (QDQ turned into int8 ops by its low-precision transformations), float32 elsewhere."""

    name = "openvino"

    def _build(self, data: bytes, key: str, spec: LatencySpec, t0: float) -> Compiled:
        core = _core()
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "plan.onnx"
            path.write_bytes(data)
            model = core.read_model(str(path))
        threads = torch.get_num_threads()
        scoring = core.compile_model(model, "CPU", _ov_config(threads))
        return _OvCompiled(core, model, scoring, key, spec, time.perf_counter() - t0)


def _core() -> Any:
    try:
        import openvino as ov
    except ImportError:
        raise ConfigError("latency engine 'openvino' needs OpenVINO: pip install 'modelopt[openvino]'") from None
    return ov.Core()


def _ov_config(threads: int) -> dict[str, Any]:
    """One stream of `threads` threads, float32 (the plan's own QDQ decides what runs in int8)."""
    return {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY",
            "INFERENCE_PRECISION_HINT": "f32"}


class _OvCompiled(Compiled):
    def __init__(self, core: Any, model: Any, scoring: Any, key: str, spec: LatencySpec, seconds: float) -> None:
        self.core, self.model, self.scoring = core, model, scoring
        self.key, self.spec, self.seconds = key, spec, seconds
        self.name = spec.name("cpu", "fp32")

    def run(self, x: torch.Tensor) -> torch.Tensor:
        rows = np.ascontiguousarray(x.detach().cpu().numpy(), dtype=np.float32)
        out = [self.scoring(rows[i : i + _SCORE_BATCH])[0] for i in range(0, len(rows), _SCORE_BATCH)]
        return torch.from_numpy(np.concatenate(out))

    def time(self, x: torch.Tensor) -> Latency:
        s = self.spec
        check_protocol(s.batch_size, s.threads, s.warmup, s.repeats)
        batch = np.ascontiguousarray(batch_of(x.detach().cpu(), s.batch_size).numpy(), dtype=np.float32)
        model = self.model.clone()
        model.reshape({model.inputs[0].get_any_name(): list(batch.shape)})  # static: what a deployment compiles
        compiled = self.core.compile_model(model, "CPU", _ov_config(s.threads))
        request = compiled.create_infer_request()
        times = time_runs(lambda: request.infer({0: batch}), s.warmup, s.repeats)
        return record(times, s.batch_size, "openvino", "cpu", s.threads, s.warmup)
