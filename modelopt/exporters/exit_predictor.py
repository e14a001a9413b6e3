"""Runs an early-exit ONNX export: segment files chained by the caller, each sample leaving at its first confident
exit. This file is copied verbatim into every exported exit folder as ``predict.py``: it imports only numpy and
the engine (onnxruntime or openvino), never modelopt, so a deployment needs neither torch nor this package.

The folder holds ``exits.json`` and one ONNX file per segment. Segment k < last reads the previous segment's
boundary tensor (the network input for the first) and returns its own boundary tensor, its exit's logits and
their confidence (max softmax of the temperature-scaled logits); the last segment returns the network's logits.
A sample whose confidence reaches its exit's threshold leaves with that exit's logits; the rows that stay go on
alone into the next segment, and the answers are scattered back into input order (so a batch costs what its
samples' exit pattern costs).

Usage (a shell in the exported folder)::

    python predict.py images.npy               # prints each row's class and the exit it left at
    >>> from predict import Predictor
    >>> logits = Predictor(".").run(x)         # x: float32 NCHW, normalised as the model expects
    >>> logits, exit_at = Predictor(".", engine="openvino").run_with_exits(x)

Another runtime runs the folder through the same class: pass a function that opens one segment file
(`Opener`) as the engine (modelopt's engines pass their own: `modelopt.latency.engine_onnx`).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

MANIFEST = "exits.json"
MIN_SCALE_CHECK = 4  # images in a batch before values all within [0, 1] are read as not normalised
FORMAT = "modelopt-exits"

# One segment as a runtime runs it: its outputs on a float32 batch (boundary, logits, confidence; the last: logits).
SegmentRunner = Callable[[np.ndarray], list[np.ndarray]]
# Opens a segment file: (path, threads, precision, static batch) -> its runner; None: the runtime's default.
Opener = Callable[[str, int | None, str | None, int | None], SegmentRunner]


def ort_runner(path: str, threads: int | None = None, precision: str | None = None, batch: int | None = None
               ) -> SegmentRunner:
    """A segment in an ONNX Runtime CPU session (every graph optimisation on); `precision` and `batch` are
    OpenVINO's choices, unused here (any batch runs)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if threads is not None:
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    outputs = [o.name for o in session.get_outputs()]
    return lambda x: session.run(outputs, {name: x})


def ov_runner(path: str, threads: int | None = None, precision: str | None = None, batch: int | None = None
              ) -> SegmentRunner:
    """A segment compiled by OpenVINO for the CPU (`precision`: its inference precision; `batch`: static)."""
    import openvino as ov

    core = ov.Core()
    model = core.read_model(path)
    if batch is not None:  # a static batch, what a deployment at a fixed batch compiles
        shape = model.inputs[0].get_partial_shape()
        shape[0] = ov.Dimension(batch)
        model.reshape({model.inputs[0].get_any_name(): shape})
    config: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1}
    if threads is not None:
        config["INFERENCE_NUM_THREADS"] = threads
    if precision is not None:
        config["INFERENCE_PRECISION_HINT"] = precision
    request = core.compile_model(model, "CPU", config).create_infer_request()
    count = len(model.outputs)

    def run(x: np.ndarray) -> list[np.ndarray]:
        out = request.infer({0: x})
        return [np.array(out[i]) for i in range(count)]  # copies: the request reuses its buffers

    return run


OPENERS: dict[str, Opener] = {"onnxruntime": ort_runner, "openvino": ov_runner}


