"""RunConfig: validation, run.json round trips (old files included), building a run, and the API over it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import modelopt
import modelopt.api
from modelopt.compressors import COMPRESSORS
from modelopt.config.assemble import default_options
from modelopt.config.build import build, make_compressors
from modelopt.config.run_config import CONFIG_FORMAT, RunConfig
from modelopt.errors import ConfigError, LoadError
from modelopt.evaluation.fidelity import Fidelity
from modelopt.latency.spec import LatencySpec
from modelopt.run.layout import CONFIG


def test_defaults_are_the_tool_defaults() -> None:
    cfg = RunConfig()
    assert (cfg.model, cfg.data, cfg.strategy, cfg.seed, cfg.budget) == ("cifar10_resnet20", "cifar10-sample",
                                                                         "mcts", 0, modelopt.api.DEFAULT_BUDGET)
    assert cfg.options["quantize"].rounding == ("gptq",) and cfg.compressors is None


@pytest.mark.parametrize(("field", "value", "words"), [
    ("strategy", "mtcs", "mtcs"),
    ("budget", 0, "budget"),
    ("budget", float("nan"), "budget"),
    ("budget", 10**400, "budget must be a positive number of full evaluations, got an integer too large for a float"),
    ("time", 10**400, "time an integer too large for a float is not a duration"),
    ("confidence", 10**400, "confidence must be in [0, 1) like 0.95; got an integer too large for a float"),
    ("seed", -1, "seed"),
    ("seed", True, "seed"),
    ("objective", "speed", "speed"),
    ("min_retention", 1.5, "min_retention"),
    ("floors", (0.99, 1.2), "floor 1.2"),
    ("floors", ("high",), "floor 'high'"),
    ("floors", (0.99, 10**400), "floor an integer of 401 digits is not a retention floor"),
    ("confidence", 1.0, "confidence"),
    ("compressors", ("quantize", "prnue"), "prnue"),
    ("options", {"quantise": {}}, "quantise"),
    ("options", {"early_exit": {"exit_images": 0}}, "exit_images"),
    ("model", "", "model"),
])
def test_a_bad_field_is_one_clear_error(field: str, value: object, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        RunConfig(**{field: value})
    assert words in str(info.value) and "\n" not in str(info.value)


def test_latency_objective_needs_a_backend_and_every_engine_times_exits() -> None:
    with pytest.raises(ConfigError, match="needs a latency engine: torch, onnxruntime or openvino"):
        RunConfig(objective="latency", latency=None)
    for engine in ("torch", "onnxruntime", "openvino"):  # ONNX engines run exits as segments that return early
        RunConfig(compressors=("early_exit",), latency=LatencySpec(engine))


def test_json_round_trip() -> None:
    cfg = RunConfig(weights="w.th", strategy="random", seed=3, budget=12.5, confidence=0.9, count_gains=True,
                    compressors=("quantize", "prune", "early_exit"),
                    options={"quantize": {"bits": [8]}, "prune": {}, "early_exit": {"exit_data": "x.npz",
                                                                                    "exit_images": 7}},
                    fidelity=None, latency=LatencySpec("torch", repeats=3),
                    fingerprints={"model_sha256": "ab", "data_sha256": "cd"})
    raw = json.loads(json.dumps(cfg.to_json()))
    assert raw["format"] == CONFIG_FORMAT and raw["model_sha256"] == "ab"
    assert RunConfig.from_json(raw) == cfg


def test_floors_are_a_curve_that_always_holds_the_reported_floor_and_survive_run_json() -> None:
    cfg = RunConfig(floors=(0.97, 0.98))
    assert cfg.floors == (0.99, 0.98, 0.97)  # --min-retention (0.99) is the reported plan's floor: always one
    assert cfg.make_objective().curve == (0.99, 0.98, 0.97) and cfg.make_objective().search.min_retention == 0.97
    assert RunConfig.from_json(json.loads(json.dumps(cfg.to_json()))) == cfg
    assert RunConfig().floors == () and RunConfig().make_objective().curve == (0.99,)


def test_a_run_resumed_with_other_floors_is_refused(tmp_path: Path) -> None:
    RunConfig(floors=(0.98,)).write(tmp_path)
    with pytest.raises(ConfigError, match="floors"):
        RunConfig(floors=(0.97,)).check_resumes(tmp_path)


def test_an_unresolved_config_keeps_its_options_through_json() -> None:
    cfg = RunConfig(options={"quantize": {"bits": [4]}})
    assert RunConfig.from_json(json.loads(json.dumps(cfg.to_json()))) == cfg


def test_a_format_0_record_reads_as_it_ran(tmp_path: Path) -> None:
    """run.json as written before RunConfig (and before confidence bounds and multi-fidelity)."""
    old = {"model": "cifar10_resnet20", "weights": None, "data": "cifar10-sample", "strategy": "mcts", "seed": 1,
           "objective": "size", "min_retention": 0.99, "compressors": {"quantize": {"bits": [8, 4],
           "granularity": ["per_channel"], "group_size": 64}}, "device": "cpu", "model_sha256": "cb96",
           "budget": 40.0, "version": "0.1.0"}
    (tmp_path / CONFIG).write_text(json.dumps(old))
    cfg = RunConfig.read(tmp_path)
    assert cfg.confidence == 0.0 and cfg.fidelity is None  # point estimates, every plan on all of val
    assert cfg.compressors == ("quantize",) and cfg.budget == 40.0 and cfg.seed == 1
    quantize = make_compressors(cfg)[0]
    # A record without a version is version 1: what it leaves out means the defaults then (nearest, no norms).
    assert quantize.opts.rounding == ("nearest",) and quantize.opts.norm_images == 0 and quantize.bits == (8, 4)
    assert quantize.options()["version"] == 2


def test_a_run_folder_resumes_as_it_was_written(tmp_path: Path) -> None:
    """run.json holds each record's JSON as before records were held: read back it compares equal (nothing redone)."""
    cfg = RunConfig(compressors=("quantize", "prune"), options={"quantize": {"bits": [8]}, "prune": {}})
    cfg.write(tmp_path)
    saved = json.loads((tmp_path / CONFIG).read_text())
    assert saved["compressors"]["quantize"] == {**default_options()["quantize"].to_json(), "bits": [8]}
    assert RunConfig.read(tmp_path).to_json() == saved == cfg.to_json()
    RunConfig.read(tmp_path).check_resumes(tmp_path)
    with pytest.raises(ConfigError, match="compressors="):
        RunConfig.read(tmp_path).replace(bits=[4]).check_resumes(tmp_path)


