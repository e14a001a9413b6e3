"""A finished run's summary.json: the reported best with its test, confirm and val figures, the
confirmation, the Pareto front, and what the run spent."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from modelopt._version import __version__
from modelopt.evaluation.metrics import Metrics
from modelopt.evaluation.trial import Trial
from modelopt.run.confirm import Confirmation

if TYPE_CHECKING:  # the runner imports this module: its type only
    from modelopt.run.runner import Runner

__all__ = ["run_summary"]


def _uniform_name(self: Runner, trial: Trial) -> str:
    """"INT4" for a plan whose compressed layers all store 4-bit weights."""
    bits = {self.space.compressors[d.compressor].weight_bits(c) for d in self.space.decisions
            if (c := trial.plan.get(d.name)) is not None}
    return f"INT{bits.pop()}" if len(bits) == 1 else "mixed"


def run_summary(
    self: Runner, best: Trial | None, search_best: Trial | None, confirmation: Confirmation,
    test: dict[str, Metrics], pareto: tuple[tuple[Trial, Metrics | None], ...], search_wall: float,
    anchors: tuple[Trial, ...] = (),
) -> dict[str, Any]:
    wl = self.evaluator.workload
    confirmed = {t.plan.key: m for t, m in confirmation.finalists}
    conf = self.objective.confidence

    def metrics(m: Metrics | None) -> dict[str, Any] | None:
        if m is None:
            return None
        lo, hi = m.retention_bounds(conf)
        return {**m.to_dict(), "retention_lower": lo, "retention_upper": hi,
                "retention_certified": self.objective.retention_lower(m)}

    def entry(t: Trial) -> dict[str, Any]:
        return {"trial": t.number, "plan_key": t.plan.key, "plan": self.space.dump_plan(t.plan),
                "test": metrics(test.get(t.plan.key)), "confirm": metrics(confirmed.get(t.plan.key)),
                "val": metrics(t.metrics)}

    splits = ("val", "confirm", "test") if "confirm" in wl.splits else ("val", "test")
    return {
        "version": __version__,
        "run_dir": str(self.run_dir),
        "config": self.config.to_json(),
        "objective": {"target": self.objective.target.value, "min_retention": self.objective.min_retention,
                      "confidence": conf, "count_gains": self.objective.count_gains,
                      "claim_images": self.objective.claim_images},
        "budget": self.budget,
        "budget_used": self.spent,
        "n_trials": len(self.trials),
        "n_failed": sum(not t.ok for t in self.trials),
        "n_feasible": sum(t.feasible for t in self.trials),
        "baseline": {s: {"accuracy": wl.baseline_accuracy(s), "n_samples": len(wl.split(s))} for s in splits},
        "float_size_bytes": wl.float_size_bytes,
        "device": str(wl.device),
        # The reported best: confirmed on images that did not select it (when the data have a
        # confirm split); `search_best` is the search's own pick on val, a search-time estimate.
        "best": None if best is None else {**entry(best), "confirmed": confirmation.usable},
        "search_best": None if search_best is None else entry(search_best),
        "confirmation": {
            "split": confirmation.split,
            "usable": confirmation.usable,
            "ceiling": confirmation.ceiling,
            "confirmed": confirmation.confirmed,
            "finalists": [{"trial": t.number, "plan_key": t.plan.key, "confirmed": confirmation.verdicts[i],
                           "pass_chance": confirmation.chances[i] if i < len(confirmation.chances) else None,
                           "confirm": metrics(m)} for i, (t, m) in enumerate(confirmation.finalists)],
        },
        # The uniform plans (INT8, INT4, INT3 per channel) scored beside the search on the same images.
        "anchors": [{**entry(t), "name": _uniform_name(self, t)} for t in anchors],
        "pareto": [entry(t) for t, _ in pareto],
        # One-time work: wall seconds in this process, and the budget units charged for it.
        "preparation": {"seconds": dict(self.evaluator.one_time.seconds),
                        "charged": dict(self.evaluator.one_time.charged)},
        "search_wall_seconds": search_wall,
        "eval_seconds_this_session": self.eval_seconds,
    }
