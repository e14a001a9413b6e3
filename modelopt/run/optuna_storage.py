"""Every trial of a run folder, whatever its strategy, as a study in an Optuna storage.

Optuna's tools (optuna-dashboard, `optuna.visualization`, `study.trials_dataframe()`) then show
any modelopt run: MCTS, random, knapsack and the Optuna baselines alike. One categorical
parameter per decision (choices in their string form, e.g. `int4/g64`, `float`), two values
to maximise (the objective's reduction factor, compression for size, and val retention),
the run's numbers as user attributes, failed trials as FAIL, and the retention floor as a
constraint (retention >= floor) where Optuna's samplers and dashboard look for one.

Exporting is idempotent: trials already in the study (matched by their modelopt number) are
skipped, so exporting a run again after it went on adds only its new trials.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from modelopt._version import __version__
from modelopt.compressors import COMPRESSORS
from modelopt.errors import ConfigError
from modelopt.plan.plan import jsonable
from modelopt.run.journal import Record
from modelopt.run.run_folder import RunFolder, read_run

if TYPE_CHECKING:
    import optuna

__all__ = ["NUMBER_ATTR", "OptunaExport", "check_storage", "default_study_name", "export_run"]

NUMBER_ATTR = "modelopt_number"  # the trial's number in the run's journal


@dataclass(frozen=True)
class OptunaExport:
    """Where a run went and what the export did."""

    storage: str
    study_name: str
    added: int
    skipped: int  # already in the study


def _optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise ConfigError("exporting to an Optuna storage needs optuna: pip install 'modelopt[optuna]'") from None
    return optuna


def check_storage(storage: str) -> None:
    """Refuses a storage that is not a database URL Optuna can open, before a run spends its budget.

    Example:
        >>> check_storage("sqlite:///runs/studies.db")
    """
    if not isinstance(storage, str) or "://" not in storage:
        raise ConfigError(f"--storage {storage!r} is not a database URL; use one like sqlite:///studies.db")
    optuna = _optuna()
    try:
        optuna.storages.get_storage(storage)
    except Exception as exc:  # noqa: BLE001 -- a bad dialect, a missing driver, an unreachable server, no folder
        raise ConfigError(f"--storage {storage!r} cannot be opened ({_why(storage, exc)}); use a URL like "
                          "sqlite:///studies.db in an existing folder this user can write to") from None


def _why(storage: str, exc: Exception) -> str:
    """What stopped the storage, in words: for SQLite, the folder that is missing or read-only; otherwise the
    driver's own first line (SQLAlchemy's message goes on with a second line linking its docs)."""
    if storage.startswith("sqlite:///"):
        folder = Path(storage.removeprefix("sqlite:///")).expanduser().resolve().parent
        if not folder.is_dir():
            return f"folder '{folder}' does not exist"
        if not os.access(folder, os.W_OK):
            return f"folder '{folder}' is read-only"
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first[:200]}"


def default_study_name(run: RunFolder) -> str:
    """The run folder's name; for a sweep cell (`.../<model>/<strategy>/seed<k>`) those three parts."""
    path = run.path.resolve()
    if path.name.startswith("seed") and len(path.parts) >= 3:
        return "/".join(path.parts[-3:])
    return path.name


def _off(compressor: str) -> str:
    """How `compressor`'s off choice reads (its `off_label`; "off" for one not installed here)."""
    return COMPRESSORS.get(compressor).off_label if compressor in COMPRESSORS else "off"


def _menus(run: RunFolder) -> dict[str, dict[str, str]]:
    """{decision: {JSON form of a choice: its label}}, in menu order: the space's full menus when the
    run folder has a layer table (so every export of a run has the same distributions), else the
    choices its trials used."""
    out: dict[str, dict[str, str]] = {}
    space = run.space
    if space is not None:
        for d in space.decisions:
            labels = {_key(jsonable(c)): (_off(d.compressor) if c is None else str(c)) for c in d.choices}
            if len(set(labels.values())) == len(labels):
                out[d.name] = labels
    for r in run.records:  # choices outside the space's menus too (the space changed): every trial is kept
        for name, raw in r.plan.items():
            labels = out.setdefault(name, {})
            k = _key(raw)
            if k not in labels:
                labels[k] = _off(name.rpartition("/")[2]) if raw is None else k
    if space is None:  # sorted, so a later export of the same run gives the same choices' order
        out = {n: dict(sorted(m.items(), key=lambda kv: (kv[0] != "null", kv[0]))) for n, m in out.items()}
    return out


def _key(raw: Any) -> str:
    return json.dumps(raw, sort_keys=True, separators=(",", ":"))


