"""`modelopt` on the command line: a thin typer shell over modelopt.api."""

from __future__ import annotations

import dataclasses
import json
import logging
import signal
import sys
import warnings
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.logging import RichHandler
from rich.markdown import Markdown
from rich.markup import escape
from rich.table import Table

from modelopt import api
from modelopt.cli import options as opt
from modelopt.cli.display import fmt_bytes, print_run, split_label
from modelopt.cli.errors import err, out
from modelopt.cli.errors import friendly as _friendly
from modelopt.cli.errors import on_sigterm as _on_sigterm
from modelopt.cli.errors import one_line_warning as _one_line_warning
from modelopt.cli.export_format import format_for as _format_for
from modelopt.cli.help_format import WholeHelpCommand
from modelopt.cli.parse import csv as _csv
from modelopt.cli.parse import on_off as _on_off
from modelopt.cli.usage import usage_line
from modelopt.cli.version import root
from modelopt.compressors import COMPRESSORS, compressor_settings
from modelopt.config.run_config import RunConfig
from modelopt.data.dataset import list_data_sources
from modelopt.data.preprocess import check_resampling
from modelopt.data.split import Split
from modelopt.errors import ConfigError
from modelopt.model.loader import list_models
from modelopt.reports import report as make_report
from modelopt.run.export import export as do_export
from modelopt.run.layout import REPORT_FILES, REPORT_HTML
from modelopt.run.lock import check_unlocked
from modelopt.run.optuna_storage import export_run
from modelopt.search import STRATEGIES
from modelopt.sweep import load_sweep, run_sweep
from modelopt.sweep.run import check_selection

app = typer.Typer(
    name="modelopt",
    help="Find how to compress a trained PyTorch vision model (quantization search), without fine-tuning.",
    no_args_is_help=False,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.callback()(root)  # `modelopt --version` (modelopt.cli.version)


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING, format="%(message)s",
                        handlers=[RichHandler(console=err, show_path=False)], force=True)


def _run_json(result: Any) -> dict[str, Any]:
    """The run's headline as one JSON object (`--json`): the best plan's figures as summary.json has them."""
    s, best = result.summary, result.summary.best

    def scores(x: Any) -> dict[str, Any] | None:
        return None if x is None else x.to_json()

    return {
        "run_dir": str(result.run_dir),
        "n_trials": s.n_trials,
        "budget_used": s.budget_used,
        "baseline": {split: b.to_json() for split, b in s.baseline.items()},
        "best_plan": None if best is None else best.plan,
        "best_test": None if best is None else scores(best.test),
        "best_confirm": None if best is None else scores(best.confirm),
        "best_val": None if best is None else scores(best.val),
        "confirmed": None if best is None else best.confirmed,
    }


def _emit_json(obj: dict[str, Any]) -> None:
    out.file.write(json.dumps(obj, default=str) + "\n")
    out.file.flush()


def _optimize_config(resume: bool, out_dir: Path | None, given: dict[str, Any], *, untold: bool) -> RunConfig:
    """One override path: the settings a new run starts from (RunConfig's defaults; with no --budget and no --time,
    the default time with the default budget its cap) or a resumed run was started with, then what the flags change."""
    if resume:
        assert out_dir is not None
        check_unlocked(out_dir)  # a run still starting there has written no settings yet: say it is busy
        return RunConfig.read(out_dir).replace(**given)
    default = {"time": api.DEFAULT_TIME, "budget": api.DEFAULT_BUDGET} if untold else {}
    return RunConfig().replace(**default, **given)


