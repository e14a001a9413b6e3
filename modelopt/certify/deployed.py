"""Deployed equals certified: the plan a run reports is built afresh as a user deploys it (the file
`modelopt export` writes, in a new session of the run's engine; with the torch engine, the deployable
module), and its answers on the test split are compared with the answers the run scored; a plan whose
deployed answers disagree beyond the tolerance (`LatencySpec.min_agreement`) is not reported as the best:
the next confirmed plan is checked instead.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from modelopt.data.split import Split
from modelopt.evaluation.evaluator import Evaluator
from modelopt.evaluation.trial import Trial
from modelopt.exporters.exit_predictor import Predictor
from modelopt.exporters.onnx import export_onnx
from modelopt.exporters.onnx_exits import export_onnx_exits
from modelopt.exporters.onnx_run import run_onnx
from modelopt.latency.plan import PlanLatency
from modelopt.model.images import Images
from modelopt.plan.plan import Plan

__all__ = ["Deployed", "check_deployed", "deployed_agreement"]

SPLIT = Split.TEST


@dataclass(frozen=True)
class Deployed:
    """How the reported plan's deployed answers compared with the certified ones."""

    engine: str  # the latency figure's name: engine/device/precision/batch
    split: str
    agreement: float | None  # share of images with the same top-1; None when no plan was checked
    min_agreement: float
    checked: int  # plans checked before one held (or none did)

    def to_json(self) -> dict[str, object]:
        return {"engine": self.engine, "split": self.split, "agreement": self.agreement,
                "min_agreement": self.min_agreement, "checked": self.checked}


def deployed_agreement(latency: PlanLatency, plan: Plan, split: str = SPLIT) -> float:
    """The share of `split`'s images on which the plan, built afresh as a user deploys it, gives the top-1 the
    run scored (the engine's, when the run scores in its engine; else the PyTorch simulation's)."""
    ev = latency.evaluator
    x = ev.workload.split(split).x
    scored = ev.scorer.predictions(plan, split)
    deployed = _deployed_logits(ev, latency, plan, x).argmax(1)
    return float((scored.cpu() == deployed.cpu()).double().mean())


def _deployed_logits(ev: Evaluator, latency: PlanLatency, plan: Plan, x: Images) -> torch.Tensor:
    if latency.engine.exported:  # what `modelopt export --format onnx` writes, in a new engine session
        with tempfile.TemporaryDirectory() as tmp:
            if ev.routes.route(plan) is not None:  # a folder of segments, run by its own predict.py's class
                folder = export_onnx_exits(ev, plan, Path(tmp) / "plan").path
                predictor = Predictor(str(folder), engine=latency.engine.name)
                return torch.from_numpy(_batched(predictor.run, x))
            return _run_file(latency.engine.name, export_onnx(ev, plan, Path(tmp) / "plan.onnx").path, x)
    model = ev.states.deployable(plan).to(ev.workload.device).eval()
    half = latency.name.split("/")[2] == "fp16"
    with torch.inference_mode():
        return torch.cat([model(x[i : i + 256].to(ev.workload.device, torch.float16 if half else torch.float32))
                          .float().cpu() for i in range(0, len(x), 256)])


def _batched(run: Callable[[np.ndarray], np.ndarray], x: Images) -> np.ndarray:
    return np.concatenate([run(np.ascontiguousarray(x[i : i + 256].detach().cpu().numpy(), dtype=np.float32))
                           for i in range(0, len(x), 256)])


def _run_file(engine: str, path: Path, x: Images) -> torch.Tensor:
    if engine == "openvino":  # in OpenVINO's default precision, as a user's plain compile_model runs it
        import openvino as ov

        compiled = ov.Core().compile_model(str(path), "CPU")
        return torch.from_numpy(_batched(lambda rows: compiled(rows)[0], x))
    return torch.from_numpy(run_onnx(path, x))


def check_deployed(latency: PlanLatency, candidates: Sequence[Trial]) -> tuple[Trial | None, Deployed]:
    """The first of `candidates` (the run's best, then the other confirmed plans, best first) whose deployed
    answers agree with its certified ones on at least `min_agreement` of the test images."""
    floor = latency.spec.min_agreement
    agreement: float | None = None
    for i, trial in enumerate(candidates):
        agreement = deployed_agreement(latency, trial.plan)
        if agreement >= floor:
            return trial, Deployed(latency.name, SPLIT, agreement, floor, i + 1)
    return None, Deployed(latency.name, SPLIT, agreement, floor, len(candidates))
