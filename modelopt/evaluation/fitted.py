"""A plan's reconstructed weights (`modelopt.reconstruct`), as a plan runs with them and a run folder keeps them.

A plan realised with its refit (`Evaluator.realise(plan, fitted)`) scores, deploys and exports with these weights in
place of the ones its cached per-layer compression gives (`Realised.weights`, `Realised.steps`), so what
confirmation and test score is what export writes. Saved as plain tensors (read back with
`torch.load(weights_only=True)`), so that export, `evaluate RUN_DIR` and `--resume` do not fit again.
"""

from __future__ import annotations

import functools
import hashlib
import math
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from modelopt.compressors.contract import Granularity, IntegerWeight
from modelopt.errors import ConfigError

__all__ = ["DROP_LEVEL", "FITTED_VERSION", "Fitted"]

FITTED_VERSION = 1
# A refit is dropped when the held-out images give less than this chance that it changes no more answers than the
# plan as composed: reconstruction is kept unless they show it harms (docs/reconstruction.md#measured: on ResNets
# it helps every plan on test, by gains the held-out images are too few to tell from noise).
DROP_LEVEL = 0.05


@dataclass(frozen=True, eq=False)
class Fitted:
    """A plan's reconstructed layers.

    Attributes:
        plan_key: The plan they belong to (`Plan.key`).
        weights: Each refitted layer's weight, full shape (structurally removed channels zero).
        integers: The codes and scales of each quantized one among them, at the stored shape.
        errors: Each refitted layer's output error on the calibration images relative to the float layer's output,
            (before, after): the whole record, kept or not.
        images: Calibration images the refit read.
        seconds: Wall time of the refit.
        held_out: (images, answers the plan as composed changes, answers the refit changes, images where exactly
            one of the two agrees with the float model), on calibration images neither fit read (None: too few
            to check; the refit is then kept).
    """

    plan_key: str
    weights: dict[str, torch.Tensor]
    integers: dict[str, IntegerWeight]
    errors: dict[str, tuple[float, float]]
    images: int
    seconds: float
    held_out: tuple[int, int, int, int] | None = None

    @property
    def chosen(self) -> bool:
        """Whether the plan runs with these weights: unless the held-out images show the refit changes more
        answers than the plan as composed (a one-sided sign test on the images where exactly one of the two
        agrees with the float model, at `DROP_LEVEL`). Then the plan runs as composed, and this record only says
        that the refit was tried."""
        if self.held_out is None:
            return True
        _, composed, refit, discordant = self.held_out
        worse = (discordant + refit - composed) // 2  # images only the refit changes
        return refit <= composed or _sign_tail(worse, discordant) >= DROP_LEVEL

    @functools.cached_property
    def digest(self) -> str:
        """What the refit holds, hashed (its weights, codes and scales): two records with the same digest run the
        plan alike, so caches key on it (`Realised.key`)."""
        h = hashlib.sha256(self.plan_key.encode())
        tensors = [(f"w:{n}", w) for n, w in self.weights.items()]
        tensors += [(f"{part}:{n}", t) for n, i in self.integers.items()
                    for part, t in (("c", i.codes), ("s", i.scales))]
        for name, t in sorted(tensors, key=lambda nt: nt[0]):
            h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
            h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        return h.hexdigest()[:16]

    def save(self, path: Path) -> None:
        """Writes the record as plain tensors and numbers (atomically: a killed write leaves no file)."""
        doc: dict[str, Any] = {
            "version": FITTED_VERSION, "plan_key": self.plan_key, "images": self.images, "seconds": self.seconds,
            "weights": {n: w.detach().cpu() for n, w in self.weights.items()},
            "integers": {n: {"codes": i.codes.cpu(), "scales": i.scales.cpu(), "bits": i.bits,
                             "granularity": i.granularity.value, "group_size": i.group_size}
                         for n, i in self.integers.items()},
            "errors": {n: list(e) for n, e in self.errors.items()},
            "held_out": None if self.held_out is None else list(self.held_out),
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        torch.save(doc, tmp)
        tmp.replace(path)

    @staticmethod
    def load(path: Path, device: torch.device | str = "cpu") -> Fitted:
        """The record `save` wrote; one ConfigError naming the file when it is not one."""
        try:
            doc = torch.load(path, map_location=device, weights_only=True)
            version = int(doc["version"])
            if version > FITTED_VERSION:
                raise ConfigError(f"{path}: reconstructed weights of format {version}, written by a newer modelopt "
                                  f"(this one reads {FITTED_VERSION}); upgrade modelopt to read it")
            integers = {n: IntegerWeight(d["codes"], d["scales"], int(d["bits"]), Granularity(d["granularity"]),
                                         int(d["group_size"])) for n, d in doc["integers"].items()}
            return Fitted(str(doc["plan_key"]), dict(doc["weights"]), integers,
                          {n: (float(a), float(b)) for n, (a, b) in doc["errors"].items()}, int(doc["images"]),
                          float(doc["seconds"]), _held_out(doc.get("held_out")))
        except ConfigError:
            raise
        except (OSError, RuntimeError, KeyError, TypeError, ValueError, AttributeError, EOFError,
                pickle.UnpicklingError) as exc:
            # a torn or foreign file: name it, say what would be right
            raise ConfigError(f"{path}: not a modelopt reconstruction file ({type(exc).__name__}: {exc}); "
                              "delete it and the run refits the plan") from None


def _held_out(v: Any) -> tuple[int, int, int, int] | None:
    """The held-out check as saved (absent in files written before it: None)."""
    if v is None:
        return None
    images, composed, refit, discordant = (int(x) for x in v)
    return images, composed, refit, discordant


def _sign_tail(k: int, n: int) -> float:
    """P(X >= k) for X ~ Binomial(n, 1/2): how likely `k` or more of `n` discordant images go the refit's way
    against it by chance."""
    return sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n if n > 0 else 1.0  # exact ints: no float overflow
