"""LRA-CMA-ES: CMA-ES with learning-rate adaptation, through the ``cmaes`` package.

Nomura, Akimoto, Ono, "CMA-ES with Learning Rate Adaptation: Can CMA-ES with Default Population
Size Solve Multimodal and Noisy Problems?", GECCO 2023 (arXiv 2304.03473), its Algorithm 1: the
learning rates of the mean (eta_m) and of the covariance (eta_Sigma) are adapted so that the
signal-to-noise ratio of each update stays near a target alpha (1.4), estimated from moving
averages of the updates in the distribution's local coordinates. On noisy fitness (k/N accuracies)
the learning rates fall instead of the population having to grow; the journal version (Nomura,
Akimoto, Ono, "CMA-ES with Learning Rate Adaptation", arXiv 2401.15876) extends the study. The
maths is ``cmaes.CMA(..., lr_adapt=True)`` (cmaes, Nomura & Shibata, arXiv 2402.01373), with its
default hyper-parameters (alpha 1.4, beta_m 0.1, beta_Sigma 0.03, gamma 0.1). Its SNR averages
start at zero, so the learning rates fall to about 0.25 in the first ~10 generations even on an
easy problem, and sigma is scaled up by the same factor (the algorithm's step-size correction):
on the D 10 sphere it needs 100 generations where cma_es needs 30 (tests/test_strategies.py), so
with few generations (``make run``'s 10) expect a slower start than ``strategy=essa``.

cmaes asks one solution at a time and minimises ``tell([(x, value), ...])``; this adapter stacks P
asks into (P, D) and negates fitness, and is the only place that does.

Exact resume: ``cmaes.CMA`` samples from its own ``np.random.RandomState`` (``_rng``), and its
pickle drops that generator and stores C as its upper triangle, which is exact only while C is
exactly symmetric; after an ask it is not (C = B diag(D^2) B^T, at the last bit): measured with
cmaes 0.13.1, D 30, P 16, three generations and an ask, a pickled copy told the same candidates
differs from the original in C and the mean in 20 of 20 seeds. So ``_rng`` is replaced by
:class:`_GeneratorRandomState`, which draws from the strategy's ``self.rng`` (saved by the base
class), and ``state_dict`` keeps every other attribute of the ``CMA`` object as it is, C whole.

Ties (``strategy.options.ties``, default ``"average"``, as in :mod:`strategies.cma_es`): cmaes
sorts with Python's stable sort, so tied candidates are weighted by their place in the told list.
For one tell the adapter swaps in the weights of :func:`strategies.cma_es.tie_weights` and their
positive count ``_mu``, and tells the candidates in :func:`strategies.cma_es.canonical_order`.
cmaes applies one weight array to the mean (``_weights[:_mu]``, eq. 41) and to C (all of
``_weights``, eq. 46-47), the same layout as pycma, so the rule is the same: tied candidates get
equal weights, the mean's weights still sum to 1, a group straddling the positive/negative
boundary shares its positive mass and drops its negative weights.

Cost: full covariance. ``cmaes.CMA.ask`` multiplies B diag(D) anew for every one of the P
samples and ``tell`` forms P outer products of D x D at once, plus four more D x D matrices for the
learning-rate adaptation. Measured on a 2-core shared Xeon (P 16, one generation; state =
pickled attributes between ask and tell, C, B and E_Sigma): D 240 0.02 s, 18 MB peak, 1.4 MB
state; D 1000 0.9 s, 304 MB, 24 MB; D 1920 (ESSA at alpha 1) 5.2 s, 1.1 GB, 89 MB (59 MB after a
tell, which drops B); D 2000 1.25 GB peak (``strategies.testing.check_memory``). Peak memory grows
as P D^2: D above :data:`MAX_DIM` (2000) is refused; use ``strategy=sep_cma`` or a smaller genome.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from strategies.base import Strategy
from strategies.cma_es import canonical_order, check_ties, has_ties, tie_weights

__all__ = ["LRACMAES", "MAX_DIM", "MIN_POPULATION"]

MAX_DIM = 2000
"""Largest D accepted: at D 1920, P 16 one generation takes 5 s and 1.1 GB (module docstring)."""

MIN_POPULATION = 4
"""cmaes needs mu = P // 2 >= 2 (mu_eff > 1, else its rank-mu learning rate is 0 and it divides by it)."""


