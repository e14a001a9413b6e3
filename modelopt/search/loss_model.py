"""MCTS's learned model of accuracy loss: additive in drop^power, fitted by hierarchical ridge regression.

    retention drop(plan) ** power ~= sum over decisions of delta[d, choice]
    delta[d, c] = kappa_d x error[d, c] + beta[d, c]

`error` is the choice's relative weight-quantization error (data-free, or measured). kappa_d is
a sensitivity per decision, shrunk toward its group's kappa (one per compressor: a pruned weight's
error and a quantized one's do not cost accuracy at the same rate; each fitted, KAPPA0 before any
data); beta is a per-choice residual shrunk toward zero. A decision's sensitivity is learned from
every choice tried there, so a few trials go a long way. Both are Gaussian posteriors, so the
rollouts can draw deltas from them (Thompson sampling).

The power is chosen from the trials (`POWERS`, the best fit of the drops themselves, once there are
`POWER_TRIALS` of them; sqrt before). How losses add up depends on the data: on clean CIFAR images a
model is sure of most answers, noise must pass a margin before it flips one, and sqrt(drop) adds up
(see `modelopt.search.mcts`); on JPEG images many answers sit near a boundary and flip as soon as any
layer is perturbed, so the flips grow with the noise's standard deviation and drop^2 adds up (measured:
docs/search.md#measured).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from modelopt.plan.plan import Decision

NOISE_SIGMA = 0.02  # noise of sqrt(drop) near a 1 % floor when one measurement is +-0.4 % (2 in 400 images)
POWERS = (0.5, 1.0, 2.0)  # candidate exponents of the additive model
POWER_TRIALS = 6  # completed trials before the exponent is fitted (sqrt until then)
DROP_REF = 0.01  # the drop at which each power's noise is NOISE_SIGMA carried through d(drop^p)
LAYER_REL = 1.0  # prior std of a decision's sensitivity, relative to the global kappa
PRIOR_REL = 0.3  # prior std of a per-(decision, choice) residual, relative to kappa_d x error
PRIOR_FLOOR = 1e-3  # ... plus this absolute floor, in sqrt(drop) units
KAPPA0 = 0.5  # sqrt(drop) per unit of relative weight error before any data (mid-range of docs/search.md#measured)
# With measured output estimates (`rescale_to_estimates`): a decision's sensitivity stays near the global one
# (what the probes leave in doubt within a layer; measured: docs/search.md#measured), and a residual's prior std
# is its prior's share alone (an absolute floor above an INT4 choice's own prior made Thompson draws pick INT8 or
# pruning at random); the anchors' three trials, spread from INT8 to INT3, already tell how drops add up.
ESTIMATED_LAYER_REL = 0.3
ESTIMATED_PRIOR_FLOOR = 1e-6


def _solve(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Ridge normal equations; least squares if a degenerate prior made them singular."""
    try:
        return np.linalg.solve(a, b)
    except np.linalg.LinAlgError:
        return np.linalg.lstsq(a, b, rcond=None)[0]


