"""The search loop, its journal and resume."""

from modelopt.run.journal import Journal
from modelopt.run.runner import Runner, RunResult

__all__ = ["Journal", "RunResult", "Runner"]
