"""Random option values on the command line: `modelopt optimize` and `evaluate` answer exit code 2 with
one `error:` line (or typer's usage message for a value of the wrong type), never a traceback; and what
can be checked without the model (budget, floor, confidence, split, names, run folder, plan file) is
refused before it loads.

No model loads here: `api.build_workload` (evaluate) and `modelopt.config.build.load_workload` (optimize) are
replaced by a stand-in that stops the command with a marker error, so a value that passes every
early check ends there.
"""

from __future__ import annotations

import json
import math
from contextlib import chdir
from pathlib import Path

import pytest
from _props import FAST, yaml_values
from hypothesis import event, example, given
from hypothesis import strategies as st
from typer.testing import CliRunner

import modelopt.api
import modelopt.config.build
from modelopt.cli.app import app
from modelopt.compressors import COMPRESSORS
from modelopt.data.dataset import SPLIT_NAMES
from modelopt.errors import ModeloptError
from modelopt.objective import Target
from modelopt.search import STRATEGIES

REACHED = "reached model loading"
runner = CliRunner()


class _Reached(ModeloptError):
    pass


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model stops the command with the marker error."""

    def build_workload(*args, **kwargs):
        raise _Reached(REACHED)

    monkeypatch.setattr(modelopt.api, "build_workload", build_workload)
    monkeypatch.setattr(modelopt.config.build, "load_workload", build_workload)


def _folder(tmp_path_factory) -> Path:
    """A fresh folder per example (relative --out and --plan paths land there) with a file and a plan."""
    folder = tmp_path_factory.mktemp("cli")
    (folder / "a_file").write_text("not a folder")
    (folder / "plan.yaml").write_text("default: {quantize: {bits: 8}}\n")
    return folder


NUMBERS = st.one_of(
    st.floats().map(repr), st.integers(-5, 5).map(str), st.floats(-0.5, 1.5).map(lambda f: f"{f:.3f}"),
    st.sampled_from(["nan", "NaN", "inf", "-inf", "1e400", "-0", "0", "1", "0.99", "0.95", "1.5", "-1", "0x10", "1_000",
                     " 1", "", "\uff11", "1,5", "1e-400", "True"]),  # U+FF11: a fullwidth 1, which float() reads
    st.text(max_size=8))
NAMES = st.one_of(st.text(max_size=12), st.sampled_from(["", ",", "quantize", "prune,quantize", "early_exit",
                                                         "quantise", " quantize , prune", "quantize,,", "é", "\x00"]))


def _mostly(valid: list[str], other: st.SearchStrategy) -> st.SearchStrategy:
    """One of `valid` three times in four, else `other`: some commands pass every early check."""
    return st.integers(0, 3).flatmap(lambda i: other if i == 0 else st.sampled_from(valid))


def _float(text: str) -> float | None:
    """What a number option holds after typer parses `text`, when Python reads it the same way."""
    try:
        return float(text)
    except ValueError:
        return None


def _check(result, *, early: bool) -> str:
    """Exit 2, one `error:` line or a usage message, no traceback; `early`: refused before the model."""
    assert result.exit_code == 2, (result.exit_code, result.output, repr(result.exception))
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    if lines and lines[0].startswith("Usage:"):
        event("usage error (typer)")
        return "usage"
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    if early:
        assert REACHED not in lines[0], (lines[0], result.stderr)
    event("reached model loading" if REACHED in lines[0] else "refused early")
    return lines[0]


@FAST
@given(budget=_mostly(["1", "4", "200.5"], NUMBERS), floor=_mostly(["0.9", "0.99", "1", "0"], NUMBERS),
       confidence=_mostly(["0.95", "0", "0.5"], NUMBERS),
       out=_mostly(["run", "runs/r1", "é"],
                   st.one_of(st.text(max_size=10), st.sampled_from(["a_file", "a_file/x", "."]))),
       strategy=_mostly(STRATEGIES.names(), st.text(max_size=8)),
       objective=_mostly([t.value for t in Target], st.text(max_size=8)),
       compressors=_mostly(["quantize", "prune,quantize", "early_exit"], NAMES),
       seed=_mostly(["0", "7", str(2**64)], NUMBERS))
@example(budget="nan", floor="0.99", confidence="0.95", out="run", strategy="mcts", objective="size",
         compressors="quantize", seed="0")
@example(budget="inf", floor="0.99", confidence="0.95", out="run", strategy="mcts", objective="size",
         compressors="quantize", seed="0")
@example(budget="10", floor="1.5", confidence="0.95", out="run", strategy="mcts", objective="size",
         compressors="quantize", seed="0")
@example(budget="10", floor="0.99", confidence="0.95", out="a_file", strategy="mcts", objective="size",
         compressors="quantize", seed="0")
@example(budget="10", floor="0.99", confidence="0.95", out="run", strategy="mcts", objective="size",
         compressors="quantize", seed="-1")  # found: a ValueError traceback from numpy once the model had loaded
def test_optimize_answers_random_values_in_one_line_and_checks_them_before_loading(
        no_model, tmp_path_factory, budget, floor, confidence, out, strategy, objective, compressors, seed):
    args = ["optimize",
        "--reconstruct", "off", "--budget", budget, "--min-retention", floor, "--confidence", confidence, "--out", out,
            "--strategy", strategy, "--objective", objective, "--compressors", compressors, "--seed", seed,
            "--no-progress"]
    b, f, c = _float(budget), _float(floor), _float(confidence)
    k = int(seed) if seed.strip().lstrip("-").isascii() and seed.strip().lstrip("-").isdigit() else None
    names = [n.strip() for n in compressors.split(",") if n.strip()]
    bad = (
        (b is not None and not 0 < b < math.inf)
        or (f is not None and not 0 <= f <= 1)
        or (c is not None and not 0 <= c < 1)
        or strategy not in STRATEGIES
        or objective not in {t.value for t in Target}
        or not names or any(n not in COMPRESSORS for n in names)
        or out.startswith("a_file")
        or (k is not None and k < 0)
    )
    with chdir(_folder(tmp_path_factory)):
        _check(runner.invoke(app, args), early=bad)


@FAST
@given(split=_mostly(list(SPLIT_NAMES), st.one_of(st.text(max_size=8), st.sampled_from(["", "VAL", " val", "all,"]))),
       plan=_mostly(["plan.yaml"], st.one_of(st.sampled_from(["missing.yaml", ".", "a_file"]), st.text(max_size=10))),
       plan_text=st.one_of(st.none(), st.text(max_size=60), st.sampled_from(["[1, 2]", "{", "default: 3", "\x1f"])),
       rounding=_mostly(["gptq", "nearest", "gptq,nearest"], st.text(max_size=8)))
@example(split="tset", plan="plan.yaml", plan_text=None, rounding="gptq")
@example(split="val", plan="missing.yaml", plan_text=None, rounding="gptq")
def test_evaluate_answers_random_values_in_one_line_and_checks_them_before_loading(no_model, tmp_path_factory, split,
                                                                                   plan, plan_text, rounding):
    folder = _folder(tmp_path_factory)
    if plan_text is not None and plan not in ("", ".", "a_file", "missing.yaml") and "\x00" not in plan \
            and "/" not in plan:
        try:
            (folder / plan).write_text(plan_text, encoding="utf-8")
        except OSError:  # a name the file system refuses
            pass
    with chdir(folder):
        result = runner.invoke(app, ["evaluate", "--split", split, "--plan", plan, "--rounding", rounding])
    names = [n.strip() for n in rounding.split(",") if n.strip()]
    bad_rounding = not names or any(n not in ("gptq", "nearest") for n in names)
    line = _check(result, early=split not in SPLIT_NAMES or bad_rounding or plan in ("missing.yaml", ".", "a_file"))
    if split not in SPLIT_NAMES and not bad_rounding and line != "usage":
        assert "split" in line, line  # checked before the plan file


RUN_KEYS = ("model", "weights", "data", "strategy", "seed", "objective", "min_retention", "confidence", "count_gains",
            "compressors", "exit_data", "budget")
JSON = yaml_values((*RUN_KEYS, "quantize", "bits", "granularity", "rounding", "activations", "path", "images"))
QUANTIZE = st.fixed_dictionaries({}, optional={k: st.one_of(JSON, st.lists(st.sampled_from([8, 4, None, "group"])))
                                               for k in ("bits", "granularity", "rounding", "activations")})
RUN_JSON = st.one_of(
    JSON,
    st.fixed_dictionaries({}, optional={
        **{k: JSON for k in RUN_KEYS},
        "compressors": st.one_of(JSON, st.dictionaries(st.sampled_from(["quantize", "prune", "x"]),
                                                       st.one_of(QUANTIZE, JSON), max_size=2)),
        "exit_data": st.one_of(JSON, st.fixed_dictionaries({}, optional={"path": JSON, "images": JSON})),
    }))


@FAST
@given(config=RUN_JSON, raw=st.one_of(st.none(), st.binary(max_size=40)))
@example(config={"compressors": ["quantize"]}, raw=None)
@example(config={"compressors": {"quantize": {"bits": 8}}}, raw=None)
@example(config={"exit_data": "x.npz"}, raw=None)
def test_resuming_a_run_folder_with_a_damaged_run_json_is_one_line(no_model, tmp_path_factory, config, raw):
    """What a resume reads back from run.json before loading is checked (these were AttributeError and
    TypeError tracebacks)."""
    folder = _folder(tmp_path_factory)
    (folder / "run").mkdir()
    run_json = folder / "run" / "run.json"
    if raw is None:
        run_json.write_text(json.dumps(config), encoding="utf-8")
    else:
        run_json.write_bytes(raw)
    with chdir(folder):
        _check(runner.invoke(app, ["optimize",
            "--reconstruct", "off", "--resume", "--out", "run", "--no-progress"]), early=False)