class LossModel:
    """The posterior of delta[d, c] given the trials so far; a choice of None (no compression) loses nothing.

    Args:
        error: per decision, each choice's relative weight error (None choices: any value, unused).
        is_none: per decision, which choices are None.
        width: the choice axis of `deltas` (at least the most choices of any decision); padding loses 0.

    Example:
        >>> model = LossModel(error, is_none, width=5)
        >>> model.fit(np.array([[1, 0, 2]]), np.array([0.995]), np.array([1.0]))
        >>> model.deltas(None)[0, 1]  # the posterior mean loss of decision 0's choice 1
    """

    def __init__(self, error: Sequence[np.ndarray], is_none: Sequence[Sequence[bool]], width: int,
                 groups: Sequence[int] | None = None, layer_rel: float = LAYER_REL, prior_floor: float = PRIOR_FLOOR,
                 power_trials: int = POWER_TRIALS, lognormal: bool = False) -> None:
        self.n_dec = len(error)
        self.layer_rel = layer_rel  # prior std of a decision's sensitivity around its group's kappa, relative
        self.prior_floor = prior_floor  # absolute prior std of a per-choice residual
        self.power_trials = power_trials  # trials before the power is fitted
        self.lognormal = lognormal  # Thompson draws multiplicative around the mean (`_lognormal_draws`)
        # Each decision's group (its compressor): the kappa its sensitivity is shrunk toward.
        self.group = np.zeros(self.n_dec, dtype=int) if groups is None else np.asarray(groups, dtype=int)
        self.n_groups = int(self.group.max()) + 1 if self.n_dec else 1
        self.power = POWERS[0]
        # One column per (decision, non-None choice).
        col = [[-1] * len(nones) for nones in is_none]
        k = 0
        for i, nones in enumerate(is_none):
            for j, none in enumerate(nones):
                if not none:
                    col[i][j] = k
                    k += 1
        self.n_cols = k
        self._colmat = np.full((self.n_dec, width), self.n_cols, dtype=int)  # n_cols: "no loss"
        for i in range(self.n_dec):
            for j, k in enumerate(col[i]):
                self._colmat[i, j] = k if k >= 0 else self.n_cols
        self._col_dec = np.array([i for i in range(self.n_dec) for k in col[i] if k >= 0], dtype=int)
        self._err_flat = np.array([error[i][j] for i in range(self.n_dec) for j, k in enumerate(col[i]) if k >= 0])
        self.fit(np.zeros((0, self.n_dec), dtype=int), np.zeros(0), np.zeros(0))

    def fit(self, idx: np.ndarray, retention: np.ndarray, weight: np.ndarray) -> None:
        """Refits on the trials that completed (from scratch: the fit is cheap, and a restore replays it),
        with the power (`POWERS`) whose predicted drops fit the trials' best once there are enough.

        Args:
            idx: (trials x decisions) the choice index each trial made.
            retention: each trial's retention (1 - drop).
            weight: each trial's share of the val split: a plan scored on a quarter is a quarter as sure.
        """
        if len(idx) >= self.power_trials:
            drop = np.maximum(1.0 - retention, 0.0)
            misfit = {}
            for p in POWERS:
                self.power = p
                self._fit(idx, retention, weight)
                misfit[p] = float((weight * (self.predicted_drop(idx) - drop) ** 2).sum())
            self.power = min(POWERS, key=lambda p: (misfit[p], p != POWERS[0]))
        else:
            self.power = POWERS[0]
        self._fit(idx, retention, weight)

    def predicted_drop(self, idx: np.ndarray) -> np.ndarray:
        """The posterior-mean drop of each plan (rows of choice indices)."""
        y = self.deltas(None)[np.arange(self.n_dec)[None, :], idx].sum(axis=1)
        return np.maximum(y, 0.0) ** (1.0 / self.power)

    @property
    def noise(self) -> float:
        """NOISE_SIGMA in this power's units (its derivative at DROP_REF carries the noise of a drop)."""
        return NOISE_SIGMA * (self.power / 0.5) * DROP_REF ** (self.power - 0.5)

    def _fit(self, idx: np.ndarray, retention: np.ndarray, weight: np.ndarray) -> None:
        err, dec = self._err_flat, self._col_dec
        noise_sigma = self.noise
        if len(idx) == 0:
            self.kappa = KAPPA0
            self.kappa_g = np.full(self.n_groups, KAPPA0)
            self.kd_mean = np.full(self.n_dec, KAPPA0)
            self.kd_std = np.full(self.n_dec, self.layer_rel * KAPPA0)
            self.beta_mean = np.zeros(self.n_cols)
            self.beta_std = PRIOR_REL * KAPPA0 * err + self.prior_floor
            return
        x = np.zeros((len(idx), self.n_cols + 1))  # the last column collects None choices
        x[np.arange(len(idx))[:, None], self._colmat[np.arange(self.n_dec), idx]] = 1.0
        x = x[:, :-1]
        drop = 1.0 - retention
        y = np.sign(drop) * np.abs(drop) ** self.power
        wt = weight  # weighted least squares
        s = x @ err
        sws = float(s @ (wt * s))
        self.kappa = float(np.clip((s @ (wt * y)) / sws, 1e-3, 100.0)) if sws > 1e-18 else KAPPA0
        # Per-decision sensitivity: z[t, d] = error of the choice trial t made at decision d.
        z = np.zeros((len(idx), self.n_dec))
        np.add.at(z.T, dec, (x * err).T)
        self.kappa_g = self._group_kappas(z, y, wt)
        base = self.kappa_g[self.group]
        lam_u = (noise_sigma / (self.layer_rel * base)) ** 2
        zw = z * wt[:, None]
        a = zw.T @ z + np.diag(lam_u)
        u = _solve(a, zw.T @ (y - z @ base))
        self.kd_mean = np.maximum(base + u, 0.0)
        self.kd_std = noise_sigma / np.sqrt(np.diag(a))
        prior = self.kd_mean[dec] * err
        tau = PRIOR_REL * prior + self.prior_floor
        lam = (noise_sigma / tau) ** 2  # per-column ridge: trust the prior as far as it is sure
        xw = x * wt[:, None]
        b = xw.T @ x + np.diag(lam)
        self.beta_mean = _solve(b, xw.T @ (y - x @ prior))
        self.beta_std = noise_sigma / np.sqrt(np.diag(b))

    def _group_kappas(self, z: np.ndarray, y: np.ndarray, wt: np.ndarray) -> np.ndarray:
        """Each group's kappa: weighted least squares of y on the groups' summed errors, shrunk toward
        the global kappa (a group no trial has varied keeps it)."""
        if self.n_groups == 1:
            return np.array([self.kappa])
        s = np.zeros((len(y), self.n_groups))
        np.add.at(s.T, self.group, z.T)
        lam = (self.noise / (self.layer_rel * self.kappa)) ** 2
        a = (s * wt[:, None]).T @ s + lam * np.eye(self.n_groups)
        k = _solve(a, (s * wt[:, None]).T @ y + lam * self.kappa)
        return np.clip(k, 1e-3, 100.0)

    def deltas(self, rng: np.random.Generator | None, draws: int = 1) -> np.ndarray:
        """(decisions x width) losses: the posterior mean, or (with `rng`) `draws` posterior draws
        (Thompson) stacked as (draws x decisions x width)."""
        if rng is None:
            flat = np.maximum(self.kd_mean[self._col_dec] * self._err_flat + self.beta_mean, 0.0)
            return np.append(flat, 0.0)[self._colmat]  # None and padding read the appended 0
        if self.lognormal:
            return self._lognormal_draws(rng, draws)
        kd = np.maximum(self.kd_mean + rng.standard_normal((draws, self.n_dec)) * self.kd_std, 0.0)
        beta = self.beta_mean + rng.standard_normal((draws, self.n_cols)) * self.beta_std
        flat = np.maximum(kd[:, self._col_dec] * self._err_flat + beta, 0.0)
        return np.concatenate([flat, np.zeros((draws, 1))], axis=1)[:, self._colmat]

    def _lognormal_draws(self, rng: np.random.Generator, draws: int) -> np.ndarray:
        """Posterior draws with the posterior's mean and spread, but multiplicative (lognormal): a choice
        priced as ruinous stays costly in every draw. Gaussian draws clipped at 0 let one draw in a few hundred
        price any choice at nothing, and a knapsack over dozens of choices finds that draw in most rollouts
        (docs/search.md#measured)."""
        mean = np.maximum(self.kd_mean[self._col_dec] * self._err_flat + self.beta_mean, 0.0)
        std = np.sqrt((self.kd_std[self._col_dec] * self._err_flat) ** 2 + self.beta_std**2)
        sigma = np.sqrt(np.log1p((std / np.maximum(mean, 1e-30)) ** 2))
        sigma = np.minimum(sigma, 1.0)  # a mean near 0 is not to be drawn 100x larger
        z = rng.standard_normal((draws, self.n_cols))
        flat = mean * np.exp(sigma * z - sigma**2 / 2)
        return np.concatenate([flat, np.zeros((draws, 1))], axis=1)[:, self._colmat]