class _GeneratorRandomState:
    """The one method of ``np.random.RandomState`` that ``cmaes.CMA`` samples with, ``randn``,
    drawn from the strategy's ``np.random.Generator`` (one source of truth for the random state)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def randn(self, *shape: int) -> np.ndarray:
        return self.rng.standard_normal(shape)


class LRACMAES(Strategy):
    """LRA-CMA-ES (``cmaes.CMA(lr_adapt=True)``) behind the ask/tell contract; fitness is maximised.

    Args:
        dim, x0, seed, population_size, sigma0: see :class:`strategies.base.Strategy`
            (cmaes's ``mean``, ``sigma``, ``population_size``); P >= :data:`MIN_POPULATION`,
            D <= :data:`MAX_DIM`.
        ties: ``"average"`` (default): tied fitness gets tied weights; ``"argsort"``: cmaes's
            plain stable sort (tied candidates weighted by their place in the told list).

    Raises:
        ValueError: on a bad ``ties``, P < 4, D > 2000, or when ``cmaes`` is not installed.

    ``state_dict()["strategy"]["cma"]`` holds the ``cmaes.CMA`` attributes (C (D, D) float64,
    its eigenbasis B (D, D), the learning-rate statistics, of which E_Sigma is (D^2, 1)), all but
    its random generator, which is ``self.rng``.
    """

    def __init__(
        self,
        dim: int,
        x0: np.ndarray | None,
        seed: int,
        population_size: int,
        sigma0: float,
        *,
        ties: str = "average",
        **options: Any,
    ) -> None:
        super().__init__(dim, x0, seed, population_size, sigma0, **options)
        self.ties = check_ties(ties)
        if self.population_size < MIN_POPULATION:
            raise ValueError(f"strategy.population_size must be >= {MIN_POPULATION} for strategy=lra_cma "
                             f"(got {self.population_size}); cmaes needs at least two positive weights")
        if self.dim > MAX_DIM:
            raise ValueError(
                f"strategy=lra_cma keeps full covariance and takes over 5 s and 1.1 GB per generation above "
                f"D={MAX_DIM} (got D={self.dim}); use strategy=sep_cma or shrink the genome (strategy.genome.alpha)")
        try:
            from cmaes import CMA
        except ImportError as err:
            raise ValueError(f"strategy=lra_cma needs the cmaes package ({err}); pip install cmaes "
                             "(it also comes with essa-engine[sweeps])") from None
        self.cma = CMA(mean=self.x0.copy(), sigma=self.sigma0, population_size=self.population_size,
                       seed=self.seed % 2**32, lr_adapt=True)
        self.cma._rng = _GeneratorRandomState(self.rng)

    def _ask(self) -> np.ndarray:
        return np.stack([self.cma.ask() for _ in range(self.population_size)])  # (P, D)

    def _tell(self, genomes: np.ndarray, fitness: np.ndarray) -> None:
        values = -fitness  # (P,) cmaes minimises: negate here only
        if self.ties == "argsort" or not has_ties(values):
            self.cma.tell([(genomes[i], float(values[i])) for i in range(self.population_size)])
            return
        order = canonical_order(genomes, values)  # cmaes's stable sort keeps this order within ties
        weights, mu = self.cma._weights, self.cma._mu
        self.cma._weights, self.cma._mu = tie_weights(weights, mu, values[order])
        try:
            self.cma.tell([(genomes[i], float(values[i])) for i in order])
        finally:
            self.cma._weights, self.cma._mu = weights, mu  # the state keeps cmaes's weights: exact resume

    @property
    def sigma(self) -> float:
        """cmaes's overall step size (``CMA._sigma``; with learning-rate adaptation it includes the
        step-size correction eta_m(t) / eta_m(t+1) of the paper's Algorithm 1)."""
        return float(self.cma._sigma)

    @property
    def mean(self) -> np.ndarray:
        """(D,) float64 copy of cmaes's distribution mean."""
        return np.array(self.cma.mean, dtype=np.float64)

    def _set_mean(self, mean: np.ndarray) -> None:
        self.cma._mean = np.array(mean, dtype=np.float64)

    @property
    def learning_rates(self) -> tuple[float, float]:
        """(eta_mean, eta_Sigma), the adapted learning rates, each in (0, 1]."""
        return float(self.cma._eta_mean), float(self.cma._eta_Sigma)

    def _state_dict(self) -> dict[str, Any]:
        return {"cma": {k: copy.deepcopy(v) for k, v in vars(self.cma).items() if k != "_rng"}}

    def _load_state_dict(self, state: dict[str, Any]) -> None:
        cma = type(self.cma).__new__(type(self.cma))  # cmaes.CMA without running its constructor again
        cma.__dict__.update(copy.deepcopy(state["cma"]))
        cma._rng = _GeneratorRandomState(self.rng)  # the generator whose state the base class restored
        self.cma = cma
