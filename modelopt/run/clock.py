"""A run's time budget (`RunConfig.time`): when it started, how long it may take, and how much is left.

The clock starts when `modelopt.api.run` is called, so loading the model and decoding the data count, as they
count for the user waiting. A resumed run gets what its earlier processes left of the same time, or a new time in
full when it is given another (`resumed`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

__all__ = ["RunClock"]


@dataclass(frozen=True)
class RunClock:
    """Seconds a run may still take; `limit` None: no time budget (every question answers "plenty").

    Example:
        >>> clock = RunClock(limit=120.0)
        >>> round(clock.left()) <= 120, clock.timed
        (True, True)
    """

    limit: float | None = None
    start: float = field(default_factory=time.monotonic)
    before: float = 0.0  # seconds the run's earlier processes took of the same limit (a resumed run)

    @property
    def timed(self) -> bool:
        return self.limit is not None

    def elapsed(self) -> float:
        """Seconds this run has taken, its earlier processes' included."""
        return self.before + time.monotonic() - self.start

    def left(self) -> float:
        """Seconds left of the limit (may be negative once past it); infinite without a limit."""
        return math.inf if self.limit is None else self.limit - self.elapsed()

    def resumed(self, limit_before: float | None, elapsed_before: float) -> RunClock:
        """This clock for a resumed run whose earlier processes ran `elapsed_before` seconds under `limit_before`:
        the same limit goes on where it stopped; another limit is this process's in full."""
        if self.limit is None or limit_before != self.limit:
            return self
        return RunClock(self.limit, self.start, max(elapsed_before, 0.0))