class Predictor:
    """An exported early-exit network, run segment by segment.

    Args:
        folder: The exported folder (``exits.json`` and the segment files).
        engine: ``onnxruntime`` or ``openvino``, or a function that opens a segment in another runtime
            (`Opener`: path, threads, precision, static batch -> the segment's runner).
        threads: Intra-op threads per segment (None: the engine's default).
        precision: OpenVINO's inference precision for float layers (``f32``, ``bf16``; None: its default on
            this CPU). Ignored by onnxruntime.
        batch: Compile for this batch size (OpenVINO: the first segment static, the later ones too at batch 1);
            None: any batch.
    """

    def __init__(self, folder: str, engine: str | Opener = "onnxruntime", threads: int | None = None,
                 precision: str | None = None, batch: int | None = None) -> None:
        if isinstance(engine, str) and engine not in OPENERS:
            raise ValueError(f"unknown engine {engine!r}; valid: {', '.join(OPENERS)}")
        open_segment = OPENERS[engine] if isinstance(engine, str) else engine
        where = os.path.join(folder, MANIFEST)
        if not os.path.isfile(where):  # one line (main: an OSError), naming the file
            raise FileNotFoundError(f"{where} is missing: this folder is not a whole modelopt early-exit export; "
                                    "export it again (modelopt export RUN --format onnx)")
        with open(where) as f:
            manifest = json.load(f)
        if manifest.get("format") != FORMAT:
            raise ValueError(f"{os.path.join(folder, MANIFEST)} is not a modelopt early-exit manifest")
        self.manifest = manifest
        self.segments = manifest["segments"]
        self.thresholds = [float(s["threshold"]) for s in self.segments[:-1]]
        self.exits = [s["exit"] for s in self.segments[:-1]]
        self.runners = []
        missing = [seg["file"] for seg in self.segments if not os.path.isfile(os.path.join(folder, seg["file"]))]
        if missing:  # ONNX Runtime's NoSuchFile was a traceback
            raise FileNotFoundError(f"{os.path.join(folder, missing[0])} is missing: {MANIFEST} names it as a segment; "
                                    "export the folder again (modelopt export RUN --format onnx)")
        for k, seg in enumerate(self.segments):
            # A later segment reads the rows that stay: static only where every batch is one image.
            static = batch if batch is not None and (k == 0 or batch == 1) else None
            self.runners.append(open_segment(os.path.join(folder, seg["file"]), threads, precision, static))

    def run(self, x: np.ndarray) -> np.ndarray:
        """Logits of each row of `x` (float32 NCHW), from the exit it left at."""
        return self.run_with_exits(x)[0]

    def checked(self, x: Any) -> np.ndarray:
        """`x` as the float32 NCHW batch the first segment reads; ValueError saying what is expected when it is not
        one (another rank, NHWC, another size, integer pixels, values on the 0-255 scale)."""
        shape = tuple(int(d) for d in self.manifest.get("input_shape") or ())
        a = np.asarray(x)
        dims = ", ".join(map(str, shape)) if shape else "C, H, W"
        want = f"float32 images of shape (N, {dims}), scaled to [0, 1] and normalised as the model expects"
        if a.ndim != 4:
            raise ValueError(f"expected a batch of {want}; got an array of shape {a.shape}")
        if shape and a.shape[1:] != shape:
            if a.shape[1:] == (*shape[1:], shape[0]):
                raise ValueError(f"expected {want}; got channels last {a.shape}: pass x.transpose(0, 3, 1, 2)")
            raise ValueError(f"expected {want}; got shape {a.shape}")
        if not np.issubdtype(a.dtype, np.floating):
            raise ValueError(f"expected {want}; got {a.dtype} pixels: divide by 255, then subtract the mean and "
                             "divide by the std of each channel")
        how = self._normalisation()
        if a.size and not np.isfinite(a).all():  # every row answered class 0, exit 0
            raise ValueError(f"expected {want}; got {int((~np.isfinite(a)).sum())} values that are NaN or infinite")
        # Normalised images stay within a few units, and go below 0; a sample of 256 values says so without costing a
        # batch of one a segment's time.
        sample = a.reshape(-1)[:: max(1, a.size // 256)] if a.size else np.zeros(1)
        peak = float(np.abs(sample).max())
        if peak > 20:
            raise ValueError(f"expected {want}; got values up to {peak:g}: pixels on the 0-255 scale, not "
                             f"normalised{how}")
        # A few bright images, normalised, may all lie in [0, 1]; a batch of real images does not.
        if a.shape[0] >= MIN_SCALE_CHECK and float(sample.min()) >= 0.0 and peak <= 1.0:
            raise ValueError(f"expected {want}; got values within [0, 1]: images scaled to [0, 1] but not "
                             f"normalised{how}")
        return np.ascontiguousarray(a, dtype=np.float32)

    def _normalisation(self) -> str:
        """How to normalise, as the export wrote it into exits.json (folders from before say it generally)."""
        mean, std = self.manifest.get("mean"), self.manifest.get("std")
        if not mean or not std:
            return ": subtract the mean and divide by the std of each channel"
        return (f": subtract the mean ({', '.join(f'{m:g}' for m in mean)}) and divide by the std "
                f"({', '.join(f'{v:g}' for v in std)}) of each channel, after scaling to [0, 1]")

    def run_with_exits(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Logits and, per row, the exit it left at (its position in `exits`; len(exits): the end)."""
        h = self.checked(x)
        n = h.shape[0]
        if n == 1:
            return self._one(h)
        exit_at = np.full(n, len(self.thresholds), dtype=np.int64)
        out: np.ndarray | None = None
        alive = np.arange(n)
        for k, threshold in enumerate(self.thresholds):
            boundary, logits, confidence = self.runners[k](h)
            if out is None:
                out = np.empty((n, logits.shape[1]), dtype=np.float32)
            fire = confidence >= np.float32(threshold)
            if fire.all():
                out[alive] = logits
                exit_at[alive] = k
                return out, exit_at
            if fire.any():
                out[alive[fire]] = logits[fire]
                exit_at[alive[fire]] = k
                stay = ~fire
                alive, h = alive[stay], np.ascontiguousarray(boundary[stay])
            else:
                h = boundary
        final = self.runners[-1](h)[0]
        if out is None:
            return final.astype(np.float32, copy=False), exit_at
        out[alive] = final
        return out, exit_at

    def _one(self, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One sample: no masks, no scatter (at batch 1 their numpy calls cost as much as a small segment)."""
        for k, threshold in enumerate(self.thresholds):
            boundary, logits, confidence = self.runners[k](h)
            if confidence[0] >= np.float32(threshold):  # as the batched path compares
                return logits, np.array([k], dtype=np.int64)
            h = boundary
        return self.runners[-1](h)[0].astype(np.float32, copy=False), np.array([len(self.thresholds)], dtype=np.int64)


def _images(path: str) -> np.ndarray:
    """The images of a `.npy` file (`np.save`); any other file is refused in one line (not numpy's pickle advice)."""
    with open(path, "rb") as f:
        if f.read(6) != b"\x93NUMPY":
            raise ValueError(f"{path} is not a .npy file; give a .npy array of images (np.save(path, x), "
                             "float32 NCHW, normalised)")
    try:
        return np.asarray(np.load(path, allow_pickle=False))
    except ValueError:  # an array of Python objects: numpy's message advises unpickling it
        raise ValueError(f"{path} holds no array of numbers; give a .npy array of images (float32 NCHW, "
                         "normalised)") from None


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print("usage: python predict.py IMAGES.npy [onnxruntime|openvino]  (float32 NCHW, normalised)")
        return 0 if len(argv) >= 2 else 2
    engine = argv[2] if len(argv) > 2 else "onnxruntime"
    try:
        predictor = Predictor(os.path.dirname(os.path.abspath(__file__)), engine=engine)
        logits, exit_at = predictor.run_with_exits(_images(argv[1]))
    except (OSError, ValueError) as exc:  # a missing or unreadable file, an input of the wrong form: one line
        print(f"predict.py: {exc}", file=sys.stderr)
        return 2
    names = [*predictor.exits, "end"]
    for i, (row, e) in enumerate(zip(logits.argmax(1), exit_at, strict=True)):
        print(f"{i}\t{int(row)}\t{names[int(e)]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
