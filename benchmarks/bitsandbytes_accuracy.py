"""Prints how closely bitsandbytes Linear layers follow the QDQ evaluation, for ResNet-20 and ResNet-56.

For a uniform INT8 per-channel plan (the fc runs as Linear8bitLt holding our int8 codes and scales)
and a uniform INT4 per-channel plan (the fc runs as Linear4bit, nf4 and fp4), on the val and test
splits of the bundled sample: top-1 accuracy of the bitsandbytes model and of the QDQ evaluation,
their top-1 agreement and the largest logit difference. Convolutions stay QDQ in float in both
(bitsandbytes has no convolution), so only the fc layer separates the two.

    python benchmarks/bitsandbytes_accuracy.py [--device auto]   # ResNet-56 weights from ../shared/models

Measured (bitsandbytes 0.50.2, torch 2.15, device cpu, on a 2-core CPU shared with other jobs, so
the seconds are loose): INT8 agrees with QDQ on 99.76-100 % of images, logits within 0.16 (only
bitsandbytes' int8 rounding of the fc's input differs); 4-bit on 97.6-99.3 %, logits within 2.7,
accuracy within 0.71 points of our INT4 either way.

    cifar10_resnet20, data cifar10-sample, device cpu
      plan                     split     n  bnb acc  QDQ acc    agree max |dlogit|  fc runs as
      int8/per_channel         val     423   91.73%   91.96%   99.76%       0.1602  Linear8bitLt (modelopt codes)  [9.7 s]
      int8/per_channel         test    423   91.49%   91.49%  100.00%       0.1496  Linear8bitLt (modelopt codes)  [6.4 s]
      int4/per_channel (nf4)   val     423   91.49%   91.73%   99.29%       2.4397  Linear4bit/nf4 (bitsandbytes codes)  [13.1 s]
      int4/per_channel (nf4)   test    423   91.96%   91.73%   98.58%       2.6549  Linear4bit/nf4 (bitsandbytes codes)  [3.8 s]
      int4/per_channel (fp4)   val     423   91.02%   91.73%   98.82%       1.7523  Linear4bit/fp4 (bitsandbytes codes)  [6.0 s]
      int4/per_channel (fp4)   test    423   91.49%   91.73%   98.58%       2.3195  Linear4bit/fp4 (bitsandbytes codes)  [5.1 s]

    cifar10_resnet56, data cifar10-sample, device cpu
      plan                     split     n  bnb acc  QDQ acc    agree max |dlogit|  fc runs as
      int8/per_channel         val     423   93.14%   93.14%  100.00%       0.1230  Linear8bitLt (modelopt codes)  [45.3 s]
      int8/per_channel         test    423   93.38%   93.38%  100.00%       0.1251  Linear8bitLt (modelopt codes)  [13.4 s]
      int4/per_channel (nf4)   val     423   92.20%   91.73%   97.64%       2.5743  Linear4bit/nf4 (bitsandbytes codes)  [18.9 s]
      int4/per_channel (nf4)   test    423   93.14%   93.38%   98.82%       2.5189  Linear4bit/nf4 (bitsandbytes codes)  [18.7 s]
      int4/per_channel (fp4)   val     423   92.43%   91.73%   98.82%       2.3632  Linear4bit/fp4 (bitsandbytes codes)  [8.6 s]
      int4/per_channel (fp4)   test    423   92.91%   93.38%   98.35%       2.3492  Linear4bit/fp4 (bitsandbytes codes)  [8.5 s]

    bitsandbytes 0.50.2, torch 2.15.0+cu132
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from modelopt.api import build_compressors, build_workload
from modelopt.compressors import QuantSpec
from modelopt.evaluation.evaluator import Evaluator
from modelopt.exporters.bitsandbytes import bitsandbytes_agreement
from modelopt.plan.space import SearchSpace

# ResNet-56 has no bundled weights: the shared checkpoint (akamaster/pytorch_resnet_cifar10).
WEIGHTS = {"cifar10_resnet56": Path(__file__).resolve().parents[2] / "shared" / "models" / "cifar10"
           / "resnet56-4bfd9763.th"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", help="auto, cpu, cuda")
    args = ap.parse_args()

    for model in ("cifar10_resnet20", "cifar10_resnet56"):
        wl = build_workload(model, "cifar10-sample", weights=WEIGHTS.get(model), device=args.device)
        options = {"quantize": {"bits": [8, 4], "rounding": ["nearest"], "norm_images": 0}}
        ev = Evaluator(wl, SearchSpace(wl.layers, build_compressors(["quantize"], options)))
        plans = {"int8/per_channel": ("nf4", ev.space.uniform("quantize", QuantSpec(8)))}
        for qt in ("nf4", "fp4"):
            plans[f"int4/per_channel ({qt})"] = (qt, ev.space.uniform("quantize", QuantSpec(4)))
        print(f"\n{model}, data cifar10-sample, device {wl.device}")
        print(f"  {'plan':24s} {'split':5s} {'n':>5s} {'bnb acc':>8s} {'QDQ acc':>8s} {'agree':>8s} "
              f"{'max |dlogit|':>12s}  fc runs as")
        for label, (qt, plan) in plans.items():
            for split in ("val", "test"):
                t0 = time.perf_counter()
                a = bitsandbytes_agreement(ev, plan, split, quant_type=qt)
                conv = ", ".join(f"{c.module} ({c.codes} codes)" for c in a.converted) or "-"
                print(f"  {label:24s} {split:5s} {a.n_samples:5d} {a.bnb_accuracy:8.2%} {a.qdq_accuracy:8.2%} "
                      f"{a.agreement:8.2%} {a.max_abs_logit_diff:12.4f}  {conv}  [{time.perf_counter() - t0:.1f} s]")
    import bitsandbytes

    print(f"\nbitsandbytes {bitsandbytes.__version__}, torch {torch.__version__}")


if __name__ == "__main__":
    main()
