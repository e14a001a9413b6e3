"""The engines a plan is deployed in, as plugins: each builds ("compiles") a plan for itself, runs it and
times it, with the device, engine, precision and batch named in the figure (docs/export-and-latency.md), and
builds the plan as a user deploys it (`Engine.deployed`), which certification checks the reported plan in.

Engines register by name (`ENGINES`, entry-point group ``modelopt.engines``; registering names the class):
``torch`` (the plan's deployable module; float32 on the CPU, half precision with CUDA graphs on a GPU),
``onnxruntime`` and ``openvino`` (the plan exported to ONNX as `modelopt export --format onnx` writes it,
integer kernels where the plan quantizes activations). An engine whose answers can differ from the PyTorch
simulation (integer kernels, half precision) scores the plans of a run that measures latency in it
(`Engine.scores`): what is certified is what the engine computes. TensorRT would be one more subclass
(docs/export-and-latency.md, engines).

Example:
    >>> engine = ENGINES.get("onnxruntime")()
    >>> built = engine.compile(evaluator, plan, LatencySpec("onnxruntime"))
    >>> built.run(x).argmax(1), built.time(x).median_ms
    >>> engine.deployed(evaluator, plan).run(x).argmax(1)    # the exported file, in a fresh session
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar, TypeAlias

import numpy as np
import torch

from modelopt._registry import Registry, named
from modelopt.evaluation.evaluator import Evaluator, Realised
from modelopt.latency.measure import Latency
from modelopt.model.images import Images
from modelopt.plan.plan import Plan

if TYPE_CHECKING:  # the spec names an engine: it imports this module
    from modelopt.latency.spec import LatencySpec

__all__ = ["ENGINES", "ArrayDeployment", "Compiled", "Deployment", "Engine", "Rows", "structure_key"]

# Normalised NCHW float images: a numpy batch, a tensor, or a split's images (`Images`, prepared batch by batch).
Rows: TypeAlias = np.ndarray | torch.Tensor | Images
_DEPLOY_BATCH = 256  # rows per call of a deployed plan: a split is answered batch by batch, never held twice


class Compiled(ABC):
    """A plan as an engine runs it.

    Attributes:
        key: what the engine runs, without the weights' values (graph, shapes, dtypes): plans with the
            same key run the same kernels and share one latency measurement.
        seconds: wall seconds building it took (export and the engine's own compilation).
        name: the latency figure's name: engine/device/precision/batch, e.g. ``onnxruntime/cpu/fp32/b1``.
    """

    key: str
    seconds: float
    name: str

    @abstractmethod
    def run(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of the plan on `x` (normalised NCHW images; any batch), float32 on the CPU."""

    def answers(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits and, for a plan whose samples leave early, the position of the exit each left at (its number of
        exits: it ran the whole network); None for a plan without exits."""
        return self.run(x), None

    @abstractmethod
    def time(self, x: torch.Tensor) -> Latency:
        """Median batch latency on batches of `x`'s rows, as the spec the plan was built with says."""


class Deployment(ABC):
    """A plan as a user deploys it in an engine (`Engine.deployed`): built afresh, in the engine's defaults."""

    @abstractmethod
    def run(self, x: Rows) -> torch.Tensor:
        """Logits of the plan on `x` (normalised NCHW float32 images; any batch), float32 on the CPU."""


class ArrayDeployment(Deployment):
    """A deployment that answers one float32 numpy batch at a time (an exported file in a runtime's session).

    Args:
        answer: Logits of one contiguous float32 NCHW batch (at most 256 rows).

    Example:
        >>> session = onnxruntime.InferenceSession("plan.onnx")
        >>> ArrayDeployment(lambda rows: session.run(None, {"input": rows})[0]).run(x)
    """

    def __init__(self, answer: Callable[[np.ndarray], np.ndarray]) -> None:
        self.answer = answer

    def run(self, x: Rows) -> torch.Tensor:
        out = [np.asarray(self.answer(_array(x[i : i + _DEPLOY_BATCH]))) for i in range(0, len(x), _DEPLOY_BATCH)]
        return torch.from_numpy(np.concatenate(out).astype(np.float32, copy=False))


def _array(rows: np.ndarray | torch.Tensor) -> np.ndarray:
    part = rows.detach().cpu().numpy() if isinstance(rows, torch.Tensor) else rows
    return np.ascontiguousarray(part, dtype=np.float32)


class Engine(ABC):
    """Builds plans for one runtime: to time and score them (`compile`), on the device `device` picks for the
    workload, and as a user deploys them (`deployed`). Its `name` is the one it registers under in `ENGINES`."""

    name: ClassVar[str]  # set by registering (`ENGINES.register("tensorrt")`): written once
    # Its answers can differ from the PyTorch simulation (integer kernels, half precision): a run that
    # measures latency in it scores its plans in it too (`modelopt.latency.plan.PlanLatency`).
    scores: ClassVar[bool] = True

    @abstractmethod
    def compile(self, evaluator: Evaluator, plan: Plan | Realised, spec: LatencySpec, precision: str | None = None
                ) -> Compiled:
        """The plan as it runs (a `Realised` record, or a plan as composed: `evaluator.realise(plan)`; the
        evaluator's `deployable` and `engine_model` and the exporters take either) built for this engine (float
        layers in `precision`, one of `float_references`; None: the engine's default). A plan the engine cannot
        build raises ConfigError in one line naming the layer and the engine's limit."""

    def deployed(self, evaluator: Evaluator, plan: Plan | Realised) -> Deployment:
        """The plan as it runs built afresh as a user deploys it in this engine: what `modelopt export` writes for
        it, in a new session with the engine's default settings (the torch engine: the deployable module). A run
        checks the plan it reports here (`modelopt.certify.deployed`): an engine that does not say cannot be
        checked.

        Raises:
            NotImplementedError: the engine does not build deployed plans (never checked in another runtime).
        """
        cls = type(self).__name__
        raise NotImplementedError(f"latency engine {getattr(self, 'name', cls)!r} ({cls}) does not build a plan as "
                                  f"deployed: implement {cls}.deployed, or the plans a run reports cannot be checked")

    def device(self, evaluator: Evaluator) -> str:
        """Where it runs plans of `evaluator`'s workload (default: the CPU)."""
        return "cpu"

    def precision(self, evaluator: Evaluator) -> str:
        """What it computes the float layers of plans in, by default on this machine (named in the figure)."""
        return "fp32"

    def float_references(self) -> tuple[str, ...]:
        """Other precisions the float model is also timed in, beside the default (OpenVINO: fp32 where its
        default is lower), so a speed-up against either reads from the run."""
        return ()

    def scores_on(self, evaluator: Evaluator) -> bool:
        """Whether its answers on this workload's device can differ from the PyTorch simulation."""
        return self.scores


ENGINES: Registry[type[Engine]] = Registry("latency engine", "modelopt.engines", named("latency engine"))


def structure_key(*parts: object) -> str:
    """A short hash of what an engine runs (graph structure, shapes, dtypes; never weight values)."""
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]
