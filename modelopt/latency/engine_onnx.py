"""The ONNX engines: ONNX Runtime and OpenVINO, each running the plan as `modelopt export --format onnx`
writes it (integer weights behind DequantizeLinear, uint8 QDQ around the layers whose inputs the plan
quantizes: integer kernels there, `modelopt.exporters.onnx`). Both run on the CPU, in float32 elsewhere.

A plan as deployed (`deployed`) is the file `modelopt export` writes, read back into a fresh session with the
runtime's defaults (OpenVINO: its default precision, as a user's plain `compile_model` gets); a plan with exits
is the exported folder of segments, run by its own `predict.py` class with this engine's segment runner.
"""

from __future__ import annotations

import re
import tempfile
import time
from abc import abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from modelopt.errors import ConfigError, LoadError
from modelopt.evaluation.evaluator import Evaluator, Realised
from modelopt.exporters.exit_predictor import Predictor, SegmentRunner, ort_runner, ov_runner
from modelopt.exporters.onnx import export_onnx, onnx_model
from modelopt.exporters.onnx_exits import ExitSegments, exit_segments, export_onnx_exits
from modelopt.exporters.onnx_run import ort_session
from modelopt.latency.engine import ENGINES, ArrayDeployment, Compiled, Deployment, Engine, structure_key
from modelopt.latency.measure import Latency, check_protocol, pattern_latency
from modelopt.plan.plan import Plan

if TYPE_CHECKING:
    from modelopt.latency.spec import LatencySpec

__all__ = ["OnnxRuntime", "OpenVino", "default_precision", "graph_key"]

_SCORE_BATCH = 256  # rows per engine call when a plan is scored
_PRECISION_NAMES = {"f32": "fp32", "bf16": "bf16", "f16": "fp16"}  # OpenVINO's element types, as figures name them


def graph_key(model: Any) -> str:
    """What an ONNX model runs, without weight values: nodes (ops, wiring, attributes) and initializer types."""
    nodes = [(n.op_type, tuple(n.input), tuple(n.output), tuple(str(a) for a in n.attribute)) for n in model.graph.node]
    inits = [(t.name, t.data_type, tuple(t.dims)) for t in model.graph.initializer]
    return structure_key(nodes, inits)


class _OnnxEngine(Engine):
    """Exports the plan to ONNX, then hands the bytes to `_build`; a plan with exits as segments (`_build_exits`)."""

    # It compiles for the batch it is timed at (static shapes): a plan with exits is timed in a second build.
    _static_batch = False

    @abstractmethod
    def _open(self, path: Path) -> Callable[[np.ndarray], np.ndarray]:
        """The file at `path` in a fresh session with the runtime's defaults: logits of a float32 batch."""

    @abstractmethod
    def _open_segment(self, path: str, threads: int | None, precision: str | None, batch: int | None) -> SegmentRunner:
        """One segment of an exit folder in this runtime (`exit_predictor.Opener`)."""

    def deployed(self, evaluator: Evaluator, plan: Plan | Realised) -> Deployment:
        """The file `modelopt export --format onnx` writes (a plan with exits: its folder, run by its Predictor),
        read back into a fresh session; the files may go once it is built."""
        with tempfile.TemporaryDirectory() as tmp:
            if evaluator.realise(plan).route is not None:
                folder = export_onnx_exits(evaluator, plan, Path(tmp) / "plan").path
                return ArrayDeployment(Predictor(str(folder), engine=self._open_segment).run)
            return ArrayDeployment(self._open(export_onnx(evaluator, plan, Path(tmp) / "plan.onnx").path))

    def compile(self, evaluator: Evaluator, plan: Plan | Realised, spec: LatencySpec, precision: str | None = None
                ) -> Compiled:
        """`precision`: the float layers' precision where the engine has a choice (None: its default)."""
        t0 = time.perf_counter()
        try:
            if evaluator.realise(plan).route is not None:
                segments = exit_segments(evaluator, plan)
                return self._build_exits(segments, plan.key, spec, t0, precision)
            model, _ = onnx_model(evaluator, plan)
            return self._build(model.SerializeToString(), graph_key(model), spec, t0, precision)
        except (ConfigError, LoadError):
            raise
        except Exception as exc:  # noqa: BLE001 -- the engine's own failure: one line naming the layer it names
            raise ConfigError(_cannot_build(self.name, str(exc))) from None

    @abstractmethod
    def _build(self, data: bytes, key: str, spec: LatencySpec, t0: float, precision: str | None) -> Compiled:
        """The engine's build of the serialized model."""

    def _build_exits(self, segments: ExitSegments, key: str, spec: LatencySpec, t0: float, precision: str | None
                     ) -> Compiled:
        """The segments as `predict.py` runs them (written to a folder, read back: what a deployment reads)."""
        with tempfile.TemporaryDirectory() as tmp:
            segments.write(Path(tmp))
            return _ExitCompiled(self, Path(tmp), key, spec, t0, precision,
                                 spec.name("cpu", _PRECISION_NAMES.get(precision or "", "fp32")))


