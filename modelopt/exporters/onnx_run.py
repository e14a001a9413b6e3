"""Running an exported ONNX file: an ONNX Runtime session with fixed threads, logits in batches, and the ops the
runtime really executes after its fusions (whether integer kernels ran)."""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch

from modelopt.model.images import Images

__all__ = ["fused_op_counts", "ort_session", "run_onnx"]


def ort_session(model: str | Path | bytes, threads: int | None = None, level: str = "all",
                optimized_path: str | Path | None = None) -> Any:
    """An ONNX Runtime CPU session: the model as a path or its serialized bytes, fixed intra-op threads (None: ORT's
    default), sequential execution and the graph optimisations of `level` (basic, extended, all). The one place
    modelopt opens a session (the exported ``predict.py``, `exit_predictor`, opens its own: it imports no modelopt).
    """
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                                     "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
                                     "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}[level]
    if threads is not None:
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if optimized_path is not None:
        opts.optimized_model_filepath = str(optimized_path)
        opts.log_severity_level = 3  # its warning that a level-"all" file is for this machine only: known, and kept
    return ort.InferenceSession(model if isinstance(model, bytes) else str(model), opts,
                                providers=["CPUExecutionProvider"])


def run_onnx(path: str | Path, x: np.ndarray | torch.Tensor | Images, *, batch_size: int = 256,
             threads: int | None = None) -> np.ndarray:
    """Logits of the ONNX model at `path` on `x` (NCHW float32), in batches, on the CPU.

    Example:
        >>> run_onnx("r20-int8.onnx", wl.split("val").x).argmax(1)
    """
    sess = ort_session(path, threads)
    name = sess.get_inputs()[0].name

    def rows(a: int) -> np.ndarray:
        part = x[a : a + batch_size]
        part = part.detach().cpu().numpy() if isinstance(part, torch.Tensor) else part
        return np.ascontiguousarray(part, dtype=np.float32)

    return np.concatenate([sess.run(None, {name: rows(i)})[0] for i in range(0, len(x), batch_size)])


def fused_op_counts(path: str | Path, level: str = "extended") -> dict[str, int]:
    """Op types of the graph ONNX Runtime actually runs after its QDQ fusions (extended level; "all" adds the
    layout changes: the NHWC integer kernels and the Transposes they need).

    Integer kernels show up as QLinearConv, QLinearAdd, ...; an unfused QDQ model shows only
    QuantizeLinear/DequantizeLinear around float Conv.

    Example:
        >>> fused_op_counts("r20-int8.onnx")["QLinearConv"]
        19
    """
    import onnx

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "optimized.onnx"
        ort_session(path, level=level, optimized_path=out)
        return dict(Counter(n.op_type for n in onnx.load(out).graph.node))
