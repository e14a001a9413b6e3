"""Prints what the error-minimising clipping search buys over plain max-scaling.

Uniform weight-only plans of the bundled ResNet-20 on all 846 exact CIFAR-10 test images of the
bundled sample, with the scale of every unit chosen by the clipping search (the default) and
by max|w| alone.

    python benchmarks/quantizer_clipping.py
"""

from __future__ import annotations

from modelopt.api import build_workload
from modelopt.compressors import Granularity, Quantize, QuantSpec
from modelopt.evaluation.evaluator import Evaluator
from modelopt.plan.space import SearchSpace


def main() -> None:
    wl = build_workload("cifar10_resnet20", "cifar10-sample")
    print(f"ResNet-20, {len(wl.split('all'))} images, float top-1 {wl.baseline_accuracy('all'):.2%}, "
          f"device {wl.device}")
    print(f"{'plan':24s} {'scales':14s} {'top-1':>7s} {'retention':>9s} {'agreement':>9s} {'compression':>11s}")
    for bits, gran in ((8, "per_channel"), (4, "per_channel"), (4, "group"), (4, "per_tensor"), (3, "group")):
        for label, ratios in (("clip search", None), ("max-scaling", (1.0,))):
            ratio_opt = {} if ratios is None else {"clip_ratios": ratios}
            comp = Quantize(bits=(bits,), granularity=(gran,), rounding=("nearest",), norm_images=0, **ratio_opt)
            space = SearchSpace(wl.layers, [comp])
            plan = space.uniform("quantize", QuantSpec(bits, Granularity(gran)))
            m = Evaluator(wl, space).scorer.evaluate(plan, "all")
            print(f"{f'uniform int{bits} {gran}':24s} {label:14s} {m.accuracy:7.2%} {m.retention:9.2%} "
                  f"{m.agreement:9.2%} {m.compression:10.2f}x")


if __name__ == "__main__":
    main()
