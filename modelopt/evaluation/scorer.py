"""Scoring a plan: forward passes over a split (whole, or in stages that stop early) into `Metrics`.

The scorer swaps a plan's tensors in (`modelopt.evaluation.compressed_state`), runs the split, lets early
routing decide where each sample leaves (`modelopt.evaluation.routes`: early exit), and prices the plan with
the one cost accounting (`modelopt.evaluation.cost`). It scores a `Realised` record, or a plan as composed;
results are cached by (the record's key, split, samples), so a plan scores the same whatever ran before it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Mapping
from typing import Protocol

import torch

from modelopt.compressors.contract import Route
from modelopt.confidence import PairedCounts
from modelopt.data.split import Split
from modelopt.errors import TrialError
from modelopt.evaluation.compressed_state import CompressedStates
from modelopt.evaluation.cost import PlanCost
from modelopt.evaluation.fidelity import Fidelity, best_case, max_correct
from modelopt.evaluation.metrics import Metrics
from modelopt.evaluation.realised import Realised
from modelopt.evaluation.routes import PlanRoutes
from modelopt.model.images import Images
from modelopt.model.workload import SplitData, Workload
from modelopt.plan.plan import Plan

__all__ = ["Engine", "Scorer"]

Predictions = tuple[torch.Tensor, torch.Tensor | None]  # top-1 per sample; with exits, where each left


class Engine(Protocol):
    """An engine the run's plans are scored in instead of the PyTorch simulation (`Scorer.engine`; the run's
    latency engine when its answers can differ from the simulation: `modelopt.latency.plan.PlanLatency`)."""

    def answers(self, realised: Realised, x: Images) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The engine's logits for the plan on `x` and, for a plan with exits, the exit each sample left at."""

    def cost(self, realised: Realised) -> float:
        """Budget building the plan for the engine costs now (0 once built)."""


