"""Does a run's plan leave the tool intact? Exports it to ONNX and to the packed format, then prints
`onnx.checker`'s verdict, ONNX Runtime's argmax agreement with the evaluator on val, the packed
file's size against `size_bytes`, and `modelopt.load`'s agreement on val.

    python benchmarks/export_check.py runs/r20             # the run's best plan
    python benchmarks/export_check.py runs/r20 --plan 17   # trial 17
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import onnx
import torch

from modelopt.exporters import load
from modelopt.exporters.onnx_run import run_onnx
from modelopt.run.export import export, resolve


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--plan", default="best", help="best or a trial number")
    args = ap.parse_args()
    t0 = time.perf_counter()
    src = resolve(args.run_dir, args.plan)
    ev, plan, wl = src.evaluator, src.plan, src.evaluator.workload
    x = wl.split("val").x.tensor()
    want = ev.states.logits(plan, x).argmax(1).cpu().numpy()
    m = ev.scorer.evaluate(plan, "val")
    print(f"plan {src.tag} of {args.run_dir}: {m.compression:.2f}x, size_bytes {m.size_bytes}, "
          f"val retention {m.retention:.2%} (search-time estimate) on {len(x)} images")
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = export(args.run_dir, plan=args.plan, format="onnx", out=Path(tmp) / "plan.onnx")
        onnx.checker.check_model(onnx.load(str(onnx_path)), full_check=True)
        got = run_onnx(onnx_path, x).argmax(1)
        print(f"ONNX ({os.path.getsize(onnx_path)} bytes): onnx.checker OK; ONNX Runtime (CPU) vs evaluator "
              f"argmax agreement on val {(got == want).mean():.2%} ({int((got == want).sum())}/{len(want)})")
        pt_path = export(args.run_dir, plan=args.plan, format="modelopt", out=Path(tmp) / "plan.pt")
        net = load(pt_path)
        with torch.inference_mode():
            got_pt = net(x.cpu()).argmax(1).numpy()
        print(f"packed ({os.path.getsize(pt_path)} bytes on disk, size_bytes {m.size_bytes}): modelopt.load vs "
              f"evaluator argmax agreement on val {(got_pt == want).mean():.2%}")
    print(f"{time.perf_counter() - t0:.0f} s on {wl.device}")


if __name__ == "__main__":
    main()
