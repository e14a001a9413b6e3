"""The ``torch`` engine: the module the plan deploys as (`CompressedStates.deployable`: structurally pruned
channels physically removed, exits that really return). On the CPU it runs in float32 (weight-only
quantization is simulated there: dequantized weights, float kernels); on a GPU in half precision, timed
through a CUDA graph (one launch per batch) where the plan has no data-dependent return. A plan as deployed is
that module too, built afresh (`deployed`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from modelopt.evaluation.evaluator import Evaluator, Realised
from modelopt.latency.engine import ENGINES, Compiled, Deployment, Engine, Rows, structure_key
from modelopt.latency.measure import Latency, batch_of, check_protocol, record, torch_latency
from modelopt.plan.plan import Plan

if TYPE_CHECKING:
    from modelopt.latency.spec import LatencySpec

__all__ = ["Torch"]


@ENGINES.register("torch")
class Torch(Engine):
    """PyTorch eager, on the workload's device: float32 on the CPU, float16 (and CUDA graphs) on CUDA."""

    def device(self, evaluator: Evaluator) -> str:
        return str(evaluator.workload.device)

    def scores_on(self, evaluator: Evaluator) -> bool:
        return evaluator.workload.device.type == "cuda"  # half precision; on the CPU it is the simulation

    def precision(self, evaluator: Evaluator) -> str:
        return "fp16" if evaluator.workload.device.type == "cuda" else "fp32"

    def compile(self, evaluator: Evaluator, plan: Plan | Realised, spec: LatencySpec, precision: str | None = None
                ) -> Compiled:
        t0 = time.perf_counter()
        device = evaluator.workload.device
        r = evaluator.realise(plan)
        model = evaluator.deployable(r).to(device).eval()
        routed = r.route is not None
        half = device.type == "cuda"
        if half:
            model = model.half()
        key = structure_key([(k, tuple(v.shape), str(v.dtype)) for k, v in model.state_dict().items()], routed,
                            str(device))
        return _TorchCompiled(model, key, spec, device, half, routed, time.perf_counter() - t0)

    def deployed(self, evaluator: Evaluator, plan: Plan | Realised) -> Deployment:
        """The plan's deployable module, built afresh, in the precision the engine runs it in on this device."""
        device = evaluator.workload.device
        model = evaluator.deployable(plan).to(device).eval()
        half = self.precision(evaluator) == "fp16"
        return _ModuleDeployment(model.half() if half else model, device, half)


class _ModuleDeployment(Deployment):
    def __init__(self, model: nn.Module, device: torch.device, half: bool) -> None:
        self.model, self.device, self.half = model, device, half

    def run(self, x: Rows) -> torch.Tensor:
        return _answers(self.model, x, self.device, self.half, routed=False)[0]


def _answers(model: nn.Module, x: Rows, device: torch.device, half: bool, routed: bool
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logits (float32, on the CPU) and, for a routed module (early exit), where each sample left
    (`EarlyExitNet.forward_with_exits`), answered 256 rows at a time."""
    dtype = torch.float16 if half else torch.float32
    forward = getattr(model, "forward_with_exits", None) if routed else None
    logits, exits = [], []
    with torch.inference_mode():
        for i in range(0, len(x), 256):
            rows = x[i : i + 256]
            batch = (torch.from_numpy(rows) if isinstance(rows, np.ndarray) else rows).to(device, dtype)
            if forward is None:
                logits.append(model(batch).float().cpu())
            else:
                out, exit_at = forward(batch)
                logits.append(out.float().cpu())
                exits.append(exit_at.cpu())
    return torch.cat(logits), torch.cat(exits) if exits else None


class _TorchCompiled(Compiled):
    def __init__(self, model: nn.Module, key: str, spec: LatencySpec, device: torch.device, half: bool,
                 routed: bool, seconds: float) -> None:
        self.model, self.key, self.spec, self.device, self.half, self.routed = model, key, spec, device, half, routed
        self.seconds = seconds
        self.name = spec.name(str(device), "fp16" if half else "fp32")

    def run(self, x: torch.Tensor) -> torch.Tensor:
        return self.answers(x)[0]

    def answers(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return _answers(self.model, x, self.device, self.half, self.routed)

    def time(self, x: torch.Tensor) -> Latency:
        s = self.spec
        if not self.half or self.routed:  # the CPU, or a module whose work depends on its input
            return torch_latency(self.model, x.to(torch.float16) if self.half else x, batch_size=s.batch_size,
                                 device=self.device, threads=s.threads, warmup=s.warmup, repeats=s.repeats,
                                 varying=self.routed)
        return _cuda_graph_latency(self.model, x, s, self.device)


def _cuda_graph_latency(model: nn.Module, x: torch.Tensor, s: LatencySpec, device: torch.device) -> Latency:
    """Median batch latency of one CUDA-graph replay (the batch captured once, in half precision)."""
    check_protocol(s.batch_size, s.threads, s.warmup, s.repeats)
    static_x = batch_of(x.detach(), s.batch_size).to(device, torch.float16)
    stream = torch.cuda.Stream(device)
    with torch.inference_mode():
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):  # warm-up on a side stream, as graph capture requires
            for _ in range(max(3, s.warmup)):
                model(static_x)
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            model(static_x)
        for _ in range(s.warmup):
            graph.replay()
        torch.cuda.synchronize(device)
        times = []
        for _ in range(s.repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(float(start.elapsed_time(end)))
    return record(times, s.batch_size, "torch", str(device), s.threads, s.warmup)