def loss_model_for(decisions: Sequence[Decision], error: Sequence[np.ndarray], *, estimated: bool) -> LossModel:
    """The loss model over `error`: with measured output estimates every choice's error is in one unit (the
    answers' KL) and each layer's gain is measured, so one kappa serves every compressor, a decision's own
    sensitivity stays near it and draws are lognormal; otherwise one kappa per compressor, each layer free."""
    compressors = sorted({d.compressor for d in decisions})
    width = max(len(d.choices) for d in decisions)
    is_none = [[c is None for c in d.choices] for d in decisions]
    if not estimated:
        return LossModel(error, is_none, width, groups=[compressors.index(d.compressor) for d in decisions])
    return LossModel(error, is_none, width, groups=[0] * len(decisions), layer_rel=ESTIMATED_LAYER_REL,
                     prior_floor=ESTIMATED_PRIOR_FLOOR, power_trials=3, lognormal=True)


def rescale_to_estimates(decisions: Sequence[Decision], error: Sequence[np.ndarray],
                         estimates: Mapping[tuple[str, int], float]) -> bool:
    """Puts each choice's estimated KL of the answers {(decision, choice index): nats} in `error` (in place),
    rescaled so the median layer keeps the scale of its relative error (KAPPA0 is in those units); choices
    without an estimate keep theirs. Returns whether any estimate was taken."""
    index = {d.name: i for i, d in enumerate(decisions)}
    pairs = [(index[name], j, v) for (name, j), v in estimates.items()
             if name in index and v > 0 and math.isfinite(v) and error[index[name]][j] > 0]
    if not pairs:
        return False
    scale = float(np.exp(np.median([math.log(error[i][j] / v) for i, j, v in pairs])))
    for i, j, v in pairs:
        error[i][j] = v * scale
    return True
