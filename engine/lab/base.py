"""The contract every lab landscape honours (engine/lab/landscapes.py, engine/lab/likelihood.py)."""
from __future__ import annotations

import numpy as np


class Landscape:
    """The contract every lab landscape honours (fitness maximised).

    Attributes:
        name: registry name. dim: D. prompts: N problems per generation (1 for classic functions).
        binary: rewards are 0/1 per problem (the variance ratio and the disagreement count apply).
        held_out_each_generation: the lab scores the held-out set after every generation (cheap), or
            only at the start and the end (a real model).
        true_fitness_name: what :meth:`true_fitness` measures (figure axes).
        has_dense: :meth:`evaluate` can also return a dense score per (genome, problem) (``rollout.dense``).
        variable_prompts: :meth:`rewards` honours a per-generation N (``rollout.adaptive_prompts``).
    """

    name = ""
    true_fitness_name = "true fitness (-f)"
    binary = False
    prompts = 1
    held_out_each_generation = True
    has_dense = False
    variable_prompts = False

    def __init__(self, dim: int, seed: int):
        self.dim, self.seed = int(dim), int(seed)

    def rewards(self, genomes: np.ndarray, seed: int, generation: int, prompts: int | None = None) -> np.ndarray:
        """Rewards of genomes (P, D) on the generation's minibatch (seeded from (seed, generation)): (P, N, 1);
        ``prompts``: this generation's N where :attr:`variable_prompts` (None: the landscape's own N)."""
        raise NotImplementedError

    def evaluate(self, genomes: np.ndarray, seed: int, generation: int, prompts: int | None = None,
                 dense: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
        """Rewards (P, N, 1) of genomes (P, D) and, with ``dense``, their dense scores (P, N, 1) on the same
        problems (None without); the landscapes with a dense score override this.

        Raises:
            ValueError: ``dense`` on a landscape without a dense score (one line naming ``rollout.dense``).
        """
        if dense and not self.has_dense:
            raise ValueError(f"rollout.dense: the {self.name} landscape has no dense score; use landscape.name=minibatch "
                             "or rollout.dense=off")
        return self.rewards(genomes, seed, generation, prompts), None

    def true_fitness(self, x: np.ndarray) -> float:
        """The landscape's true (expected) fitness of one genome (D,)."""
        raise NotImplementedError

    def held_out(self, x: np.ndarray) -> np.ndarray | None:
        """Per-problem 0/1 rewards of one genome (D,) on the held-out set, (n,); None without one."""
        return None

    def oracle(self) -> dict | None:
        """The best achievable fitness by direct optimisation, or None (see the subclasses)."""
        return None

    def close(self) -> None:
        """Free what the landscape holds (an engine); nothing for the simulated ones."""
