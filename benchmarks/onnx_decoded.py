"""Is a size plan's ONNX file as fast as the float model's, and does it give the certified answers?

Exports a run's reported plan (its refitted weights where the run chose them) to ONNX twice, with its integer
weights behind DequantizeLinear (`--weights integer`, the smallest file) and decoded to float32 once at export
(`--weights decoded`), beside the float model's file; times each in plain ONNX Runtime (CPUExecutionProvider, batch
1, 1 intra-op thread, the median of `--repeats` runs after warm-up), and compares each file's answers with the
answers the run certified (the evaluator's on the test split).

    python benchmarks/onnx_decoded.py runs/r20
    python benchmarks/onnx_decoded.py runs/r20 --plan 17 --threads 2
"""

from __future__ import annotations

import argparse
import tempfile
import warnings
from collections import Counter
from pathlib import Path

import onnx

from modelopt.data.split import Split
from modelopt.exporters.onnx import export_onnx
from modelopt.exporters.onnx_run import run_onnx
from modelopt.latency import onnx_latency
from modelopt.run.export import resolve


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--plan", default="best", help="best or a trial number")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=300)
    args = ap.parse_args()
    src = resolve(args.run_dir, args.plan)
    ev, realised = src.evaluator, src.realised
    x = ev.workload.split(Split.TEST).x.tensor().cpu()
    certified = ev.answers(realised, Split.TEST)[0].cpu().numpy()
    float_plan = ev.space.plan({})
    print(f"plan {src.tag} of {args.run_dir}: {ev.plan_cost(realised).size_bytes:,} bytes packed; "
          f"{len(x)} test images; ONNX Runtime CPU, batch 1, {args.threads} thread(s), median of {args.repeats}")
    print("| file | bytes | graph nodes | ms / image | vs float | agreement with the certified answers |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        rows = [("float model", float_plan, "integer"), ("plan, --weights integer", realised, "integer"),
                ("plan, --weights decoded", realised, "decoded")]
        float_ms = None
        for name, plan, weights in rows:
            path = Path(tmp) / f"{name.split()[0]}-{weights}.onnx"
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the integer form's one-line cost note: this table states it
                export_onnx(ev, plan, path, weights=weights)
            ms = onnx_latency(path, x, batch_size=1, threads=args.threads, repeats=args.repeats).median_ms
            float_ms = ms if float_ms is None else float_ms
            got = run_onnx(path, x).argmax(1)
            agree = (got == certified).mean()
            ops = Counter(node.op_type for node in onnx.load(str(path)).graph.node)
            nodes = ", ".join(f"{n} {op}" for op, n in sorted(ops.items(), key=lambda kv: -kv[1])[:3])
            print(f"| {name} | {path.stat().st_size:,} | {nodes} | {ms:.3f} | {float_ms / ms:.2f}x | {agree:.2%} |",
                  flush=True)


if __name__ == "__main__":
    main()
