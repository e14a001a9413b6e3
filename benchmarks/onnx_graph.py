"""ONNX Runtime: the exported W8A8 graph with a float stem and an integer one, beside ORT's own `quantize_static`.

For the bundled ResNet-20 (or any zoo model), five ONNX files of the same network: the float model as a user
exports it (`torch.onnx.export`, the reference every speed-up divides), the float model as `modelopt export` writes it
(option-A shortcuts as strided 1x1 convs), uniform W8A8 exported by `modelopt export` with the image left float
(`quantize_input=False`) and with it quantized (the default: the first conv runs the integer kernel the plan was
scored with), and ONNX Runtime's `quantize_static` of the user's float file (QDQ, per-channel int8 weights, uint8
activations, minmax, the same 512 calibration images). Each is timed in plain ORT sessions (1 thread, all graph
optimisations), the files alternated round by round and the best round's mean kept, at batch 1 over the test
images and at batch 64; then scored on the test split (retention and agreement against the float file's answers),
and the per-op share of kernel time from ORT's own profiler, with the Transposes ORT inserts (level "all").

    python benchmarks/onnx_graph.py                                   # bundled ResNet-20, exact test images
    python benchmarks/onnx_graph.py --data ../shared/data/cifar10/cifar10_jpeg_test.npz --images 1000
    python benchmarks/onnx_graph.py --file "search's plan=runs/r/model-best.onnx"   # a run's export beside them
    python benchmarks/onnx_graph.py --openvino      # the same files timed in OpenVINO too (default precision and f32)

`--file LABEL=PATH` (repeatable) adds ONNX files of the same model, e.g. what `modelopt export RUN --format onnx`
wrote for a latency search's plan (with `--skip` its W8A8 removes those blocks' residual branches: the plan
`modelopt.compressors.depth` offers), timed in the same rounds, profiled and scored beside the four.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from modelopt.api import build_compressors, build_workload
from modelopt.compressors import QuantSpec
from modelopt.compressors.contract import BranchAnalysis
from modelopt.compressors.depth import SKIP
from modelopt.data.split import Split
from modelopt.evaluation.evaluator import Evaluator
from modelopt.exporters.onnx import export_onnx
from modelopt.exporters.onnx_run import fused_op_counts
from modelopt.plan.space import SearchSpace

CALIB_IMAGES = 512  # what `export_onnx` calibrates activation ranges on (calib_samples)


def _session(path: Path, profile: str | None = None) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = 1, 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if profile is not None:
        opts.enable_profiling, opts.profile_file_prefix = True, profile
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _plain_export(model: torch.nn.Module, x: torch.Tensor, path: Path) -> Path:
    """The float model as a user exports it: `torch.onnx.export`, nothing rewritten."""
    torch.onnx.export(model.cpu().float().eval(), (x.cpu().float(),), str(path), dynamo=False, opset_version=17,
                      input_names=["input"], output_names=["logits"],
                      dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})
    return path


def _quantize_static(float_path: Path, calib: np.ndarray, out: Path) -> Path:
    """ORT's own post-training quantization of the float file, as its documentation shows it."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([{"input": calib[i:i + 64]} for i in range(0, len(calib), 64)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)

    pre = out.with_name("pre.onnx")
    quant_pre_process(str(float_path), str(pre))
    quantize_static(str(pre), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return out


def _answers(sess: ort.InferenceSession, x: np.ndarray) -> np.ndarray:
    name = sess.get_inputs()[0].name
    return np.concatenate([sess.run(None, {name: x[i:i + 256]})[0] for i in range(0, len(x), 256)]).argmax(1)


def _timed(sessions: dict[str, ort.InferenceSession], x: np.ndarray, batch: int, rounds: int) -> dict[str, float]:
    """Best-of-`rounds` mean ms per batch, the files alternated within each round (a shared VM's slow spells
    then hit every file alike)."""
    best = dict.fromkeys(sessions, float("inf"))
    starts = list(range(0, len(x) - batch + 1, batch))
    for _ in range(rounds):
        for label, sess in sessions.items():
            name = sess.get_inputs()[0].name
            sess.run(None, {name: x[:batch]})
            t0 = time.perf_counter()
            for i in starts:
                sess.run(None, {name: x[i:i + batch]})
            best[label] = min(best[label], 1e3 * (time.perf_counter() - t0) / len(starts))
    return best


def _ov_timed(files: dict[str, Path], x: np.ndarray, batch: int, rounds: int) -> tuple[dict[str, float], str]:
    """The same files in OpenVINO's CPU plugin (1 thread, one stream, a static batch as a deployment compiles it), in
    its default precision, and the float file in f32 too; best-of-`rounds` mean ms per batch, alternated."""
    import openvino as ov

    core = ov.Core()
    default = str(core.get_property("CPU", "INFERENCE_PRECISION_HINT").to_string())
    config = {"INFERENCE_NUM_THREADS": 1, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY"}
    requests = {}
    for label, path in {**files, "float, f32": files["float"]}.items():
        model = core.read_model(str(path))
        model.reshape({model.inputs[0].get_any_name(): [batch, *x.shape[1:]]})
        extra = {"INFERENCE_PRECISION_HINT": "f32"} if label == "float, f32" else {}
        requests[label] = core.compile_model(model, "CPU", {**config, **extra}).create_infer_request()
    best = dict.fromkeys(requests, float("inf"))
    starts = list(range(0, len(x) - batch + 1, batch))
    for _ in range(rounds):
        for label, request in requests.items():
            request.infer({0: x[:batch]})
            t0 = time.perf_counter()
            for i in starts:
                request.infer({0: x[i:i + batch]})
            best[label] = min(best[label], 1e3 * (time.perf_counter() - t0) / len(starts))
    return best, default


def _profile(path: Path, x: np.ndarray, folder: Path) -> dict[str, float]:
    """Share of kernel time per op type over batch-1 runs of the test images (ORT's profiler)."""
    sess = _session(path, str(folder / path.stem))
    name = sess.get_inputs()[0].name
    for i in range(len(x)):
        sess.run(None, {name: x[i:i + 1]})
    events = json.loads(Path(sess.end_profiling()).read_text())
    per_op: Counter[str] = Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per_op[e["args"]["op_name"]] += e["dur"]
    total = sum(per_op.values())
    return {op: us / total for op, us in per_op.most_common()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="cifar10_resnet20")
    ap.add_argument("--weights", default=None)
    ap.add_argument("--data", default="cifar10-exact-sample")
    ap.add_argument("--images", type=int, default=None, help="test images timed and scored (default: all)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--file", action="append", default=[], metavar="LABEL=PATH",
                    help="another ONNX file of the model to time beside the others (repeatable)")
    ap.add_argument("--openvino", action="store_true", help="time the same files in OpenVINO too")
    ap.add_argument("--skip", action="append", default=[], metavar="BLOCK",
                    help="also W8A8 with this block's residual branch removed (repeatable: one file, all removed)")
    args = ap.parse_args()
    wl = build_workload(args.model, args.data, weights=args.weights, device="cpu")
    options = {"quantize": {"bits": [8], "activations": [None, 8]}}
    space = SearchSpace(wl.layers, build_compressors(["depth", "quantize"] if args.skip else ["quantize"], options))
    ev = Evaluator(wl, space)
    w8a8 = space.uniform("quantize", QuantSpec(8).with_activations(8))
    tmp = Path(tempfile.mkdtemp())
    files = {"float": _plain_export(wl.model, wl.split(Split.VAL).x[:1], tmp / "float.onnx"),
             "float, modelopt export": export_onnx(ev, space.plan(), tmp / "float_mo.onnx", activations=False).path,
             "W8A8, float stem": export_onnx(ev, w8a8, tmp / "w8a8_float_stem.onnx", quantize_input=False).path,
             "W8A8 (default export)": export_onnx(ev, w8a8, tmp / "w8a8.onnx").path}
    if args.skip:
        ends = {b.block: b.layers[-1] for b in wl.analyses.get(BranchAnalysis).branches.values()}
        unknown = [b for b in args.skip if b not in ends]
        if unknown:
            raise SystemExit(f"--skip {unknown[0]!r}: no removable residual branch there; valid: {', '.join(ends)}")
        removed = {f"{ends[block]}/depth": SKIP for block in args.skip}
        label = f"W8A8, {', '.join(args.skip)} removed"
        files[label] = export_onnx(ev, space.plan({**dict(w8a8.choices), **removed}), tmp / "w8a8_skip.onnx").path
    for item in args.file:
        label, _, path = item.rpartition("=")
        files[label or Path(path).stem] = Path(path)
    calib = wl.split(Split.CALIB).x[:CALIB_IMAGES].cpu().numpy()
    files["ORT quantize_static"] = _quantize_static(files["float"], calib, tmp / "ort_static.onnx")
    test = wl.split(Split.TEST)
    n = len(test) if args.images is None else min(args.images, len(test))
    x, y = test.x[:n].cpu().numpy(), test.y[:n].cpu().numpy()
    sessions = {k: _session(p) for k, p in files.items()}
    answers = {k: _answers(s, x) for k, s in sessions.items()}
    ms1, ms64 = _timed(sessions, x, 1, args.rounds), _timed(sessions, x, 64, args.rounds)
    base = float((answers["float"] == y).sum())
    print(f"{args.model} on {n} test images of {args.data}; ONNX Runtime {ort.__version__}, CPU, 1 thread, "
          f"all graph optimisations; best of {args.rounds} alternated rounds")
    print("| file | KiB | batch 1 ms | speed-up | batch 64 ms | speed-up | retention | agreement | Transposes |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for k, p in files.items():
        transposes = fused_op_counts(p, level="all").get("Transpose", 0)
        print(f"| {k} | {p.stat().st_size / 1024:.0f} | {ms1[k]:.3f} | {ms1['float'] / ms1[k]:.2f}x | {ms64[k]:.2f} "
              f"| {ms64['float'] / ms64[k]:.2f}x | {100 * float((answers[k] == y).sum()) / base:.2f} % "
              f"| {100 * float((answers[k] == answers['float']).mean()):.2f} % | {transposes} |")
    if args.openvino:
        import openvino as ov

        (ov1, default), (ov64, _) = _ov_timed(files, x, 1, args.rounds), _ov_timed(files, x, 64, args.rounds)
        print(f"\nOpenVINO {ov.get_version()}, CPU plugin, 1 thread, one stream, static batch; default precision "
              f"{default} (the float file also in f32); speed-ups over the float file in the default precision")
        print("| file | batch 1 ms | speed-up | batch 64 ms | speed-up |\n| --- | ---: | ---: | ---: | ---: |")
        for k in ov1:
            print(f"| {k} | {ov1[k]:.3f} | {ov1['float'] / ov1[k]:.2f}x | {ov64[k]:.2f} "
                  f"| {ov64['float'] / ov64[k]:.2f}x |")
    print("\nShare of kernel time per op (batch 1):")
    for k in [k for k in files if k != "float"]:
        shares = _profile(files[k], x[: min(n, 300)], tmp)
        print(f"- {k}: " + ", ".join(f"{op} {100 * s:.0f} %" for op, s in shares.items() if s >= 0.005))


if __name__ == "__main__":
    main()
