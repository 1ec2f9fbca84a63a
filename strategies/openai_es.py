"""OpenAI-ES: antithetic Gaussian sampling, centred ranks, a fixed sigma and an SGD/Adam step.

Salimans, Ho, Chen, Sidor, Sutskever, "Evolution Strategies as a Scalable Alternative to
Reinforcement Learning", 2017 (arXiv 1703.03864): §2, Algorithm 1 (the search-gradient estimate
g = 1 / (n sigma) sum_i F_i eps_i and the step theta += alpha g), and §2.1 (mirrored sampling,
pairs +eps / -eps, and fitness shaping by a rank transformation). The same update, with a fixed
sigma and P candidates told at once, is what ES at scale (Qiu et al., arXiv 2509.24372) and
EGGROLL (arXiv 2511.16652) run on LLM weights; here it runs on the genome::

    eps_1..eps_{P/2} ~ N(0, I_D);  x_i = mean + sigma eps_i,  x_{P/2+i} = mean - sigma eps_i
    u = centred_ranks(fitness)                               # (P,) in [-0.5, 0.5], ties averaged
    g = 1 / (P sigma) sum_i u_i eps_i  - weight_decay mean   # (D,) ascent direction
    mean += lr g  (sgd)   or   mean += adam(g)  (adam)

eps_i is recomputed from the told genomes, (x_i - mean) / sigma, so the estimate weights exactly
the candidates that were evaluated. Weight decay pulls the genome toward 0, which for the codecs
of :mod:`strategies.genomes` is the SFT adapter (the L2 coefficient of the paper's code).

Default learning rate (``lr=None``): with centred ranks, a perfectly ranked direction e gets
E[u_i eps_i . e] = 1 / (2 sqrt(pi)) = 0.282 (:data:`RANK_SIGNAL`, the covariance of a uniform
quantile with its normal score), so SGD moves the mean lr 0.282 / sigma along it per generation.
``lr=None`` sets that to half a sampling standard deviation, lr = sigma0^2 / (2 x 0.282) (0.16 at
ESSA's sigma0 0.3): far enough to matter in 10-20 generations, and without signal (random ranks)
the mean wanders lr / sigma sqrt(D (P+1) / 12) / (P-1) per generation, 0.65 in norm at D 240,
P 16, i.e. 0.14 sigma per coordinate (measured over 200 seeds: 0.51 sigma along a perfectly
ranked direction, 0.63 in norm without signal). Adam normalises each coordinate's step to about lr, so its
default is sigma0 / 2 (0.15 at sigma0 0.3; the released OpenAI-ES code's humanoid configuration,
Adam step 0.01 at noise std 0.02, has the same ratio).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from strategies.base import FixedSigmaCentre, Strategy, average_over_ties

__all__ = ["OpenAIES", "AdamState", "RANK_SIGNAL", "adam_step", "centred_ranks"]

RANK_SIGNAL = 1.0 / (2.0 * math.sqrt(math.pi))
"""E[u z] for z ~ N(0, 1) and u its centred rank among many: the per-generation signal of the rank
shaping (module docstring, default learning rate)."""

OPTIMIZERS = ("sgd", "adam")


def centred_ranks(fitness: np.ndarray) -> np.ndarray:
    """Centred-rank fitness shaping (Salimans et al. 2017, §2.1), ties sharing their mean rank.

    Args:
        fitness: (P,) float, higher is better, finite (P >= 2).

    Returns:
        (P,) float64 in [-0.5, 0.5]: rank / (P - 1) - 0.5 with rank 0 for the worst; tied entries
        get the average of the ranks they occupy, so they get equal weight; the values sum to 0.

    Raises:
        ValueError: if ``fitness`` is not 1-D with at least two entries.
    """
    f = np.asarray(fitness, dtype=np.float64)
    if f.ndim != 1 or len(f) < 2:
        raise ValueError(f"centred_ranks: fitness must be (P,) with P >= 2, got shape {f.shape}")
    order = np.argsort(f, kind="stable")  # worst first
    ranks = np.empty(len(f))
    ranks[order] = average_over_ties(f[order], np.arange(len(f), dtype=np.float64))
    return ranks / (len(f) - 1) - 0.5


class AdamState(NamedTuple):
    """Adam's moments (Kingma & Ba, "Adam", arXiv 1412.6980, Algorithm 1).

    m: (D,) float64 first moment; v: (D,) float64 second moment; t: int, steps taken.
    """

    m: np.ndarray
    v: np.ndarray
    t: int


def adam_step(grad: np.ndarray, state: AdamState, lr: float, beta1: float = 0.9, beta2: float = 0.999,
              eps: float = 1e-8) -> tuple[np.ndarray, AdamState]:
    """One Adam step for gradient ASCENT (Kingma & Ba 2015, Algorithm 1), a pure function.

    Args:
        grad: (D,) float64 ascent direction.
        state: the moments after the previous step (zeros and t = 0 at the start).
        lr, beta1, beta2, eps: Adam's alpha, beta_1, beta_2, epsilon (the paper's defaults; the
            OpenAI-ES code uses the same).

    Returns:
        ``(step, new_state)``: (D,) float64 to ADD to the parameters, and the new moments.
    """
    t = state.t + 1
    m = beta1 * state.m + (1.0 - beta1) * grad
    v = beta2 * state.v + (1.0 - beta2) * grad * grad
    m_hat, v_hat = m / (1.0 - beta1 ** t), v / (1.0 - beta2 ** t)
    return lr * m_hat / (np.sqrt(v_hat) + eps), AdamState(m, v, t)


class OpenAIES(FixedSigmaCentre, Strategy):
    """OpenAI-ES (Salimans et al. 2017, §2, §2.1) behind the ask/tell contract; fitness is maximised.

    Args:
        dim, x0, seed, population_size, sigma0: see :class:`strategies.base.Strategy`; P must be
            even (P / 2 mirrored pairs); sigma stays sigma0.
        lr: learning rate (> 0); None = half a sampling std per generation along a perfectly
            ranked direction: sigma0^2 / (2 x 0.282) for sgd, sigma0 / 2 for adam (module docstring).
        optimizer: ``"sgd"`` (plain ``mean += lr g``) or ``"adam"`` (:func:`adam_step`).
        weight_decay: L2 coefficient (>= 0) pulling the mean toward 0 (the SFT adapter).

    Raises:
        ValueError: on an odd population size or a bad ``lr``, ``optimizer`` or ``weight_decay``
            (one line naming the field).

    ``state_dict()["strategy"]`` holds ``mean`` ((D,) float64) and, for adam, ``adam_m``, ``adam_v``
    ((D,) float64) and ``adam_t`` (int).
    """

    def __init__(
        self,
        dim: int,
        x0: np.ndarray | None,
        seed: int,
        population_size: int,
        sigma0: float,
        *,
        lr: float | None = None,
        optimizer: str = "sgd",
        weight_decay: float = 0.0,
        **options: Any,
    ) -> None:
        super().__init__(dim, x0, seed, population_size, sigma0, **options)
        if self.population_size % 2:
            raise ValueError(f"strategy.population_size must be even for strategy=openai_es (got "
                             f"{self.population_size}): candidates come in mirrored pairs +eps, -eps")
        if not (isinstance(optimizer, str) and optimizer in OPTIMIZERS):
            raise ValueError(f"strategy.options.optimizer must be 'sgd' or 'adam' (got {optimizer!r})")
        if lr is None:
            lr = self.sigma0 / 2 if optimizer == "adam" else self.sigma0 ** 2 / (2 * RANK_SIGNAL)
        if not (isinstance(lr, (int, float)) and not isinstance(lr, bool) and math.isfinite(lr) and lr > 0):
            raise ValueError(f"strategy.options.lr must be a finite number > 0 or null for the default (got {lr!r})")
        if not (isinstance(weight_decay, (int, float)) and not isinstance(weight_decay, bool)
                and math.isfinite(weight_decay) and weight_decay >= 0):
            raise ValueError(f"strategy.options.weight_decay must be a finite number >= 0 (got {weight_decay!r})")
        self.lr, self.optimizer, self.weight_decay = float(lr), optimizer, float(weight_decay)
        self._mean = self.x0.copy()
        self._adam = AdamState(np.zeros(self.dim), np.zeros(self.dim), 0)

    def _ask(self) -> np.ndarray:
        half = self.rng.standard_normal((self.population_size // 2, self.dim))  # (P/2, D)
        return self._mean + self.sigma0 * np.concatenate([half, -half])  # (P, D): pairs i, i + P/2

    def _tell(self, genomes: np.ndarray, fitness: np.ndarray) -> None:
        eps = (genomes - self._mean) / self.sigma0  # (P, D), the evaluated perturbations
        u = centred_ranks(fitness)  # (P,)
        grad = u @ eps / (self.population_size * self.sigma0) - self.weight_decay * self._mean  # (D,)
        if self.optimizer == "adam":
            step, self._adam = adam_step(grad, self._adam, self.lr)
        else:
            step = self.lr * grad
        self._mean = self._mean + step

    def _state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"mean": self._mean.copy()}
        if self.optimizer == "adam":
            state.update(adam_m=self._adam.m.copy(), adam_v=self._adam.v.copy(), adam_t=self._adam.t)
        return state

    def _load_state_dict(self, state: dict[str, Any]) -> None:
        if ("adam_t" in state) != (self.optimizer == "adam"):
            raise ValueError("load_state_dict: the checkpoint's strategy.options.optimizer differs from this "
                             f"strategy's ({self.optimizer}); build it with the checkpoint's optimizer")
        self._mean = np.array(state["mean"], dtype=np.float64)
        if self.optimizer == "adam":
            self._adam = AdamState(np.array(state["adam_m"], dtype=np.float64),
                                   np.array(state["adam_v"], dtype=np.float64), int(state["adam_t"]))
