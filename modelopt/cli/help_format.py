"""Help that stays whole in a narrow terminal or a pipe.

Typer's rich help lays every option out as a table of four columns; below about 120 columns the table
squeezes the help column and cuts option names and help text with an ellipsis ("--latency-threa…").
Narrower than that, the command prints click's plain layout instead, wrapped at word boundaries and
never at a hyphen, so that option names and paths in the help stay whole.
"""

from __future__ import annotations

import textwrap
import types
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from typer.core import TyperCommand

RICH_MIN_WIDTH = 120  # the widest option table (optimize's) fits its rich layout from here


def _write_dl(
    self: Any, rows: Sequence[tuple[str, str]], col_max: int = 30, col_spacing: int = 2
) -> None:
    """Click's `HelpFormatter.write_dl`, wrapping at spaces only (a hyphen is part of an option's name)."""
    rows = list(rows)
    first = min(max((len(term) for term, _ in rows), default=0), col_max) + col_spacing
    text_width = max(self.width - first - self.current_indent, 10)
    indent = " " * self.current_indent
    for term, text in rows:
        self.write(f"{indent}{term}")
        if not text:
            self.write("\n")
            continue
        lines = textwrap.wrap(text, text_width, break_on_hyphens=False) or [""]
        if len(term) + col_spacing <= first:
            self.write(" " * (first - len(term)) + lines[0] + "\n")
            lines = lines[1:]
        else:
            self.write("\n")
        for line in lines:
            self.write(f"{indent}{' ' * first}{line}\n")


class WholeHelpCommand(TyperCommand):
    """A typer command whose help falls back to the plain layout when the terminal is narrow."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        if Console().width >= RICH_MIN_WIDTH:
            return super().format_help(ctx, formatter)
        # typer vendors its own click: the plain layout is the base class's, the formatter the one typer passes
        plain = type(formatter)(width=formatter.width, max_width=formatter.width)
        plain.write_dl = types.MethodType(_write_dl, plain)
        super(TyperCommand, self).format_help(ctx, plain)
        formatter.write(plain.getvalue())
        return None
