"""Images and labels: the splits a run uses, and the readers for `.npz` files and image folders."""
