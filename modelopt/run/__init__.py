"""The search loop, its journal and resume."""

from modelopt.run.journal import Journal
from modelopt.run.runner import RunResult, Runner

__all__ = ["Journal", "RunResult", "Runner"]
