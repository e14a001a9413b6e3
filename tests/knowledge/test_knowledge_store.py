"""The store: round trip, merging runs, concurrent writers, and one-line refusal of a damaged file."""

from __future__ import annotations

import json
import threading

import pytest

from modelopt.errors import LoadError
from modelopt.knowledge import KnowledgeIndex, LayerPrint, RunLessons, Store, read_store, record, store_file
from modelopt.knowledge.index import Estimate, combine
from modelopt.knowledge.lessons import ChoiceLesson, LayerLesson

PRINT = LayerPrint("conv", (16, 16, 3, 3), -6, 0, 5)


def lessons(run: str, kd: float = 1.5, std: float = 0.2, family: str = "cifar10_resnet", lp: LayerPrint = PRINT):
    choices = {'{"bits":4}': ChoiceLesson(0.01, 0.002, 0.01), '{"bits":8}': ChoiceLesson(1e-5, 0.0, 0.005)}
    return RunLessons(run, "cifar10_resnet20", family, "broken", 12, 0.3,
                      (LayerLesson("layer1.0.conv1", "quantize", lp, kd, std, choices),))


def test_round_trip_file_and_folder(tmp_path):
    for path in (tmp_path / "k.json", tmp_path / "store"):
        assert read_store(path).runs == {}  # none yet: empty, not an error
        written = record(path, lessons("host:/a"))
        assert read_store(path) == written and read_store(path).runs["host:/a"] == lessons("host:/a")
    assert store_file(tmp_path / "store") == tmp_path / "store" / "knowledge.json"


def test_recording_a_run_again_replaces_it_and_stores_merge(tmp_path):
    path = tmp_path / "k.json"
    record(path, lessons("host:/a", kd=1.0))
    record(path, lessons("host:/a", kd=2.0))  # the same run, resumed and recorded again
    record(path, lessons("host:/b"))
    store = read_store(path)
    assert sorted(store.runs) == ["host:/a", "host:/b"] and store.runs["host:/a"].layers[0].kd_rel == 2.0
    other = Store({"host:/c": lessons("host:/c")})
    assert sorted(store.merged(other).runs) == ["host:/a", "host:/b", "host:/c"]


def test_concurrent_writers_keep_every_run(tmp_path):
    path = tmp_path / "k.json"
    threads = [threading.Thread(target=record, args=(path, lessons(f"host:/{i}"))) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(read_store(path).runs) == 8


def test_index_merges_runs_by_precision_and_looks_up_the_nearest_print():
    store = Store({"a": lessons("a", kd=1.0, std=0.1), "b": lessons("b", kd=1.0, std=0.1),
                   "c": lessons("c", kd=9.0, family="imagenet_vit")})
    index = KnowledgeIndex(store, family="cifar10_resnet", measure="broken")
    assert index.runs == 2  # the other family is not used
    prior = index.lookup("quantize", LayerPrint("conv", (16, 16, 3, 3), -5, 0, 5))  # one bin off: matches
    assert prior is not None and prior.kd_rel.mean == pytest.approx(1.0) and prior.kd_rel.std < 0.1
    assert index.lookup("quantize", LayerPrint("conv", (16, 16, 3, 3), -3, 0, 5)) is None  # three bins off
    assert index.lookup("prune", PRINT) is None and index.lookup("quantize", LayerPrint("conv", (32, 16, 3, 3),
                                                                                         -6, 0, 5)) is None


def test_disagreeing_runs_leave_the_prior_loose():
    agree, disagree = combine([Estimate(1, 0.1)] * 2), combine([Estimate(0.5, 0.1), Estimate(1.5, 0.1)])
    assert agree.std < 0.1 < 0.5 <= disagree.std


@pytest.mark.parametrize(("content", "needle"), [
    (b"\x89PNG\r\n\x1a\n\x00\xff", "not text"),
    (b"{\"format\": \"modelopt-knowledge\", \"version\": 1, \"runs\": {", "not valid JSON"),
    (b"[1, 2, 3]", "not a modelopt knowledge store"),
    (b'{"format": "modelopt-knowledge", "version": 99, "runs": {}}', "newer modelopt"),
    (b'{"format": "modelopt-knowledge", "version": 1, "runs": {"h:/r": {"layers": [{"x": 1}], "trials": 3}}}',
     "damaged entry for run 'h:/r'"),
])
def test_a_damaged_store_is_refused_naming_the_file(tmp_path, content, needle):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(LoadError) as exc:
        read_store(path)
    message = str(exc.value)
    assert needle in message and str(path) in message and "\n" not in message
    with pytest.raises(LoadError):  # a writer refuses it too, and leaves it as it was
        record(path, lessons("host:/a"))
    assert path.read_bytes() == content


def test_written_store_is_versioned_json(tmp_path):
    record(tmp_path / "k.json", lessons("host:/a"))
    raw = json.loads((tmp_path / "k.json").read_text())
    assert raw["format"] == "modelopt-knowledge" and raw["version"] == 1 and list(raw["runs"]) == ["host:/a"]
