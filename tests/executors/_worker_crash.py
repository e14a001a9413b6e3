"""A compressor whose "crash" choice kills the process that applies it, armed only in Ray workers
scoring plans (their setup hook, `arm`): the pre-pass that computes every choice must survive."""

from __future__ import annotations

import os

from modelopt.compressors import COMPRESSORS, Compressor


class CrashWorker(Compressor):
    name = "crash_worker"
    armed = False

    def menu(self, layer):
        return (None, "crash") if layer.name == "linear" else (None,)

    def parse(self, raw, layer):
        return raw

    def dump(self, choice):
        return choice

    def apply(self, weight, choice):
        if choice == "crash" and CrashWorker.armed:
            os._exit(1)  # as the OOM killer or a segfault: no exception, no cleanup
        return weight

    def weight_bytes(self, layer, choice):
        return layer.params * (2 if choice == "crash" else 4)  # smaller: a search wants to try it


def register() -> None:
    if "crash_worker" not in COMPRESSORS._items:
        COMPRESSORS.register("crash_worker")(CrashWorker)


def arm() -> None:
    """The Ray workers' setup hook: armed once the worker scores its first plan (its start-up computes
    every choice's tensors, as the driver's build does, and must survive like the driver's)."""
    from modelopt.executors.ray_worker import PlanWorker

    register()
    score = PlanWorker.score

    def armed_score(self, job):
        CrashWorker.armed = True
        return score(self, job)

    PlanWorker.score = armed_score
