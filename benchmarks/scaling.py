"""Prints how a run scales out: plans per minute against Ray workers, search quality against the
number of plans asked ahead, and where the driver becomes the bottleneck.

    python benchmarks/scaling.py throughput [--workers 1,2] [--budget 40]
    python benchmarks/scaling.py quality [--seeds 0,1,2] [--batches 1,2] [--budget 200]
    python benchmarks/scaling.py driver [--workers 1,16,32,64] [--delay 0.5] [--trials 256]

`throughput` and `quality` run MCTS on ResNet-56 with the 846 exact CIFAR-10 test images from
../shared as data (split 169 calib / 169 val / 169 confirm / 339 test). Retention is the point
estimate (`--confidence 0`): 169 val images cannot certify a 99 % floor at 95 % confidence.

- throughput: the same run on `--workers N` Ray workers for each N (and the local executor).
  Plans per minute are trials over the search loop's wall time (`search_wall_seconds`: workers
  already started); the wall time with start-up is printed beside it.
- quality: the best plan at equal budget when the strategy is asked for `n` plans at a time. It
  runs on the local executor with `n` slots, which records the same trials as `n` Ray workers
  (tests/executors/test_ray.py checks that), so the figures do not depend on this machine's cores.
  The best is reported on its held-out test images (the headline), with the val estimate beside.
- driver: a synthetic executor (threads that wait `--delay` seconds, then return metrics computed
  from the plan's size and data-free errors, no forward pass) with 1 to 64 workers: trials per
  second against the ideal workers / delay, which shows where asking, telling and journaling in
  the driver stop keeping the workers busy.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path
from queue import Queue

import torch

from modelopt.api import optimize
from modelopt.config.build import build
from modelopt.config.run_config import RunConfig
from modelopt.evaluation.metrics import Metrics
from modelopt.executors import Executor, Job, Scored
from modelopt.run.journal import read_records
from modelopt.run.runner import Runner
from modelopt.search import STRATEGIES

SHARED = Path(__file__).resolve().parents[2] / "shared"
R56 = dict(model="cifar10_resnet56", data=str(SHARED / "data/cifar10/cifar10_exact_test.npz"),
           weights=str(SHARED / "models/cifar10/resnet56-4bfd9763.th"))
SETTINGS = dict(strategy="mcts", confidence=0.0, min_retention=0.99, latency=None, report=False, progress=False)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def throughput(args: argparse.Namespace, root: Path) -> None:
    per = f"{args.threads} thread(s) per worker" if args.threads else "the cores split between workers"
    print(f"ResNet-56, exact test images, MCTS budget {args.budget:g}, seed 0, on {os.cpu_count()} CPU cores, "
          f"{per}\n")
    print("| executor | workers | trials | search wall (s) | plans / min | wall with start-up (s) |")
    print("|---|---:|---:|---:|---:|---:|")
    base = None
    runs = [("local", 1), *(("ray", w) for w in _ints(args.workers))]
    if args.threads:  # one core per worker: a local Ray cluster of `workers` CPUs, each worker one thread
        import ray  # the distributed extra

        torch.set_num_threads(args.threads)  # the local executor's one process, too
        os.environ.setdefault("RAY_worker_niceness", "0")  # as the executor's own cluster
    for executor, workers in runs:
        if args.threads and executor == "ray":
            ray.shutdown()
            ray.init(num_cpus=workers * args.threads, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
        t0 = time.perf_counter()
        result = optimize(R56["model"], R56["data"], weights=R56["weights"], budget=args.budget, seed=0,
                          out=root / f"{executor}-{workers}", executor=executor, workers=workers, **SETTINGS)
        wall = time.perf_counter() - t0
        search = result.summary.search_wall_seconds
        rate = len(result.trials) / search * 60
        base = rate if executor == "ray" and workers == 1 else base
        ratio = "" if base is None or executor == "local" else f" ({rate / base:.2f}x of 1 worker)"
        print(f"| {executor} | {workers} | {len(result.trials)} | {search:.1f} | {rate:.1f}{ratio} | {wall:.1f} |",
              flush=True)


def quality(args: argparse.Namespace, root: Path) -> None:
    print(f"ResNet-56, exact test images, MCTS budget {args.budget:g}: the search's best on val (its compression, and "
          "its retention on val and on held-out test), and the plan the run reports after confirmation\n")
    print("| seed | plans asked at once | trials | search best: compression | val retention | test retention "
          "| reported (confirmed) |")
    print("|---:|---:|---:|---:|---:|---:|---|")
    for seed in _ints(args.seeds):
        for n in _ints(args.batches):
            out = root / f"quality-n{n}-s{seed}"
            result = optimize(R56["model"], R56["data"], weights=R56["weights"], budget=args.budget, seed=seed,
                              out=out, executor="local", workers=n, resume=(out / "trials.jsonl").is_file(),
                              **SETTINGS)
            best, reported = result.summary.search_best, result.summary.best
            said = "none confirmed" if reported is None or reported.test is None else (
                f"{reported.test.metrics.compression:.2f}x at {reported.test.metrics.retention:.2%} on test")
            if best is None or best.val is None or best.test is None:
                print(f"| {seed} | {n} | {len(result.trials)} | none | | | {said} |", flush=True)
                continue
            print(f"| {seed} | {n} | {len(result.trials)} | {best.val.metrics.compression:.2f}x | "
                  f"{best.val.metrics.retention:.2%} | {best.test.metrics.retention:.2%} | {said} |", flush=True)


class SyntheticExecutor(Executor):
    """`slots` threads that wait `delay` seconds per job, then return metrics made from the plan's
    size and its choices' data-free errors (retention 1 - their sum): a stand-in for a cluster whose
    evaluations take `delay`, with no forward pass."""

    name = "synthetic"

    def __init__(self, runner_evaluator, slots: int, delay: float) -> None:
        self.evaluator, self.slots, self.delay = runner_evaluator, slots, delay
        self._jobs: Queue[Job | None] = Queue()
        self._done: Queue[tuple[Job, Scored]] = Queue()
        self._threads = [threading.Thread(target=self._work, daemon=True) for _ in range(slots)]
        for t in self._threads:
            t.start()

    def _metrics(self, job: Job) -> Metrics:
        space, ev = self.evaluator.space, self.evaluator
        error = sum(f.error for d in space.decisions for c, f in zip(d.choices, space.features[d.name], strict=True)
                    if job.plan.get(d.name) == c and c is not None)
        size, float_size = ev.plan_cost(job.plan).size_bytes, ev.workload.float_size_bytes
        retention = max(0.0, 1.0 - error)
        return Metrics(split="val", n_samples=len(ev.workload.split("val")), accuracy=0.9 * retention,
                       baseline_accuracy=0.9, retention=retention, agreement=retention, size_bytes=size,
                       float_size_bytes=float_size, compression=float_size / size, bitops=1, macs=1,
                       eval_seconds=self.delay)

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            time.sleep(self.delay)
            self._done.put((job, Scored(self._metrics(job), self.delay)))

    def submit(self, job: Job) -> None:
        self._jobs.put(job)

    def wait(self) -> list[tuple[Job, Scored]]:
        done = [self._done.get()]
        while not self._done.empty():
            done.append(self._done.get())
        return done

    def close(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)


def driver(args: argparse.Namespace, root: Path) -> None:
    config = RunConfig().replace(**{**R56, "strategy": "mcts", "confidence": 0.0, "latency": None,
                                    "fidelity": None, "budget": float(args.trials)})
    built = build(config)
    print(f"MCTS driver on ResNet-56's space ({len(built.space.decisions)} decisions), synthetic evaluations of "
          f"{args.delay:g} s each, {args.trials} trials\n")
    print("| workers | trials / s | ideal (workers / delay) | share of ideal | driver s / trial |")
    print("|---:|---:|---:|---:|---:|")
    for workers in _ints(args.workers):
        strategy = STRATEGIES.get("mcts")(built.space, built.objective, seed=0)  # fresh for each cluster size
        executor = SyntheticExecutor(built.evaluator, workers, args.delay)
        runner = Runner(built.evaluator, strategy, built.objective, budget=float(args.trials),
                        run_dir=root / f"driver-{workers}", config=built.config, progress=False, executor=executor)
        wall = runner.run().summary.search_wall_seconds  # the search loop only, not the final re-scoring
        journal = read_records(root / f"driver-{workers}" / "trials.jsonl")
        rate, ideal = len(journal) / wall, workers / args.delay
        busy = len(journal) * args.delay / workers  # the time the workers alone would need
        print(f"| {workers} | {rate:.2f} | {ideal:.2f} | {rate / ideal:.0%} | {(wall - busy) / len(journal):.4f} |",
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=["throughput", "quality", "driver"])
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--budget", type=float, default=None)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--batches", default="1,2")
    parser.add_argument("--delay", type=float, default=0.5)
    parser.add_argument("--trials", type=int, default=256)
    parser.add_argument("--threads", type=int, default=0, help="throughput: threads per worker (default: the "
                        "executor's split of the cores; 1 isolates how Ray's workers scale from torch's threads)")
    parser.add_argument("--out", type=Path, default=None, help="keep the run folders here (quality resumes them)")
    args = parser.parse_args()
    args.budget = args.budget or {"throughput": 40.0, "quality": 200.0}.get(args.part, 0.0)
    if args.part == "driver" and args.workers == "1,2":
        args.workers = "1,16,32,64"
    root = args.out or Path(tempfile.mkdtemp(prefix="modelopt-scaling-"))
    {"throughput": throughput, "quality": quality, "driver": driver}[args.part](args, root)


if __name__ == "__main__":
    main()
