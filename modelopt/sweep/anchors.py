"""The uniform plans every run scores (INT8, INT4, INT3 per channel: `SearchSpace.anchors`), as a sweep
table shows them: the no-search answers every strategy stands beside, on the same images."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from modelopt.run.reported import Scores
from modelopt.run.summary import read_summary

__all__ = ["anchor_lines"]


def anchor_lines(run_dirs: Sequence[Path]) -> list[str]:
    """Markdown lines: each anchor's compression, its val and confirm retention bound and its test retention
    (with interval), read from the first finished run among `run_dirs` that scored them; none when none did.

    Example:
        >>> "\n".join(anchor_lines([Path("experiments/jpeg_r20/runs/resnet20/mcts/seed0")]))
    """
    for run_dir in run_dirs:
        summary = read_summary(run_dir)
        if summary is None or not summary.anchors:
            continue
        tested = {f.plan_key: f for f in summary.confirmation.finalists}
        lines = ["", f"**The uniform plans on the same images** (scored in every run; from `{run_dir.name}` of "
                 f"`{run_dir.parent.name}`; confirmed: its confirm bound cleared the floor in that run's sequence).",
                 "", "| plan | × | val retention bound | confirm retention bound | confirmed | test retention |",
                 "| --- | ---: | ---: | ---: | --- | ---: |"]
        for a in summary.anchors:
            finalist = tested.get(a.plan_key)
            conf = None if finalist is None else finalist.confirm
            x = "–" if a.val is None else f"{a.val.metrics.compression:.2f}"
            lines.append(f"| uniform {a.name or '?'} | {x}× | {_certified(a.val)} | {_certified(conf)} | "
                         f"{'yes' if finalist is not None and finalist.confirmed else 'no'} | {_interval(a.test)} |")
        return lines
    return []


def _certified(s: Scores | None) -> str:
    return _pct(None if s is None else s.retention_certified)


def _interval(s: Scores | None) -> str:
    """Retention with its bounds: "99.10 % [98.20 %, 99.90 %]"."""
    if s is None:
        return "– [–, –]"
    return f"{_pct(s.metrics.retention)} [{_pct(s.retention_lower)}, {_pct(s.retention_upper)}]"


def _pct(v: float | None) -> str:
    return "–" if v is None or math.isnan(v) else f"{100 * v:.2f} %"
