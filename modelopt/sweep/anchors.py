"""The uniform plans every run scores (INT8, INT4, INT3 per channel: `SearchSpace.anchors`), as a sweep
table shows them: the no-search answers every strategy stands beside, on the same images."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from modelopt.run.journal import read_json
from modelopt.run.layout import SUMMARY

__all__ = ["anchor_lines"]


def anchor_lines(run_dirs: Sequence[Path]) -> list[str]:
    """Markdown lines: each anchor's compression, its val and confirm retention bound and its test retention
    (with interval), read from the first finished run among `run_dirs` that scored them; none when none did.

    Example:
        >>> "\n".join(anchor_lines([Path("experiments/jpeg_r20/runs/resnet20/mcts/seed0")]))
    """
    for run_dir in run_dirs:
        summary = read_json(run_dir / SUMMARY) or {}
        anchors = summary.get("anchors") or []
        if not anchors:
            continue
        tested = {f["plan_key"]: f for f in (summary.get("confirmation") or {}).get("finalists", [])}
        lines = ["", f"**The uniform plans on the same images** (scored in every run; from `{run_dir.name}` of "
                 f"`{run_dir.parent.name}`; confirmed: its confirm bound cleared the floor in that run's sequence).",
                 "", "| plan | × | val retention bound | confirm retention bound | confirmed | test retention |",
                 "| --- | ---: | ---: | ---: | --- | ---: |"]
        for a in anchors:
            val, test = a.get("val") or {}, a.get("test") or {}
            conf = (tested.get(a["plan_key"]) or {}).get("confirm") or {}
            lines.append(f"| uniform {a.get('name', '?')} | {val.get('compression', float('nan')):.2f}× | "
                         f"{_pct(val.get('retention_certified'))} | {_pct(conf.get('retention_certified'))} | "
                         f"{'yes' if (tested.get(a['plan_key']) or {}).get('confirmed') else 'no'} | "
                         f"{_pct(test.get('retention'))} [{_pct(test.get('retention_lower'))}, "
                         f"{_pct(test.get('retention_upper'))}] |")
        return lines
    return []


def _pct(v: object) -> str:
    return f"{100 * v:.2f} %" if isinstance(v, (int, float)) else "–"
