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

Both gate candidates are scored on the same fresh problems as each other (a paired comparison), which
the direction never saw. A tie keeps the centre. The first generation has no proposal yet and asks P
perturbations.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from strategies.base import FixedSigmaCentre, Strategy
from strategies.openai_es import centred_ranks
from strategies.perturb import check_positive

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
            P >= 4 and even (the two gate candidates plus mirrored pairs).
        lr: the proposal's step, in units of sigma0 times the weighted mean perturbation (> 0).
        margin: the gate commits when f(proposal) > f(centre) + margin (fitness units, >= 0).
        gate: false commits every proposal at once (no gate candidates; the ablation that isolates the gate).

    ``state_dict()["strategy"]`` holds ``mean`` (the centre), ``proposal`` ((D,) or None, pending),
    ``commits`` and ``gates`` (gates held so far and commits among them).

    Raises:
        ValueError: an odd or too small P, a bad ``lr`` or ``margin`` (one line naming the field).
    """

    def __init__(self, dim: int, x0: np.ndarray | None, seed: int, population_size: int, sigma0: float, *,
                 lr: float = 1.0, margin: float = 0.0, gate: bool = True, **options: Any) -> None:
        super().__init__(dim, x0, seed, population_size, sigma0, **options)
        if self.population_size < 4 or self.population_size % 2:
            raise ValueError(f"strategy.population_size must be even and >= 4 for strategy=corp (got "
                             f"{self.population_size}): a proposal, the centre and mirrored pairs")
        self.lr = check_positive(lr, "lr", "1.0")
        if not (isinstance(margin, (int, float)) and not isinstance(margin, bool) and 0 <= margin < float("inf")):
            raise ValueError(f"strategy.options.margin must be a finite number >= 0 (got {margin!r}), "
                             "e.g. strategy.options.margin=0")
        if not isinstance(gate, (bool, np.bool_)):
            raise ValueError(f"strategy.options.gate must be true or false (got {gate!r})")
        self.margin, self.gate = float(margin), bool(gate)
        self._mean = self.x0.copy()
        self._proposal: np.ndarray | None = None
        self.commits = self.gates = 0

    def _ask(self) -> np.ndarray:
        gate = [] if self._proposal is None else [self._proposal, self._mean]
        half = self.rng.standard_normal(((self.population_size - len(gate)) // 2, self.dim))
        perturbations = self._mean + self.sigma0 * np.concatenate([half, -half])
        return np.concatenate([np.array(gate).reshape(-1, self.dim), perturbations])

    def _tell(self, genomes: np.ndarray, fitness: np.ndarray) -> None:
        centre = self._mean
        gate = np.zeros(len(genomes), dtype=bool)
        if self._proposal is not None:
            is_prop, is_centre = (np.all(genomes == x, axis=1) for x in (self._proposal, centre))
            gate = is_prop | is_centre
            self.gates += 1
            if is_prop.any() and is_centre.any() and fitness[is_prop].max() > fitness[is_centre].max() + self.margin:
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