@pytest.mark.parametrize(("change", "words"), [
    ({"seed": "0"}, "seed"),
    ({"compressors": ["quantize"]}, "compressors"),
    ({"compressors": {"quantize": {"bits": "8,4"}}}, "compressors.quantize.bits"),
    ({"strategy": "nope"}, "nope"),
    ({"fidelity": {"stages": [2.0]}}, "run.json"),
])
def test_a_damaged_record_is_one_load_error(tmp_path: Path, change: dict, words: str) -> None:
    raw = {**RunConfig(compressors=("quantize",)).to_json(), **change}
    (tmp_path / CONFIG).write_text(json.dumps(raw))
    with pytest.raises(LoadError) as info:
        RunConfig.read(tmp_path)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_not_a_run_folder(tmp_path: Path) -> None:
    with pytest.raises(LoadError, match="not a modelopt run folder"):
        RunConfig.read(tmp_path)
    (tmp_path / CONFIG).write_text("[1, 2]")
    with pytest.raises(LoadError, match="no run settings"):
        RunConfig.read(tmp_path)


@pytest.mark.slow
def test_build_returns_the_parts_and_a_resolved_record(small_workload) -> None:
    cfg = RunConfig(strategy="random", min_retention=0.9, options={"quantize": {"bits": [8, 4]}})
    built = build(cfg, small_workload)
    assert built.workload is small_workload and built.space is built.evaluator.space
    assert built.config.compressors == tuple(built.space.compressors) == ("prune", "quantize")
    assert built.config.options["quantize"].bits == (8, 4)
    assert built.config.fingerprints == small_workload.fingerprints()
    assert built.config.device == "cpu" and built.config.data == str(small_workload.data.source)
    (plan,) = built.strategy.ask()
    assert set(dict(plan.choices)) == {d.name for d in built.space.decisions}


def test_optimize_takes_a_config_and_refuses_a_setting_beside_it(small_workload, tmp_path: Path) -> None:
    cfg = RunConfig(strategy="random", budget=2, min_retention=0.9, compressors=("quantize",),
                    options={"quantize": {"bits": [8]}}, fidelity=Fidelity(), latency=None)
    with pytest.raises(ConfigError, match="'budget' was passed beside a RunConfig"):
        modelopt.optimize(cfg, budget=5, out=tmp_path / "refused", reconstruct=False)
    result = modelopt.api.run(cfg, workload=small_workload, out=tmp_path / "run", report=False, progress=False)
    saved = RunConfig.read(result.run_dir)
    assert saved.options["quantize"].to_json() == {**default_options()["quantize"].to_json(), "bits": [8]}  # in full
    ran = dataclasses.replace(cfg, model="cifar10_resnet20", data=str(small_workload.data.source), device="cpu",
                              fingerprints=small_workload.fingerprints())
    assert dataclasses.replace(saved, options=cfg.options) == ran
    assert result.budget_used >= 2


def test_replace_is_the_one_override_path() -> None:
    """Fields and compressors' settings by name; a setting merges into its compressor's options."""
    cfg = RunConfig().replace(budget=50, strategy="random", bits=(8, 4), rounding="nearest")
    assert (cfg.budget, cfg.strategy) == (50, "random")
    assert cfg.options["quantize"].bits == (8, 4) and cfg.options["quantize"].rounding == ("nearest",)
    assert cfg.options["quantize"].granularity == RunConfig().options["quantize"].granularity  # kept
    assert RunConfig().replace(objective="bitops").options["quantize"].activations == (None, 8)
    assert RunConfig().options["quantize"].activations == (None,)  # float inputs where they lower nothing
    assert RunConfig().replace(bits=[4]).replace(objective="bitops").options["quantize"].bits == (4,)  # given: kept
    assert all(isinstance(o, COMPRESSORS.get(n).record) for n, o in cfg.options.items())  # records, not JSON


