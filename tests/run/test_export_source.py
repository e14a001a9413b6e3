"""A run folder's plan is evaluated and exported on the images the run was searched on, or refused."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from modelopt.errors import LoadError
from modelopt.run.export import resolve


def test_a_run_whose_data_file_changed_is_refused_not_scored_on_other_images(tmp_path, small_run):
    """`evaluate RUN_DIR` and `export` checked the weights' fingerprint, not the data's: after the run's .npz was
    rewritten in another order, evaluate scored other images with no word (--resume already refused it)."""
    run = tmp_path / "run"
    shutil.copytree(small_run, run)
    doc = json.loads((run / "run.json").read_text())
    with np.load(doc["data"]) as f:
        x, y = f["x"], f["y"]
    order = np.random.default_rng(0).permutation(len(y))
    moved = tmp_path / "reordered.npz"
    np.savez(moved, x=x[order], y=y[order])
    (run / "run.json").write_text(json.dumps({**doc, "data": str(moved)}))
    with pytest.raises(LoadError, match=r"differs from the data run .* was searched on"):
        resolve(run)