@app.command(cls=WholeHelpCommand)
@_friendly
@opt.with_compressor_settings
def optimize(
    model: opt.Model = None,
    weights: opt.Weights = None,
    data: opt.Data = None,
    unlabeled: opt.Unlabeled = None,
    resize: opt.Resize = None,
    crop: opt.Crop = None,
    interpolation: opt.Interpolation = None,
    mean: opt.Mean = None,
    std: opt.Std = None,
    strategy: opt.Strategy = None,
    budget: opt.Budget = None,
    time_: opt.Time = None,
    objective: opt.Objective = None,
    latency: opt.Latency = None,
    latency_batch: opt.LatencyBatch = None,
    latency_threads: opt.LatencyThreads = None,
    min_retention: opt.MinRetention = None,
    floors: opt.Floors = None,
    confidence: opt.Confidence = None,
    count_gains: opt.CountGains = None,
    reconstruct: opt.Reconstruct = None,
    seed: opt.Seed = None,
    compressors: opt.Compressors = None,
    device: opt.Device = None,
    out_dir: opt.OutDir = None,
    resume: opt.Resume = False,
    allow_pickle: opt.AllowPickle = False,
    json_out: opt.JsonOut = False,
    progress: opt.Progress = True,
    storage: opt.Storage = None,
    workers: opt.Workers = None,
    executor: opt.Executor = None,
    ray_address: opt.RayAddress = None,
    knowledge: opt.Knowledge = None,
    verbose: opt.Verbose = False,
    *,
    settings: dict[str, Any],
) -> None:
    """Search for the smallest plan above the retention floor; with no options, ResNet-20 on bundled CIFAR-10."""
    _setup_logging(verbose)
    check_resampling(resize, crop, interpolation)
    given: dict[str, Any] = dict(
        model=model, weights=weights, data=data, unlabeled=unlabeled, strategy=strategy, budget=budget,
        objective=objective, min_retention=min_retention, confidence=confidence, count_gains=count_gains, seed=seed,
        device=device, workers=workers, executor=executor, ray_address=ray_address, knowledge=knowledge,
        latency=latency, compressors=None if compressors is None else _csv(compressors, str, "compressors"),
        resize=resize, crop=crop, interpolation=interpolation,
        mean=None if mean is None else _csv(mean, float, "mean"), std=None if std is None else _csv(std, float, "std"),
        reconstruct=None if reconstruct is None else _on_off(reconstruct, "--reconstruct"),
        floors=None if floors is None else _csv(floors, float, "floors"), time=time_,
    )
    given = {k: v for k, v in given.items() if v is not None}
    if latency is not None and latency.lower() == "none":
        given["latency"] = None
    out_dir = out_dir or (api.latest_run_dir() if resume else None)
    config = _optimize_config(resume, out_dir, {**given, **settings}, untold=budget is None and time_ is None)
    if latency_batch is not None or latency_threads is not None:
        spec = config.latency
        if spec is None:
            raise ConfigError("--latency-batch and --latency-threads set how the latency engine times; pass "
                              "--latency torch, onnxruntime or openvino too")
        config = config.replace(latency=dataclasses.replace(
            spec, batch_size=spec.batch_size if latency_batch is None else latency_batch,
            threads=spec.threads if latency_threads is None else latency_threads))
    result = api.run(config, out=out_dir, resume=resume, storage=storage, progress=progress,
                     allow_pickle=allow_pickle)
    print_run(out, result)
    if (result.run_dir / REPORT_HTML).is_file():
        out.print(f"Report: {result.run_dir / REPORT_HTML}")
    if storage is not None:
        out.print(f"Trials written to {storage}; view them with: optuna-dashboard {storage}", highlight=False,
                  soft_wrap=True)
    if json_out:
        _emit_json(_run_json(result))
    if result.stopped:  # Ctrl-C stopped the search: what it had is certified above; the search may go on
        err.print(f"[yellow]interrupted[/]: the plan above is certified on the {len(result.trials)} trials so far; "
                  f"--resume --out {result.run_dir} continues the search", highlight=False, soft_wrap=True)
        raise typer.Exit(130)


