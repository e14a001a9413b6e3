"""Preparation a run pays for once: a reference pass, a head fit, a calibration.

Each is charged to the first trial that needs it, by key. A resumed run marks as paid what its
journal's trials needed (`Evaluator.mark_paid`), so it does not pay again for work the killed
process already charged, and spends its budget exactly as the uninterrupted run would have.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = ["OneTimeCosts"]


class OneTimeCosts:
    """Which one-time preparations a run has been charged for.

    Example:
        >>> costs = OneTimeCosts()
        >>> costs.charge("norm_reference:512", 1.21), costs.charge("norm_reference:512", 1.21)
        (1.21, 0.0)
    """

    def __init__(self) -> None:
        self._paid: set[str] = set()
        self.charged: dict[str, float] = {}  # what this process charged, by key (budget units)
        self.seconds: dict[str, float] = {}  # wall seconds preparations took in this process, by key
        self.since_forget: dict[str, float] = {}  # what was charged since `forget_paid` (a worker's trial)

    def charge(self, key: str, cost: float) -> float:
        """`cost` the first time `key` is charged in this run, 0 after (or once marked paid)."""
        if key in self._paid:
            return 0.0
        self._paid.add(key)
        self.charged[key] = cost
        self.since_forget[key] = cost
        return cost

    def forget_paid(self) -> None:
        """Charges every preparation again from here on, and starts `since_forget` afresh: a worker
        scoring plans for a run elsewhere reports each plan's preparations in full, and the run
        charges each once (`modelopt.evaluation.evaluator.Evaluator.settle`)."""
        self._paid.clear()
        self.since_forget = {}

    def timed(self, key: str, seconds: float) -> None:
        """Records that preparation `key` took `seconds` (added up when it recurs)."""
        self.seconds[key] = self.seconds.get(key, 0.0) + seconds

    def mark_paid(self, keys: Iterable[str]) -> None:
        self._paid.update(keys)

    def to_json(self) -> dict[str, dict[str, float]]:
        return {"charged": dict(self.charged), "seconds": dict(self.seconds)}

    def restore(self, saved: Mapping[str, Mapping[str, float]]) -> None:
        """What an earlier process of this run charged and spent (`to_json`, a resumed run): paid, and
        reported with this process's own as what the run paid."""
        charged, seconds = saved.get("charged") or {}, saved.get("seconds") or {}
        for key, cost in charged.items():
            self._paid.add(key)
            self.charged[key] = float(cost) + self.charged.get(key, 0.0)
        for key, secs in seconds.items():
            self.timed(key, float(secs))
