"""Build the bundled CIFAR-10 sample, `assets/cifar10_sample.npz`, from `shared/data/cifar10/`.

Run once by a maintainer (`python -m modelopt.zoo.make_sample [DATA_DIR]`); the package
only reads the result. Exact pixels only: JPEG re-encoding costs the reference models
about ten points of accuracy, which would make the bundled sample a poor yardstick.

The 846 exact test images are all the unseen clean images there are, too few to also confirm a
99 % floor (a confirm split of 212 would cap even a perfect plan at 98.2 % at 95 % confidence).
So the sample confirms on 1,000 further training images the search never scores. The model was
fitted on them and is right on 99.8 % of them, so a plan can hardly gain there: retention on
them is its agreement with the float model, a stricter test than retention on test images,
where lucky gains offset losses.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ASSET = Path(__file__).parent / "assets" / "cifar10_sample.npz"
DEFAULT_DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "cifar10"
PER_BATCH_STORED = 932  # cifar10_exact_train.npz holds this many images of each training batch
PER_BATCH_KEPT = 200  # 5 batches x 200 = 1,000 calibration images
PER_BATCH_CONFIRM = 200  # the next 200 of each batch: 1,000 confirmation images
NUM_BATCHES = 5


def build(data_dir: Path = DEFAULT_DATA, out: Path = ASSET) -> Path:
    """Write the sample archive and return its path.

    Args:
        data_dir: Folder holding `cifar10_exact_test.npz` and `cifar10_exact_train.npz`.
        out: Where to write the archive.

    Returns:
        `out`.

    Example:
        >>> build()  # doctest: +SKIP
    """
    test = np.load(data_dir / "cifar10_exact_test.npz")
    train = np.load(data_dir / "cifar10_exact_train.npz")
    idx = np.concatenate(
        [b * PER_BATCH_STORED + np.arange(PER_BATCH_KEPT) for b in range(NUM_BATCHES)]
    )
    conf = np.concatenate(
        [b * PER_BATCH_STORED + PER_BATCH_KEPT + np.arange(PER_BATCH_CONFIRM) for b in range(NUM_BATCHES)]
    )
    arrays = {
        "test_x": np.ascontiguousarray(test["x"], dtype=np.uint8),
        "test_y": test["y"].astype(np.int64),
        "calib_x": np.ascontiguousarray(train["x"][idx], dtype=np.uint8),
        "calib_y": train["y"][idx].astype(np.int64),
        "confirm_x": np.ascontiguousarray(train["x"][conf], dtype=np.uint8),
        "confirm_y": train["y"][conf].astype(np.int64),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out, **arrays)
    return out


if __name__ == "__main__":
    path = build(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_DATA)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB)")
