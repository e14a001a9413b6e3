"""How the CLI shows a finished run: the best plan's figures (held-out test first), its per-layer
choices, the preparation a run paid for, and where everything was written."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from rich.console import Console
from rich.table import Table

from modelopt.data.split import Split
from modelopt.errors import LoadError
from modelopt.evaluation.metrics import Metrics
from modelopt.objective import Target
from modelopt.plan.plan import Plan
from modelopt.run.layout import BEST_PLAN
from modelopt.run.reported import PlanEntry, Scores
from modelopt.run.run_folder import read_run
from modelopt.run.runner import RunResult
from modelopt.run.summary import Preparation, RunSummary


def fmt_bytes(n: float) -> str:
    return f"{n / 1024:,.1f} KiB" if n < 1024**2 else f"{n / 1024**2:,.2f} MiB"


def _fewer(reference: int, value: int) -> str:
    """`reference / value` as a reduction factor ("1.52x"); "?" when unknown."""
    return f"{reference / value:.2f}x" if reference and value else "?"


def _plan_table(plan: Plan, bits: Mapping[str, float] | None = None) -> Table:
    """One row per layer, one column per compressor ("—": off), and the bits a weight of the layer takes in the
    file where they are known."""
    rows: dict[str, dict[str, str]] = {}
    for name, choice in plan.choices:
        layer, _, comp = name.rpartition("/")
        rows.setdefault(layer or name, {})[comp or name] = "—" if choice is None else str(choice)
    comps = list(dict.fromkeys(c for r in rows.values() for c in r))
    table = Table(title="Best plan per layer")
    table.add_column("layer")
    for c in comps:
        table.add_column(c)
    if bits:
        table.add_column("bits / weight", justify="right")
    for layer, r in rows.items():
        extra = (f"{bits[layer]:.2f}" if layer in bits else "",) if bits else ()
        table.add_row(layer, *(r.get(c, "") for c in comps), *extra)
    return table


def _best_bits(result: RunResult) -> dict[str, float] | None:
    """Each layer's stored bits per weight under the reported plan, its codes as test scored them (the refit's)."""
    s = result.summary
    if s.best is None:
        return None
    try:
        run = read_run(result.run_dir)
    except LoadError:
        return None
    record = next((r for r in run.records if r.plan_key == s.best.plan_key), None)
    if record is None:
        return None
    scored = s.best.test or s.best.val
    return run.layer_bits(record if scored is None else dataclasses.replace(record, metrics=scored.metrics))


def print_run(out: Console, result: RunResult) -> None:
    """A finished run as the CLI shows it: the best plan's figures (test first), its layers, the run folder."""
    s = result.summary
    if s.best is None or result.best is None:
        _print_none(out, result)
        return
    out.print(best_table(s))
    _print_figures(out, s, s.best)
    sb = s.search_best
    if sb is not None and sb.plan_key != s.best.plan_key and sb.val is not None:
        out.print(own_pick_text(s.objective.target, sb.trial, sb.val, s.confirmation.confirmed,
                                len(s.confirmation.finalists)), highlight=False)
    if rebuilt := _reconstruction_text(s):
        out.print(rebuilt, highlight=False)
    if len(s.curve) > 1:
        out.print(curve_table(s))
    out.print(_plan_table(result.best.plan, _best_bits(result)))
    if prep := _preparation_text(s.preparation):
        out.print(f"Preparation: {prep}", highlight=False)
    out.print(f"Pareto front: {len(result.pareto)} plans (re-scored on test) — run folder: [bold]{result.run_dir}[/]")
    out.print(f"Best plan written to {result.run_dir / BEST_PLAN}")


def _print_figures(out: Console, s: RunSummary, best: PlanEntry) -> None:
    """The reported plan's size, MACs and bitops, where its images leave (an exit plan), and its latency."""
    val, test = best.val, best.test
    ref = test or val  # test's MACs first: with exits they are a mean over the split's images
    if ref is not None:
        m = ref.metrics
        decoded = f", {fmt_bytes(m.decoded_bytes)} decoded" if m.decoded_bytes else ""
        out.print(f"Size {fmt_bytes(m.size_bytes)} stored{decoded} (float {fmt_bytes(m.float_size_bytes)}); "
                  f"{_fewer(m.float_macs, m.macs)} fewer MACs, {_fewer(m.float_bitops, m.bitops)} fewer bitops",
                  highlight=False)
    if test is None:
        return
    if val is not None and test.metrics.exited is not None:
        out.print(f"Early exit: {test.metrics.exited:.1%} of test and {val.metrics.exited:.1%} of val images leave "
                  "at an exit (MACs and bitops are means over the images)")
        if s.exits is not None:
            out.print(_exits_table(s))
    if test.metrics.latency_ms is not None and test.metrics.float_latency_ms is not None:
        out.print(latency_text(test.metrics, s.float_latency), highlight=False)


