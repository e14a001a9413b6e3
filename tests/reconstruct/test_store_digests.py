"""What was certified is what is run: each reconstruction file is checked against the digest the run recorded when it
wrote it, and one that is gone is refitted (said in one line), never replaced by the plan as composed."""

from __future__ import annotations

import json
import shutil

import pytest

from modelopt.errors import LoadError
from modelopt.evaluation.fitted import Fitted
from modelopt.reconstruct.store import DIGESTS, fitted_path
from modelopt.run.export import resolve

pytestmark = pytest.mark.slow  # reads the session fixture small_run (a finished run with its reconstructions)


def _copy(small_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(small_run, run)
    best = json.loads((run / "summary.json").read_text())["best"]["plan_key"]
    assert best in json.loads((run / DIGESTS).read_text())  # the run recorded its best's reconstruction
    return run, best


def test_a_deleted_reconstruction_is_refitted_as_the_run_fitted_it_and_said(tmp_path, small_run):
    run, best = _copy(small_run, tmp_path)
    stored = Fitted.load(fitted_path(run, best))
    for f in (run / "reconstructed").glob("*.pt"):
        f.unlink()
    with pytest.warns(UserWarning, match="is missing: refitting it as the run did"):
        src = resolve(run, "best")
    assert src.realised.fitted is not None
    assert sorted(src.realised.fitted.weights) == sorted(stored.weights)
    for name, w in stored.weights.items():  # the same weights the run certified, not the plan as composed
        assert src.realised.fitted.weights[name].cpu().equal(w)


def test_a_damaged_or_swapped_reconstruction_is_refused_in_one_line_naming_it(tmp_path, small_run):
    run, best = _copy(small_run, tmp_path)
    path = fitted_path(run, best)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # still unpickles: only the digest tells
    path.write_bytes(bytes(data))
    with pytest.raises(LoadError, match="sha256 differs") as info:
        resolve(run, "best")
    assert str(path) in str(info.value) and "\n" not in str(info.value)
    others = [f for f in (run / "reconstructed").glob("*.pt") if f != path]
    if others:  # another finalist's file under the best's name
        shutil.copy(others[0], path)
        with pytest.raises(LoadError, match="sha256 differs"):
            resolve(run, "best")
