"""Images and labels: the splits a run uses, and the readers for `.npz` files and image folders."""

from modelopt.data import sample  # noqa: F401  (registers the bundled sample's named sources)