def _print_none(out: Console, result: RunResult) -> None:
    """A run that reports no plan: why (a confirm split too small to certify the floor), and the search's best."""
    s = result.summary
    conf, floor, confirmation = s.objective.confidence, s.objective.min_retention, s.confirmation
    out.print(f"[yellow]No plan was {'confirmed' if confirmation.split else 'certified'} at the "
              f"{floor:.1%} floor in {s.n_trials} trials.[/] Run folder: {result.run_dir}")
    ceiling = confirmation.ceiling
    if ceiling is not None and ceiling < floor:
        out.print(f"The confirm split is too small to certify the floor: a plan that agrees with the float model "
                  f"on all {s.baseline[Split.CONFIRM].n_samples} of its images is certified only at "
                  f"{ceiling:.2%} (confidence {conf:g}). Pass more data, or --confidence 0 for point estimates.")
    sb = s.search_best
    if sb is not None and sb.val is not None:
        m = sb.val.metrics
        out.print(f"The search's best on val (a search-time estimate, not confirmed): trial "
                  f"{sb.trial}, {m.compression:.2f}x at {m.retention:.2%} val retention.")


def _status(s: RunSummary) -> str:
    """How the reported plan was certified, as the best table's title says it."""
    if s.confirmed:
        return "confirmed on images that did not select it"
    if s.confirmation.split is None:
        return "certified on val, NOT confirmed (the data have no confirm split)"
    return "certified on val, NOT confirmed (the confirm split is too small to certify the floor)"


def curve_table(s: RunSummary) -> Table:
    """The certified curve: per floor, the smallest plan certified there and its held-out test figures, beside the
    uniform plans certified at the same floor (every point holds at once at the run's confidence)."""
    conf = s.objective.confidence
    what = "speed-up" if s.objective.target is Target.LATENCY else f"÷{s.objective.target.value}"
    table = Table(title=f"Certified curve: every point holds at once (confidence {conf:g}); test retention "
                        "[bounds] on held-out images")
    for col in ("floor", "trial", what, "test retention"):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column("uniform plans certified there")
    for point in s.curve:
        entry = point.plan
        uniform = ", ".join(point.uniform) or "none"
        if entry is None or entry.headline is None:
            table.add_row(f"{point.floor:.1%}", "–", "–", "nothing certified", uniform)
            continue
        x = entry.test or entry.headline
        bounds = "" if x.interval is None else f" [{x.interval[0]:.1%}, {x.interval[1]:.1%}]"
        reduction = "–" if x.reduction is None else f"{x.reduction:.2f}x"
        table.add_row(f"{point.floor:.1%}", str(entry.trial), reduction, f"{x.metrics.retention:.2%}{bounds}", uniform)
    return table


def best_table(s: RunSummary) -> Table:
    """The reported plan's figures on each split (test first), beside the float model's: columns selected from its
    record (`s.best`, `modelopt.run.reported.PlanEntry`)."""
    best = s.best
    assert best is not None
    conf = s.objective.confidence
    table = Table(title=f"Best plan (trial {best.trial} of {s.n_trials}), {_status(s)}; "
                        f"retention [bounds at confidence {conf:g}]")
    for col in ("images", "n", "top-1", "retention", f"bounds ({conf:g})", "agree", "÷size"):
        table.add_column(col, justify="right", no_wrap=True)
    base = s.baseline[Split.TEST]
    table.add_row("float (test)", str(base.n_samples), f"{base.accuracy:.2%}", "100.00%", "", "100.00%", "1.00x")
    rows = ((f"{Split.TEST} (held out)", best.test), (Split.CONFIRM, best.confirm),
            (f"{Split.VAL} (search estimate)", best.val))
    for name, x in rows:
        if x is None:
            continue
        m = x.metrics
        bounds = "" if conf <= 0 else f"[{x.retention_lower:.1%}, {x.retention_upper:.1%}]"
        table.add_row(name, str(m.n_samples), f"{m.accuracy:.2%}", f"{m.retention:.2%}", bounds, f"{m.agreement:.2%}",
                      f"{m.compression:.2f}x")
    return table


def split_label(split: str, n: int) -> str:
    """A split and its image count as a result's title names them; "all" says which images it is (a user asking
    for all of a folder's images got val and test, without a word on the calib and confirm images left out)."""
    if split == Split.ALL:
        return f"all = val + test ({n} images; the calib and confirm images are not scored)"
    return f"{split} ({n} images)"


