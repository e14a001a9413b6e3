"""How the CLI answers what goes wrong: a user error, an unwritable folder, Ctrl-C or SIGTERM is one line on stderr
and an exit code (2, 130, 143); a bug keeps its traceback. Every verb of `modelopt.cli.app` runs inside `friendly`.
"""

from __future__ import annotations

import errno
import functools
import os
import signal
import sys
from collections.abc import Callable
from typing import Any, TypeVar, cast

import typer
from rich.console import Console
from rich.markup import escape

from modelopt.errors import ModeloptError

__all__ = ["Terminated", "err", "friendly", "on_sigterm", "one_line_warning", "out"]

out = Console()
err = Console(stderr=True)
_WIDE = 160  # columns when stdout is not a terminal (see `_fit_width`)


def _fit_width() -> None:
    """Not a terminal (a log file, a pipe, CI): rich would assume 80 columns and cut the result tables' own
    headers ("retent…"); wide enough for every table instead. COLUMNS, when set, still decides."""
    if not sys.stdout.isatty() and not os.environ.get("COLUMNS"):
        out.width = err.width = _WIDE


F = TypeVar("F", bound=Callable[..., Any])


# Where a file cannot be written for reasons of the user's folder (read-only, no permission, full): one line.
_UNWRITABLE = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT})
# The verbs that keep a journal of finished trials (what Ctrl-C leaves is resumed with --resume).
_JOURNALED = frozenset({"optimize", "sweep"})


def friendly(fn: F) -> F:
    """User errors become one line on stderr and exit code 2; bugs keep their traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        finally:
            # The work is done (or has unwound): a SIGTERM from here on ends the process as the signal does,
            # silently; raised during interpreter shutdown it printed "Exception ignored ... Terminated".
            if signal.getsignal(signal.SIGTERM) is on_sigterm:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)

    @functools.wraps(fn)
    def friendly(*args: Any, **kwargs: Any) -> Any:
        _fit_width()
        try:
            return wrapper(*args, **kwargs)
        except ModeloptError as exc:  # escaped: rich would take '[distributed]' or '[random, mcts]' for markup
            err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except OSError as exc:
            if exc.errno not in _UNWRITABLE or exc.filename is None:
                raise  # a bug, or a fault that is not the user's folder: its traceback
            err.print(f"[bold red]error:[/] cannot write {escape(str(exc.filename))!s}: {escape(exc.strerror or '')}; "
                      "give a folder this user can write to", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (`Terminated`) from a scheduler or `kill`
            what = "terminated" if isinstance(exc, Terminated) else "interrupted"
            if fn.__name__ not in _JOURNALED:  # export, evaluate, report: no journal, no --resume
                verb = fn.__name__.rstrip("_")
                left = _INTERRUPTED_WRITES.get(verb, "it writes nothing")
                err.print(f"[yellow]{what}[/]: {verb} did not finish; {left}; run the same command again",
                          soft_wrap=True)
            elif fn.__name__ == "sweep":  # no --resume: the same command skips finished cells, resumes the rest
                err.print(f"[yellow]{what}[/]: finished cells and trials are kept; run the same sweep command again to "
                          "continue (finished cells are skipped, a partial one resumed)", soft_wrap=True)
            elif getattr(exc, "started", True):
                err.print(f"[yellow]{what}[/]: finished trials are in the journal; rerun with --resume to continue",
                          soft_wrap=True)
            else:
                err.print(f"[yellow]{what}[/] while loading, before the run began: nothing was written; run the same "
                          "command again", soft_wrap=True)
            raise typer.Exit(143 if isinstance(exc, Terminated) else 130) from None

    return cast(F, friendly)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is so it unwinds as Ctrl-C does (temporary files removed)."""


def on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated()


# What an interrupted verb that keeps no journal leaves behind (one that writes nothing is not listed).
_INTERRUPTED_WRITES = {
    "export": "each file it wrote is whole, one it had not finished is not there (an exported exit folder may lack "
              "files)",
    "report": "each file it wrote is whole, one it had not finished is not there",
    "dashboard": "the trials it added to the storage stay there, and running it again adds only the others",
}


def one_line_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                      line: str | None = None) -> str:
    """A warning as one line on stderr, without the source line Python prints under it."""
    return f"warning: {' '.join(str(message).split())}\n"
