"""`modelopt` on the command line: a thin typer shell over modelopt.api."""

from __future__ import annotations

import functools
import json
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.table import Table

from modelopt import api
from modelopt.errors import ConfigError, ModeloptError
from modelopt.metrics import Metrics
from modelopt.plan import Plan

app = typer.Typer(
    name="modelopt",
    help="Find how to compress a trained PyTorch vision model (quantization search), without fine-tuning.",
    no_args_is_help=False,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console()
err = Console(stderr=True)
F = TypeVar("F", bound=Callable[..., Any])


def _friendly(fn: F) -> F:
    """User errors become one line on stderr and exit code 2; bugs keep their traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ModeloptError as exc:
            err.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (`_Terminated`) from a scheduler or `kill`
            what = "terminated" if isinstance(exc, _Terminated) else "interrupted"
            err.print(f"[yellow]{what}[/]: finished trials are in the journal; rerun with --resume to continue")
            raise typer.Exit(143 if isinstance(exc, _Terminated) else 130) from None

    return wrapper  # type: ignore[return-value]


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is so it unwinds as Ctrl-C does (temporary files removed)."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Terminated()


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="%(message)s",
        handlers=[RichHandler(console=err, show_path=False)],
        force=True,
    )


def _csv(value: str, cast: Callable[[str], Any], what: str) -> list[Any]:
    try:
        items = [cast(v.strip()) for v in value.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"--{what} expects a comma-separated list like 8,4; got {value!r}") from None
    if not items:
        raise ConfigError(f"--{what} is empty")
    return items


def _activation_bits(value: str) -> int | None:
    """`none` (float inputs) or a bit width, for --activations."""
    return None if value.lower() in ("none", "null", "float") else int(value)


def _emit_json(obj: dict[str, Any]) -> None:
    out.file.write(json.dumps(obj, default=str) + "\n")
    out.file.flush()


def _fmt_bytes(n: float) -> str:
    return f"{n / 1024:,.1f} KiB" if n < 1024**2 else f"{n / 1024**2:,.2f} MiB"


@app.command()
@_friendly
def optimize(
    model: Annotated[str, typer.Option(help="Zoo name, torchvision:NAME, pkg.module:factory, or a saved module file.")] = None,  # type: ignore[assignment]
    weights: Annotated[Path, typer.Option(help="Checkpoint (state dict) for --model.")] = None,  # type: ignore[assignment]
    data: Annotated[str, typer.Option(help="cifar10-sample, an .npz, an image folder or a CIFAR10 root.")] = None,  # type: ignore[assignment]
    strategy: Annotated[str, typer.Option(help="Search strategy (see `modelopt list`).")] = None,  # type: ignore[assignment]
    budget: Annotated[float, typer.Option(help="Budget in full evaluations of the val split (default 150).")] = None,  # type: ignore[assignment]
    objective: Annotated[str, typer.Option(help="What to minimise: size, bitops, macs or latency (measured).")] = None,  # type: ignore[assignment]
    latency: Annotated[str, typer.Option(help="Latency backend: torch, onnxruntime (INT8 QDQ export) or none; measured for the final Pareto set, or every plan with --objective latency.")] = "torch",
    min_retention: Annotated[float, typer.Option(help="Floor on accuracy relative to float, on images the search never saw.")] = None,  # type: ignore[assignment]
    confidence: Annotated[float, typer.Option(help="A plan meets the floor when a one-sided lower bound on its retention at this "
                                          "confidence does (default 0.95); 0: the point estimate.")] = None,  # type: ignore[assignment]
    count_gains: Annotated[bool, typer.Option("--count-gains", help="Let images a plan fixes offset images it breaks in that "
                                              "bound (default: only breaks count; gains on few images are mostly luck).")] = False,
    seed: Annotated[int, typer.Option(help="Seed of the search.")] = None,  # type: ignore[assignment]
    bits: Annotated[str, typer.Option(help="Weight bit widths offered, e.g. 8,4 or 8,4,3,2.")] = None,  # type: ignore[assignment]
    granularity: Annotated[str, typer.Option(help="Scale granularities: per_tensor, per_channel, group.")] = None,  # type: ignore[assignment]
    rounding: Annotated[str, typer.Option(help="How codes are picked: gptq (calibrated on the calib split), nearest, "
                                          "or gptq,nearest to let the search choose (default gptq).")] = None,  # type: ignore[assignment]
    exit_data: Annotated[Path, typer.Option(help="An .npz of images the search never scores (e.g. "
                                            "../shared/data/cifar10/cifar10_jpeg_train.npz): early-exit heads are also fitted on them.")] = None,  # type: ignore[assignment]
    exit_images: Annotated[int, typer.Option(help="How many --exit-data images (a seeded subset).")] = 10000,
    activations: Annotated[str, typer.Option(help="Input activation bits offered per layer: none (float), 8, or none,8 "
                                             "(default: none,8 for --objective bitops, else none).")] = None,  # type: ignore[assignment]
    compressors: Annotated[str, typer.Option(help="Compressors that contribute decisions, e.g. quantize,prune,early_exit (see `modelopt list`); default: every registered one that can lower the objective.")] = None,  # type: ignore[assignment]
    device: Annotated[str, typer.Option(help="auto (CUDA when present), cpu, cuda, cuda:N.")] = "auto",
    out_dir: Annotated[Path, typer.Option("--out", help="Run folder (default runs/<time>-<model>-<strategy>-s<seed>).")] = None,  # type: ignore[assignment]
    resume: Annotated[bool, typer.Option(help="Continue the run in --out (default: the latest under runs/).")] = False,
    allow_pickle: Annotated[bool, typer.Option(help="Allow full unpickling of a model file (trusted files only).")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object as the last line of stdout.")] = False,
    progress: Annotated[bool, typer.Option(help="Show the progress bar.")] = True,
    storage: Annotated[str, typer.Option(help="Also write every trial into an Optuna storage, e.g. sqlite:///studies.db "
                                         "(view with optuna-dashboard).")] = None,  # type: ignore[assignment]
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
) -> None:
    """Search for the smallest plan above the retention floor; with no options, ResNet-20 on bundled CIFAR-10."""
    _setup_logging(verbose)
    given = dict(model=model, weights=weights, data=data, strategy=strategy, budget=budget, objective=objective,
                 min_retention=min_retention, confidence=confidence, count_gains=count_gains or None, seed=seed)
    settings: dict[str, Any] = dict(model="cifar10_resnet20", weights=None, data="cifar10-sample", strategy="mcts",
                                    budget=api.DEFAULT_BUDGET, objective="size", min_retention=0.99,
                                    confidence=api.DEFAULT_CONFIDENCE, count_gains=False, seed=0,
                                    bits=[8, 4], granularity=["per_channel", "group"],
                                    rounding=list(api.DEFAULT_ROUNDING), compressors=api.DEFAULT_COMPRESSORS)
    if resume:
        run_dir = out_dir or api.latest_run_dir()
        saved = api.saved_run_config(run_dir)
        settings.update({k: saved[k] for k in settings if k in saved and saved[k] is not None})
        q = saved.get("compressors", {}).get("quantize", {})
        settings.update({k: q[k] for k in ("bits", "granularity", "activations") if k in q})
        settings["rounding"] = q.get("rounding", ["nearest"])  # a record without it predates gptq
        settings["norm_images"] = q.get("norm_images", 0)  # likewise batch-norm re-estimation
        if saved.get("compressors"):
            settings["compressors"] = list(saved["compressors"])
        if saved.get("exit_data") and exit_data is None:  # the heads are fitted on the same images again
            exit_data, exit_images = Path(saved["exit_data"]["path"]), int(saved["exit_data"]["images"])
        out_dir = run_dir
    settings.update({k: v for k, v in given.items() if v is not None})
    if bits is not None:
        settings["bits"] = _csv(bits, int, "bits")
    if granularity is not None:
        settings["granularity"] = _csv(granularity, str, "granularity")
    if rounding is not None:
        settings["rounding"] = _csv(rounding, str, "rounding")
    if compressors is not None:
        settings["compressors"] = _csv(compressors, str, "compressors")
    if activations is not None:
        settings["activations"] = _csv(activations, _activation_bits, "activations")
    result = api.optimize(
        settings["model"], settings["data"], weights=settings["weights"], strategy=settings["strategy"],
        budget=settings["budget"], objective=settings["objective"], min_retention=settings["min_retention"],
        confidence=settings["confidence"], count_gains=settings["count_gains"], seed=settings["seed"], device=device, out=out_dir, resume=resume, bits=settings["bits"],
        granularity=settings["granularity"], rounding=settings["rounding"],
        norm_images=settings.get("norm_images", api.DEFAULT_NORM_IMAGES), compressors=settings["compressors"],
        allow_pickle=allow_pickle,
        activations=settings.get("activations"), exit_data=exit_data, exit_images=exit_images,
        progress=progress, storage=storage, latency=None if latency.lower() == "none" else latency,
    )
    _print_run(result)
    if (result.run_dir / "report.html").is_file():
        out.print(f"Report: {result.run_dir / 'report.html'}")
    if storage is not None:
        out.print(f"Trials written to {storage}; view them with: optuna-dashboard {storage}", highlight=False,
                  soft_wrap=True)
    if json_out:
        s = result.summary
        best = s["best"]
        _emit_json({
            "run_dir": str(result.run_dir),
            "n_trials": s["n_trials"],
            "budget_used": s["budget_used"],
            "baseline": s["baseline"],
            "best_plan": None if best is None else best["plan"],
            "best_test": None if best is None else best["test"],
            "best_confirm": None if best is None else best["confirm"],
            "best_val": None if best is None else best["val"],
            "confirmed": None if best is None else best["confirmed"],
        })


def _fewer(reference: int, value: int) -> str:
    """`reference / value` as a reduction factor ("1.52x"); "?" when unknown."""
    return f"{reference / value:.2f}x" if reference and value else "?"


def _plan_table(plan: Plan) -> Table:
    """One row per layer, one column per compressor ("—": off)."""
    rows: dict[str, dict[str, str]] = {}
    for name, choice in plan.choices:
        layer, _, comp = name.rpartition("/")
        rows.setdefault(layer or name, {})[comp or name] = "—" if choice is None else str(choice)
    comps = list(dict.fromkeys(c for r in rows.values() for c in r))
    table = Table(title="Best plan per layer")
    table.add_column("layer")
    for c in comps:
        table.add_column(c)
    for layer, r in rows.items():
        table.add_row(layer, *(r.get(c, "") for c in comps))
    return table


def _print_run(result: api.RunResult) -> None:
    s = result.summary
    conf = float(s["objective"].get("confidence") or 0.0)
    floor = float(s["objective"]["min_retention"])
    confirmation = s.get("confirmation") or {}
    if result.best is None:
        out.print(f"[yellow]No plan was {'confirmed' if confirmation.get('split') else 'certified'} at the "
                  f"{floor:.1%} floor in {s['n_trials']} trials.[/] Run folder: {result.run_dir}")
        ceiling = confirmation.get("ceiling")
        if ceiling is not None and ceiling < floor:
            out.print(f"The confirm split is too small to certify the floor: a plan that agrees with the float model "
                      f"on all {s['baseline']['confirm']['n_samples']} of its images is certified only at "
                      f"{ceiling:.2%} (confidence {conf:g}). Pass more data, or --confidence 0 for point estimates.")
        if result.search_best is not None:
            m = result.search_best.metrics
            out.print(f"The search's best on val (a search-time estimate, not confirmed): trial "
                      f"{result.search_best.number}, {m.compression:.2f}x at {m.retention:.2%} val retention.")
        return
    val, test, conf_m = result.best.metrics, result.best_test, result.best_confirm
    if s["best"].get("confirmed"):
        status = "confirmed on images that did not select it"
    elif confirmation.get("split") is None:
        status = "certified on val, NOT confirmed (the data have no confirm split)"
    else:
        status = "certified on val, NOT confirmed (the confirm split is too small to certify the floor)"
    table = Table(title=f"Best plan (trial {result.best.number} of {s['n_trials']}), {status}; "
                        f"retention [bounds at confidence {conf:g}]")
    for col in ("images", "n", "top-1", "retention", f"bounds ({conf:g})", "agree", "÷size"):
        table.add_column(col, justify="right", no_wrap=True)
    base = s["baseline"]
    table.add_row("float (test)", str(base["test"]["n_samples"]), f"{base['test']['accuracy']:.2%}", "100.00%", "",
                  "100.00%", "1.00x")
    rows = (("test (held out)", test), ("confirm", conf_m), ("val (search estimate)", val))
    for name, m in rows:
        if m is None:
            continue
        lo, hi = m.retention_bounds(conf)
        bounds = "" if conf <= 0 else f"[{lo:.1%}, {hi:.1%}]"
        table.add_row(name, str(m.n_samples), f"{m.accuracy:.2%}", f"{m.retention:.2%}", bounds, f"{m.agreement:.2%}",
                      f"{m.compression:.2f}x")
    out.print(table)
    ref = test or val
    out.print(f"Size {_fmt_bytes(ref.size_bytes)} (float {_fmt_bytes(ref.float_size_bytes)}); "
              f"{_fewer(ref.float_macs, ref.macs)} fewer MACs, {_fewer(ref.float_bitops, ref.bitops)} fewer bitops",
              highlight=False)
    if test is not None and test.exited is not None:
        out.print(f"Early exit: {test.exited:.1%} of test and {val.exited:.1%} of val images leave at an exit "
                  "(MACs and bitops are means over the images)")
    if test is not None and test.latency_ms is not None:
        out.print(f"Latency ({test.latency_backend}): {test.latency_ms:.3f} ms vs float {test.float_latency_ms:.3f} ms "
                  f"({test.float_latency_ms / test.latency_ms:.2f}x)")
    sb = result.search_best
    if sb is not None and sb.plan.key != result.best.plan.key:
        out.print(f"The search's own pick on val, trial {sb.number} ({sb.metrics.compression:.2f}x), was not confirmed; "
                  f"the best plan is the smallest of {confirmation.get('confirmed', 0)} finalists confirmed in turn.")
    out.print(_plan_table(result.best.plan))
    if prep := _preparation_text(s.get("preparation") or {}):
        out.print(f"Preparation: {prep}", highlight=False)
    out.print(f"Pareto front: {len(result.pareto)} plans (re-scored on test) — run folder: [bold]{result.run_dir}[/]")
    out.print(f"Best plan written to {result.run_dir / 'best_plan.yaml'}")


_PREP_NAMES = {"layer_inputs": "layer inputs (GPTQ)", "choice_tensors": "every choice's tensors",
               "fisher": "gradient sensitivities", "norm_reference": "batch-norm reference",
               "exit_heads": "exit heads"}


def _preparation_text(prep: dict[str, dict[str, float]]) -> str:
    """One-time work of a run: seconds here and budget units charged, e.g. 'layer inputs (GPTQ) 3.4 s, 0.61 units'."""
    seconds, charged = prep.get("seconds", {}), prep.get("charged", {})
    parts = []
    for key in dict.fromkeys([*seconds, *charged]):
        name = _PREP_NAMES.get(key.split(":")[0], key)
        units = f"{charged[key]:.2f} units" if key in charged else "not charged"
        parts.append(f"{name} {seconds[key]:.1f} s, {units}" if key in seconds else f"{name} {units}")
    return "; ".join(parts)


@app.command()
@_friendly
def evaluate(
    plan: Annotated[Path, typer.Option(help="Plan YAML file (default: no compression).")] = None,  # type: ignore[assignment]
    model: Annotated[str, typer.Option(help="Zoo name, torchvision:NAME, pkg.module:factory, or a saved module file.")] = "cifar10_resnet20",
    weights: Annotated[Path, typer.Option(help="Checkpoint (state dict) for --model.")] = None,  # type: ignore[assignment]
    data: Annotated[str, typer.Option(help="cifar10-sample, an .npz, an image folder or a CIFAR10 root.")] = "cifar10-sample",
    split: Annotated[str, typer.Option(help="calib, val, confirm (data with a confirm split), test, or all (val + test).")] = "val",
    compressors: Annotated[str, typer.Option(help="Compressors the plan may use, e.g. quantize,prune (default: every registered one the model suits).")] = None,  # type: ignore[assignment]
    rounding: Annotated[str, typer.Option(help="Rounding of plan entries that name none: gptq or nearest.")] = "gptq",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:N.")] = "auto",
    allow_pickle: Annotated[bool, typer.Option(help="Allow full unpickling of a model file (trusted files only).")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object as the last line of stdout.")] = False,
) -> None:
    """Score one plan on one split: accuracy, retention, agreement, size, compression, bitops."""
    _setup_logging(False)
    names = _csv(compressors, str, "compressors") if compressors is not None else api.DEFAULT_COMPRESSORS
    m = api.evaluate(model, plan, data, weights=weights, split=split, device=device, allow_pickle=allow_pickle,
                     compressors=names, rounding=_csv(rounding, str, "rounding"))
    table = Table(title=f"{model} — {'float' if plan is None else plan} on {split} ({m.n_samples} images)")
    for col in ("top-1", "float top-1", "retention", "agree", "size", "ratio", "MACs", "bitops"):
        table.add_column(col, justify="right")
    table.add_row(f"{m.accuracy:.2%}", f"{m.baseline_accuracy:.2%}", f"{m.retention:.2%}", f"{m.agreement:.2%}",
                  _fmt_bytes(m.size_bytes), f"{m.compression:.2f}x", f"{m.macs / 1e6:.1f}M", f"{m.bitops:.3g}")
    out.print(table)
    if m.exited is not None:
        out.print(f"Early exit: {m.exited:.1%} of the images leave at an exit (MACs and bitops are means over them)")
    if json_out:
        _emit_json(m.to_dict())


@app.command("list")
@_friendly
def list_(
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object as the last line of stdout.")] = False,
) -> None:
    """The registered models, data sources, compressors and strategies."""
    from modelopt.compressors import COMPRESSORS
    from modelopt.data import list_data_sources
    from modelopt.models import list_models
    from modelopt.search import STRATEGIES

    items = {"models": list_models(), "data": list_data_sources(), "compressors": COMPRESSORS.names(),
             "strategies": STRATEGIES.names()}
    table = Table(title="modelopt registry")
    table.add_column("kind")
    table.add_column("names")
    for kind, names in items.items():
        table.add_row(kind, ", ".join(names))
    out.print(table)
    if json_out:
        _emit_json(items)


@app.command()
@_friendly
def sweep(
    file: Annotated[Path, typer.Argument(help="Sweep file (YAML): models, strategies, budgets, seeds.")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List the cells and which are done; run nothing.")] = False,
    progress: Annotated[bool, typer.Option(help="Show the progress display.")] = True,
    only: Annotated[list[str], typer.Option(help="Run only cells matching model/strategy/seedK (shell pattern, "
                                            "repeatable; run in the order given), e.g. 'resnet56/mcts/*'.")] = None,  # type: ignore[assignment]
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
) -> None:
    """Run every model × strategy × seed of a sweep file (skipping finished cells), then write its table."""
    from rich.markdown import Markdown

    from modelopt.run.sweep import load_sweep, run_sweep

    _setup_logging(verbose)
    if dry_run:
        spec = load_sweep(file)
        cells = spec.cells()
        table = Table(title=f"sweep {spec.name}: {len(cells)} cells at budget {spec.budget:g} -> {spec.out}")
        for col in ("model", "strategy", "seed", "status", "trials", "spent", "run folder"):
            table.add_column(col, justify="right" if col in ("seed", "trials", "spent") else "left", overflow="fold")
        for c in cells:
            style = {"done": "green", "partial": "yellow", "todo": "dim"}[c.status]
            table.add_row(c.model, c.strategy, str(c.seed), f"[{style}]{c.status}[/]", str(c.n_trials),
                          f"{c.spent:g}", str(c.run_dir.relative_to(spec.out)))
        out.print(table)
        n_done = sum(c.done for c in cells)
        out.print(f"{n_done} of {len(cells)} cells done; budgets {', '.join(f'{b:g}' for b in spec.budgets)}")
        return
    result = run_sweep(file, progress=progress, only=only or ())
    out.print(Markdown(result.markdown))
    out.print(f"Ran {len(result.ran)} of {len(result.cells)} cells. Table: {result.table_md} and {result.table_csv}")


@app.command()
@_friendly
def report(
    folder: Annotated[Path, typer.Argument(help="A run folder (holds run.json) or a sweep folder (holds runs/).")],
) -> None:
    """Write report.md and a self-contained report.html (plots inlined) into a run or sweep folder."""
    from modelopt.report import report as make_report

    _setup_logging(False)
    paths = make_report(folder)
    out.print(f"Report: {paths.html}  (Markdown: {paths.markdown}, figures in {paths.markdown.parent / 'report_files'})",
              highlight=False, soft_wrap=True)


@app.command()
@_friendly
def dashboard(
    run_dir: Annotated[Path, typer.Argument(help="A run folder (any strategy).")],
    storage: Annotated[str, typer.Option(help="Optuna storage URL, e.g. sqlite:///studies.db.")],
    study_name: Annotated[str, typer.Option(help="Study name (default: the run folder's name).")] = None,  # type: ignore[assignment]
) -> None:
    """Write every trial of a run folder into an Optuna study, for optuna-dashboard (rerun: adds only new trials)."""
    from modelopt.run.optuna_storage import export_run

    _setup_logging(False)
    done = export_run(run_dir, storage, study_name=study_name)
    out.print(f"Study [bold]{done.study_name}[/] in {done.storage}: {done.added} trials added, {done.skipped} already "
              f"there. View: optuna-dashboard {done.storage}", highlight=False, soft_wrap=True)


@app.command("export")
@_friendly
def export_(
    run_dir: Annotated[Path, typer.Argument(help="A run folder (holds run.json).")],
    plan: Annotated[str, typer.Option(help="best, a trial number, or a plan YAML file.")] = "best",
    format: Annotated[str, typer.Option("--format", help="modelopt (packed checkpoint) or onnx (QDQ).")] = "modelopt",
    out_path: Annotated[Path | None, typer.Option("--out", help="File to write (default RUN_DIR/model-<plan>.pt|.onnx).")] = None,
    calibration: Annotated[str | None, typer.Option(help="onnx: activation ranges from minmax or percentile.")] = None,
) -> None:
    """Write a run's plan as a packed checkpoint (reload with modelopt.load) or an ONNX model for ONNX Runtime."""
    from modelopt.export import export as do_export

    _setup_logging(False)
    if calibration is not None and format != "onnx":
        raise ConfigError(f"--calibration applies only to --format onnx, not {format!r}")
    options = {} if calibration is None else {"calibration": calibration}
    path = do_export(run_dir, plan=plan, format=format, out=out_path, **options)
    out.print(f"Wrote {path} ({_fmt_bytes(path.stat().st_size)})", highlight=False, soft_wrap=True)


def main() -> None:
    signal.signal(signal.SIGTERM, _on_sigterm)
    app(prog_name="modelopt")
    sys.exit(0)
