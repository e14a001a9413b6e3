"""How long a packed file takes to decode: ResNet-50 (torchvision, random weights sized to 10 classes: nothing here
reads accuracy) at uniform INT4 and INT8 per-channel, written entropy coded (format 5) and read back.

Prints, per plan: the file's bytes, the seconds `modelopt.load` takes (architecture built, every layer's codes
decoded and dequantized, norms unfolded), and the seconds the codes' decoding alone takes (the ANS segments to int8
codes), each the median of `--repeats` reads in this process, after one warm-up read.

    python benchmarks/decode.py                       # ResNet-50, 64 images of CIFAR-10 JPEG scaled to 224 pixels
    python benchmarks/decode.py --model torchvision:resnet18
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path

import torch

from modelopt.api import build_compressors, build_workload
from modelopt.compressors.contract import IntegerWeight, decode_codes
from modelopt.evaluation.evaluator import Evaluator
from modelopt.exporters import export_packed, load
from modelopt.plan.space import SearchSpace

sys.path.insert(0, str(Path(__file__).parent))
from full_size import make_folder


def _decode_codes(path: Path) -> None:
    payload = torch.load(path, weights_only=True)
    index = json.loads(zlib.decompress(payload["index"]))
    codes, start = payload["codes"].numpy(), 0
    for _, tag, shape, kept, n, _ in index["q"]:
        decode_codes(codes[start : start + n], IntegerWeight.layout(tag)[0], shape if kept < 0 else (kept,))
        start += n


def _median_seconds(fn: object, repeats: int) -> float:
    assert callable(fn)
    fn()  # warm-up: imports, allocator
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="torchvision:resnet50")
    ap.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "modelopt-decode-224"))
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.manual_seed(0)
    name = args.model.split(":")[-1]
    import torchvision

    weights = Path(args.cache) / f"{name}-random.pt"
    weights.parent.mkdir(parents=True, exist_ok=True)
    torch.save(getattr(torchvision.models, name)(num_classes=10).state_dict(), weights)
    wl = build_workload(args.model, str(make_folder(Path(args.cache) / "images", 64)), weights=str(weights))
    comps = build_compressors(["quantize"], {"quantize": {"bits": [8, 4], "rounding": ["nearest"], "norm_images": 0}})
    ev = Evaluator(wl, SearchSpace(wl.layers, comps))
    params = sum(x.params for x in wl.layers)
    print(f"{args.model}: {len(wl.layers)} layers, {params:,} weights; torch threads {torch.get_num_threads()}")
    print("| plan | file bytes | bits / weight | modelopt.load (s) | codes decoded alone (s) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for bits in (4, 8):
        plan = ev.space.parse_plan({"default": {"quantize": {"bits": bits}}})
        path = export_packed(ev, plan, Path(args.cache) / f"{name}-int{bits}.pt")
        size = path.stat().st_size
        full = _median_seconds(lambda path=path: load(path), args.repeats)
        codes = _median_seconds(lambda path=path: _decode_codes(path), args.repeats)
        print(f"| uniform INT{bits} per channel | {size:,} | {8 * size / params:.2f} | {full:.2f} | {codes:.2f} |",
              flush=True)


if __name__ == "__main__":
    main()
