"""Closed-form layer solvers on the second moments of a layer's inputs, each written once.

- `gptq.py`: GPTQ's column sweep (codes chosen column by column with second-order error feedback; with no grid, the
  Optimal Brain Surgeon update of a mask), used by quantization, SparseGPT and reconstruction.
- `least_squares.py`: the least-squares refit of a layer (`least_squares`) and its one ridge (`RIDGE`), used by
  structured pruning's reader repair (`refit_reader`, `output_kept`), reconstruction and the depth repair.
"""
