"""The options of `modelopt optimize`, one typed alias each (the command's signature stays one line per
option), and the compressors' own settings as flags (`with_compressor_settings`: each compressor declares
them, `Compressor.record.settings()`). None means "not given": a new run takes `RunConfig`'s default, a resumed run
keeps its own."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from modelopt.compressors import compressor_settings
from modelopt.errors import ConfigError

Model = Annotated[
    str | None, typer.Option(help="Zoo name, torchvision:NAME, timm:NAME, pkg.module:factory, or a saved module file.")
]
Weights = Annotated[Path | None, typer.Option(help="Checkpoint (state dict) for --model.")]
Data = Annotated[str | None, typer.Option(help="cifar10-sample, an .npz, an image folder or a CIFAR10 root.")]
Strategy = Annotated[str | None, typer.Option(help="Search strategy (see `modelopt list`).")]
Budget = Annotated[float | None, typer.Option(help="Budget in full evaluations of the val split (default 100).")]
Time = Annotated[str | None, typer.Option(
    "--time", help="Wall time the whole run may take, e.g. 90s, 2m, 1h: the search stops early enough to certify "
    "its finalists within it (with no --budget and no --time: 2m20s, at most 100 evals).")]
Objective = Annotated[str | None, typer.Option(help="What to minimise: size, bitops, macs or latency (measured).")]
Latency = Annotated[
    str | None,
    typer.Option(
        help="Latency engine: torch, onnxruntime or openvino (the INT8 QDQ export), or none; measured for the "
        "final Pareto set, or every plan with --objective latency (default torch)."
    ),
]
LatencyBatch = Annotated[
    int | None, typer.Option(help="Images per timed batch in the latency engine (default 1).", min=1)
]
LatencyThreads = Annotated[
    int | None, typer.Option(help="Threads the latency engine times with (default 1).", min=1)
]
MinRetention = Annotated[
    float | None, typer.Option(help="Floor on accuracy relative to float, on images the search never saw.")
]
Floors = Annotated[
    str | None,
    typer.Option(help="Certify the best plan at several floors at once, e.g. 0.995,0.99,0.98,0.97: a curve, every "
                      "point holding jointly at --confidence (--min-retention is always one of them)."),
]
Confidence = Annotated[
    float | None,
    typer.Option(
        help="A plan meets the floor when a one-sided lower bound on its retention at this confidence does "
        "(default 0.95); 0: the point estimate."
    ),
]
CountGains = Annotated[
    bool | None,
    typer.Option(
        "--count-gains/--breaks-only",
        help="Bound retention itself: images a plan fixes offset images it breaks (default); --breaks-only "
        "bounds the stricter share of the float model's right answers kept.",
    ),
]
Reconstruct = Annotated[
    str | None,
    typer.Option(
        help="on (default): refit each plan that goes to confirmation on its own compressed inputs before it is "
        "confirmed, tested and exported; off: certify the plans as the search composed them.",
    ),
]
Unlabeled = Annotated[
    Path | None,
    typer.Option(
        help="Unlabeled images for calibration and fitting (an .npz of x or JPEG bytes, or an image folder; "
        "e.g. ../shared/data/cifar10/cifar10_jpeg_train.npz): every labeled --data image then goes to "
        "val, confirm and test."
    ),
]
Resize = Annotated[int | None, typer.Option(
    help="Resize each decoded image's shorter side to this many pixels (e.g. 256, or 32 for a CIFAR model on larger "
         "images); recorded in run.json.")]
Crop = Annotated[int | None, typer.Option(
    help="Then take a centre crop of this many pixels square (e.g. 224); recorded in run.json.")]
Interpolation = Annotated[str | None, typer.Option(
    help="How --resize resamples: bicubic (default), bilinear, lanczos, box, nearest.")]
Mean = Annotated[str | None, typer.Option(
    help="Per-channel mean the inputs are normalised with, e.g. 0.485,0.456,0.406 (default: the model's own); "
         "recorded in run.json.")]
Std = Annotated[str | None, typer.Option(
    help="Per-channel std the inputs are divided by, e.g. 0.229,0.224,0.225 (default: the model's own).")]
Seed = Annotated[int | None, typer.Option(help="Seed of the search.")]
Compressors = Annotated[
    str | None,
    typer.Option(
        help="Compressors that contribute decisions, e.g. quantize,prune,early_exit (see `modelopt list`); "
        "default: every registered one that can lower the objective."
    ),
]
Device = Annotated[str | None, typer.Option(help="auto (CUDA when present; the default), cpu, cuda, cuda:N.")]
OutDir = Annotated[
    Path | None, typer.Option("--out", help="Run folder (default runs/<time>-<model>-<strategy>-s<seed>).")
]
Resume = Annotated[bool, typer.Option(help="Continue the run in --out (default: the latest under runs/).")]
AllowPickle = Annotated[bool, typer.Option(help="Allow full unpickling of a model file (trusted files only).")]
JsonOut = Annotated[bool, typer.Option("--json", help="Print one JSON object as the last line of stdout.")]
Progress = Annotated[bool, typer.Option(help="Show the progress bar.")]
Storage = Annotated[
    str | None,
    typer.Option(
        help="Also write every trial into an Optuna storage, e.g. sqlite:///studies.db (view with optuna-dashboard)."
    ),
]
Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")]
Workers = Annotated[
    int | None,
    typer.Option(
        help="Plans scored at once: N Ray workers, each with its own copy of the model (a GPU each where there "
        "are GPUs; the CPU's threads split between them). Needs the `distributed` extra. Default 1: in this process."
    ),
]
Executor = Annotated[
    str | None,
    typer.Option(help="Who scores plans: local (this process) or ray (default: ray when --workers > 1 or "
                 "--ray-address is given)."),
]
RayAddress = Annotated[
    str | None, typer.Option(help="Join a running Ray cluster at this address (e.g. ray://head:10001 or auto).")
]
Knowledge = Annotated[
    Path | None,
    typer.Option(
        help="A knowledge store (a folder): warm-start the search's priors from what earlier runs learned per "
        "layer, and add this run's. Off by default."
    ),
]


class with_compressor_settings:
    """`command` with one option per registered compressor's setting (`--bits`, `--exit-data`, ...): those
    given reach it parsed (`Setting.from_text`), as ``settings={option: value}``.

    The options are read from the registry each time the command line is built (typer reads the signature
    then), so a compressor registered after this module was imported gets its flags too.

    Example:
        >>> @app.command()
        ... @with_compressor_settings
        ... def optimize(budget: Budget = None, *, settings: dict[str, Any]) -> None: ...
    """

    def __init__(self, command: Callable[..., Any]) -> None:
        self.command = command
        self.own = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != "settings"]
        # Its name and help, not its signature or `__wrapped__`: `inspect.signature` must stop at `__signature__`.
        functools.update_wrapper(self, command, assigned=("__module__", "__name__", "__qualname__", "__doc__"),
                                 updated=())

    @property
    def __signature__(self) -> inspect.Signature:
        declared = compressor_settings()
        clash = sorted({p.name for p in self.own} & set(declared))
        if clash:
            raise ConfigError(f"compressor {declared[clash[0]][0]!r} declares the setting {clash[0]!r}, which is "
                              "already an option of the command; the compressor must rename it")
        extra = [inspect.Parameter(option, inspect.Parameter.KEYWORD_ONLY, default=None,
                                   annotation=Annotated[str | None, typer.Option(s.flag, help=f"{s.help} [{comp}]")])
                 for option, (comp, s) in declared.items()]
        return inspect.Signature([*self.own, *extra])

    @property
    def __annotations__(self) -> dict[str, Any]:  # type: ignore[override]
        return {p.name: p.annotation for p in self.__signature__.parameters.values()}

    def __call__(self, **kwargs: Any) -> Any:
        declared = compressor_settings()
        given = {o: declared[o][1].from_text(kwargs.pop(o)) for o in declared if kwargs.get(o) is not None}
        for o in declared:
            kwargs.pop(o, None)
        return self.command(**kwargs, settings=given)
