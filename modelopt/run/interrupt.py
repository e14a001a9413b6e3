"""Ctrl-C during a search: the first stops the search after the trial in progress and the run certifies what it
has; a second stops at once (KeyboardInterrupt, as before).

Stopping between trials, not inside one, leaves the evaluator's caches whole for the certification that follows,
and the journal holds every finished trial for `--resume` either way.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

__all__ = ["StopRequest"]


class StopRequest:
    """While entered (in the main thread), the first SIGINT sets `requested` and calls `said`; the next raises
    KeyboardInterrupt. Elsewhere (a thread, a worker) it installs nothing and `requested` stays False.

    Example:
        >>> with StopRequest(print) as stop:
        ...     while not stop.requested: step()
    """

    def __init__(self, said: Callable[[], None] = lambda: None) -> None:
        self.requested = False
        self._said = said
        self._before: Any = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        self._said()

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            self._before = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._before is not None:
            signal.signal(signal.SIGINT, self._before)
            self._before = None
