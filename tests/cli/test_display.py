"""What the CLI prints about a finished run."""

from __future__ import annotations

from modelopt.cli.display import latency_text, own_pick_text, split_label
from modelopt.evaluation.metrics import Metrics
from modelopt.objective import Objective
from modelopt.run.reported import Scores


def _metrics(**kw) -> Metrics:
    base = dict(split="val", n_samples=2000, accuracy=0.81, baseline_accuracy=0.82, retention=0.988, agreement=0.9,
                size_bytes=275_000, float_size_bytes=1_078_888, compression=3.92, bitops=1, macs=1, eval_seconds=1.0)
    return Metrics(**{**base, **kw})


def test_a_latency_runs_own_pick_is_named_by_its_speed_up_not_its_size():
    """A latency run's line read "trial 2 (3.92x)": the pick's compression, beside plans timed at 2.3-2.4x."""
    m = _metrics(latency_ms=0.326, float_latency_ms=0.719, latency_backend="onnxruntime/cpu/fp32/b1")
    latency = Objective("latency")
    line = own_pick_text(latency.target, 2, Scores.of(m, latency), 5, 5)
    assert "trial 2 (2.21x latency on val)" in line and "3.92" not in line
    assert "that is the fastest of the 5 finalists confirmed (of 5 tested" in line


def test_a_size_runs_own_pick_is_named_by_its_compression():
    size = Objective("size")
    line = own_pick_text(size.target, 7, Scores.of(_metrics(), size), 3, 6)
    assert "trial 7 (3.92x size on val)" in line and "the smallest of the 3 finalists confirmed (of 6" in line


def test_a_plan_timed_as_the_float_model_says_why_instead_of_reading_1_00x():
    """A size run's line read "torch/cpu/fp32/b1: 2.311 ms vs float 2.311 ms (1.00x)": a weight-only plan builds to the
    float model's graph in torch and shares its timing."""
    same = _metrics(latency_ms=2.311, float_latency_ms=2.311, latency_backend="torch/cpu/fp32/b1")
    line = latency_text(same, {"torch/cpu/fp32/b1": 2.311})
    assert "1.00x" not in line and "2.311 ms, the float model's: the plan changes no kernel this engine runs" in line
    faster = _metrics(latency_ms=0.301, float_latency_ms=0.719, latency_backend="onnxruntime/cpu/fp32/b1")
    assert latency_text(faster, {}) == "Latency (onnxruntime/cpu/fp32/b1): 0.301 ms vs float 0.719 ms (2.39x)"


def test_split_all_says_it_is_val_and_test():
    """`evaluate --split all` scored 508 of a folder's 846 images and titled them "all (508 images)"."""
    assert split_label("all", 508) == "all = val + test (508 images; the calib and confirm images are not scored)"
    assert split_label("test", 423) == "test (423 images)"
