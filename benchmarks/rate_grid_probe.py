"""Rate grids against clipped INT-b grids on the bundled ResNet-20: val agreement with the float model and the codes'
order-0 entropy (what an entropy coder spends on them), per uniform plan.

Each plan puts every layer but the first conv and the classifier at one choice (those two at INT8 per channel), all
GPTQ-rounded with batch norms re-estimated (the quantizer's defaults). The entropy is that of each layer's codes
under its own histogram, averaged over the inner layers' weights: the bits a weight costs once coded. The size is
the evaluator's (`plan_cost(plan).size_bytes`): the whole model, its codes priced as the packed file codes them.

    python benchmarks/rate_grid_probe.py
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from modelopt.api import build_workload
from modelopt.compressors import Quantize
from modelopt.compressors.quantize.rate import code_entropy
from modelopt.evaluation.evaluator import Evaluator
from modelopt.plan.space import SearchSpace

RATES = (2.0, 2.5, 3.0, 3.5)
ROWS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("INT4 per-channel", {"bits": 4}),
    ("INT3 per-channel", {"bits": 3}),
    ("rate 3.5", {"rate": 3.5}),
    ("rate 3.0", {"rate": 3.0}),
    ("rate 2.5", {"rate": 2.5}),
    ("rate 2.0", {"rate": 2.0}),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="cifar10-exact-sample")
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()
    torch.manual_seed(0)
    wl = build_workload("cifar10_resnet20", args.data, device=args.device)
    ev = Evaluator(wl, SearchSpace(wl.layers, [Quantize(bits=(8, 4, 3), rates=RATES)]))
    names = [x.name for x in wl.layers]
    ends, inner = (names[0], names[-1]), names[1:-1]
    print(f"cifar10_resnet20 on {args.data}: {len(inner)} inner layers, {len(wl.split('val').y)} val images, "
          f"device {wl.device}")
    print("| plan | val agreement | entropy of inner codes (bits/weight) | size, coded (bytes) | seconds |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for label, entry in ROWS:
        t0 = time.perf_counter()
        layers = {n: {"quantize": {"bits": 8} if n in ends else {**entry, "granularity": "per_channel"}}
                  for n in names}
        plan = ev.space.parse_plan({"layers": layers})
        agreement = ev.evaluate(plan).agreement
        forms = ev.realise(plan).forms
        codes = [forms[n].integer.codes for n in inner if forms[n].integer is not None]
        assert len(codes) == len(inner), "every inner layer stores integer codes"
        bits = sum(code_entropy(c) * c.numel() for c in codes) / sum(c.numel() for c in codes)
        size = ev.plan_cost(plan).size_bytes
        print(f"| {label} | {100 * agreement:.2f} % | {bits:.3f} | {size} | {time.perf_counter() - t0:.0f} |",
              flush=True)


if __name__ == "__main__":
    main()