class Scorer:
    """Scores plans on the workload's splits.

    Args:
        workload: The resident model and splits.
        states: Builds the tensors a plan swaps in.
        routes: Where each sample leaves (early exit): the plan's route, where samples left.
        price: The plan's costs (`modelopt.evaluation.cost`), with the channels structured pruning really keeps.

    Example:
        >>> scorer = Scorer(wl, states, routes, evaluator.plan_cost)      # as `Evaluator` wires it
        >>> scorer.evaluate(plan, "val", n=500).retention         # or a `Realised` record
    """

    def __init__(self, workload: Workload, states: CompressedStates, routes: PlanRoutes,
                 price: Callable[[Plan | Realised], PlanCost]) -> None:
        self.workload, self.states, self.routes, self.price = workload, states, routes, price
        self._results: dict[tuple[str, str, int], Metrics] = {}
        # Where plans are scored when not in the PyTorch simulation: the run's latency engine, when what it
        # computes differs (integer kernels, half precision): the run certifies what deploys.
        self.engine: Engine | None = None

    def cost(self, split: str = Split.VAL, n: int | None = None) -> float:
        """Budget charged for scoring one plan on n samples of a split: n / len(val)."""
        total = len(self.workload.split(Split.VAL))
        return min(n or total, len(self.workload.split(split))) / total

    def trial_cost(self, metrics: Metrics) -> float:
        """Budget a scored plan costs: the samples scored plus its preparation (`Metrics.prep_cost`)."""
        return self.cost(metrics.split, metrics.n_samples) + metrics.prep_cost

    def settle(self, metrics: Metrics, charges: Mapping[str, float]) -> Metrics:
        """`metrics` of a plan scored elsewhere (a worker that charged it `charges`, every one-time
        preparation it needed, in full), charged as this run charges: each preparation once, to the
        first trial recorded that needed it, and this run's own pre-passes with the first of all."""
        pre_passes = self.states.pre_passes
        due = {**charges, **pre_passes}
        paid = [self.states.one_time.charge(key, cost) for key, cost in due.items()]
        if all(p == due[k] for p, k in zip(paid, due, strict=True)) and not pre_passes:
            return metrics  # everything it charged is this run's first: the worker's sum stands as it is
        return dataclasses.replace(metrics, prep_cost=metrics.prep_cost - sum(charges.values()) + sum(paid))

    def evaluate(self, plan: Plan | Realised, split: str = Split.VAL, n: int | None = None) -> Metrics:
        """Scores `plan` (a plan as composed, or a `Realised` record) on the first `n` samples of `split` (all
        when None).

        Raises:
            TrialError: when the compressed model yields non-finite outputs.
        """
        data = self.workload.split(split)
        n = len(data) if n is None else max(1, min(n, len(data)))
        key = (plan.key, split, n)
        if key in self._results:
            return self._results[key]
        t0 = time.perf_counter()
        r, policy, state, prep = self._prepare(plan)
        with self._resident(r, state):
            pred = self._predict(r, data.x.part(0, n), policy)
        metrics = self._metrics(r, split, pred, time.perf_counter() - t0, prep_cost=prep, policy=policy)
        self._results[key] = metrics
        return metrics

    def predictions(self, plan: Plan | Realised, split: str) -> torch.Tensor:
        """The plan's top-1 on every image of `split`, as it is scored (exits, engine and all)."""
        return self.answers(plan, split)[0]

    def answers(self, plan: Plan | Realised, split: str) -> Predictions:
        """The plan's top-1 on every image of `split` and, with exits, where each left, as it is scored."""
        return self.answers_on(plan, self.workload.split(split).x)

    def answers_on(self, plan: Plan | Realised, x: Images) -> Predictions:
        """`answers` on images `x` of no split (unlabeled ones)."""
        r, policy, state, _ = self._prepare(plan)
        with self._resident(r, state):
            return self._predict(r, x, policy)

    def evaluate_staged(self, plan: Plan | Realised, min_retention: float, fidelity: Fidelity, *, finish: bool = True,
                        confidence: float = 0.0, count_gains: bool = True, claim_images: int | None = None) -> Metrics:
        """Scores `plan` on the val split in stages, stopping once the rest cannot matter.

        After each stage of `fidelity`, the plan stops if an upper confidence bound on its
        retention over the whole split is below `min_retention` (see `modelopt.evaluation.fidelity`), or,
        with `confidence` > 0, if even the best case for the rest of the split (no further
        loss, gains at their optimistic rate) leaves its lower retention bound at `confidence`
        under the floor: it could not be certified feasible (`modelopt.evaluation.fidelity.best_case`).
        With `finish=False` (the plan cannot beat the best one found, whatever its accuracy)
        it stops after the first stage: its retention there only informs the search.
        """
        data = self.workload.split(Split.VAL)
        full = (plan.key, Split.VAL, len(data))
        if full in self._results:
            return self._results[full]
        t0 = time.perf_counter()
        preds: list[Predictions] = []
        r, policy, state, prep = self._prepare(plan)
        with self._resident(r, state):
            start = 0
            for stop in fidelity.cuts(len(data)):
                preds.append(self._predict(r, data.x.part(start, stop), policy))
                start = stop
                if stop == len(data):
                    break
                stopped = "dominated" if not finish else _hopeless(
                    data, _joined(preds)[0], min_retention, fidelity.delta, confidence, count_gains, claim_images)
                if stopped is not None:
                    return self._metrics(r, Split.VAL, _joined(preds), time.perf_counter() - t0, stopped=stopped,
                                         prep_cost=prep, policy=policy)
        metrics = self._metrics(r, Split.VAL, _joined(preds), time.perf_counter() - t0, prep_cost=prep,
                                policy=policy)
        self._results[full] = metrics
        return metrics

    def _prepare(self, plan: Plan | Realised) -> tuple[Realised, Route | None, dict[str, torch.Tensor], float]:
        """The plan realised, its route, the tensors it swaps in, and the budget its preparation cost (a routing
        prepares on the float model, e.g. exit heads are fitted there, so before the swap)."""
        policy, prep = self.routes.setup(plan.plan if isinstance(plan, Realised) else plan)
        r = self.states.realise(plan)
        state, cost = self.states.compressed_state(r)
        if self.engine is not None:
            cost += self.engine.cost(r)
        return r, policy, state, prep + cost

    def _resident(self, r: Realised, state: dict[str, torch.Tensor]) -> contextlib.AbstractContextManager[object]:
        """The plan's tensors swapped into the model (and its inputs quantized) while the simulation predicts;
        nothing to swap when an engine scores it."""
        if self.engine is not None:
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        stack.enter_context(self.workload.state(state))
        stack.enter_context(self.states.activation_quant(r))
        return stack

    def _predict(self, r: Realised, x: Images, policy: Route | None) -> Predictions:
        """Predictions for `x` and, with a route, the exit each sample left at (the engine's, when one scores)."""
        if self.engine is not None:
            logits, exit_at = self.engine.answers(r, x)
            return logits.argmax(dim=1), exit_at if policy is not None else None
        if policy is not None:
            return self.routes.predict(policy, x)
        logits = self.workload.logits(x)
        if not torch.isfinite(logits).all():
            raise TrialError(f"plan {r.plan.key} gives non-finite outputs")
        return logits.argmax(dim=1), None

    def _metrics(self, r: Realised, split: str, predictions: Predictions, seconds: float, stopped: str | None = None,
                 prep_cost: float = 0.0, policy: Route | None = None) -> Metrics:
        """Metrics of `predictions` for the first len(pred) samples of `split` (with exits, where
        each left: MACs and bitops are then means over the samples)."""
        pred, exit_at = predictions
        data = self.workload.split(split)
        n = int(pred.shape[0])
        y, base = data.y[:n], data.base_pred[:n]
        right, base_right = pred == y, base == y
        acc = float(right.float().mean())
        base_acc = float(base_right.float().mean())
        costs = self.price(r)  # the bytes of the codes it stores, the refit's where it has one
        size = costs.size_bytes
        reach, head_macs, exited = None, 0.0, None
        if policy is not None and exit_at is not None:
            reach, head_macs, exited = self.routes.reach(policy, exit_at)
        return Metrics(
            split=split,
            n_samples=n,
            accuracy=acc,
            baseline_accuracy=base_acc,
            retention=acc / base_acc if base_acc > 0 else math.nan,
            agreement=float((pred == base).float().mean()),
            size_bytes=size,
            float_size_bytes=self.workload.float_size_bytes,
            compression=self.workload.float_size_bytes / size,
            bitops=costs.bitops(reach, head_macs),
            macs=costs.macs(reach, head_macs),
            eval_seconds=seconds,
            float_bitops=self.workload.macs * 32 * 32,
            float_macs=self.workload.macs,
            stopped=stopped,
            prep_cost=prep_cost,
            exited=exited,
            base_right=int(base_right.sum()),
            lost=int((base_right & ~right).sum()),
            gained=int((right & ~base_right).sum()),
            coded={x.layer.name: x.storage.coded for x in costs.layers if x.storage.coded is not None},
            decoded_bytes=costs.decoded_bytes,
        )


