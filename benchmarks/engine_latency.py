"""Prints, per run folder and engine, the float model against the run's reported plan: median batch latency at
batch 1 and 64 (threads fixed, after warm-up), the speed-up, and the plan's test retention as that engine
computes it, with the machine named.

    python benchmarks/engine_latency.py runs/r20-ort [runs/r56-ort ...] [--engines onnxruntime,openvino]
        [--threads 1] [--repeats 50]

Each run folder is rebuilt from its run.json (`modelopt.run.export.resolve`): its workload, its best plan
(best_plan.yaml). Both plans are built in each engine afresh (`modelopt.latency.engine`), timed on rows of the
val split, and scored on the test split: retention = the plan's test accuracy in the engine over the float
model's in the same engine.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
from pathlib import Path

import torch

from modelopt.latency import ENGINES, LatencySpec
from modelopt.run.export import resolve


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run folders (a latency or size run, finished)")
    ap.add_argument("--engines", default="onnxruntime,openvino", help="comma-separated engine names")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"machine: {_cpu()}, {os.cpu_count()} logical cores; {args.threads} thread(s) per engine, median of "
          f"{args.repeats} batches after {args.warmup} warm-up\n")
    print("| run | engine | float b1 ms | plan b1 ms | speed-up b1 | float b64 ms | plan b64 ms | speed-up b64 "
          "| plan test retention | compression |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for run in args.runs:
        src = resolve(run, "best", device="cpu")
        ev, best = src.evaluator, src.plan
        x, test = ev.workload.split("val").x.tensor(), ev.workload.split("test")
        compression = ev.workload.float_size_bytes / ev.plan_cost(best).size_bytes
        for name in args.engines.split(","):
            engine = ENGINES.get(name.strip())()
            spec = LatencySpec(engine.name, batch_size=1, threads=args.threads, warmup=args.warmup,
                               repeats=args.repeats)
            cells = {}
            for label, plan in (("float", ev.space.plan()), ("plan", best)):
                built = engine.compile(ev, plan, spec)
                right = (built.run(test.x.tensor()).argmax(1) == test.y.cpu()).double().mean()
                b1 = built.time(x).median_ms
                built64 = engine.compile(ev, plan, dataclasses.replace(spec, batch_size=64,
                                                                       repeats=max(5, args.repeats // 5)))
                cells[label] = (float(right), b1, built64.time(x).median_ms)
            (fa, f1, f64), (pa, p1, p64) = cells["float"], cells["plan"]
            print(f"| {run.name} | {engine.name} | {f1:.3f} | {p1:.3f} | {f1 / p1:.2f}x | {f64:.2f} | {p64:.2f} | "
                  f"{f64 / p64:.2f}x | {pa / fa:.2%} | {compression:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