@app.command(cls=WholeHelpCommand)
@_friendly
@opt.with_compressor_settings
def evaluate(
    run_dir: Annotated[Path | None, typer.Argument(
        help="A run folder: evaluate its plans on its own splits, with its model, data and compressors.",
        show_default=False)] = None,
    plan: Annotated[str | None, typer.Option(
        help="Plan YAML file (default: no compression); with RUN_DIR also best (its default) or a trial "
             "number.")] = None,
    model: Annotated[str, typer.Option(
        help="Zoo name, torchvision:NAME, timm:NAME, pkg.module:factory, or a saved module file.")
    ] = "cifar10_resnet20",
    weights: Annotated[Path | None, typer.Option(help="Checkpoint (state dict) for --model.")] = None,
    data: Annotated[str, typer.Option(
        help="cifar10-sample, an .npz, an image folder or a CIFAR10 root.")] = "cifar10-sample",
    split: Annotated[str, typer.Option(
        help="calib, val, confirm (data with a confirm split), test, or all (val + test).")] = Split.VAL,
    compressors: Annotated[str | None, typer.Option(
        help="Compressors the plan may use, e.g. quantize,prune (default: every registered one the model "
             "suits).")] = None,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:N.")] = "auto",
    allow_pickle: Annotated[bool, typer.Option(
        help="Allow full unpickling of a model file (trusted files only).")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object as the last line of stdout.")] = False,
    unlabeled: opt.Unlabeled = None,
    resize: opt.Resize = None,
    crop: opt.Crop = None,
    interpolation: opt.Interpolation = None,
    mean: opt.Mean = None,
    std: opt.Std = None,
    reconstruct: opt.Reconstruct = None,
    *,
    settings: dict[str, Any],
) -> None:
    """Score one plan on one split: accuracy, retention, agreement, size, compression, bitops. A compressor's
    settings (e.g. --rounding nearest) are what plan entries that name none get. A plan file's plan is
    reconstructed on its own inputs first, as `optimize` does before confirmation (--reconstruct off: as composed);
    a run's plan is scored as the run certified it.

    `modelopt evaluate RUN_DIR --split test` scores the run's reported plan on the run's own test images (`--plan
    N`: its trial N)."""
    _setup_logging(False)
    check_resampling(resize, crop, interpolation)
    if run_dir is not None:
        declared = compressor_settings()
        api.check_run_alone(run_dir, flags=True, given={
            "--model": model != "cifar10_resnet20" or None, "--data": data != "cifar10-sample" or None,
            "--weights": weights, "--compressors": compressors, "--unlabeled": unlabeled, "--resize": resize,
            "--crop": crop, "--interpolation": interpolation, "--mean": mean, "--std": std,
            "--reconstruct": reconstruct, **{declared[option][1].flag: value for option, value in settings.items()}})
    names = _csv(compressors, str, "compressors") if compressors is not None else None
    means, stds = (None if v is None else _csv(v, float, k) for k, v in (("mean", mean), ("std", std)))
    if reconstruct is not None:
        settings = {**settings, "reconstruct": _on_off(reconstruct, "--reconstruct")}
    if run_dir is not None:
        chosen: str | int | None = int(plan) if plan is not None and plan.isdigit() else plan
        m = api.evaluate(model, chosen, data, weights=weights, split=split, device=device, allow_pickle=allow_pickle,
                         compressors=names, unlabeled=unlabeled, run=run_dir, resize=resize, crop=crop,
                         interpolation=interpolation, mean=means, std=stds, **settings)
        title = f"{run_dir} — {plan or 'best'} on {split_label(split, m.n_samples)}"
    else:
        m = api.evaluate(model, plan, data, weights=weights, split=split, device=device, allow_pickle=allow_pickle,
                         compressors=names, unlabeled=unlabeled, resize=resize, crop=crop,
                         interpolation=interpolation, mean=means, std=stds, **settings)
        title = f"{model} — {'float' if plan is None else plan} on {split_label(split, m.n_samples)}"
    table = Table(title=title)
    for col in ("top-1", "float top-1", "retention", "agree", "size", "ratio", "MACs", "bitops"):
        table.add_column(col, justify="right")
    table.add_row(f"{m.accuracy:.2%}", f"{m.baseline_accuracy:.2%}", f"{m.retention:.2%}", f"{m.agreement:.2%}",
                  fmt_bytes(m.size_bytes), f"{m.compression:.2f}x", f"{m.macs / 1e6:.1f}M", f"{m.bitops:.3g}")
    out.print(table)
    if m.exited is not None:
        out.print(f"Early exit: {m.exited:.1%} of the images leave at an exit (MACs and bitops are means over them)")
    if json_out:  # "all" names its images there too: val and test, not the calib and confirm images
        _emit_json({**m.to_dict(), **({"split": "all", "splits": [Split.VAL, Split.TEST]} if split == Split.ALL
                                      else {})})


@app.command("list", cls=WholeHelpCommand)
@_friendly
def list_(
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object as the last line of stdout.")] = False,
) -> None:
    """The registered models, data sources, compressors and strategies."""

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


@app.command(cls=WholeHelpCommand)
@_friendly
def sweep(
    file: Annotated[Path, typer.Argument(help="Sweep file (YAML): models, strategies, budgets, seeds.")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List the cells and which are done; run nothing.")] = False,
    progress: Annotated[bool, typer.Option(help="Show the progress display.")] = True,
    only: Annotated[list[str] | None, typer.Option(help="Run only cells matching model/strategy/seedK (shell pattern, "
                                            "repeatable; run in the order given), e.g. 'resnet56/mcts/*'.")] = None,
    workers: Annotated[int, typer.Option(help="Cells run at once on Ray, each in its own process "
                                         "(needs modelopt[distributed]); 1: one after another.")] = 1,
    ray_address: Annotated[str | None, typer.Option(help="A running Ray cluster, e.g. ray://head:10001 "
                                                    "(default: a local one for the sweep).")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
) -> None:
    """Run every model × strategy × seed of a sweep file (skipping finished cells), then write its table."""
    _setup_logging(verbose)
    spec = load_sweep(file)
    check_selection(spec, only or (), workers)
    result = None if dry_run else run_sweep(file, progress=progress, only=only or (), workers=workers,
                                            ray_address=ray_address)
    if result is None:
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
    out.print(Markdown(result.markdown))
    out.print(f"Ran {len(result.ran)} of {len(result.cells)} cells. Table: {result.table_md} and {result.table_csv}")


@app.command(cls=WholeHelpCommand)
@_friendly
def report(
    folder: Annotated[Path, typer.Argument(help="A run folder (holds run.json) or a sweep folder (holds runs/).")],
) -> None:
    """Write report.md and a self-contained report.html (plots inlined) into a run or sweep folder."""
    _setup_logging(False)
    paths = make_report(folder)
    figures = paths.markdown.parent / REPORT_FILES
    out.print(f"Report: {paths.html}  (Markdown: {paths.markdown}, figures in {figures})", highlight=False,
              soft_wrap=True)


@app.command(cls=WholeHelpCommand)
@_friendly
def dashboard(
    run_dir: Annotated[Path, typer.Argument(help="A run folder (any strategy).")],
    storage: Annotated[str, typer.Option(help="Optuna storage URL, e.g. sqlite:///studies.db.")],
    study_name: Annotated[str | None, typer.Option(help="Study name (default: the run folder's name).")] = None,
) -> None:
    """Write every trial of a run folder into an Optuna study, for optuna-dashboard (rerun: adds only new trials)."""
    _setup_logging(False)
    done = export_run(run_dir, storage, study_name=study_name)
    out.print(f"Study [bold]{done.study_name}[/] in {done.storage}: {done.added} trials added, {done.skipped} already "
              f"there. View: optuna-dashboard {done.storage}", highlight=False, soft_wrap=True)


@app.command("export", cls=WholeHelpCommand)
@_friendly
def export_(
    run_dir: Annotated[Path, typer.Argument(help="A run folder (holds run.json).")],
    plan: Annotated[str, typer.Option(help="best, a trial number, floor:F (the point a --floors run certified at "
                                           "F), or a plan YAML file.")] = "best",
    format: Annotated[str | None, typer.Option("--format", help="modelopt (packed checkpoint) or onnx (QDQ); "
                                                "default: from --out's suffix (.onnx: onnx), else modelopt.")] = None,
    out_path: Annotated[Path | None, typer.Option("--out",
        help="File to write (default RUN_DIR/model-<plan>.pt|.onnx).")] = None,
    calibration: Annotated[str | None, typer.Option(help="onnx: activation ranges from minmax or percentile.")] = None,
    activations: Annotated[str | None, typer.Option(
        help="onnx: which activations are quantized (uint8 QDQ, so ONNX Runtime and OpenVINO run integer kernels): "
             "plan (around the layers whose inputs the plan quantizes; the default), all, or none.")] = None,
    image_input: Annotated[str | None, typer.Option("--input",
        help="onnx: what the graph reads: float (the normalised NCHW image; the default) or uint8 (pixels as a "
             "decoder gives them, batch x height x width x channels at the size the model reads; the graph "
             "normalises them).")] = None,
    weights: Annotated[str | None, typer.Option(
        help="onnx: integer (codes behind DequantizeLinear: the smallest file; the default) or decoded (layers whose "
             "inputs stay float get their decoded float32 weights: float speed in ONNX Runtime, float size).")] = None,
) -> None:
    """Write a run's plan as a packed checkpoint (reload with modelopt.load) or an ONNX model for ONNX Runtime."""
    _setup_logging(False)
    format_given = format is not None
    format = _format_for(out_path, format or "modelopt", format_given)
    given = {k: v for k, v in (("calibration", calibration), ("activations", activations),
                               ("image_input", image_input), ("weights", weights)) if v is not None}
    if given and format != "onnx":
        flag = {"image_input": "input"}.get(min(given), min(given))
        raise ConfigError(f"--{flag} applies only to --format onnx, not {format!r}")
    options: dict[str, Any] = dict(given)
    path = do_export(run_dir, plan=plan, format=format, out=out_path, **options)
    said = ""
    if path.is_file() and path.suffix == ".onnx":  # what its input must be, as the model's doc string says it
        import onnx

        said = f"; {onnx.load(str(path), load_external_data=False).doc_string}"
    out.print(f"Wrote {path} ({fmt_bytes(path.stat().st_size)}){said}", highlight=False, soft_wrap=True)


def main() -> None:
    signal.signal(signal.SIGTERM, _on_sigterm)
    warnings.formatwarning = _one_line_warning
    try:  # not standalone: typer's own answer to a usage error is a framed box that does not name the value
        code = app(prog_name="modelopt", standalone_mode=False)
    except typer.Abort:  # end of input at a prompt
        err.print("[yellow]aborted[/]")
        sys.exit(1)
    except typer.TyperException as exc:
        err.print(f"[bold red]error:[/] {escape(usage_line(exc, sys.argv[1:]))}", highlight=False, soft_wrap=True)
        sys.exit(int(getattr(exc, "exit_code", 2)))
    sys.exit(code if isinstance(code, int) else 0)