def _hopeless(data: SplitData, pred: torch.Tensor, min_retention: float, delta: float, confidence: float,
              count_gains: bool, claim_images: int | None = None) -> str | None:
    """"infeasible" when the first len(pred) samples of val already rule the plan out: an upper bound
    on its whole-split retention under the floor, or (`confidence` > 0) not even the best case for the
    rest could certify it (at its rates on `claim_images` images, when given: `Objective.bounded`);
    None while it may still meet the floor."""
    stop = int(pred.shape[0])
    base_right = data.base_correct
    right = pred == data.y[:stop]
    br, bw = base_right[:stop], ~base_right[:stop]
    right_rest, wrong_rest = int(base_right[stop:].sum()), int((~base_right[stop:]).sum())
    bound = max_correct(
        plan_correct=int(right.sum()),
        base_right=int(br.sum()), lost=int((br & ~right).sum()),
        base_wrong=int(bw.sum()), gained=int((bw & right).sum()),
        base_right_rest=right_rest, base_wrong_rest=wrong_rest,
        delta=delta,
    )
    stage = PairedCounts(stop, int(br.sum()), int((br & ~right).sum()), int((bw & right).sum()) if count_gains else 0)
    best = best_case(stage, right_rest, wrong_rest, delta) if confidence > 0 else None
    if best is not None and claim_images:
        best = best.scaled(claim_images)
    hopeless = best is not None and best.retention_lower(confidence) < min_retention
    return "infeasible" if hopeless or bound < min_retention * int(base_right.sum()) else None


def _joined(parts: list[Predictions]) -> Predictions:
    """Predictions (and exits, when any) of consecutive stages, concatenated."""
    pred = torch.cat([p for p, _ in parts])
    exits = [e for _, e in parts if e is not None]
    return pred, torch.cat(exits) if exits and len(exits) == len(parts) else None
