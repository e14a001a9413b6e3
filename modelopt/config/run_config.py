"""`RunConfig`: one typed, versioned record of a run's settings.

It validates itself (one clear error per bad field) and reads and writes a run folder's `run.json` (files from
before it had a format number still load: `modelopt.config.run_json`). It is data: `modelopt.config.build` turns it
into a run's parts. `modelopt.optimize`, the CLI, resume, export, reports and sweeps all start a run, or rebuild
one, through it.

Example:
    >>> cfg = RunConfig(budget=50, seed=1)
    >>> built = build(cfg)                       # modelopt.config.build: loads ResNet-20 and the sample
    >>> RunConfig.read("runs/r20").budget        # the settings a finished run was started with
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelopt._files import write_json_atomic
from modelopt._version import __version__
from modelopt.compressors import COMPRESSORS, Options, Setting, compressor_settings
from modelopt.confidence import DEFAULT_CONFIDENCE
from modelopt.config.assemble import (
    DEFAULT_BUDGET,
    default_compressors,
    default_options,
    options_record,
)
from modelopt.config.duration import parse_duration
from modelopt.config.forms import check_forms
from modelopt.config.run_json import CONFIG, CONFIG_FORMAT, as_records, fields_of, read_config_json
from modelopt.data.preprocess import DEFAULT_INTERPOLATION, Preprocess
from modelopt.errors import TOO_LARGE, ConfigError, LoadError, UnknownNameError, beyond_float
from modelopt.evaluation.fidelity import Fidelity
from modelopt.latency.spec import LatencySpec
from modelopt.objective import Objective, Target, check_floors
from modelopt.search import STRATEGIES

# The executors a run may name (modelopt.executors; listed here so a config is checked without importing Ray).
EXECUTOR_NAMES = ("local", "ray")
# The most plans a run may keep in flight: each is a task holding a model's copy on a worker, and Ray refuses a
# cluster of more than 1e14 CPUs with a traceback; a run asks no more than this of any real cluster.
MAX_WORKERS = 4096
# The settings a resumed run must share with the run it continues (a changed one is refused).
RESUME_KEYS = ("model_sha256", "data_sha256", "strategy", "seed", "objective", "min_retention", "floors", "confidence",
               "count_gains", "compressors", "data_seed", "fidelity", "unlabeled", "resize", "crop", "interpolation",
               "mean", "std")
# What a run's settings say before its model and data load (the rest is resolved against them).
SETTLED_RESUME_KEYS = ("strategy", "seed", "objective", "min_retention", "floors", "confidence", "count_gains",
                       "data_seed", "resize", "crop", "interpolation", "mean", "std")


def check_budget(budget: float) -> None:
    """Raises ConfigError unless `budget` is a positive finite number."""
    if not isinstance(budget, (int, float)) or isinstance(budget, bool) or not 0 < budget < math.inf:
        raise ConfigError(f"budget must be a positive number of full evaluations, got {budget!r}")
    if beyond_float(budget):  # run.json writes it as a float
        raise ConfigError(f"budget must be a positive number of full evaluations, got {TOO_LARGE}")


def check_seed(seed: int) -> None:
    """Raises ConfigError unless `seed` is a non-negative integer (numpy's generators take no other)."""
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer like 0, got {seed!r}")


@dataclass(frozen=True)
class RunConfig:
    """Everything a search run is started with (the run folder and progress display aside).

    Attributes:
        model, weights: a zoo name, `torchvision:NAME`, `pkg.module:factory` or a file; its checkpoint.
        data, data_seed: a named source or path; the seed of its calib/val/test split (fixed across
            search seeds).
        strategy, seed: a registered strategy name (`modelopt list`) and its seed.
        budget: full-evaluation equivalents the search may spend (a trial on all of val costs 1); infinite
            (run.json: null) for a run given a `time` and no budget.
        time: wall seconds the whole run may take, from loading to its summary (``"2m"``, ``"90s"`` or a number
            of seconds, `modelopt.config.duration`); the search stops early enough for the finalists to be
            certified within it. None: no limit, the budget alone ends the search.
        objective: size, bitops, macs or latency (measured).
        min_retention: floor on accuracy / float accuracy, on images the search never saw.
        floors: more floors to certify the best plan at, jointly, in the same run (a certified curve); empty: one.
            `min_retention` is always one of the curve's floors, and the one the reported plan is certified at.
        confidence: a plan meets the floor when a one-sided lower bound on its retention at this
            confidence does (`modelopt.confidence`); 0: the point estimate.
        count_gains: let images a plan fixes offset those it breaks in that bound, as they do in
            retention (off: the stricter share of the float model's right answers kept).
        unlabeled: unlabeled images (an `.npz` or image folder) for calibration and fitting; every
            labeled `data` image then goes to val, confirm and test (`modelopt.data.dataset.load_data`).
        compressors: registry names contributing decisions; None: every registered one that can
            lower `objective` on the model (`default_compressors`: quantize and prune for size;
            early exit and prune for macs; all three for bitops and latency), resolved by `build`.
        options: each registered compressor's options record (`Compressor.record`). Given as a record, or in
            JSON form (a mapping with its `version`, as run.json holds it; without one, some fields over the
            tool's defaults for the objective): built records are held; a compressor not named gets those
            defaults (`default_options`); None: the tool's defaults for every compressor. Users change them
            through `replace` by setting name (`bits=[8, 4]`, `exit_data=...`: the fields each record declares
            as settings).
        device: auto, cpu, cuda or cuda:N (a resolved record names the device it ran on).
        fidelity: multi-fidelity scoring: a plan below the floor beyond doubt on part of val (or
            that cannot beat the best so far) stops there and is charged only that part; None
            scores every plan on all of val.
        latency: how latency is measured (`LatencySpec`): for every plan when `objective` is
            latency, else for the best plan and the Pareto front at the end; None measures none.
        fingerprints: content hashes of the model and data a run was searched on (set by `build`).
        read_as: how its images were read, a record of what was applied, not a setting (set by `build`): the
            resize, crop, interpolation, mean and std, and `by`, whose they are: "--resize/--crop" (the user's),
            "the weights' authors" (a published weights file's transforms) or "as stored".
        executor, workers, ray_address: who scores plans (`modelopt.executors`): `local` (in this
            process) or `ray` (one actor per worker, on this machine or the cluster at `ray_address`),
            and how many plans are in flight at once (each worker one; the local executor scores its
            `workers` plans one after another, the same trials Ray gives).
        knowledge: a knowledge store (`modelopt.knowledge`) the run warm-starts its priors from and
            adds what it learned to; None: neither.
        reconstruct: refit every plan that goes to confirmation on its own compressed inputs before it is
            confirmed, tested and exported (`modelopt.reconstruct`); a run.json without the field ran without.
    """

    model: str = "cifar10_resnet20"
    weights: str | None = None
    data: str = "cifar10-sample"
    data_seed: int = 0
    strategy: str = "mcts"
    seed: int = 0
    budget: float = DEFAULT_BUDGET
    time: float | None = None
    objective: str = "size"
    min_retention: float = 0.99
    floors: tuple[float, ...] = ()
    confidence: float = DEFAULT_CONFIDENCE
    count_gains: bool = True
    unlabeled: str | None = None
    resize: int | None = None
    crop: int | None = None
    interpolation: str = DEFAULT_INTERPOLATION
    mean: tuple[float, ...] | None = None  # None: the model's own
    std: tuple[float, ...] | None = None
    compressors: tuple[str, ...] | None = None
    # None at construction means the tool's defaults for the objective: `__post_init__` puts them here.
    options: Mapping[str, Options] = None  # type: ignore[assignment]
    device: str = "auto"
    fidelity: Fidelity | None = field(default_factory=Fidelity)
    latency: LatencySpec | None = field(default_factory=lambda: LatencySpec("torch"))
    fingerprints: Mapping[str, str] = field(default_factory=dict)
    read_as: Mapping[str, Any] | None = None
    executor: str = "local"
    workers: int = 1
    ray_address: str | None = None
    knowledge: str | None = None
    reconstruct: bool = True

    def __post_init__(self) -> None:
        for name in ("model", "data", "device", "strategy"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ConfigError(f"{name} must be a non-empty string, got {getattr(self, name)!r}")
        for name in ("weights", "knowledge", "unlabeled"):  # paths are kept as the strings the user gave
            if isinstance(getattr(self, name), Path):
                object.__setattr__(self, name, str(getattr(self, name)))
        check_seed(self.seed)
        check_seed(self.data_seed)
        if not isinstance(self.reconstruct, bool):
            raise ConfigError(f"reconstruct must be true or false (on or off), got {self.reconstruct!r}")
        prep = self.preprocess  # a bad --resize, --crop, --mean or --std: one line, before anything loads
        object.__setattr__(self, "mean", prep.mean)
        object.__setattr__(self, "std", prep.std)
        if self.time is not None:
            object.__setattr__(self, "time", parse_duration(self.time, "time"))
        if not (self.budget == math.inf and self.time is not None):  # a timed run may leave the budget open
            check_budget(self.budget)
        if self.floors:  # the reported plan's floor is always one of the curve's
            object.__setattr__(self, "floors", check_floors((*check_floors(self.floors), self.min_retention)))
        else:
            object.__setattr__(self, "floors", ())
        STRATEGIES.get(self.strategy)  # an unknown name: one line listing the registered ones
        self.make_objective()
        if self.compressors is not None:
            object.__setattr__(self, "compressors", tuple(self.compressors))
        if self.options is None:
            object.__setattr__(self, "options", default_options(self.objective))
        elif not isinstance(self.options, Mapping) or not all(isinstance(o, (Options, Mapping))
                                                              for o in self.options.values()):
            raise ConfigError(f"options must map compressor names to their options, got {self.options!r}")
        if isinstance(self.latency, str):
            object.__setattr__(self, "latency", LatencySpec(self.latency))
        for name in [*(self.compressors or ()), *self.options]:
            COMPRESSORS.get(name)
        # Each record checked its own fields when it was built (`Options.check`): a bad bit width is refused here,
        # before a model loads, and no compressor is built to find out.
        object.__setattr__(self, "options", self._records())
        self._check_latency()
        self._check_executor()

    def replace(self, **changes: Any) -> RunConfig:
        """This config with some settings changed: the one way the CLI, `modelopt.optimize`, sweep files and
        a resumed run's flags change a config.

        A name is one of RunConfig's fields or any registered compressor's setting (`Compressor.record.settings()`,
        e.g. ``bits=[8, 4]``, ``exit_data="train.npz"``), which is merged into that compressor's options.
        ``executor`` left out while ``workers`` > 1 or ``ray_address`` is given: ``ray``. A new objective
        brings its own tool defaults when the options were the old objective's.

        Raises:
            ConfigError: an unknown name (one line listing the valid ones), a bad value, or a compressor's
                setting on a run that does not use that compressor.

        Example:
            >>> RunConfig().replace(budget=50, strategy="random", bits=[8, 4]).options["quantize"].bits
            (8, 4)
        """
        fields = {f.name for f in dataclasses.fields(self)}
        settings = compressor_settings()
        unknown = sorted(set(changes) - fields - set(settings))
        if unknown:
            raise UnknownNameError("setting", unknown[0], sorted(fields | set(settings)))
        own = self._implied({k: v for k, v in changes.items() if k in fields})
        given = {k: v for k, v in changes.items() if k not in fields}
        if given:
            own["options"] = self._with_settings(own.get("options", self.options), own.get("objective", self.objective),
                                                 given, settings)
        out = dataclasses.replace(self, **own)
        out.check_settings_apply(given)
        return out

    def _implied(self, own: Mapping[str, Any]) -> dict[str, Any]:
        """`own` (changed fields) with what they imply: a new objective's default options where the options were the
        old objective's defaults; the executor `workers` or `ray_address` ask for where none is named."""
        out = dict(own)
        if own.get("time") is not None and "budget" not in own:  # a time given alone: the time ends the search
            out["budget"] = math.inf
        if "objective" in own and "options" not in own and self.options == default_options(self.objective):
            out["options"] = default_options(str(own["objective"]))
        if own.get("executor") is None and ({"workers", "ray_address"} & own.keys()):
            workers, address = own.get("workers", self.workers), own.get("ray_address", self.ray_address)
            out["executor"] = "ray" if address is not None or (isinstance(workers, int) and workers > 1) else "local"
        elif "executor" in own and own["executor"] is None:
            del out["executor"]
        return out

    @staticmethod
    def _with_settings(options: Mapping[str, Options | Mapping[str, Any]], objective: str, given: Mapping[str, Any],
                       settings: Mapping[str, tuple[str, Setting]]) -> dict[str, Options | Mapping[str, Any]]:
        """`options` with each setting in `given` changed in its compressor's record (the record checks it)."""
        merged = dict(options)
        for option, value in given.items():
            compressor, setting = settings[option]
            base = options_record(compressor, merged.get(compressor), objective)
            merged[compressor] = base.replace(**{option: setting.check(value, option)})
        return merged

    def check_settings_apply(self, given: Mapping[str, Any]) -> None:
        """Refuses compressor settings given for a compressor this run does not use (they would be ignored)."""
        if not given:
            return
        names = self.compressors if self.compressors is not None else tuple(default_compressors(self.objective))
        settings = compressor_settings()
        for option in given:
            compressor, setting = settings[option]
            if compressor not in names:
                raise ConfigError(f"{setting.flag} ({option}) is a setting of compressor {compressor!r}, which this "
                                  f"run does not use (compressors: {', '.join(names)}); add {compressor} to "
                                  f"--compressors, or drop {setting.flag}")

    def _check_executor(self) -> None:
        if self.executor not in EXECUTOR_NAMES:
            raise ConfigError(f"unknown executor {self.executor!r}; choose one of {', '.join(EXECUTOR_NAMES)}")
        if not isinstance(self.workers, int) or isinstance(self.workers, bool) or not 1 <= self.workers <= MAX_WORKERS:
            shown = TOO_LARGE if isinstance(self.workers, int) and beyond_float(self.workers) else repr(self.workers)
            raise ConfigError(f"workers must be a number of plans in flight from 1 to {MAX_WORKERS}, like 2; got "
                              f"{shown}")
        if self.ray_address is not None and self.executor != "ray":
            raise ConfigError(f"ray_address {self.ray_address!r} needs executor 'ray', not {self.executor!r}")

    def _records(self) -> dict[str, Options]:
        """Every registered compressor's options record: given ones read by `options_record` (a record kept as it
        is; JSON read, an unknown field refused), the rest the tool's defaults for the objective."""
        given = {name: options_record(name, o, self.objective) for name, o in self.options.items()}
        return {**default_options(self.objective), **given}

    def _check_latency(self) -> None:
        if self.latency is None and self.objective == Target.LATENCY.value:
            raise ConfigError("objective 'latency' needs a latency engine: torch, onnxruntime or openvino "
                              "(--latency on the command line, latency= in the API and sweep files)")

    @property
    def preprocess(self) -> Preprocess:
        """How decoded images are resized and cropped, and normalised when said (`modelopt.data.preprocess`)."""
        return Preprocess(self.resize, self.crop, self.interpolation, self.mean, self.std)

    def make_objective(self) -> Objective:
        """The run's objective (on a workload, `modelopt.config.build.make_objective` also sizes its claims)."""
        return Objective(Target.parse(self.objective), self.min_retention, self.confidence, self.count_gains,
                         floors=self.floors)

    # ---- run.json ----------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """run.json's form (the key layout of format 0, plus `format` and the tool's `version`)."""
        comps = None if self.compressors is None else {n: self.options[n].to_json() for n in self.compressors}
        out: dict[str, Any] = {
            "format": CONFIG_FORMAT, "model": self.model, "weights": self.weights, "data": self.data,
            "data_seed": self.data_seed, "strategy": self.strategy, "seed": self.seed, "objective": self.objective,
            "min_retention": self.min_retention, "floors": list(self.floors), "confidence": self.confidence,
            "count_gains": self.count_gains,
            "unlabeled": self.unlabeled, "resize": self.resize, "crop": self.crop,
            "interpolation": self.interpolation, "mean": None if self.mean is None else list(self.mean),
            "std": None if self.std is None else list(self.std), "compressors": comps,
            "device": self.device,
            "fidelity": None if self.fidelity is None else self.fidelity.to_dict(),
            "latency": None if self.latency is None else dataclasses.asdict(self.latency),
            **self.fingerprints, "read_as": None if self.read_as is None else dict(self.read_as),
            "budget": float(self.budget) if self.budget < math.inf else None, "time": self.time,
            "version": __version__,
            "executor": self.executor, "workers": self.workers, "ray_address": self.ray_address,
            "knowledge": self.knowledge, "reconstruct": self.reconstruct,
        }
        if comps is None:
            out["options"] = {n: o.to_json() for n, o in self.options.items()}
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], where: str = CONFIG) -> RunConfig:
        """The config a run.json holds; LoadError naming the first field that has not the form it must."""
        check_forms(raw, where)
        try:
            return cls(**fields_of(raw))
        except (ConfigError, TypeError) as exc:
            raise LoadError(f"{where!r} holds settings modelopt refuses ({exc}); its run.json was damaged or is "
                            "not a modelopt run's") from None

    @classmethod
    def read(cls, run_dir: str | Path) -> RunConfig:
        """The settings a run folder was started with; LoadError when it is not a run folder."""
        return cls.from_json(read_config_json(run_dir), str(Path(run_dir) / CONFIG))

    def write(self, run_dir: str | Path) -> None:
        write_json_atomic(Path(run_dir) / CONFIG, self.to_json())

    def check_resumes(self, run_dir: str | Path, keys: Sequence[str] = RESUME_KEYS) -> None:
        """Raises ConfigError unless this (resolved) config may continue the run in `run_dir`: the same
        model and data by content, search, floor and menus (the budget may grow). `keys`: what to compare
        (`SETTLED_RESUME_KEYS`: what needs no model, checked before one loads)."""
        saved, mine = read_config_json(run_dir), self.to_json()
        if isinstance(saved.get("compressors"), dict):  # records compared, not their JSON: an old one read as it ran
            saved["compressors"] = {n: o.to_json() if isinstance(o, Options) else o
                                    for n, o in as_records(saved["compressors"], str(run_dir)).items()}
        for key in keys:
            if key in saved and key in mine and saved[key] != mine[key]:
                raise ConfigError(f"cannot resume {str(run_dir)!r}: it was run with {key}={saved[key]!r}, "
                                  f"not {mine[key]!r}")
