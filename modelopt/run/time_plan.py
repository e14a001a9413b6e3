"""How a timed run (`RunConfig.time`) divides its seconds: loading, the anchors, the search, then certifying.

The end of a run costs seconds the search must leave: each claim confirmation tests is a pass over the confirm
split plus, with reconstruction, a refit of the plan; then the reported plans are scored on test and the report
is written. `TimePlan` prices these from the run's own pace (seconds an image, measured on the trials so far),
stops the search while they still fit (`search_may_go_on`), and tells confirmation how many claims the time left
affords (`claims_affordable`). An untimed run (no `time`) is never stopped by it and caps nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from modelopt.certify.confirm import TIMED_GATE
from modelopt.config.duration import format_duration
from modelopt.data.split import Split
from modelopt.evaluation.evaluator import Evaluator
from modelopt.evaluation.trial import Trial
from modelopt.run.clock import RunClock

__all__ = ["CLAIMS_RESERVED", "GATE_CLAIMS", "SEARCH_CLAIMS", "TimePlan"]

# The claims a timed search leaves room to certify: the gate's two most compressed likely anchors (confirmed as
# composed, a confirm pass each: `modelopt.certify.confirm.TIMED_GATE`) and two of the search's sequence (each
# refitted first); measured on the default run: docs/results.md#time.
GATE_CLAIMS = TIMED_GATE
SEARCH_CLAIMS = 2
CLAIMS_RESERVED = GATE_CLAIMS + SEARCH_CLAIMS
# A refit of a finalist, in passes over the confirm split at the search's pace (default run, 2 cores: 12-13.5 s a
# refit; a confirm pass of 7,154 images 5.3-6.4 s, priced at 6.9 s from the val trials' median pace).
REFIT_IN_CONFIRM_PASSES = 2.0
REPORTED_ON_TEST = 10  # plans scored on test at the end: the best, the anchors, the front (up to 16) ...
REPORT_SECONDS = 6.0  # report.md and report.html with their figures (default run, 2 cores)
RECENT = 5  # trials whose mean prices the next


@dataclass
class TimePlan:
    """The seconds of a timed run, priced from its own pace.

    Example:
        >>> plan = TimePlan(RunClock(150.0), evaluator, reconstruct=True)
        >>> plan.search_may_go_on(trials)      # False once the end no longer fits in the time left
    """

    clock: RunClock
    evaluator: Evaluator
    reconstruct: bool

    def seconds_per_image(self, trials: Sequence[Trial]) -> float | None:
        """The pace of a pass over a split: the median seconds per image of the trials scored on all of val (a
        trial's own set-up included, so a confirm or test pass is priced on the safe side); None before one."""
        n_val = len(self.evaluator.workload.split(Split.VAL))
        full = sorted(t.seconds / t.metrics.n_samples for t in trials if t.metrics is not None and t.seconds > 0
                      and t.metrics.stopped is None and t.metrics.n_samples >= n_val > 0)
        return full[len(full) // 2] if full else None

    @staticmethod
    def trial_seconds(trials: Sequence[Trial]) -> float:
        """What the next trial is expected to take: the mean of the last few (pruned plans re-estimate their norms,
        stopped ones end early)."""
        recent = [t.seconds for t in trials[-RECENT:]]
        return sum(recent) / len(recent) if recent else 0.0

    def _images(self, split: str) -> int:
        return len(self.evaluator.workload.split(split)) if split in self.evaluator.workload.splits else 0

    def confirm_seconds(self, pace: float) -> float:
        """A claim of the gate: one pass over the confirm split."""
        return pace * self._images(Split.CONFIRM)

    def claim_seconds(self, pace: float) -> float:
        """A claim of the search's sequence: its confirm pass and, with reconstruction, its refit. The pace is a val
        trial's, its set-up included, so a pass of the end is priced on the safe side and needs no margin."""
        return self.confirm_seconds(pace) * (1.0 + (REFIT_IN_CONFIRM_PASSES if self.reconstruct else 0.0))

    def tail_seconds(self, pace: float) -> float:
        """What follows confirmation: the reported plans on test and the report."""
        return REPORTED_ON_TEST * pace * self._images(Split.TEST) + REPORT_SECONDS

    def end_seconds(self, pace: float) -> float:
        """The end a search leaves room for: the gate's claims, the search's, the test figures and the report."""
        return self._fixed_end(pace) + SEARCH_CLAIMS * self.claim_seconds(pace)

    def _fixed_end(self, pace: float) -> float:
        """The end but the search's claims: the gate's claims, the test figures and the report."""
        return GATE_CLAIMS * self.confirm_seconds(pace) + self.tail_seconds(pace)

    def search_may_go_on(self, trials: Sequence[Trial]) -> bool:
        """Whether one more trial (at the pace so far) and the end still fit in the time left."""
        if not self.clock.timed:
            return True
        pace = self.seconds_per_image(trials)
        if pace is None:
            return True
        return self.clock.left() > self.trial_seconds(trials) + self.end_seconds(pace)

    def stop_line(self, trials: Sequence[Trial]) -> str | None:
        """None while the search may go on; else the line that says it stops for the time."""
        if self.search_may_go_on(trials):
            return None
        return (f"Time: the search stops after {len(trials)} trials, {format_duration(max(self.clock.left(), 0.0))} "
                "left to certify")

    def left_text(self) -> str:
        """The time left, for the progress line ('' without a time budget)."""
        return format_duration(max(self.clock.left(), 0.0)) if self.clock.timed else ""

    def claims_affordable(self, trials: Sequence[Trial]) -> int | None:
        """How many claims of the search's sequence confirmation can test in the time left, beside the gate's (at
        least one); None: no limit."""
        if not self.clock.timed:
            return None
        pace = self.seconds_per_image(trials)
        if pace is None:
            return None
        room = self.clock.left() - self._fixed_end(pace)
        if room <= 0:  # not even the gate's: one claim, the one most worth testing
            return 1
        # Rounded, not floored: the search stopped with room for SEARCH_CLAIMS, and a last trial slower than the
        # mean leaves a little less (on the default run it cut the claim that reported 13.03x).
        return max(1, math.floor(room / max(self.claim_seconds(pace), 1e-9) + 0.5))

    def refit_affordable(self, trials: Sequence[Trial]) -> bool:
        """Whether the time left covers refitting the search's plans before they are confirmed (else they are
        confirmed as composed, and a line says so)."""
        pace = self.seconds_per_image(trials)
        if not self.clock.timed or pace is None or not self.reconstruct:
            return True
        return self.clock.left() >= self._fixed_end(pace) + self.claim_seconds(pace)

    def announce(self, trials: Sequence[Trial]) -> str | None:
        """What the time buys, said once the anchors are scored: e.g. 'Time 2m30s: 1m41s left; about 30 trials
        of search (1.9 s each), then up to 4 claims certified (14 s each) and the test figures (12 s)'."""
        pace = self.seconds_per_image(trials)
        if not self.clock.timed or pace is None:
            return None
        assert self.clock.limit is not None
        left = self.clock.left()
        trial = self.trial_seconds(trials)
        search = max(left - self.end_seconds(pace), 0.0)
        return (f"Time {format_duration(self.clock.limit)}: {format_duration(max(left, 0.0))} left; about "
                f"{math.floor(search / trial) if trial > 0 else 0} trials of search ({trial:.1f} s each), then up to "
                f"{CLAIMS_RESERVED} claims certified ({self.confirm_seconds(pace):.0f} s each for the uniform plans, "
                f"{self.claim_seconds(pace):.0f} s for the search's) and the test figures and report "
                f"({self.tail_seconds(pace):.0f} s)")