@pytest.mark.parametrize(("changes", "words"), [
    ({"budgte": 3}, "'budgte'"),
    ({"bits": "eight"}, "bits expects a list of integers"),
    ({"bits": [9]}, "9"),
    ({"exit_data": "train.npz"}, "--exit-data (exit_data) is a setting of compressor 'early_exit', which this run "
                                 "does not use"),
])
def test_replace_refuses_in_one_line(changes: dict, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        RunConfig().replace(**changes)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_a_setting_reaches_its_compressor() -> None:
    cfg = RunConfig(compressors=("early_exit", "quantize")).replace(exit_data="train.npz", exit_images=64)
    assert cfg.options["early_exit"] == default_options()["early_exit"].replace(exit_data="train.npz", exit_images=64)
    (early_exit,) = [c for c in make_compressors(cfg) if c.name == "early_exit"]
    assert early_exit.options()["exit_data"] == "train.npz" and early_exit.options()["exit_images"] == 64


def test_a_format_1_record_keeps_its_early_exit_images(tmp_path: Path) -> None:
    """Format 1 kept early exit's images at the top level; they are early exit's options now."""
    raw = RunConfig(compressors=("early_exit", "prune")).to_json()
    raw.update(format=1, exit_data={"path": "train.npz", "images": 500})
    (tmp_path / CONFIG).write_text(json.dumps(raw))
    cfg = RunConfig.read(tmp_path)
    assert cfg.options["early_exit"] == default_options()["early_exit"].replace(exit_data="train.npz",
                                                                                exit_images=500)


def test_latency_menus_offer_what_an_engine_can_run_fast() -> None:
    options = RunConfig(objective="latency").options
    assert options["quantize"].bits == (8,) and options["quantize"].granularity == ("per_channel",)
    assert options["quantize"].activations == (None, 8) and options["prune"].kind == ("structured",)
    assert options["prune"].channel_multiple == 16  # counts integer kernels run fast
    assert RunConfig().options["prune"].sparse_images == RunConfig().options["prune"].repair_images == 256
    assert RunConfig().options["quantize"].bits == (8, 4, 3)


@pytest.mark.parametrize(("fmt", "says"), [(99, "written by a newer modelopt"), (-1, "changed by hand"),
                                           ("two", "changed by hand")])
def test_a_run_json_format_this_modelopt_does_not_know_is_refused(tmp_path, fmt, says) -> None:
    """A run folder whose run.json says format 99 (a newer modelopt) was read silently and scored."""
    RunConfig().write(tmp_path)
    doc = json.loads((tmp_path / "run.json").read_text())
    (tmp_path / "run.json").write_text(json.dumps({**doc, "format": fmt, "version": "99.0.0"}))
    with pytest.raises(LoadError, match=f"format .*{says}"):
        RunConfig.read(tmp_path)


@pytest.mark.parametrize(("version", "says"), [(99, "written by a newer modelopt"), (0, "changed by hand")])
def test_an_options_version_says_what_is_true_of_it(version, says) -> None:
    """Options version 0 was called "written by a newer modelopt"."""
    from modelopt.compressors import COMPRESSORS

    record = COMPRESSORS.get("quantize").record
    with pytest.raises(ConfigError, match=says):
        record.from_json({"version": version})


@pytest.mark.parametrize(("field", "value", "says"), [("clip_ratios", ["a"], "clip_ratios must be fractions"),
                                                      ("act_percentile", "x", "act_percentile must be a number")])
def test_a_hand_edited_quantize_number_in_run_json_is_one_line_naming_run_json(tmp_path, field, value, says) -> None:
    raw = RunConfig().to_json()
    raw["options"]["quantize"][field] = value
    (tmp_path / CONFIG).write_text(json.dumps(raw))
    with pytest.raises(LoadError, match=says) as info:
        RunConfig.read(tmp_path)
    assert "run.json" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(("compressor", "field", "value", "says"), [
    ("quantize", "bits", 4, r"options of quantize: bits must be a list, e\.g\. \[4\]; got 4"),
    ("prune", "kind", "structured", r"options of prune: kind must be a list, e\.g\. \[\"structured\"\]"),
])
def test_one_value_where_run_json_wants_a_list_names_the_field_and_the_list_form(
        tmp_path, compressor, field, value, says) -> None:
    """`bits: 4` was "'int' object is not iterable"; `kind: "structured"` was "kind 's' not offered"."""
    raw = RunConfig(compressors=("quantize", "prune")).to_json()
    raw["compressors"][compressor][field] = value
    (tmp_path / CONFIG).write_text(json.dumps(raw))
    with pytest.raises(LoadError, match=says) as info:
        RunConfig.read(tmp_path)
    assert "\n" not in str(info.value)
