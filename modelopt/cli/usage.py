"""A command-line usage error (a value of the wrong type, an unknown option, a missing one) as one line.

typer answers these itself, in a framed box of five or more lines that does not name the value given
(`--budget abc`: "Input should be a valid number"); every other bad input is one line naming the value and what
would be right, and so are these.
"""

from __future__ import annotations

from collections.abc import Sequence

import typer

__all__ = ["usage_line"]


def usage_line(exc: typer.TyperException, argv: Sequence[str]) -> str:
    """`exc` as one line: typer's message, the value given where an option's value was refused, and where help is.

    Example:
        >>> usage_line(error, ["optimize", "--budget", "abc"])
        "Invalid value for '--budget': Input should be a valid number, ..., got 'abc'; see 'modelopt optimize --help'"
    """
    format_message = getattr(exc, "format_message", None)
    message = " ".join(str(format_message() if callable(format_message) else exc).split()).rstrip(".")
    param = getattr(exc, "param", None)
    value = _given(argv, tuple(getattr(param, "opts", ()))) if isinstance(exc, typer.BadParameter) else None
    if value is not None:
        message = f"{message}, got {value!r}"
    ctx = getattr(exc, "ctx", None)
    where = getattr(ctx, "command_path", None) or "modelopt"
    return f"{message}; see '{where} --help'"


def _given(argv: Sequence[str], opts: tuple[str, ...]) -> str | None:
    """The value the command line gave an option (`--opt value` or `--opt=value`; the last one given), if any."""
    value = None
    for i, token in enumerate(argv):
        for opt in opts:
            if token == opt and i + 1 < len(argv) and opt.startswith("-"):
                value = argv[i + 1]
            elif opt.startswith("--") and token.startswith(opt + "="):
                value = token[len(opt) + 1:]
    return value
