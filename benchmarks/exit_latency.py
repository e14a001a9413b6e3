"""Prints, per run folder and engine, the run's reported plan as a user deploys it beside the float model and the
uniform W8A8 plan, all three exported as `modelopt export --format onnx` writes them (a plan with exits: its
folder of segments, run by its own predict.py's class) and timed side by side in this one process, in plain engine
sessions, on the run's test images: the mean time per batch over the images' own exit pattern (each batch its
fastest of a few rounds), at batch 1 and 64. Also the plan's test retention as deployed, its agreement with the
answers the run certified, and where its test images left.

    python benchmarks/exit_latency.py runs/r20-ort [runs/r20-ov ...] [--engines onnxruntime,openvino]
        [--threads 1] [--rounds 3]

OpenVINO runs every model in its default precision on this CPU (what a plain `compile_model` gives: bf16 where
the CPU has bfloat16 instructions); the float model is also timed at f32, and speed-ups are given against both.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from engine_latency import _cpu  # this folder's sibling script: the machine's name, as it prints it

from modelopt.evaluation.evaluator import Evaluator
from modelopt.exporters.exit_predictor import Predictor
from modelopt.exporters.onnx import export_onnx
from modelopt.exporters.onnx_exits import export_onnx_exits
from modelopt.exporters.onnx_run import ort_session
from modelopt.latency.measure import pattern_latency
from modelopt.plan.plan import Plan
from modelopt.run.export import resolve

Run = Callable[[np.ndarray], np.ndarray]


def _file_runner(path: Path, engine: str, threads: int, precision: str | None, batch: int | None) -> Run:
    if engine == "onnxruntime":
        session = ort_session(path, threads)
        name = session.get_inputs()[0].name
        return lambda x: session.run(None, {name: x})[0]
    import openvino as ov

    core = ov.Core()
    model = core.read_model(str(path))
    if batch is not None:  # static at the timed batch, as a deployment compiles it
        shape = model.inputs[0].get_partial_shape()
        shape[0] = ov.Dimension(batch)
        model.reshape({model.inputs[0].get_any_name(): shape})
    config = {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY"}
    if precision is not None:
        config["INFERENCE_PRECISION_HINT"] = precision
    request = core.compile_model(model, "CPU", config).create_infer_request()
    return lambda x: np.array(request.infer({0: x})[0])


def _export(ev: Evaluator, plan: Plan, folder: Path, tag: str) -> Path:
    if ev.routes.route(plan) is not None:
        return export_onnx_exits(ev, plan, folder / tag).path
    return export_onnx(ev, plan, folder / f"{tag}.onnx").path


def _runner(path: Path, engine: str, threads: int, precision: str | None, batch: int | None) -> Run:
    if path.is_dir():
        predictor = Predictor(str(path), engine=engine, threads=threads, precision=precision,
                              batch=batch if engine == "openvino" else None)
        return predictor.run
    return _file_runner(path, engine, threads, precision, batch)


def _ms(run: Run, x: np.ndarray, batch: int, engine: str, threads: int, rounds: int) -> float:
    return pattern_latency(run, x, batch, engine, threads, warmup=5, repeats=rounds * 10, images=len(x)).median_ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="finished run folders")
    ap.add_argument("--engines", default="onnxruntime,openvino", help="comma-separated engine names")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=10, help="rounds over the images; a batch's time is its fastest")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"machine: {_cpu()}, {os.cpu_count()} logical cores; {args.threads} thread(s) per session; mean per batch "
          f"over the test images in order, each batch its fastest of {args.rounds} rounds\n")
    print("| run | engine | batch | float ms | W8A8 ms | plan ms | plan vs float | plan vs W8A8 | float f32 ms "
          "| plan vs f32 float | plan test retention | agreement with certified | left early |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for run in args.runs:
        src = resolve(run, "best", device="cpu")
        ev, best = src.evaluator, src.plan
        w8a8 = ev.space.anchors((8,), act_bits=8)[0]
        test = ev.workload.split("test")
        x = np.ascontiguousarray(test.x.tensor().numpy(), dtype=np.float32)
        certified = ev.scorer.predictions(best, "test").cpu().numpy()  # as the run scored it (its engine)
        with tempfile.TemporaryDirectory() as tmp:
            paths = {tag: _export(ev, plan, Path(tmp), tag)
                     for tag, plan in (("float", ev.space.plan()), ("w8a8", w8a8), ("plan", best))}
            for engine in (e.strip() for e in args.engines.split(",")):
                plan_path = paths["plan"]
                scorer = _runner(plan_path, engine, args.threads, None, None)
                pred = np.concatenate([scorer(x[i : i + 256]) for i in range(0, len(x), 256)]).argmax(1)
                base = _runner(paths["float"], engine, args.threads, None, None)
                base_pred = np.concatenate([base(x[i : i + 256]) for i in range(0, len(x), 256)]).argmax(1)
                y = test.y.cpu().numpy()
                retention = (pred == y).mean() / max((base_pred == y).mean(), 1e-12)
                agreement = (pred == certified).mean()
                left = ""
                if plan_path.is_dir():
                    _, exit_at = Predictor(str(plan_path), engine=engine, threads=args.threads).run_with_exits(x)
                    shares = np.bincount(exit_at) / len(exit_at)
                    left = " / ".join(f"{s:.1%}" for s in shares[:-1])
                for batch in (1, 64):
                    ms = {tag: _ms(_runner(path, engine, args.threads, None, batch), x, batch, engine, args.threads,
                                   args.rounds) for tag, path in paths.items()}
                    f32 = ""
                    f32_speedup = ""
                    if engine == "openvino":
                        f32_ms = _ms(_runner(paths["float"], engine, args.threads, "f32", batch), x, batch, engine,
                                     args.threads, args.rounds)
                        f32, f32_speedup = f"{f32_ms:.3f}", f"{f32_ms / ms['plan']:.2f}x"
                    print(f"| {run.name} | {engine} | {batch} | {ms['float']:.3f} | {ms['w8a8']:.3f} | "
                          f"{ms['plan']:.3f} | {ms['float'] / ms['plan']:.2f}x | {ms['w8a8'] / ms['plan']:.2f}x | "
                          f"{f32} | {f32_speedup} | {retention:.2%} | {agreement:.2%} | {left} |", flush=True)


if __name__ == "__main__":
    main()
