"""run.json read back: checked to be a run's settings of a format this modelopt reads (`read_config_json`), and
RunConfig's fields from a file of any format (`fields_of`: format 0 files without fields added later read as the
runs that wrote them ran, format 1's early-exit images moved into their compressor's options)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from modelopt._version import __version__
from modelopt.compressors import COMPRESSORS, FIRST_COMPRESSOR, Options, compressor_settings
from modelopt.errors import LoadError
from modelopt.evaluation.fidelity import Fidelity
from modelopt.latency.spec import LatencySpec
from modelopt.objective import Objective, Target

__all__ = ["CONFIG", "CONFIG_FORMAT", "as_records", "fields_of", "objective_from_json", "read_config_json"]

CONFIG = "run.json"  # a run folder's settings (`modelopt.run.layout` names the folder's other files)
# run.json's layout; files without `format` are format 0 and read the same way; 2: early exit's images are its
# compressor's options (format 1 has them at the top level, as exit_data: {path, images})
CONFIG_FORMAT = 2


def read_config_json(run_dir: str | Path) -> dict[str, Any]:
    """run.json as JSON, checked to be a run's settings (LoadError otherwise)."""
    path = Path(run_dir) / CONFIG
    if not path.is_file():
        raise LoadError(f"{str(run_dir)!r} is not a modelopt run folder (no {CONFIG})")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise LoadError(f"{str(path)!r} is not readable as a run's settings ({exc}); it is not a modelopt run "
                        "folder, or its run.json was damaged") from None
    if not isinstance(raw, dict):
        raise LoadError(f"{str(path)!r} holds no run settings; it is not a modelopt run folder")
    if "model" not in raw:  # `{}`: read as the default settings, a run of the bundled model it never was
        raise LoadError(f"{str(run_dir)!r} is not a modelopt run folder (its {CONFIG} names no model); pass a folder "
                        "written by `modelopt optimize --out`")
    fmt = raw.get("format", 0)
    if isinstance(fmt, bool) or not isinstance(fmt, int) or not 0 <= fmt <= CONFIG_FORMAT:
        newer = isinstance(fmt, int) and not isinstance(fmt, bool) and fmt > CONFIG_FORMAT
        raise LoadError(f"{str(path)!r} is run.json format {fmt!r}"
                        + (f", written by a newer modelopt ({raw.get('version', '?')}); this one ({__version__}) reads "
                           f"formats 0 to {CONFIG_FORMAT}: upgrade modelopt to read it" if newer else
                           f", which no modelopt writes (formats 0 to {CONFIG_FORMAT}); the file was changed by hand"))
    return raw


def fields_of(raw: Mapping[str, Any]) -> dict[str, Any]:
    """RunConfig's fields from a run.json already checked for form (`check_forms`)."""
    comps = raw.get("compressors")
    first: dict[str, Any] = {FIRST_COMPRESSOR: {}}  # a record without compressors ran the one compressor there was
    options = {n: dict(o) for n, o in (raw.get("options") or comps or first).items()}
    exit_data = raw.get("exit_data") or {}  # format 1: the early-exit images at the top level
    if exit_data.get("path") is not None:
        owner = compressor_settings()["exit_data"][0]
        if owner in options:
            options[owner].update(exit_data=exit_data["path"], exit_images=int(exit_data.get("images", 10000)))
    values: dict[str, Any] = {k: raw[k] for k in _SCALARS if raw.get(k) is not None}
    values.update(
        compressors=None if comps is None and "options" in raw else tuple(comps or first),
        options=as_records(options, CONFIG),
        fidelity=None if raw.get("fidelity") is None else Fidelity(**_fidelity_args(raw["fidelity"])),
        latency=None if raw.get("latency") is None else LatencySpec(**raw["latency"]),
        fingerprints={k: raw[k] for k in ("model_sha256", "data_sha256") if isinstance(raw.get(k), str)},
        read_as=raw["read_as"] if isinstance(raw.get("read_as"), dict) else None,
    )
    values.update({k: v for k, v in _BEFORE.items() if k not in raw})
    if "budget" in raw and raw["budget"] is None and raw.get("time") is not None:  # timed, the budget left open
        values["budget"] = math.inf
    return values


def as_records(options: Mapping[str, Mapping[str, Any]], where: str) -> dict[str, Options | dict[str, Any]]:
    """run.json's compressor options as records, each read as its version wrote it (a record without one is
    version 1: `Options.from_json`); a compressor not installed here is left as JSON (`RunConfig` names it)."""
    return {n: COMPRESSORS.get(n).record.from_json(o, f"{where}: options of {n}") if n in COMPRESSORS
            else dict(o) for n, o in options.items()}


def objective_from_json(raw: Mapping[str, Any]) -> Objective:
    """The objective a run.json names (what reports need even where its compressors cannot be built)."""
    floor = float(raw.get("min_retention") or 0.99)
    floors = raw.get("floors") or ()
    return Objective(Target.parse(raw.get("objective") or "size"), floor,
                     float(raw.get("confidence", _BEFORE["confidence"]) or 0.0),
                     bool(raw.get("count_gains", _BEFORE["count_gains"])),
                     floors=tuple(floors) if floor in floors else ())


# What a run.json without a field ran with (the field came later): point estimates, every plan
# scored on the whole val split, a bound on breaks only.
_BEFORE: dict[str, Any] = {"confidence": 0.0, "fidelity": None, "count_gains": False, "reconstruct": False}
_SCALARS = ("model", "weights", "data", "data_seed", "strategy", "seed", "budget", "time", "objective", "min_retention",
            "floors", "confidence", "count_gains", "unlabeled", "resize", "crop", "interpolation", "mean", "std",
            "device", "executor", "workers", "ray_address", "knowledge", "reconstruct")


def _fidelity_args(raw: Mapping[str, Any]) -> dict[str, Any]:
    return {**raw, "stages": tuple(raw.get("stages", ()))}