class _ExitCompiled(Compiled):
    """A plan with exits, run as its exported folder runs: segment by segment, each sample leaving at its first
    confident exit. Timed on the exit pattern of real images (`pattern_latency`), not one repeated batch."""

    def __init__(self, engine: _OnnxEngine, folder: Path, key: str, spec: LatencySpec, t0: float,
                 precision: str | None, name: str) -> None:
        self.spec, self.key, self.name = spec, key, name
        threads = torch.get_num_threads()
        self.scoring = Predictor(str(folder), engine=engine._open_segment, threads=threads, precision=precision)
        # Timed as deployed at the spec's batch: compiled for it where the engine builds static shapes.
        static = engine._static_batch
        self.timing = self.scoring if not static and spec.threads == threads else Predictor(
            str(folder), engine=engine._open_segment, threads=spec.threads, precision=precision,
            batch=spec.batch_size if static else None)
        self.seconds = time.perf_counter() - t0

    def run(self, x: torch.Tensor) -> torch.Tensor:
        return self.answers(x)[0]

    def answers(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        rows = np.ascontiguousarray(x.detach().cpu().numpy(), dtype=np.float32)
        parts = [self.scoring.run_with_exits(rows[i : i + _SCORE_BATCH]) for i in range(0, len(rows), _SCORE_BATCH)]
        return (torch.from_numpy(np.concatenate([p[0] for p in parts])),
                torch.from_numpy(np.concatenate([p[1] for p in parts])))

    def time(self, x: torch.Tensor) -> Latency:
        s = self.spec
        rows = np.ascontiguousarray(x.detach().cpu().numpy(), dtype=np.float32)
        return pattern_latency(self.timing.run, rows, s.batch_size, self.spec.backend, s.threads, s.warmup, s.repeats)


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

    def _open(self, path: Path) -> Callable[[np.ndarray], np.ndarray]:
        session = ort_session(path)  # ORT's default threads, as a user's session has them
        name = session.get_inputs()[0].name
        return lambda rows: session.run(None, {name: rows})[0]

    def _open_segment(self, path: str, threads: int | None, precision: str | None, batch: int | None) -> SegmentRunner:
        return ort_runner(path, threads)

    def _build(self, data: bytes, key: str, spec: LatencySpec, t0: float, precision: str | None) -> Compiled:
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
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "plan.onnx"
            path.write_bytes(self.data)
            session = ort_session(path, s.threads)
        name = session.get_inputs()[0].name
        rows = np.ascontiguousarray(x.detach().cpu().numpy(), dtype=np.float32)
        return pattern_latency(lambda b: session.run(None, {name: b}), rows, s.batch_size, "onnxruntime", s.threads,
                               s.warmup, s.repeats)


@ENGINES.register("openvino")
class OpenVino(_OnnxEngine):
    """OpenVINO's CPU plugin (QDQ turned into int8 ops by its low-precision transformations), float32 elsewhere."""

    _static_batch = True

    def _open(self, path: Path) -> Callable[[np.ndarray], np.ndarray]:
        compiled = _core().compile_model(str(path), "CPU")  # its default precision, as a plain compile_model runs
        return lambda rows: compiled(rows)[0]

    def _open_segment(self, path: str, threads: int | None, precision: str | None, batch: int | None) -> SegmentRunner:
        return ov_runner(path, threads, precision, batch)

    def precision(self, evaluator: Evaluator) -> str:
        """OpenVINO's default inference precision on this CPU (bf16 where the CPU has bfloat16 instructions)."""
        return _PRECISION_NAMES.get(default_precision(), "fp32")

    def float_references(self) -> tuple[str, ...]:
        return ("f32",) if default_precision() != "f32" else ()

    def _build(self, data: bytes, key: str, spec: LatencySpec, t0: float, precision: str | None) -> Compiled:
        core = _core()
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "plan.onnx"
            path.write_bytes(data)
            model = core.read_model(str(path))
        threads = torch.get_num_threads()
        scoring = core.compile_model(model, "CPU", _ov_config(threads, precision))
        name = spec.name("cpu", _PRECISION_NAMES.get(precision or default_precision(), "fp32"))
        return _OvCompiled(core, model, scoring, key, spec, time.perf_counter() - t0, precision, name)

    def _build_exits(self, segments: ExitSegments, key: str, spec: LatencySpec, t0: float, precision: str | None
                     ) -> Compiled:
        _core()  # a missing OpenVINO in one line
        with tempfile.TemporaryDirectory() as tmp:
            segments.write(Path(tmp))
            name = spec.name("cpu", _PRECISION_NAMES.get(precision or default_precision(), "fp32"))
            return _ExitCompiled(self, Path(tmp), key, spec, t0, precision, name)


def _core() -> Any:
    try:
        import openvino as ov
    except ImportError:
        raise ConfigError("latency engine 'openvino' needs OpenVINO: pip install 'modelopt[openvino]'") from None
    return ov.Core()


def default_precision() -> str:
    """OpenVINO's CPU inference precision when none is asked for (``bf16`` on CPUs with bfloat16 instructions,
    ``f32`` elsewhere): what a user's plain `compile_model` gets."""
    return str(_core().get_property("CPU", "INFERENCE_PRECISION_HINT").to_string())


def _ov_config(threads: int, precision: str | None = None) -> dict[str, Any]:
    """One stream of `threads` threads; float layers in `precision` (None: OpenVINO's default on this CPU); the
    plan's own QDQ decides what runs in int8."""
    config: dict[str, Any] = {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY"}
    if precision is not None:
        config["INFERENCE_PRECISION_HINT"] = precision
    return config


class _OvCompiled(Compiled):
    def __init__(self, core: Any, model: Any, scoring: Any, key: str, spec: LatencySpec, seconds: float,
                 precision: str | None, name: str) -> None:
        self.core, self.model, self.scoring = core, model, scoring
        self.key, self.spec, self.seconds, self.precision = key, spec, seconds, precision
        self.name = name

    def run(self, x: torch.Tensor) -> torch.Tensor:
        rows = np.ascontiguousarray(x.detach().cpu().numpy(), dtype=np.float32)
        out = [self.scoring(rows[i : i + _SCORE_BATCH])[0] for i in range(0, len(rows), _SCORE_BATCH)]
        return torch.from_numpy(np.concatenate(out))

    def time(self, x: torch.Tensor) -> Latency:
        s = self.spec
        check_protocol(s.batch_size, s.threads, s.warmup, s.repeats)
        rows = np.ascontiguousarray(x.detach().cpu().numpy(), dtype=np.float32)
        model = self.model.clone()
        shape = [s.batch_size, *rows.shape[1:]]
        model.reshape({model.inputs[0].get_any_name(): shape})  # static: what a deployment compiles
        compiled = self.core.compile_model(model, "CPU", _ov_config(s.threads, self.precision))
        request = compiled.create_infer_request()
        return pattern_latency(lambda b: request.infer({0: b}), rows, s.batch_size, "openvino", s.threads, s.warmup,
                               s.repeats)
