"""A run folder's layer table keeps what the structural analyses found (issue 57): a report rebuilds the run's space,
structured pruning's and depth's choices included, from the workload's layers or from layers.json alone."""

from __future__ import annotations

import json

from modelopt.config.build import make_space
from modelopt.config.run_config import RunConfig
from modelopt.run.layout import CONFIG, LAYERS
from modelopt.run.run_folder import read_run, save_layers


def test_the_space_is_rebuilt_from_the_workloads_layers_and_from_the_layer_table(resnet20_workload, tmp_path):
    wl = resnet20_workload
    config = RunConfig(compressors=("depth", "prune", "quantize"))
    (tmp_path / CONFIG).write_text(json.dumps(config.to_json()))
    want = make_space(config, wl.layers)
    kinds = {(d.compressor, type(c).__name__, getattr(c, "kind", None)) for d in want.decisions for c in d.choices}
    assert ("depth", "Skip", None) in kinds and any(k[2] is not None and k[2].value == "structured" for k in kinds)

    live = read_run(tmp_path, layers=wl.layers).space
    save_layers(tmp_path, wl.layers)
    stored = read_run(tmp_path).space
    assert live is not None and stored is not None
    assert live.decisions == want.decisions == stored.decisions
    assert stored.features == want.features
    entry = next(d for d in json.loads((tmp_path / LAYERS).read_text())["layers"] if d["name"] == "layer1.0.conv2")
    assert entry["branch"] == ["layer1.0.conv1", "layer1.0.conv2"] and entry["channel_group"] == []
