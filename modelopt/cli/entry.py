"""The command line's entry point: starts the CLI, and answers Ctrl-C while it starts in one line.

Importing the CLI imports torch and the tool (seconds); a Ctrl-C then would end in an import's traceback. This module
imports nothing heavy (nor does `import modelopt`, whose names load on first use), so the interrupt is caught here.
"""

from __future__ import annotations

import sys

__all__ = ["main"]

INTERRUPTED = 130  # the shell's code for a command ended by SIGINT


def main() -> None:
    try:
        from modelopt.cli.app import main as run
    except KeyboardInterrupt:
        print("modelopt: interrupted while starting; nothing was run or written", file=sys.stderr)
        raise SystemExit(INTERRUPTED) from None
    run()
