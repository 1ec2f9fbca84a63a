"""CoRP-style search: a reward-weighted direction, its candidates reweighted by compatibility, and a
held-out gate before each commit.

CoRP (arXiv 2605.31494; ``../shared/notes/es-levers-2.md``) builds one update direction from a rewarded
population, weights each candidate by how well it agrees with that direction, and commits the update
only when a validation set it was not built on confirms it. On the genome, with the next generation's
fresh minibatch as the gate's held-out set (the gate costs two candidates, not an extra engine call)::

    x_i = c + sigma0 eps_i                        # P - 2 mirrored perturbations of the centre c
    a   = centred_ranks(f(x))                     # (P - 2,), ties share their rank
    d0  = sum_i a_i eps_i                         # the reward-weighted direction
    w_i = a_i max(0, cos(sign(a_i) eps_i, d0))    # compatibility: candidates that disagree get 0
    p   = c + lr sigma0 sum_i w_i eps_i / sum_i |w_i|          # the proposal (pending)
    next generation: candidates [p, c, perturbations of c]; c <- p only if f(p) > f(c) + margin

Both gate candidates are scored on the same problems (a paired comparison), drawn independently of the
minibatch the direction was built on (consecutive minibatches may share a few problems). A tie, or a failed
(NaN) gate candidate, keeps the centre; a fully tied generation leaves the proposal pending, to be gated
again. The first generation has no proposal yet and asks P perturbations. The engine's own centre candidate
(``rollout.center``) scores the centre a second time: its row stays a control and is not told to the strategy.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from strategies.base import FixedSigmaCentre, Strategy
from strategies.openai_es import centred_ranks
from strategies.perturb import check_positive, mirrored_noise

__all__ = ["CoRP", "compatible_direction"]


def compatible_direction(eps: np.ndarray, fitness: np.ndarray) -> np.ndarray:
    """The compatibility-weighted direction of perturbations ``eps`` (n, D) with finite fitness (n,).

    Returns:
        (D,) float64: ``sum_i w_i eps_i / sum_i |w_i|`` with w_i = a_i max(0, cos(sign(a_i) eps_i, d0)),
        a = centred ranks (ties averaged), d0 = sum_i a_i eps_i (module docstring); zeros when every
        weight is 0 (all tied, or d0 = 0).
    """
    a = centred_ranks(fitness)
    d0 = a @ eps
    norm = np.linalg.norm(d0) * np.linalg.norm(eps, axis=1)
    cos = np.divide(np.sign(a) * (eps @ d0), norm, out=np.zeros(len(a)), where=norm > 0)
    w = a * np.maximum(cos, 0.0)
    total = np.abs(w).sum()
    return w @ eps / total if total > 0 else np.zeros(eps.shape[1])


class CoRP(FixedSigmaCentre, Strategy):
    """CoRP-style compatibility-weighted direction with a held-out gate (module docstring); maximises.

    Args:
        dim, x0, seed, population_size, sigma0: see :class:`strategies.base.Strategy`; sigma stays sigma0;
            P even, >= 4 with the gate (its two candidates plus mirrored pairs), >= 2 without.
        lr: the proposal's step, in units of sigma0 times the weighted mean perturbation (> 0).
        margin: the gate commits when f(proposal) > f(centre) + margin (fitness units, >= 0).
        gate: false commits every proposal at once (no gate candidates; the ablation that isolates the gate).

    ``state_dict()["strategy"]`` holds ``mean`` (the centre), ``proposal`` ((D,) or None, pending),
    ``commits`` and ``gates`` (gates held so far and commits among them).

    Raises:
        ValueError: an odd P, P < 4 with the gate (P < 2 without), a bad ``lr``, ``margin`` or ``gate`` (one line
            naming the field); at :meth:`tell`, told genomes that lack the pending proposal or the centre.
    """

    def __init__(self, dim: int, x0: np.ndarray | None, seed: int, population_size: int, sigma0: float, *,
                 lr: float = 1.0, margin: float = 0.0, gate: bool = True, **options: Any) -> None:
        super().__init__(dim, x0, seed, population_size, sigma0, **options)
        if not isinstance(gate, (bool, np.bool_)):
            raise ValueError(f"strategy.options.gate must be true or false (got {gate!r}), e.g. strategy.options.gate=true")
        least = 4 if gate else 2
        if self.population_size < least or self.population_size % 2:
            raise ValueError(f"strategy.population_size must be even and >= {least} for strategy=corp (got "
                             f"{self.population_size}): {'a proposal, the centre and ' if gate else ''}mirrored pairs")
        self.lr = check_positive(lr, "lr", "1.0")
        number = isinstance(margin, (int, float, np.integer, np.floating)) and not isinstance(margin, bool)
        if not (number and 0 <= margin < float("inf")):
            raise ValueError(f"strategy.options.margin must be a finite number >= 0 (got {margin!r}), "
                             "e.g. strategy.options.margin=0")
        self.margin, self.gate = float(margin), bool(gate)
        self._failed = np.zeros(self.population_size, dtype=bool)
        self._mean = self.x0.copy()
        self._proposal: np.ndarray | None = None
        self.commits = self.gates = 0

    def _ask(self) -> np.ndarray:
        gate = [] if self._proposal is None else [self._proposal, self._mean]
        eps = mirrored_noise(self.rng, (self.population_size - len(gate)) // 2, self.dim)
        return np.vstack([*gate, self._mean + self.sigma0 * eps])  # (P, D): [proposal, centre,] perturbations

    def tell(self, genomes: np.ndarray, fitness: np.ndarray) -> None:
        """:meth:`strategies.base.Strategy.tell`, remembering which candidates failed (NaN), so that a failed
        gate candidate gives no verdict instead of a lowest rank."""
        f = np.asarray(fitness, dtype=np.float64)
        self._failed = ~np.isfinite(f) if f.shape == (self.population_size,) else self._failed
        super().tell(genomes, fitness)

    def shrink_mean(self, factor: float) -> None:
        """:meth:`strategies.base.Strategy.shrink_mean` for the centre and the pending proposal alike, so that a
        commit does not undo the decay."""
        super().shrink_mean(factor)
        if self._proposal is not None:
            self._proposal = self.x0 + factor * (self._proposal - self.x0)

    def _rows(self, genomes: np.ndarray, x: np.ndarray, what: str) -> np.ndarray:
        """(P,) bool: the told rows equal to ``x`` to 1e-6 relative (a float32 round trip keeps them)."""
        rows = np.all(np.abs(genomes - x) <= 1e-6 * (1.0 + np.abs(x)), axis=1)
        if not rows.any():
            raise ValueError(f"tell: the {what} that ask() put first is not among the told genomes; pass ask()'s "
                             "genomes back (any order, float32 is fine)")
        return rows

    def _tell(self, genomes: np.ndarray, fitness: np.ndarray) -> None:
        centre = self._mean
        gate = np.zeros(len(genomes), dtype=bool)
        if self._proposal is not None:
            is_prop, is_centre = self._rows(genomes, self._proposal, "proposal"), self._rows(genomes, centre, "centre")
            gate = is_prop | is_centre
            self.gates += 1
            verdict = not self._failed[gate].any()
            if verdict and fitness[is_prop].max() > fitness[is_centre].max() + self.margin:
                self._mean, self.commits = self._proposal.copy(), self.commits + 1
        eps = (genomes[~gate] - centre) / self.sigma0  # (n, D), perturbations of the centre they were asked around
        step = compatible_direction(eps, fitness[~gate])
        self._proposal = self._mean + self.lr * self.sigma0 * step if step.any() else None
        if not self.gate and self._proposal is not None:
            self._mean, self._proposal = self._proposal, None

    def _state_dict(self) -> dict[str, Any]:
        proposal = None if self._proposal is None else self._proposal.copy()
        return {"mean": self._mean.copy(), "proposal": proposal, "commits": self.commits, "gates": self.gates}

    def _load_state_dict(self, state: dict[str, Any]) -> None:
        self._mean = np.array(state["mean"], dtype=np.float64)
        self._proposal = None if state["proposal"] is None else np.array(state["proposal"], dtype=np.float64)
        self.commits, self.gates = int(state["commits"]), int(state["gates"])
