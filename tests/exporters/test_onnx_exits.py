"""An early-exit plan exported to ONNX: a folder of segments that return early, with a predict.py that needs only
onnxruntime (or openvino) and numpy. Run in a subprocess that never imports torch or modelopt, it gives the
answers and exit points the engine gave when the plan was scored in it (what the run certified), which are
near the PyTorch simulation's (integer kernels aside)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from modelopt.api import build_compressors
from modelopt.errors import ConfigError
from modelopt.evaluation.evaluator import Evaluator
from modelopt.exporters.exit_predictor import Predictor
from modelopt.exporters.onnx import export_onnx
from modelopt.exporters.onnx_exits import export_onnx_exits
from modelopt.latency import ENGINES, LatencySpec
from modelopt.latency.plan import PlanLatency
from modelopt.plan.space import SearchSpace
from modelopt.testing.engines import check_engine

pytest.importorskip("onnxruntime")
# One test process for the module: its evaluator's exit heads (fitted on 2,000 images) are fitted once, not in each.
pytestmark = pytest.mark.xdist_group("onnx_exits")

# A low threshold early in the network and one later, so images leave at both exits and run to the end.
EXITS = {"early_exit": {"exits": {"layer1.2": 0.8, "layer2.2": 0.9}}}


@pytest.fixture(scope="session")
def ev(resnet20_workload) -> Evaluator:
    # The plan's two exits are the only candidates: two heads are fitted, not eight.
    options = {"quantize": {"bits": [8], "granularity": ["per_channel"], "activations": [None, 8],
                            "rounding": ["nearest"], "norm_images": 0},
               "early_exit": {"exits": [f"{block}.conv2" for block in EXITS["early_exit"]["exits"]],
                              "blocks": list(EXITS["early_exit"]["exits"])}}
    wl = resnet20_workload
    return Evaluator(wl, SearchSpace(wl.layers, build_compressors(["quantize", "early_exit"], options, model=wl.model)))


@pytest.fixture(scope="session")
def plan(ev):
    return ev.space.parse_plan({"default": {"quantize": {"bits": 8, "activations": 8}}, **EXITS})


@pytest.fixture(scope="session")
def exported(ev, plan, tmp_path_factory) -> Path:
    """The plan's folder, exported once (three segments through torch.onnx each time) for the tests that read it;
    a test that changes it changes a copy."""
    return export_onnx_exits(ev, plan, tmp_path_factory.mktemp("exits") / "r20-exits").path


@pytest.mark.slow
def test_an_exit_plan_runs_without_modelopt_as_the_engine_scored_it(ev, plan, exported, tmp_path) -> None:
    folder = exported
    manifest = json.loads((folder / "exits.json").read_text())
    assert [s.get("exit") for s in manifest["segments"]] == ["layer1.2", "layer2.2", None]
    assert sorted(p.name for p in folder.iterdir()) == ["exits.json", "predict.py", "segment0.onnx",
                                                         "segment1.onnx", "segment2.onnx"]
    x = ev.workload.split("test").x.tensor()
    np.save(tmp_path / "x.npy", x.numpy())
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(folder)!r})
        import numpy as np
        from predict import Predictor
        logits, exit_at = Predictor({str(folder)!r}, threads=1).run_with_exits(np.load({str(tmp_path / 'x.npy')!r}))
        np.save({str(tmp_path / 'logits.npy')!r}, logits); np.save({str(tmp_path / 'exits.npy')!r}, exit_at)
        assert not {{"torch", "modelopt"}} & set(sys.modules), "predict.py imported torch or modelopt"
    """)
    # -B: importing predict.py writes no __pycache__ into the folder the other tests share
    subprocess.run([sys.executable, "-B", "-c", script], check=True, cwd=tmp_path, timeout=300)
    logits, exit_at = np.load(tmp_path / "logits.npy"), np.load(tmp_path / "exits.npy")

    timer = PlanLatency(ev, LatencySpec("onnxruntime", batch_size=1, warmup=1, repeats=3))
    scored, scored_exits = timer.answers(plan, x)  # as a run that measures latency in ONNX Runtime scores it
    assert np.array_equal(logits.argmax(1), scored.argmax(1).numpy())
    assert np.array_equal(exit_at, scored_exits.numpy())
    assert set(np.unique(exit_at)) == {0, 1, 2}  # images leave at both exits and run to the end

    pred, sim_exits = ev.scorer.answers(plan, "test")  # the PyTorch simulation (this evaluator has no engine)
    assert sim_exits is not None
    assert float((torch.from_numpy(logits.argmax(1)) == pred).double().mean()) >= 0.97
    assert float((torch.from_numpy(exit_at) == sim_exits).double().mean()) >= 0.95


