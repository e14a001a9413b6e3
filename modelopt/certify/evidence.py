"""What a run's labeled splits can certify: refused before any work when val cannot certify the floor at
all, said when the confirm split cannot, and one evidence line a run prints before it searches."""

from __future__ import annotations

from modelopt.confidence import PairedCounts, clears, most_changed
from modelopt.data.split import Split
from modelopt.errors import ConfigError
from modelopt.model.workload import Workload
from modelopt.objective import Objective

__all__ = ["can_certify", "certifiable_retention", "check_certifiable", "evidence", "evidence_lines"]

def certifiable_retention(workload: Workload, split: str, confidence: float) -> float:
    """The retention bound of a plan that agrees with the float model on every image of `split`:
    the most that split can certify at `confidence`."""
    data = workload.split(split)
    return PairedCounts(len(data), int(data.base_correct.sum()), 0, 0).retention_lower(confidence)


def can_certify(workload: Workload, split: str, confidence: float, floor: float) -> bool:
    """Whether `split` is large enough to certify `floor` at `confidence` at all: a plan that agrees with the float
    model on every one of its images is certified there (`certifiable_retention`)."""
    return clears(certifiable_retention(workload, split, confidence), floor)


def check_scores(workload: Workload, split: str) -> None:
    """Refuses, in one line, a float model that answers none of `split`'s labeled images right (retention would
    be 0 / 0): a head that does not match the data's classes, or the wrong weights or data."""
    if split != Split.ALL and split not in workload.splits:
        return
    data = workload.split(split)
    if len(data) and not bool(data.base_correct.any()):
        outputs, classes = workload.num_outputs, workload.data.num_classes
        why = (f"its {outputs}-way head does not fit the data's {classes} classes (pass --weights with a checkpoint "
               "trained on them)" if outputs != classes else
               "wrong or missing weights (--weights), or images preprocessed otherwise than the model was trained")
        raise ConfigError(f"the float model gets none of the {len(data):,} {split} images right (0 % top-1), so "
                          f"there is no accuracy to retain: {why}")


def check_certifiable(workload: Workload, objective: Objective) -> tuple[str, ...]:
    """Refuses, in one line, a val split too small to certify the floor even for a plan that agrees
    with the float model on every image (the search would be pointless); returns the warning for a
    confirm split that small (the best plan is then reported unconfirmed). A float model that gets no val image
    right is refused first: there is nothing to retain, and more data would not help."""
    check_scores(workload, Split.VAL)
    if objective.confidence <= 0:
        return ()
    floor, conf = objective.min_retention, objective.confidence
    warnings = []
    for split in (Split.VAL, Split.CONFIRM):
        if split not in workload.splits:
            continue
        if can_certify(workload, split, conf, floor):
            continue
        ceiling = certifiable_retention(workload, split, conf)
        n = len(workload.split(split))
        said = (f"the {split} split ({n} images) is too small to certify a {floor:.1%} retention floor: a plan "
                f"that agrees with the float model on all of them is certified only at {ceiling:.2%} "
                f"(confidence {conf:g})")
        if split == Split.VAL:
            raise ConfigError(f"{said}; pass more data, a lower --min-retention, or --confidence 0 for point estimates")
        warnings.append(f"{said}; the best plan will be certified on val only and reported as unconfirmed")
    return tuple(warnings)


def evidence(workload: Workload, objective: Objective) -> str:
    """One line: what each labeled split can certify at the floor (the largest share of its images a plan
    may change, as many fixed as broken), and what four times the images would buy (twice the resolution).

    Example:
        >>> evidence(wl, Objective("size", 0.99, 0.95))
        'evidence at 99.0 % (95 % confidence): val 1,500 images (float 81.5 %) certify plans that change up to ...'
    """
    floor, conf = objective.min_retention, objective.confidence
    parts = []
    for split in (Split.VAL, Split.CONFIRM, Split.TEST):
        if split not in workload.splits:
            continue
        data = workload.split(split)
        n, right = len(data), int(data.base_correct.sum())
        now, more = most_changed(n, right, conf, floor), most_changed(4 * n, 4 * right, conf, floor)
        parts.append(f"{split} {n:,} images (float {right / max(n, 1):.1%}) up to {now:.1%} (4x: {more:.1%})")
    return (f"evidence at {floor:.1%} ({conf:g} confidence): the share of answers a plan may change, as many fixed "
            "as broken, and still be certified: " + "; ".join(parts))


def evidence_lines(workload: Workload, objective: Objective) -> tuple[str, ...]:
    """What a run prints before it searches: the evidence line, then a warning per split too small to confirm
    the floor; refuses (ConfigError) a val split that cannot certify it (`check_certifiable`). Nothing under
    point estimates (confidence 0). Called once per run, before any work (`modelopt.config.build`)."""
    warnings = check_certifiable(workload, objective)
    if objective.confidence <= 0:
        return ()
    return (evidence(workload, objective), *(f"[yellow]warning:[/] {w}" for w in warnings))
