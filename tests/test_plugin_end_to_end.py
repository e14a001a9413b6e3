"""A compressor written only in this file runs through search, export, reload, report and the
Optuna export, with no edit anywhere else (issue 14: the compressor contract is complete).

The toy rounds a layer's weights to one decimal (a step of float16's 0.1, so export stores them
exactly as int8 codes times one float16 scale).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

import modelopt
from modelopt.compressors import COMPRESSORS, Cell, Compressor, Options, ReportColumn, SettingKind, option
from modelopt.compressors.contract import Choice, Granularity, IntegerWeight, Precision, WeightForm
from modelopt.config.run_config import RunConfig
from modelopt.errors import ConfigError
from modelopt.model.layer_inputs import LayerInputs
from modelopt.model.layers import Layer
from modelopt.run.export import resolve
from modelopt.run.optuna_storage import export_run
from modelopt.run.run_folder import read_run

# One test process runs the module's tests one after another (xdist_group): `toy_run` is module-scoped (the toy is
# registered for this module only), and a test process that ran another module's test in between rebuilt it.
pytestmark = pytest.mark.xdist_group("plugin_toy")

STEP = float(torch.tensor(0.1, dtype=torch.float16))  # 0.0999755859375: what a float16 scale holds
ON = "1dp"


@dataclasses.dataclass(frozen=True)
class RoundOptions(Options):
    """Its options record: one field, its own flag (--decimals), sweep-file key and optimize keyword."""

    decimals: int = option(1, SettingKind.INT, "Decimals weights are rounded to (1 only).")

    def check(self) -> None:  # the record refuses a bad value however it is built: the plugin only reads it
        if self.decimals != 1:
            raise ConfigError(f"round1 rounds to 1 decimal, not {self.decimals!r}")


class RoundOneDecimal(Compressor):
    """Rounds every weight of a layer to a multiple of 0.1 (int8 codes, one scale per tensor)."""

    order = 30  # after pruning: it rounds the kept weights
    record = RoundOptions  # its settings, and its own report column
    opts: RoundOptions
    report_columns = (ReportColumn("decimals", "Greens", lambda raw: Cell("–", None) if raw is None
                                   else Cell("1 dp", 0.5)),)  # raw: the choice's JSON form, "1dp"

    def menu(self, layer: Layer) -> tuple[Choice, ...]:
        return (None, ON)

    def parse(self, raw: Mapping[str, Any] | None, layer: Layer) -> Choice:
        if raw is None:
            return None
        if dict(raw) != {"decimals": 1}:
            raise ConfigError(f"round1 takes {{decimals: 1}}, got {dict(raw)!r}")
        return ON

    def dump(self, choice: Choice) -> dict[str, Any] | None:
        return None if choice is None else {"decimals": 1}

    def apply(self, weight: torch.Tensor, choice: Choice) -> torch.Tensor:
        if choice is None:
            return weight
        return (weight / STEP).round().clamp(-127, 127) * STEP

    def weight_bytes(self, layer: Layer, choice: Choice) -> int:
        return layer.params + 2  # an int8 code per weight and one float16 scale

    def pack(self, form: WeightForm, choice: Choice, inputs: LayerInputs | None = None) -> WeightForm:
        if choice is None:
            return form
        codes = (form.weight / STEP).round().clamp(-127, 127).to(torch.int8)
        integer = IntegerWeight(codes, torch.tensor([STEP], dtype=torch.float16), 8, Granularity.PER_TENSOR)
        return WeightForm(integer.dequantize().to(form.weight.dtype), form.mask, integer)

    def precision(self, choice: Choice) -> Precision:
        return Precision() if choice is None else Precision(weight=8)


@pytest.fixture(scope="module")
def toy() -> Iterator[type[Compressor]]:
    COMPRESSORS.register("round1")(RoundOneDecimal)
    yield RoundOneDecimal
    COMPRESSORS._items.pop("round1")  # other tests see the registry as shipped


@pytest.fixture(scope="module")
def toy_run(toy, small_workload, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("toy") / "run"
    config = RunConfig(strategy="random", budget=6, seed=0, min_retention=0.5, confidence=0.0,
                       compressors=("round1",), options={}, latency=None)
    modelopt.api.run(config, workload=small_workload, out=out, progress=False, report=False)
    return out


def _a_rounding_trial(run_dir: Path) -> int:
    records = read_run(run_dir).records
    return next(r.number for r in records if r.ok and any(v is not None for v in r.plan.values()))


def test_search_journals_and_records_the_plugin(toy_run: Path) -> None:
    run = read_run(toy_run)
    assert run.done and len(run.records) >= 3 and all(r.ok for r in run.records)
    assert run.run_config is not None and run.run_config.compressors == ("round1",)
    assert {name.rsplit("/", 1)[1] for name in run.records[0].plan} == {"round1"}


def test_report_sizes_each_layer_as_the_evaluator_did(toy_run: Path) -> None:
    run = read_run(toy_run)
    for record in run.records:
        assert run.size_bytes(record) == record.metrics.size_bytes  # the report's layer bytes add up


def test_export_and_reload_give_the_scored_model(toy_run: Path, small_workload, tmp_path: Path) -> None:
    number = _a_rounding_trial(toy_run)
    path = modelopt.export(toy_run, plan=number, out=tmp_path / "toy.pt")
    source = resolve(toy_run, number)  # the evaluator a run folder rebuilds
    ev, plan = source.evaluator, source.plan
    net = modelopt.load(path)
    x = small_workload.split("val").x[:64]
    want = ev.states.logits(plan, x)
    with torch.inference_mode():
        got = net(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    record = next(r for r in read_run(toy_run).records if r.number == number)
    assert math.isclose(ev.plan_cost(plan).size_bytes, record.metrics.size_bytes)


def test_onnx_export_runs_the_plugins_codes(toy_run: Path, small_workload, tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    import onnx
    import onnxruntime as ort

    number = _a_rounding_trial(toy_run)
    path = modelopt.export(toy_run, plan=number, format="onnx", out=tmp_path / "toy.onnx")
    onnx.checker.check_model(onnx.load(str(path)))
    source = resolve(toy_run, number)
    x = small_workload.split("val").x[:64]
    want = source.evaluator.states.logits(source.plan, x).argmax(1).numpy()
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0].argmax(1)
    assert (got == want).mean() >= 0.95


def test_html_report_and_optuna_export(toy_run: Path, tmp_path: Path) -> None:
    pytest.importorskip("optuna")
    copy = tmp_path / "run"
    copy.mkdir()
    for f in toy_run.iterdir():
        if f.is_file():
            (copy / f.name).write_bytes(f.read_bytes())
    paths = modelopt.report(copy)
    assert "| decimals |" in paths.markdown.read_text(encoding="utf-8")  # its own column in the per-layer map
    assert paths.html.is_file()
    done = export_run(copy, f"sqlite:///{tmp_path / 'studies.db'}")
    assert done.added == len(read_run(copy).records)
    summary = json.loads((copy / "summary.json").read_text())
    assert summary["config"]["compressors"] == {"round1": {"decimals": 1, "version": 1}}
    assert dataclasses.is_dataclass(read_run(copy).run_config)


def test_its_flag_reaches_it_from_the_command_line(toy, small_data, tmp_path: Path) -> None:
    """`--decimals` exists because the toy declares it: refused by the toy in one line, taken when right."""
    from typer.testing import CliRunner

    from modelopt.cli.app import app
    from modelopt.testing.cli import assert_one_line_error

    args = ["optimize", "--reconstruct", "off", "--compressors", "round1", "--data", str(small_data), "--strategy",
            "random", "--budget", "2", "--min-retention", "0.5", "--confidence", "0", "--latency", "none",
            "--no-progress"]
    assert "--decimals" in CliRunner().invoke(app, ["optimize", "--help"]).stdout
    assert_one_line_error(CliRunner().invoke(app, [*args, "--decimals", "2", "--out", str(tmp_path / "no")]),
                          "round1 rounds to 1 decimal, not 2")
    result = CliRunner().invoke(app, [*args, "--decimals", "1", "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert RunConfig.read(tmp_path / "run").options["round1"].to_json() == {"decimals": 1, "version": 1}


def test_its_sweep_key_reaches_it_from_a_sweep_file(toy, tmp_path: Path) -> None:
    from modelopt.sweep import load_sweep

    text = ("name: t\nmodels: [{name: r20, model: cifar10_resnet20}]\nstrategies: [random]\nbudgets: [2]\n"
            "seeds: [0]\ncompressors: [round1]\ndecimals: DECIMALS\n")
    (tmp_path / "good.yaml").write_text(text.replace("DECIMALS", "1"))
    sweep = load_sweep(tmp_path / "good.yaml")
    assert sweep.settings["decimals"] == 1 and sweep.config.options["round1"].to_json() == {"decimals": 1, "version": 1}
    (tmp_path / "bad.yaml").write_text(text.replace("DECIMALS", "2"))
    with pytest.raises(ConfigError, match=r"line 7, key 'decimals': round1 rounds to 1 decimal, not 2"):
        load_sweep(tmp_path / "bad.yaml")