def test_a_batch_is_answered_in_input_order_whatever_leaves(ev, exported) -> None:
    """Rows that stay go on alone and are scattered back: a batch gives each row what it gives alone."""
    predictor = Predictor(str(exported), threads=1)
    x = ev.workload.split("val").x[:64].numpy()
    logits, exit_at = predictor.run_with_exits(x)
    alone = [predictor.run_with_exits(x[i : i + 1]) for i in range(len(x))]
    assert np.array_equal(exit_at, np.concatenate([e for _, e in alone]))
    assert np.allclose(logits, np.concatenate([lg for lg, _ in alone]), atol=1e-4)


def test_openvino_runs_the_exported_folder(ev, exported) -> None:
    pytest.importorskip("openvino")
    x = ev.workload.split("test").x[:256].numpy()
    ort_logits, ort_exits = Predictor(str(exported), threads=1).run_with_exits(x)
    ov_logits, ov_exits = Predictor(str(exported), engine="openvino", threads=1, precision="f32").run_with_exits(x)
    assert (ov_logits.argmax(1) == ort_logits.argmax(1)).mean() >= 0.97
    assert (ov_exits == ort_exits).mean() >= 0.95


@pytest.mark.parametrize("name", ["onnxruntime", "openvino", "torch"])
def test_an_exit_plan_passes_the_engine_suite(ev, plan, name: str) -> None:
    """Each engine builds, times and deploys the exit plan (certification's deployed form: for the ONNX engines
    the exported folder run by its Predictor with the engine's own segment runner; for torch the routed module),
    each answering as the run scored it."""
    if name == "openvino":
        pytest.importorskip("openvino")
    check_engine(ENGINES.get(name), ev, [plan], ev.workload.split("test").x.part(0, 128))


def test_one_file_refuses_exits_and_a_folder_is_not_overwritten_by_accident(ev, plan, tmp_path) -> None:
    with pytest.raises(ConfigError, match="folder of segments"):
        export_onnx(ev, plan, tmp_path / "one.onnx")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(ConfigError, match="is not an early-exit export"):
        export_onnx_exits(ev, plan, tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"


def test_predict_py_says_what_input_it_expects(ev, exported, tmp_path) -> None:
    """Raw uint8 pixels were answered 7.5 % right with no word; a 3-D, channels-last or other-sized batch, or a
    missing file, ended in ONNX Runtime's error or a traceback. Each is one line saying what is expected."""
    folder = Path(shutil.copytree(exported, tmp_path / "exits"))  # its files are removed below
    predictor = Predictor(str(folder), threads=1)
    x = ev.workload.split("val").x[:4].numpy()
    for bad, says in [(x[0], "batch of float32 images of shape \\(N, 3, 32, 32\\)"),
                      (x.transpose(0, 2, 3, 1), "channels last .*transpose\\(0, 3, 1, 2\\)"),
                      (x[:, :, :16, :16], "got shape \\(4, 3, 16, 16\\)"),
                      ((x * 60 + 120).clip(0, 255).astype(np.uint8), "got uint8 pixels: divide by 255"),
                      (x * 60 + 120, "pixels on the 0-255 scale"),
                      ((x * 0.25 + 0.5).clip(0, 1), r"scaled to \[0, 1\] but not normalised: subtract the mean \(0\."),
                      (np.full_like(x, np.nan), "4 values|values that are NaN or infinite")]:
        with pytest.raises(ValueError, match=says):
            predictor.run(bad)
    assert predictor.run(x).shape == (4, 10)
    done = subprocess.run([sys.executable, str(folder / "predict.py"), str(tmp_path / "missing.npy")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "missing.npy" in done.stderr, done.stderr
    (tmp_path / "images.txt").write_text("1 2 3\n")  # not a .npy: numpy's advice was to allow pickles
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    for name, says in (("images.txt", "is not a .npy file"), ("objects.npy", "no array of numbers")):
        done = subprocess.run([sys.executable, str(folder / "predict.py"), str(tmp_path / name)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and re.search(says, done.stderr), done.stderr
        assert "allow_pickle" not in done.stderr
    np.save(tmp_path / "x.npy", x)
    for gone in ("segment1.onnx", "exits.json"):  # a segment file, then the manifest: one line naming it, each
        (folder / gone).unlink()
        done = subprocess.run([sys.executable, str(folder / "predict.py"), str(tmp_path / "x.npy")],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and f"{gone} is missing" in done.stderr, \
            done.stderr