def latency_text(test: Metrics, float_latency: dict[str, float]) -> str:
    """The reported plan's latency line: beside the float model's in the same engine, and in the other engines the
    run timed the float model in; a plan that runs the float model's kernels says so instead of reading 1.00x."""
    assert test.latency_ms is not None and test.float_latency_ms is not None
    others = "".join(f"; float {ms:.3f} ms in {name} ({ms / test.latency_ms:.2f}x)"
                     for name, ms in float_latency.items() if name != test.latency_backend)
    if test.latency_ms == test.float_latency_ms:  # the float model's graph (`latency.plan` times one once)
        return (f"Latency ({test.latency_backend}): {test.latency_ms:.3f} ms, the float model's: the plan changes no "
                f"kernel this engine runs (weights stored in fewer bits are dequantized to float; --objective latency "
                f"searches plans that run integer kernels or less work){others}")
    return (f"Latency ({test.latency_backend}): {test.latency_ms:.3f} ms vs float {test.float_latency_ms:.3f} ms "
            f"({test.float_latency_ms / test.latency_ms:.2f}x){others}")


# Which finalist a run reports, by its objective's figure (the reported plan is the best confirmed one).
_REPORTED = {Target.SIZE: "the smallest", Target.LATENCY: "the fastest", Target.MACS: "the one with the fewest MACs",
             Target.BITOPS: "the one with the fewest bitops"}


def own_pick_text(target: Target, number: int, val: Scores, confirmed: int, finalists: int) -> str:
    """The line saying the search's own pick on val is not the reported plan, with the pick's reduction on the run's
    objective (a latency run's pick by its speed-up, not its size), as its record holds it."""
    return (f"The search's own pick on val, trial {number} ({val.reduction:.2f}x {target.value} on val), is not "
            f"the reported plan: that is {_REPORTED[target]} of the {confirmed} finalists confirmed "
            f"(of {finalists} tested on the confirm split).")


def _exits_table(s: RunSummary) -> Table:
    """Per exit: the share of test images that leave there and their top-1, float model (same exits) and plan."""
    assert s.exits is not None
    table = Table(title="Where test images leave: the float model with the plan's exits, and the plan")
    for col in ("exit", "float: share", "float: top-1", "plan: share", "plan: top-1"):
        table.add_column(col, justify="right", no_wrap=True)
    for f, p in zip(s.exits.float, s.exits.plan, strict=True):
        table.add_row(f.exit, f"{f.share:.1%}", "" if f.accuracy is None else f"{f.accuracy:.2%}", f"{p.share:.1%}",
                      "" if p.accuracy is None else f"{p.accuracy:.2%}")
    return table


def _reconstruction_text(s: RunSummary) -> str:
    """The finalists reconstructed before confirmation: answers changed on confirm as composed and as confirmed."""
    rebuilt = [f for f in s.confirmation.finalists if f.composed is not None and f.confirm is not None]
    if not rebuilt:
        return ""
    parts = [f"trial {f.trial} {1 - f.composed.metrics.agreement:.2%} -> {1 - f.confirm.metrics.agreement:.2%}"
             + ("" if f.confirmed else " (not confirmed)")
             for f in rebuilt if f.composed is not None and f.confirm is not None]
    return ("Reconstructed before confirmation (answers changed on confirm, as composed -> as confirmed): "
            + ", ".join(parts))


_PREP_NAMES = {"layer_inputs": "layer inputs (GPTQ)", "reconstruct": "reconstruction of the finalists",
               "choice_tensors": "every choice's tensors",
               "fisher": "gradient sensitivities", "norm_reference": "batch-norm reference",
               "exit_heads": "exit heads"}
_COUNTED = ("norm_reference",)  # preparations keyed by their image count, which a run may hold twice


def _preparation_text(prep: Preparation) -> str:
    """One-time work of a run: seconds here and budget units charged, e.g. 'layer inputs (GPTQ) 3.4 s, 0.61 units'."""
    seconds, charged = prep.seconds, prep.charged
    parts = []
    for key in dict.fromkeys([*seconds, *charged]):
        base, _, detail = key.partition(":")
        name = _PREP_NAMES.get(base, key)
        if base in _COUNTED and detail:  # one per image count: named apart
            name = f"{name} ({detail} images)"
        elif base == "skip":
            name = f"repair of the removed {detail}"
        units = f"{charged[key]:.2f} units" if key in charged else "not charged"
        parts.append(f"{name} {seconds[key]:.1f} s, {units}" if key in seconds else f"{name} {units}")
    return "; ".join(parts)
