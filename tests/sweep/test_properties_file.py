"""Random sweep files: each loads as a sweep whose settings are sane and can be written, or is one
`ConfigError` line naming the file; never another exception (a traceback on the CLI)."""

from __future__ import annotations

import json
import math

import yaml
from _props import FAST, SCALARS, yaml_values
from hypothesis import event, example, given
from hypothesis import strategies as st

from modelopt.errors import ConfigError, ModeloptError
from modelopt.sweep import load_sweep

KEYS = ("name", "out", "models", "strategies", "budgets", "seeds", "objective", "min_retention", "confidence",
        "compressors", "bits", "granularity", "rounding", "device")
WORDS = (*KEYS, "model", "weights", "data", "resnet20", "cifar10_resnet20", "cifar10-sample", "random", "mcts", "tpe",
         "size", "macs", "bitops", "quantize", "prune", "per_channel", "group", "gptq", "nearest", "cpu", "auto",
         "cuda:0", "cuda:-1", "tpu", "weights.pt", "data.npz", "../x", "/", ".", "a/b")
VALUES = yaml_values(WORDS)
NEAR = st.one_of(st.sampled_from([0, 1, 2, -1, 0.5, 0.99, 1.0, 1.5, 1e309, float("nan"), "1", True, None, 8, 4, 2**40]),
                 st.floats(-2, 2), st.sampled_from(WORDS), SCALARS)


def _mostly(valid: st.SearchStrategy) -> st.SearchStrategy:
    """`valid`, but one time in sixteen a near miss instead."""
    return st.integers(0, 15).flatmap(lambda i: st.one_of(NEAR, VALUES) if i == 0 else valid)


def _list(item: st.SearchStrategy) -> st.SearchStrategy:
    return _mostly(st.lists(item, min_size=1, max_size=3, unique_by=repr))


MODEL = st.fixed_dictionaries(
    {"name": _mostly(st.sampled_from(["resnet20", "r20", "m.1"])),
     "model": _mostly(st.sampled_from(["cifar10_resnet20", "torchvision:resnet18", "pkg.mod:make", "model.pt"]))},
    optional={"weights": _mostly(st.just("weights.pt")),
              "data": _mostly(st.sampled_from(["cifar10-sample", "data.npz"]))})
VALIDISH = st.fixed_dictionaries({
    "name": _mostly(st.sampled_from(["t", "sweep", "é"])),
    "models": _mostly(st.lists(MODEL, min_size=1, max_size=2, unique_by=lambda m: repr(m["name"]))),
    "strategies": _list(_mostly(st.sampled_from(["random", "mcts", "knapsack"]))),
    "budgets": _list(_mostly(st.floats(0.1, 500) | st.integers(1, 500))),
    "seeds": _list(_mostly(st.integers(0, 5))),
}, optional={
    "out": _mostly(st.sampled_from(["results", "a/b", "."])),
    "objective": _mostly(st.sampled_from(["size", "macs", "bitops", "latency"])),
    "min_retention": _mostly(st.floats(0, 1)),
    "confidence": _mostly(st.floats(0, 0.999)),
    "compressors": _list(_mostly(st.sampled_from(["quantize", "prune", "early_exit"]))),
    "bits": _list(_mostly(st.sampled_from([8, 4, 3, 2]))),
    "granularity": _list(_mostly(st.sampled_from(["per_channel", "group", "per_tensor"]))),
    "rounding": _list(_mostly(st.sampled_from(["gptq", "nearest"]))),
    "device": _mostly(st.sampled_from(["cpu", "auto"])),
})
SHAPED = st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=6)), st.one_of(NEAR, VALUES), max_size=8)
SWEEP_DOCS = st.integers(0, 3).flatmap(lambda i: VALIDISH if i < 2 else SHAPED if i == 2 else VALUES)


def _load_or_clean_error(path):
    try:
        sweep = load_sweep(path)
    except ModeloptError as exc:
        assert isinstance(exc, ConfigError), repr(exc)
        assert str(exc).startswith("sweep file ") and "\n" not in str(exc), repr(str(exc))
        event("refused")
        return None
    event("loaded")
    return sweep


def _sane(sweep) -> None:
    assert sweep.models and sweep.strategies and sweep.budgets and sweep.seeds
    assert list(sweep.budgets) == sorted(sweep.budgets) and all(0 < b < math.inf for b in sweep.budgets)
    assert all(isinstance(k, int) and k >= 0 for k in sweep.seeds)
    assert 0 <= sweep.config.min_retention <= 1 and 0 <= sweep.config.confidence < 1
    json.dumps(sweep.to_json(), allow_nan=False)  # sweep.json can be written
    for cell in sweep.cells():  # nothing on disk yet: every cell to do, inside the sweep's folder
        assert cell.status == "todo" and sweep.out in cell.run_dir.parents


@FAST
@given(doc=SWEEP_DOCS)
@example(doc={"name": "t", "models": [{"name": "r20", "model": "cifar10_resnet20"}], "strategies": ["random"],
              "budgets": [1], "seeds": [0], "device": "cpu"})
# What this test found (an OverflowError and a ValueError traceback before the fix):
@example(doc={"name": "t", "models": [{"name": "r20", "model": "cifar10_resnet20"}], "strategies": ["random"],
              "budgets": [1], "seeds": [0], "min_retention": 10**400})
@example(doc={"name": "t", "models": [{"name": "r20", "model": "cifar10_resnet20"}], "strategies": ["random"],
              "budgets": [1], "seeds": [0], "confidence": 10**400})
@example(doc={"name": "\x00", "models": [{"name": "r20", "model": "cifar10_resnet20"}], "strategies": ["random"],
              "budgets": [1], "seeds": [0]})
def test_a_random_sweep_document_loads_sanely_or_is_one_clean_error(tmp_path_factory, doc):
    folder = tmp_path_factory.mktemp("sweep")
    (folder / "weights.pt").write_bytes(b"")
    (folder / "model.pt").write_bytes(b"")
    (folder / "data.npz").write_bytes(b"")
    path = folder / "s.yaml"
    try:
        path.write_text(yaml.safe_dump(doc, allow_unicode=True), encoding="utf-8")
    except yaml.YAMLError:
        return  # not representable as YAML
    sweep = _load_or_clean_error(path)
    if sweep is not None:
        _sane(sweep)


LINES = ["name: t", "models:", "  - name: r20", "    model: cifar10_resnet20", "strategies: [random]", "budgets: [1]",
         "seeds: [0]", "budgets: [.nan]", "seeds: [-1]", "device: cpu", "? [a]", ": b", "&x 1", "*x", "*y", "{", "]",
         "!!python/object/apply:os.system ['true']", "!!binary AAAA", "!!set {a}", "%TAG ! tag:x,2000:", "---", "...",
         "\t", "- a", "name: !!str", "out: 2000-01-01", "budgets: [0x10, 1_0, 1e3, .inf]"]


@FAST
@given(text=st.one_of(st.text(max_size=200), st.lists(st.sampled_from(LINES), max_size=10).map("\n".join)),
       raw=st.binary(max_size=64))
def test_random_text_or_bytes_as_a_sweep_file_is_one_clean_error_or_loads(tmp_path_factory, text, raw):
    folder = tmp_path_factory.mktemp("sweep")
    for path, write in ((folder / "t.yaml", lambda p: p.write_text(text, encoding="utf-8")),
                        (folder / "b.yaml", lambda p: p.write_bytes(raw))):
        write(path)
        sweep = _load_or_clean_error(path)
        if sweep is not None:
            _sane(sweep)