def _frozen_trial(run: RunFolder, r: Record, cum_cost: float, menus: dict[str, dict[str, str]],
                  optuna: Any) -> optuna.trial.FrozenTrial:
    from optuna.distributions import BaseDistribution, CategoricalDistribution
    from optuna.trial import TrialState, create_trial

    params: dict[str, Any] = {}
    dists: dict[str, BaseDistribution] = {}
    for name, raw in r.plan.items():
        menu = menus[name]
        params[name] = menu[_key(raw)]
        dists[name] = CategoricalDistribution(tuple(menu.values()))
    attrs: dict[str, Any] = {NUMBER_ATTR: r.number, "plan_key": r.plan_key, "cost": r.cost,
                             "cumulative_cost": cum_cost, "strategy": r.strategy, "seed": r.seed,
                             "feasible": bool(r.metrics is not None and run.objective.feasible(r.metrics))}
    system: dict[str, Any] = {}
    if r.metrics is None:
        attrs["error"] = (r.error or "")[:500]
        state, values = TrialState.FAIL, None
    else:
        m = r.metrics
        reduction = run.reduction(m)
        attrs.update(size_bytes=m.size_bytes, compression=m.compression, retention=m.retention,
                     accuracy=m.accuracy, agreement=m.agreement, bitops=m.bitops, macs=m.macs,
                     n_samples=m.n_samples, reward=r.reward)
        stopped = getattr(m, "stopped", None)
        if stopped is not None:
            attrs["stopped"] = stopped
        test = run.test_by_key.get(r.plan_key)
        if test is not None:
            attrs.update(test_retention=test.retention, test_accuracy=test.accuracy)
        system["constraints"] = (run.objective.min_retention - m.retention,)  # <= 0: feasible, as Optuna reads it
        state, values = TrialState.COMPLETE, [reduction, m.retention]
    attrs = {k: v for k, v in attrs.items() if v is not None}
    return create_trial(state=state, values=values, params=params, distributions=dists, user_attrs=attrs,
                        system_attrs=system)


def export_run(
    run_dir: str | Path, storage: str, *, study_name: str | None = None, run: RunFolder | None = None,
) -> OptunaExport:
    """Writes every trial of a run folder into an Optuna study (created if needed).

    Args:
        run_dir: the run folder (any strategy; finished or still running).
        storage: an Optuna storage URL, e.g. `sqlite:///studies.db`.
        study_name: default: the run folder's name (model/strategy/seed<k> for a sweep cell).
        run: the folder already read (saves reading it twice).

    Returns:
        The study name and how many trials were added and skipped.

    Raises:
        ConfigError: the storage cannot be opened, or the study exists and holds another run.
        LoadError: `run_dir` is not a run folder.

    Example:
        >>> export_run("runs/r20", "sqlite:///studies.db").study_name
        'r20'
        >>> # then: optuna-dashboard sqlite:///studies.db
    """
    optuna = _optuna()
    run = run or read_run(run_dir)
    name = study_name or default_study_name(run)
    check_storage(storage)
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # not a line per study opened
    try:
        return _export(optuna, run, storage, name)
    finally:
        optuna.logging.set_verbosity(verbosity)


def _export(optuna: Any, run: RunFolder, storage: str, name: str) -> OptunaExport:
    what = "compression" if run.objective.target.value == "size" else f"{run.objective.target.value}_reduction"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ExperimentalWarning (metric names), not the user's concern
        study = optuna.create_study(storage=storage, study_name=name, directions=["maximize", "maximize"],
                                    load_if_exists=True)
        if [d.name for d in study.directions] != ["MAXIMIZE", "MAXIMIZE"]:
            raise ConfigError(f"study {name!r} in {storage!r} has other objectives ({len(study.directions)}); "
                              "pass another --study-name")
        cfg = run.config
        mine = {"modelopt_run_dir": str(run.path.resolve()), "model": cfg.get("model"), "data": cfg.get("data"),
                "strategy": cfg.get("strategy"), "seed": cfg.get("seed"), "objective": run.objective.target.value,
                "min_retention": run.objective.min_retention, "budget": run.budget,
                "float_size_bytes": run.float_size_bytes, "modelopt_version": __version__}
        existing_attrs = study.user_attrs
        for key, value in mine.items():
            if existing_attrs.get(key) != value:
                study.set_user_attr(key, value)
        if hasattr(study, "set_metric_names"):  # Optuna >= 3.2
            study.set_metric_names([what, "val_retention"])
    have: dict[int, str] = {}
    for t in study.get_trials(deepcopy=False):
        if NUMBER_ATTR in t.user_attrs:
            have[int(t.user_attrs[NUMBER_ATTR])] = str(t.user_attrs.get("plan_key"))
    for r in run.records:
        if r.number in have and have[r.number] != r.plan_key:
            raise ConfigError(
                f"study {name!r} in {storage!r} holds another run (its trial {r.number} has plan {have[r.number]}, "
                f"this run's has {r.plan_key}); pass another --study-name"
            )
    menus = _menus(run)
    new = [_frozen_trial(run, r, cum, menus, optuna) for r, cum in zip(run.records, run.cum_costs, strict=True)
           if r.number not in have]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study.add_trials(new)
    return OptunaExport(storage, name, len(new), len(run.records) - len(new))
