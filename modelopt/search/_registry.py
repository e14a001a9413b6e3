"""Registry of search strategies (entry-point group `modelopt.strategies`)."""

from __future__ import annotations

from modelopt._registry import Registry
from modelopt.search._base import Strategy

STRATEGIES: Registry[type[Strategy]] = Registry("strategy", "modelopt.strategies")
