"""Fitness landscapes for the strategy lab: a simulator of what ES sees in essa, and classic test functions.

Every landscape maps genomes (P, D) to rewards (P, N, 1) for the generation's minibatch, seeded from
(seed, generation) like ``engine.tasks.minibatch``, so a lab run is deterministic. Fitness is
maximised. Registry: :data:`LANDSCAPES`; build one with :func:`make_landscape`.

``minibatch``: the simulator (:class:`MinibatchLandscape`)
--------------------------------------------------------------
What ES sees in this product (docs/results/evolution.md and its study log): a genome
x (D,), a train pool of problems and a held-out set of 500; each generation a fresh minibatch of
N problems shared by every candidate; 0/1 outcomes that are DETERMINISTIC per (genome, problem),
as greedy decoding is, so nearby candidates tie. Problem i is solved when its score is positive::

    y = w * x                                   # (D,) effective genome: w 1 on the top block, lower_weight below
    s_i(y) = b_i                                # difficulty, N(mu_b, 1)
           + sum_l (gbar_l t_l - kappa_l t_l^2 / 2),  t = U y     # useful directions (k << D)
           - sharpness sum_q (v_q . y)^2        # a few sharp directions: the warm start is a sharp optimum
           + eta_i(y)                           # per-problem chaos, a smooth random field
    correct_i(y) = [s_i(y) > 0]

* Coordinates come in blocks of ``block`` (240) per singular-value rank: the default genome
  (alpha 0.125, D 240) is the top block, alpha 1 (D 1920) is eight blocks; the lower blocks move
  the model less per unit (``lower_weight``), as a relative change of a smaller singular value
  does. A genome of D < 1920 is the first D coordinates of the same landscape, so D 240 and
  D 1920 share the warm start, the problems and the chaos, as the real genomes do.
* eta_i is a random-Fourier-feature field (Rahimi & Recht, NIPS 2007): chaos sqrt(2/F)
  sum_f xi_if cos(omega_f . y / length + phi_if), omega_f ~ N(0, I), so its correlation between
  two genomes is exp(-|y - y'|^2 / (2 length^2)): candidates closer than ``length`` mostly tie,
  far ones flip independently.
* Useful directions: ``useful_top`` in the top block holding ``gain_top`` (score units) at
  distance ``reach_top``, ``useful_low`` in the lower blocks holding ``gain_low`` at
  ``reach_low`` (reachable only with D > 240). Per direction gbar = 2 G / (k r), kappa =
  2 G / (k r^2): the score rises by G / k at t = r and falls beyond.
* Sharp directions (``sharp`` of them, top block): a perturbation of sigma pays sharpness
  sigma^2 per direction on every problem, so the centre (the mean genome) scores above its
  population, while the mean itself stays near the ridge because selection sees the cost.
* Expected accuracy (over problems) has a closed form, ``true_fitness``: A(y) = Phi((mu_b +
  useful(t) - sharp(y)) / sqrt(1 + chaos^2)); ``oracle()`` maximises it by L-BFGS over the genome,
  the lab's counterpart of tools/genome_capacity.py's gradient oracle.

The knobs (:class:`MinibatchParams`, score units: problem difficulty has spread 1) are calibrated by
``engine/lab/calibrate.py`` against the real default run (D 240, P 16, N 64, sigma0 0.3, CMA-ES, 10
generations; its docstring holds the table, ``python -m engine.lab.calibrate`` prints it)::

    knob                  value   sets (what it was calibrated against)
    accuracy0             0.29    genome zero's expected accuracy (the 20-step warm start, 0.276-0.294)
    chaos, length         0.56, 6 per-problem flips: b + c ~ 65 of 500 after 10 generations, max - mean 0.04-0.09
    sharp, sharpness      4, 0.2  centre >= population mean in ~8.6 of 10 generations, split-half rho ~0.1-0.2
    useful_top, gain_top, 2, 0.16, ES's +3 to +5 points at D 240 in 10 generations, then a plateau;
      reach_top           1.0     the oracle's few points inside D 240
    useful_low, gain_low, 16, 0.36, the oracle's +17 points inside D 1920, out of ES's reach
      reach_low           12
    lower_weight          0.5     effect per unit of a lower singular value (D 1920's wider candidate spread)
    block, features       240, 128 coordinates per singular-value rank; Fourier features of eta
    pool, held_out        4000, 500 train problems; held-out problems (essa train's val_size)

and ``landscape.seed`` 5 (conf/lab.yaml) is the instance whose held-out set scores 0.292 at genome zero.

The dense score (``rollout.dense``): what essa train's dense reward is in the simulator
----------------------------------------------------------------------------------------
Studied in docs/log/2026-12-02-signal-levers-in-the-lab.md (which lever makes ES learn).
essa train's dense reward is log p(reference answer | prompt, the rollout's own reasoning), a sum over
the answer's tokens in nats (engine/evaluation/population.py ``dense_scores``): near 0 where greedy
decoding wrote the reference (it was the argmax), very negative where the reasoning led elsewhere, and
graded in between. With one main competing answer log p(ref) = log sigmoid(logit margin), so the
simulator's dense score of genome y on problem i is::

    dense_i(y) = log sigmoid((s_i(y) - (1 - dense_eta) eta_i(y) + zeta_i(y)) / dense_temperature)   # (P, N) nats, <= 0, never NaN

s_i the problem's score margin (above: correct where > 0; ``dense_eta`` 1, the default, keeps all of its
chaos eta_i, 0 leaves only difficulty and shared skill, b_i + useful - sharp) and zeta_i a second random-Fourier-feature
field (std ``dense_chaos``, correlation length ``dense_length``, its own stream of the landscape seed):
the part of the dense score that is not the correctness margin (which wrong path the reasoning took,
the answer's tokenisation). Deterministic per (genome, problem) like the outcome. Loosely calibrated,
ASSUMED, not measured (no real run had logged the dense score when this was written):
``dense_temperature`` 0.2 puts a typical wrong problem (s about -1) near -5 nats and a solved one
(s about +0.5) near -0.1; the population's mean dense score came out at -4.6 nats in the lab; only ranks (``tiebreak``)
and population z-scores (``weighted``) reach the strategy, so the scale matters only through where
the sigmoid saturates. ``dense_chaos`` 0.56 (= ``chaos``) makes the dense score's own noise as large as
the per-problem chaos of the outcome; 0 makes it a pure function of the margin (the most informative
case), several times ``chaos`` makes it mostly noise. Its split-half rank correlation (the lab's
``dense_split_half_rho``) is what a real run with ``rollout.dense`` on should be compared with, from
the ``dense`` column of its rollouts/gen_*.parquet, before the lab's dense predictions are trusted.

Classic landscapes (sanity checks, no held-out set, N = 1, reward = fitness)
----------------------------------------------------------------------------
``sphere`` -|x - x*|^2, ``ellipsoid`` -sum_j 10^(6 j / (D - 1)) (x_j - x*_j)^2 and ``rastrigin``
-(10 D + sum_j (z_j^2 - 10 cos 2 pi z_j)), z = x - x*, with x* uniform in [-1, 1]^D from the
landscape seed (Hansen et al., COCO/BBOB noiseless functions f1, f2, f15, arXiv 1603.08785).

``likelihood`` (engine/lab/likelihood.py): the real model and SVD-LoRA genome of the cached warm start,
fitness the mean log-likelihood of reference solutions, scored prefill-only through vLLM.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Callable

import numpy as np

from engine.lab.base import Landscape

__all__ = ["LANDSCAPES", "Landscape", "MinibatchLandscape", "MinibatchParams", "make_landscape", "landscape_names"]

FULL_BLOCKS = 8
"""Singular-value ranks of the full genome (alpha 1 at LoRA rank 8): D 1920 = 8 blocks of 240."""


# --- the simulator ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class MinibatchParams:
    """Knobs of :class:`MinibatchLandscape` (score units: the spread of problem difficulty is 1).

    accuracy0: expected accuracy of genome zero (the warm start). pool: train problems. held_out:
    held-out problems. block: coordinates per singular-value rank. lower_weight: effect per unit of
    a coordinate outside the top block. chaos: std of the per-problem field eta. length: its
    correlation length (effective genome units). features: F random Fourier features. sharp:
    number of sharp directions; sharpness: their curvature. useful_top / gain_top / reach_top and
    useful_low / gain_low / reach_low: useful directions in the top / lower blocks, the score they
    hold together and the distance where it peaks (module docstring). dense_temperature: score units per
    nat of the dense score's margin; dense_chaos / dense_length: std and correlation length of its own
    field; dense_eta: the weight of the outcome's chaos eta in its margin (1: the outcome's margin; 0: only
    the shared skill, which with dense_chaos 0 ranks candidates by expected accuracy: a perfect signal)
    (module docstring, "The dense score": assumed, not measured). numerics: std of the batch-slot noise
    added to every (candidate, problem) score of a training minibatch, fresh each generation (the bf16
    numerics floor of issue 42; :func:`placebo_discordance` calibrates it against a real placebo
    generation; 0: float32's exact invariance). Held-out scores stay exact.
    """

    accuracy0: float = 0.29
    pool: int = 4000
    held_out: int = 500
    block: int = 240
    lower_weight: float = 0.5
    chaos: float = 0.56
    length: float = 6.0
    features: int = 128
    sharp: int = 4
    sharpness: float = 0.2
    useful_top: int = 2
    gain_top: float = 0.16
    reach_top: float = 1.0
    useful_low: int = 16
    gain_low: float = 0.36
    reach_low: float = 12.0
    dense_temperature: float = 0.2
    dense_chaos: float = 0.56
    dense_length: float = 6.0
    dense_eta: float = 1.0
    numerics: float = 0.0

    @classmethod
    def with_options(cls, options: dict | None) -> "MinibatchParams":
        """The calibrated defaults with ``options`` (knob -> value) replaced.

        Raises:
            ValueError: an unknown knob (one line naming ``landscape.options.<knob>`` and the knobs).
        """
        options = dict(options or {})
        names = [f.name for f in fields(cls)]
        bad = sorted(set(options) - set(names))
        if bad:
            raise ValueError(f"landscape.options.{bad[0]}: no such knob of the minibatch landscape; "
                             f"knobs: {', '.join(names)}")
        values = {}
        for k, v in options.items():
            kind = type(getattr(cls(), k))
            try:
                values[k] = kind(v)
            except (TypeError, ValueError):
                raise ValueError(f"+landscape.options.{k}={v!r}: must be a {kind.__name__}, e.g. "
                                 f"+landscape.options.{k}={getattr(cls(), k)}") from None
        params = replace(cls(), **values)
        params.check()
        return params

    def check(self) -> None:
        """Raises ValueError naming the first knob outside its range (``landscape.options.<knob>``); every knob
        is finite (``inf`` passed the ``>= 0`` rules and ran, e.g. numerics=inf: verdicts of pure noise)."""
        for f in fields(self):
            if not math.isfinite(getattr(self, f.name)):
                raise ValueError(f"landscape.options.{f.name}={getattr(self, f.name)}: must be a finite number, e.g. "
                                 f"+landscape.options.{f.name}={f.default}")
        rules = [("accuracy0", 0 < self.accuracy0 < 1, "in (0, 1)"), ("pool", self.pool >= 1, ">= 1"),
                 ("held_out", self.held_out >= 1, ">= 1"), ("block", self.block >= 1, ">= 1"),
                 ("lower_weight", self.lower_weight >= 0, ">= 0"), ("chaos", self.chaos >= 0, ">= 0"),
                 ("length", self.length > 0, "> 0"), ("features", self.features >= 1, ">= 1"),
                 ("sharp", 0 <= self.sharp <= self.block, "in [0, block]"), ("sharpness", self.sharpness >= 0, ">= 0"),
                 ("useful_top", 0 <= self.useful_top <= self.block, "in [0, block]"),
                 ("useful_low", 0 <= self.useful_low <= (FULL_BLOCKS - 1) * self.block, "in [0, 7 block]"),
                 ("reach_top", self.reach_top > 0, "> 0"), ("reach_low", self.reach_low > 0, "> 0"),
                 ("dense_temperature", self.dense_temperature > 0, "> 0"), ("dense_chaos", self.dense_chaos >= 0, ">= 0"),
                 ("dense_length", self.dense_length > 0, "> 0"), ("dense_eta", self.dense_eta >= 0, ">= 0"),
                 ("numerics", self.numerics >= 0, ">= 0")]
        for name, ok, what in rules:
            if not ok:
                raise ValueError(f"landscape.options.{name}={getattr(self, name)}: must be {what}")


def _unit_rows(rng: np.random.Generator, k: int, lo: int, hi: int, width: int) -> np.ndarray:
    """(k, width) orthonormal rows supported on coordinates [lo, hi) (k <= hi - lo)."""
    out = np.zeros((k, width))
    if k:
        q, _ = np.linalg.qr(rng.standard_normal((hi - lo, k)))  # (hi - lo, k)
        out[:, lo:hi] = q.T
    return out


class MinibatchLandscape(Landscape):
    """The simulator of essa's fitness (module docstring): 0/1 rewards per (genome, problem).

    Args:
        dim: D (the genome is the first D coordinates of the 8-block space, or more).
        prompts: N problems per generation. seed: the landscape's seed (the "task and warm start";
            the lab's run seed only moves the strategy and the minibatches, as in essa train).
        params: the knobs (:class:`MinibatchParams`, default the calibrated ones).
    """

    name = "minibatch"
    binary = True
    has_dense = True
    variable_prompts = True
    true_fitness_name = "expected accuracy"

    def __init__(self, dim: int, seed: int = 0, prompts: int = 64, params: MinibatchParams | None = None):
        super().__init__(dim, seed)
        self.p = p = params or MinibatchParams()
        self.prompts = int(prompts)
        width = max(self.dim, FULL_BLOCKS * p.block)
        rng = [np.random.default_rng([seed, 20251201, part]) for part in range(6)]  # one stream per part
        self.w = np.where(np.arange(width) < p.block, 1.0, p.lower_weight)[:self.dim]  # (D,)
        top = min(p.block, width)
        low = _unit_rows(rng[1], p.useful_low, top, FULL_BLOCKS * p.block, width)
        self.U = np.vstack([_unit_rows(rng[0], p.useful_top, 0, top, width), low])[:, :self.dim]  # (k, D)
        gains = [(p.gain_top, p.reach_top, p.useful_top), (p.gain_low, p.reach_low, p.useful_low)]
        self.gbar = np.concatenate([np.full(k, 2 * g / (max(k, 1) * r)) for g, r, k in gains])  # (k,)
        self.kappa = np.concatenate([np.full(k, 2 * g / (max(k, 1) * r * r)) for g, r, k in gains])  # (k,)
        self.V = _unit_rows(rng[2], p.sharp, 0, top, width)[:, :self.dim]  # (q, D)
        self.omega = rng[3].standard_normal((p.features, width))[:, :self.dim] / p.length  # (F, D)
        n = p.pool + p.held_out
        self.mu_b = float(_norm_ppf(p.accuracy0) * math.sqrt(1 + p.chaos ** 2))
        self.b = self.mu_b + np.concatenate([_stratified_normal(rng[4], p.pool),
                                             _stratified_normal(rng[4], p.held_out)])  # (M,)
        self.xi = rng[5].standard_normal((n, p.features)) * (p.chaos * math.sqrt(2.0 / p.features))  # (M, F)
        self.phi = rng[5].uniform(0, 2 * np.pi, (n, p.features))  # (M, F)
        self.held_out_ids = np.arange(p.pool, n)
        self._dense_field(seed, width, n)

    def _dense_field(self, seed: int, width: int, n: int) -> None:
        """The dense score's own field zeta (module docstring), from two streams of its own (parts 6, 7), so
        the outcome's landscape is the same with or without it: omega (F, D), xi and phi (M, F)."""
        p = self.p
        rng = [np.random.default_rng([seed, 20251201, part]) for part in (6, 7)]
        self.omega_d = rng[0].standard_normal((p.features, width))[:, :self.dim] / p.dense_length  # (F, D)
        self.xi_d = rng[1].standard_normal((n, p.features)) * (p.dense_chaos * math.sqrt(2.0 / p.features))  # (M, F)
        self.phi_d = rng[1].uniform(0, 2 * np.pi, (n, p.features))  # (M, F)

    def _common(self, Y: np.ndarray) -> np.ndarray:
        """Useful gain minus sharp cost of effective genomes Y (P, D): (P,) score units."""
        T = _rowdot(Y, self.U)  # (P, k)
        useful = (T * self.gbar).sum(axis=1) - 0.5 * (T * T * self.kappa).sum(axis=1)
        return useful - self.p.sharpness * (_rowdot(Y, self.V) ** 2).sum(axis=1)

    def scores(self, genomes: np.ndarray, problems: np.ndarray) -> np.ndarray:
        """Scores s_i(y) of genomes (P, D) on problem ids (N,): (P, N); correct where > 0. Each entry is
        computed from its genome and problem alone (no BLAS reduction across the batch), so an outcome
        is the same to the last bit whatever else is evaluated with it."""
        Y = np.atleast_2d(genomes) * self.w  # (P, D)
        eta = _fourier_field(Y, self.omega, self.xi[problems], self.phi[problems])  # (P, N)
        return self.b[problems][None, :] + self._common(Y)[:, None] + eta

    def dense(self, genomes: np.ndarray, problems: np.ndarray, scores: np.ndarray | None = None) -> np.ndarray:
        """Dense scores of genomes (P, D) on problem ids (N,): log sigmoid((s + zeta) / dense_temperature),
        (P, N) nats, <= 0 and finite (module docstring, "The dense score"). ``scores``: their (P, N)
        :meth:`scores` when already computed. Per entry like :meth:`scores` (batch-independent)."""
        s = self.scores(genomes, problems) if scores is None else scores
        Y = np.atleast_2d(genomes) * self.w  # (P, D)
        if self.p.dense_eta != 1.0:  # less (or more) of the outcome's chaos in the dense margin
            s = s - (1.0 - self.p.dense_eta) * _fourier_field(Y, self.omega, self.xi[problems], self.phi[problems])
        zeta = _fourier_field(Y, self.omega_d, self.xi_d[problems], self.phi_d[problems])
        return -np.logaddexp(0.0, -(s + zeta) / self.p.dense_temperature)  # log sigmoid, no overflow

    def minibatch(self, seed: int, generation: int, prompts: int | None = None) -> np.ndarray:
        """The generation's N problem ids from the train pool (N = ``prompts`` or the landscape's own), drawn
        as engine.tasks.minibatch draws."""
        rng = np.random.default_rng([seed, generation])
        return rng.choice(self.p.pool, size=min(prompts or self.prompts, self.p.pool), replace=False)

    def slot_noise(self, shape: tuple[int, int], seed: int, generation: int) -> np.ndarray:
        """(P, N) batch-slot noise of a generation (``numerics`` std; zeros when 0): a candidate's verdict
        moves with where it sits in the batch, not with its genome (issue 42)."""
        if self.p.numerics == 0:
            return np.zeros(shape)
        return self.p.numerics * np.random.default_rng([seed, generation, 42]).standard_normal(shape)

    def rewards(self, genomes: np.ndarray, seed: int, generation: int, prompts: int | None = None) -> np.ndarray:
        """0/1 rewards of genomes (P, D) on the generation's minibatch: (P, N, 1) float64."""
        return self.evaluate(genomes, seed, generation, prompts)[0]

    def evaluate(self, genomes: np.ndarray, seed: int, generation: int, prompts: int | None = None,
                 dense: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
        """0/1 rewards (P, N, 1) of genomes (P, D) on the generation's minibatch and, with ``dense``, their
        dense scores (P, N, 1) nats on the same problems (else None), from one computation of the scores."""
        problems = self.minibatch(seed, generation, prompts)
        s = self.scores(genomes, problems)  # (P, N)
        s = s + self.slot_noise(s.shape, seed, generation)
        d = self.dense(genomes, problems, s)[:, :, None] if dense else None
        return (s > 0).astype(float)[:, :, None], d

    def held_out(self, x: np.ndarray) -> np.ndarray:
        """0/1 rewards of one genome (D,) on the 500 held-out problems: (500,)."""
        return (self.scores(x, self.held_out_ids)[0] > 0).astype(float)

    def true_fitness(self, x: np.ndarray) -> float:
        """Expected accuracy over the problem distribution (module docstring, A(y)), a fraction."""
        z = (self.mu_b + self._common(np.atleast_2d(x) * self.w)[0]) / math.sqrt(1 + self.p.chaos ** 2)
        return float(_norm_cdf(z))

    def oracle(self) -> dict:
        """The gradient oracle: maximise the expected accuracy over the whole genome (L-BFGS from zero).

        Returns:
            ``{"x": (D,) genome, "expected": A(x), "held_out": held-out accuracy of x (500 problems),
            "held_out_zero": of genome zero, "gain": held_out - held_out_zero}``.
        """
        from scipy.optimize import minimize

        def loss(x):  # the score inside Phi is monotone: maximise it (exact gradient)
            y = x * self.w
            T, S = self.U @ y, self.V @ y  # (k,), (q,)
            val = T @ self.gbar - 0.5 * (T * T) @ self.kappa - self.p.sharpness * S @ S
            grad = self.U.T @ (self.gbar - self.kappa * T) - 2 * self.p.sharpness * self.V.T @ S
            return -val, -grad * self.w

        x = minimize(loss, np.zeros(self.dim), jac=True, method="L-BFGS-B").x
        zero = float(self.held_out(np.zeros(self.dim)).mean())
        acc = float(self.held_out(x).mean())
        return {"x": x, "expected": self.true_fitness(x), "held_out": acc, "held_out_zero": zero, "gain": acc - zero}


def placebo_discordance(landscape: MinibatchLandscape, population: int = 17, generations: int = 10,
                        seed: int = 0) -> float:
    """Mean pairwise verdict discordance of ``population`` copies of genome zero over ``generations``
    minibatches: the lab's counterpart of a real placebo generation (engine/evaluation/numerics.py), to
    calibrate ``numerics`` against the real figure of a CPU class and dtype."""
    from engine.results.stats import pairwise_discordance

    zeros = np.zeros((population, landscape.dim))
    return float(np.mean([pairwise_discordance(landscape.rewards(zeros, seed, g)) for g in range(generations)]))


def _fourier_field(Y: np.ndarray, omega: np.ndarray, xi: np.ndarray, phi: np.ndarray) -> np.ndarray:
    """A random-Fourier-feature field (Rahimi & Recht 2007) at effective genomes Y (P, D) for N problems:
    sum_f xi_nf cos(omega_f . y + phi_nf), omega (F, D), xi and phi (N, F) -> (P, N)."""
    Z = _rowdot(Y, omega)  # (P, F)
    return (xi[None] * np.cos(Z[:, None, :] + phi[None])).sum(axis=2)


def _rowdot(Y: np.ndarray, M: np.ndarray) -> np.ndarray:
    """(P, D) x (K, D) -> (P, K) dot products, each summed on its own (numpy's pairwise sum along D), so a
    row's result does not depend on the batch it is in (a BLAS matmul may sum in another order)."""
    return (Y[:, None, :] * M[None, :, :]).sum(axis=2)


def _stratified_normal(rng: np.random.Generator, n: int) -> np.ndarray:
    """n draws of N(0, 1), one from each of n equal-probability strata, shuffled (n,): the held-out set's
    difficulty then matches the distribution closely, so genome zero scores near ``accuracy0``."""
    from scipy.special import ndtri

    return ndtri((rng.permutation(n) + rng.uniform(size=n)) / n)


def _norm_cdf(z):
    from scipy.special import ndtr

    return ndtr(z)


def _norm_ppf(p: float) -> float:
    from scipy.special import ndtri

    return float(ndtri(p))


# --- classic test functions ---------------------------------------------------------------------------

class _Classic(Landscape):
    """A deterministic test function f, maximised as -f(x - x*), x* ~ U[-1, 1]^D from the seed."""

    def __init__(self, dim: int, seed: int = 0, **_: Any):
        super().__init__(dim, seed)
        self.optimum = np.random.default_rng([seed, 20251201]).uniform(-1, 1, self.dim)  # (D,)

    def f(self, Z: np.ndarray) -> np.ndarray:
        """The function at Z = X - x* (P, D): (P,) >= 0, 0 at the optimum."""
        raise NotImplementedError

    def rewards(self, genomes: np.ndarray, seed: int, generation: int, prompts: int | None = None) -> np.ndarray:
        """-f of genomes (P, D) as (P, 1, 1) (no minibatch: the same every generation; ``prompts`` unused)."""
        return -self.f(np.atleast_2d(genomes) - self.optimum)[:, None, None]

    def true_fitness(self, x: np.ndarray) -> float:
        """-f(x - x*), 0 at the optimum."""
        return float(-self.f(np.atleast_2d(x) - self.optimum)[0])

    def oracle(self) -> dict:
        """The optimum x* and its fitness 0."""
        return {"x": self.optimum.copy(), "expected": 0.0}


class Sphere(_Classic):
    """sum_j z_j^2 (BBOB f1)."""

    name = "sphere"

    def f(self, Z):
        return np.sum(Z * Z, axis=1)


class Ellipsoid(_Classic):
    """sum_j 10^(6 j / (D - 1)) z_j^2 (BBOB f2, condition number 1e6)."""

    name = "ellipsoid"

    def f(self, Z):
        D = Z.shape[1]
        return (Z * Z) @ (10.0 ** (6.0 * np.arange(D) / max(D - 1, 1)))


class Rastrigin(_Classic):
    """10 D + sum_j (z_j^2 - 10 cos(2 pi z_j)) (BBOB f15 without rotation; 0 at the optimum)."""

    name = "rastrigin"

    def f(self, Z):
        return 10.0 * Z.shape[1] + np.sum(Z * Z - 10.0 * np.cos(2 * np.pi * Z), axis=1)


LIKELIHOOD_OPTIONS = {"train": [], "max_tokens": 96, "true_problems": 64}
"""``landscape.options`` of the likelihood landscape: essa train overrides that choose its model, task,
LoRA, warm start and engine (conf/train.yaml's groups); held-out answer length; held-out problems of
its true fitness."""


def _likelihood(dim: int | None, seed: int = 0, prompts: int = 64, options: dict | None = None,
                context: dict | None = None) -> Landscape:
    """The real-model landscape (engine/lab/likelihood.py). ``context``: ``{"groups": essa train's model,
    task, lora, sft, engine and reward groups, "genome": the strategy.genome group, "adapters": P + 1}``,
    composed by the command from ``options.train``."""
    bad = sorted(set(options or {}) - set(LIKELIHOOD_OPTIONS))
    if bad:
        raise ValueError(f"landscape.options.{bad[0]}: not an option of the likelihood landscape; options: "
                         f"{', '.join(LIKELIHOOD_OPTIONS)}")
    if not context:
        raise ValueError("landscape.name=likelihood needs essa train's config groups; run it through essa lab")
    from engine.lab.likelihood import build_likelihood

    opts = {**LIKELIHOOD_OPTIONS, **(options or {})}
    return build_likelihood(context["groups"], context["genome"], dim, prompts, seed, context["adapters"],
                            int(opts["max_tokens"]), int(opts["true_problems"]))


def _minibatch(dim: int, seed: int = 0, prompts: int = 64, options: dict | None = None, context=None) -> Landscape:
    return MinibatchLandscape(dim, seed, prompts, MinibatchParams.with_options(options))


def _classic(cls) -> Callable[..., Landscape]:
    def build(dim: int, seed: int = 0, prompts: int = 1, options: dict | None = None, context=None) -> Landscape:
        if options:
            raise ValueError(f"landscape.options={options}: the {cls.name} landscape has no knobs; drop them")
        return cls(dim, seed)
    return build


LANDSCAPES: dict[str, Callable[..., Landscape]] = {
    "minibatch": _minibatch,
    "likelihood": _likelihood,
    "sphere": _classic(Sphere),
    "ellipsoid": _classic(Ellipsoid),
    "rastrigin": _classic(Rastrigin),
}
"""name -> builder ``(dim, seed, prompts, options, context) -> Landscape``."""


def landscape_names() -> list[str]:
    """The registered landscape names, sorted."""
    return sorted(LANDSCAPES)


def make_landscape(name: str, dim: int | None, seed: int = 0, prompts: int = 64, options: dict | None = None,
                   context: dict | None = None) -> Landscape:
    """Build a registered landscape.

    Args:
        name: a key of :data:`LANDSCAPES`. dim: D >= 1 (likelihood: None = the genome codec's D). seed: the landscape's own seed (problems,
            warm start, optimum). prompts: N per generation (minibatch, likelihood). options: knobs
            (minibatch: :class:`MinibatchParams` fields; likelihood: :data:`LIKELIHOOD_OPTIONS`).
            context: what a real-model landscape needs beyond them (:func:`_likelihood`).

    Raises:
        ValueError: unknown name, D < 1, N < 1, an unknown knob, or a landscape that cannot be built
            (one line naming the ``landscape.*`` field).
    """
    if name not in LANDSCAPES:
        raise ValueError(f"landscape.name={name!r} is not a landscape; use one of: {', '.join(landscape_names())}")
    if dim is None and name == "likelihood":  # the codec's D (engine/lab/likelihood.py)
        pass
    elif not isinstance(dim, (int, np.integer)) or dim < 1:
        raise ValueError(f"landscape.dim={dim!r}: must be an integer >= 1 (the genome length D, e.g. 240)")
    if prompts < 1:
        raise ValueError(f"landscape.prompts={prompts!r}: must be >= 1 (problems per generation, e.g. 64)")
    return LANDSCAPES[name](dim, seed, prompts=prompts, options=options, context=context)


def params_dict(landscape: Landscape) -> dict:
    """The knobs of a minibatch landscape as a dict ({} for the others), for lab_summary.json."""
    return asdict(landscape.p) if isinstance(landscape, MinibatchLandscape) else {}
