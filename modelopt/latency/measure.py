"""Measured latency: the median wall time of one batch, after warm-up, on a stated backend.

One protocol (docs/export-and-latency.md, latency_ms): a fixed thread count, `warmup` untimed runs, then
`repeats` timed runs of the same batch, and the median reported. These are the timers; a plan is timed through
the engine its run names (`modelopt.latency.engine.ENGINES`), which times with them.

- `torch_latency`: an nn.Module under `torch.inference_mode`; on CUDA each run is timed with CUDA
  events (the GPU's own clock, no host-side sync noise), on the CPU with `perf_counter`.
- `onnx_latency`: an ONNX file or bytes in a CPU session with fixed intra-op threads,
  sequential execution and all graph optimisations (so QDQ models run their integer kernels).
- `pattern_latency`: a model whose work depends on its input (early exit), on real images' exit pattern.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from modelopt.errors import ConfigError
from modelopt.exporters.onnx_run import ort_session

# Rounds over the images in `pattern_latency`. On a shared virtual machine the time of one run swings in bursts
# (steal), while the fastest runs stay put: enough rounds that the same plan reads the same (measured:
# docs/export-and-latency.md#measured).
ROUNDS = 10


@dataclass(frozen=True)
class Latency:
    """One latency measurement; `median_ms` is the figure reports quote as latency_ms."""

    median_ms: float
    batch_size: int
    backend: str
    device: str
    threads: int
    repeats: int
    warmup: int
    min_ms: float
    max_ms: float

    def __str__(self) -> str:
        return (f"{self.median_ms:.3f} ms/batch of {self.batch_size} ({self.backend}, {self.device}, "
                f"{self.threads} threads, median of {self.repeats})")


def check_protocol(batch_size: int, threads: int, warmup: int, repeats: int) -> None:
    for name, v, low in (("batch_size", batch_size, 1), ("threads", threads, 1), ("warmup", warmup, 0),
                         ("repeats", repeats, 1)):
        if not isinstance(v, int) or isinstance(v, bool) or v < low:
            raise ConfigError(f"latency: {name} must be an integer >= {low}, got {v!r}")


def time_runs(run: Callable[[], Any], warmup: int, repeats: int) -> list[float]:
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def record(times: list[float], batch_size: int, backend: str, device: str, threads: int, warmup: int) -> Latency:
    return Latency(statistics.median(times), batch_size, backend, device, threads, len(times), warmup,
                   min(times), max(times))


def torch_latency(
    model: nn.Module,
    example: torch.Tensor,
    *,
    batch_size: int = 1,
    device: str | torch.device = "cpu",
    threads: int = 1,
    warmup: int = 10,
    repeats: int = 50,
    varying: bool = False,
) -> Latency:
    """Median latency of `model` on a batch of `batch_size` inputs shaped like `example`.

    With `varying` (a model whose work depends on its input, such as early exit), one timed run
    is a pass over every row of `example` in batches, and its figure is the mean time per batch:
    the median over max(3, repeats // 10) passes of the latency averaged over the inputs.

    Args:
        model: the network (moved to `device` and put in eval mode).
        example: one input or a batch; its first `batch_size` rows are used, repeated if fewer.
        batch_size: rows per timed batch.
        device: cpu, cuda or cuda:N.
        threads: torch intra-op threads during the measurement (restored after).
        warmup: untimed runs first.
        repeats: timed runs; the median is reported.

    Example:
        >>> torch_latency(model, wl.split("val").x, batch_size=64, threads=2).median_ms
    """
    check_protocol(batch_size, threads, warmup, repeats)
    dev = torch.device(device)
    x = batch_of(example.detach(), batch_size).to(dev, torch.float32)
    model = model.to(dev).eval()
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            if varying:
                rows = example.detach().to(dev, torch.float32)
                batches = [rows[i : i + batch_size] for i in range(0, rows.shape[0] - batch_size + 1, batch_size)]

                def one_pass() -> None:
                    for b in batches:
                        model(b)
                    if dev.type == "cuda":
                        torch.cuda.synchronize(dev)

                times = [t / len(batches) for t in time_runs(one_pass, 1, max(3, repeats // 10))]
            elif dev.type == "cuda":
                times = _cuda_times(model, x, warmup, repeats)
            else:
                times = time_runs(lambda: model(x), warmup, repeats)
    finally:
        torch.set_num_threads(old_threads)
    return record(times, batch_size, "torch", str(dev), threads, warmup)


def _cuda_times(model: nn.Module, x: torch.Tensor, warmup: int, repeats: int) -> list[float]:
    for _ in range(warmup):
        model(x)
    torch.cuda.synchronize(x.device)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        model(x)
        end.record()
        end.synchronize()
        times.append(float(start.elapsed_time(end)))
    return times


def onnx_latency(
    model: str | Path | bytes,
    example: torch.Tensor | np.ndarray,
    *,
    batch_size: int = 1,
    threads: int = 1,
    warmup: int = 10,
    repeats: int = 50,
) -> Latency:
    """Median latency of an ONNX model in ONNX Runtime (CPUExecutionProvider).

    Args:
        model: an .onnx path or the serialized model.
        example: one input or a batch (NCHW float32); its first `batch_size` rows are used.
        batch_size: rows per timed batch.
        threads: the session's intra-op threads (inter-op 1, sequential execution).
        warmup: untimed runs first.
        repeats: timed runs; the median is reported.

    Example:
        >>> onnx_latency("r20-int8.onnx", wl.split("val").x, batch_size=64, threads=2).median_ms
    """
    check_protocol(batch_size, threads, warmup, repeats)
    sess = ort_session(model, threads)
    ex = torch.as_tensor(example) if isinstance(example, np.ndarray) else example.detach()
    x = np.ascontiguousarray(batch_of(ex, batch_size).cpu().numpy(), dtype=np.float32)
    feed = {sess.get_inputs()[0].name: x}
    times = time_runs(lambda: sess.run(None, feed), warmup, repeats)
    return record(times, batch_size, "onnxruntime", "cpu", threads, warmup)


def pattern_latency(run: Callable[[np.ndarray], Any], rows: np.ndarray, batch_size: int, backend: str, threads: int,
                    warmup: int, repeats: int, images: int = 256) -> Latency:
    """Latency of a model whose work depends on its input (early exit), on the exit pattern of real images.

    The first `images` rows (at least 8 batches' worth when there are that many) are cut into batches of
    `batch_size` in order; every batch runs once per round over max(ROUNDS, repeats // 10) rounds after `warmup`
    untimed batches, and a batch's time is its fastest round (what remains is the work, not the machine's noise).
    The figure is the mean over the batches: the expected cost of a batch drawn as these images are. `min_ms` and
    `max_ms` are the fastest and slowest batch. The ONNX engines time every plan this way, with exits or without,
    so plans are compared on one protocol.

    Example:
        >>> pattern_latency(predictor.run, x_val, 1, "onnxruntime", 1, 5, 30).median_ms
    """
    check_protocol(batch_size, threads, warmup, repeats)
    count = min(len(rows), max(images, 8 * batch_size)) // batch_size
    if count < 1:
        raise ConfigError(f"latency: {len(rows)} images cannot fill one batch of {batch_size}")
    batches = [np.ascontiguousarray(rows[i * batch_size : (i + 1) * batch_size]) for i in range(count)]
    for i in range(warmup):
        run(batches[i % count])
    best = [math.inf] * count
    rounds = max(ROUNDS, repeats // 10)
    for _ in range(rounds):
        for i, b in enumerate(batches):
            t0 = time.perf_counter()
            run(b)
            best[i] = min(best[i], (time.perf_counter() - t0) * 1e3)
    return Latency(statistics.fmean(best), batch_size, backend, "cpu", threads, rounds, warmup, min(best), max(best))


def batch_of(x: torch.Tensor, batch_size: int) -> torch.Tensor:
    if x.dim() == 3:
        x = x.unsqueeze(0)
    if x.shape[0] >= batch_size:
        return x[:batch_size].contiguous()
    reps = -(-batch_size // x.shape[0])
    return x.repeat(reps, *[1] * (x.dim() - 1))[:batch_size].contiguous()
