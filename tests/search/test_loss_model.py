"""MCTS's loss model on data drawn from a known additive model: the fit must recover it."""

from __future__ import annotations

import numpy as np

from modelopt.search.loss_model import KAPPA0, LossModel

ERROR = np.array([0.0, 4.0**-8, 4.0**-4, 4.0**-2])  # None, then INT8, INT4, INT2 (relative error ~ 4^-bits)
N_DEC = 8


def _model() -> LossModel:
    return LossModel([ERROR] * N_DEC, [[True, False, False, False]] * N_DEC, width=5)


def test_before_any_data_the_mean_is_the_data_free_prior():
    model = _model()
    mean = model.deltas(None)
    assert mean.shape == (N_DEC, 5)
    assert np.allclose(mean[:, :4], KAPPA0 * ERROR, atol=1e-12)
    assert (mean[:, 0] == 0).all() and (mean[:, 4] == 0).all()  # None and padding lose nothing


def test_fit_recovers_per_decision_sensitivities_from_noiseless_trials():
    rng = np.random.default_rng(0)
    kappa = rng.uniform(0.1, 3.0, N_DEC)  # far from KAPPA0 and from each other
    truth = kappa[:, None] * ERROR[None, :]
    idx = rng.integers(0, 4, (300, N_DEC))
    sqrt_drop = truth[np.arange(N_DEC), idx].sum(axis=1)
    model = _model()
    model.fit(idx, 1.0 - sqrt_drop**2, np.ones(len(idx)))
    got = model.deltas(None)[:, :4]
    assert np.abs(got[:, 3] - truth[:, 3]).max() < 0.1 * truth[:, 3].min()  # INT2, where the loss is
    assert np.abs(got - truth).max() < 0.01
    # Thompson draws scatter around the mean, narrowly once the data is plentiful.
    draws = model.deltas(np.random.default_rng(1), draws=200)
    assert draws.shape == (200, N_DEC, 5)
    assert np.abs(draws.mean(axis=0)[:, :4] - got).max() < 0.01
