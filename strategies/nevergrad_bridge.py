"""A bridge to Nevergrad's ask/tell optimizers: ``strategy=nevergrad strategy.options.optimizer=<name>``.

Nevergrad (Rapin & Teytaud, facebookresearch/nevergrad; ``nevergrad.optimizers.registry``) holds some
hundred derivative-free optimizers behind one ask/tell interface, among them the ones for noisy
continuous problems: TBPSA (population-size adaptation with noise management; Hellwig & Beyer 2016),
NoisyOnePlusOne, and NGOpt, its selector, which routes a noisy problem above ~100 dimensions with a
budget of a few hundred evaluations to TBPSA or one-shot recentering. The genome is one
``ng.p.Array(init=x0)`` with mutation sigma ``sigma0``; the optimizer is built with ``num_workers=P``
(P candidates asked before any is told) and ``budget`` (NGOpt chooses by it; None = unknown).

Conventions: Nevergrad minimises; this adapter tells ``-fitness`` and is the only place that does.
Candidates are told in :func:`strategies.cma_es.canonical_order` (by value, ties by genome bytes), so
the ask order of tied candidates does not matter. An ``ask`` before the previous candidates are told
returns them again (Nevergrad refuses more than ``num_workers`` candidates in flight). A told genome that was not asked is told as a new
child (Nevergrad's "tell not asked"). The mean is Nevergrad's recommendation (``recommend()``: for
noisy optimizers an averaged or model-based point, not the best seen; Nevergrad issue 1063).

Exact resume: the parametrization's ``random_state`` is a ``np.random.RandomState`` seeded from the
strategy's generator at construction; the optimizer and the asked-but-not-told candidates are pickled
together (``state_dict()["strategy"]["optimizer"]``, bytes) and read back with only Nevergrad's, pycma's
and numpy's classes allowed.
"""
from __future__ import annotations

import copy
import pickle
import warnings
from typing import Any

import numpy as np

from strategies.base import Strategy, plain_loads
from strategies.cma_es import canonical_order
from strategies.perturb import check_count

__all__ = ["NevergradStrategy", "optimizer_names"]

PICKLE_MODULES = ("nevergrad", "cma", "numpy", "collections", "builtins", "copyreg")
"""Modules whose classes a Nevergrad optimizer's pickle may name (checked in tests/test_search_strategies.py)."""


def _nevergrad():
    try:
        import nevergrad
    except ImportError as err:
        raise ValueError(f"strategy=nevergrad needs the nevergrad package ({err}); pip install nevergrad") from None
    return nevergrad


def optimizer_names() -> list[str]:
    """Nevergrad's registered optimizer names, sorted (empty without nevergrad)."""
    try:
        return sorted(_nevergrad().optimizers.registry)
    except ValueError:
        return []


class NevergradStrategy(Strategy):
    """A Nevergrad optimizer behind the ask/tell contract (module docstring); fitness is maximised.

    Args:
        dim, x0, seed, population_size, sigma0: see :class:`strategies.base.Strategy` (x0: the Array's
            init; sigma0: its mutation sigma; P: ``num_workers``).
        optimizer: a name of ``nevergrad.optimizers.registry`` (``NGOpt``, ``TBPSA``, ``OnePlusOne``, ...);
            the class default ``DiagonalCMA`` needs no budget; conf/strategy/nevergrad.yaml sets ``NGOpt``.
        budget: total evaluations the optimizer may plan for (P x generations), >= P; None = unknown
            (NGOpt refuses it). TBPSA starts with 4 D candidates per update: at D 240 it does not move
            its centre within 160 evaluations.

    Raises:
        ValueError: an unknown optimizer (one line naming ``strategy.options.optimizer`` and a few
            names), a bad budget, an optimizer that cannot ask P candidates at once or cannot ask at all
            (NGOpt without a budget), or no nevergrad.
    """

    def __init__(self, dim: int, x0: np.ndarray | None, seed: int, population_size: int, sigma0: float, *,
                 optimizer: str = "DiagonalCMA", budget: int | None = None, **options: Any) -> None:
        super().__init__(dim, x0, seed, population_size, sigma0, **options)
        ng = _nevergrad()
        if not (isinstance(optimizer, str) and optimizer in ng.optimizers.registry):
            raise ValueError(f"strategy.options.optimizer={optimizer!r} is not a Nevergrad optimizer; use e.g. "
                             "TBPSA, NGOpt, NoisyOnePlusOne, OnePlusOne, DiagonalCMA, TwoPointsDE, PSO "
                             "(nevergrad.optimizers.registry lists all)")
        if budget is not None:
            budget = check_count(budget, "budget", self.population_size, 10 ** 9, str(10 * self.population_size))
        self.optimizer, self.budget = optimizer, budget
        param = ng.p.Array(init=self.x0.copy()).set_mutation(sigma=self.sigma0)
        param.random_state = np.random.RandomState(self.rng.integers(2 ** 32))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Nevergrad warns about budgets and workers it will work around
                self.opt = ng.optimizers.registry[optimizer](parametrization=param, budget=budget,
                                                             num_workers=self.population_size)
        except (ValueError, TypeError) as err:
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise ValueError(f"strategy.options.optimizer={optimizer}: Nevergrad cannot build it for P "
                             f"{self.population_size} candidates per generation ({first}); pick another") from None
        self._pending: list = []  # asked, not yet told: (P,) ng.p.Array
        self._probe()

    def _probe(self) -> None:
        """Ask a copy of the optimizer once, so that one that cannot ask (NGOpt without a budget) fails here."""
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                copy.deepcopy(self.opt).ask()
        except Exception as err:  # noqa: BLE001 - whatever the optimizer raises is the finding
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            fix = ("set strategy.options.budget (P x generations, e.g. 160)" if self.budget is None
                   else "pick another optimizer")
            raise ValueError(f"strategy.options.optimizer={self.optimizer}: its first ask fails "
                             f"({type(err).__name__}: {first}); {fix}") from None

    def _ask(self) -> np.ndarray:
        if not self._pending:  # an ask before the last one is told returns its candidates again (module docstring)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._pending = [self.opt.ask() for _ in range(self.population_size)]
        return np.stack([np.asarray(c.value, dtype=np.float64) for c in self._pending])  # (P, D)

    def _candidate(self, genome: np.ndarray, asked: dict):
        """The asked candidate whose value is ``genome``, else a new child of the parametrization."""
        found = asked.pop(genome.tobytes(), None)
        return found if found is not None else self.opt.parametrization.spawn_child(new_value=genome.copy())

    def _tell(self, genomes: np.ndarray, fitness: np.ndarray) -> None:
        asked = {np.asarray(c.value, dtype=np.float64).tobytes(): c for c in self._pending}
        values = -fitness  # (P,) Nevergrad minimises: negate here only
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for i in canonical_order(genomes, values):
                self.opt.tell(self._candidate(genomes[i], asked), float(values[i]))
        self._pending = []

    @property
    def sigma(self) -> float:
        """The Array's mutation sigma, sigma0 (the optimizer may scale its own steps inside)."""
        return self.sigma0

    @property
    def mean(self) -> np.ndarray:
        """(D,) float64: Nevergrad's recommendation (x0 before the first tell)."""
        if self.generation == 0:
            return self.x0.copy()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return np.array(self.opt.recommend().value, dtype=np.float64)

    def _state_dict(self) -> dict[str, Any]:
        return {"optimizer": pickle.dumps((self.opt, self._pending), protocol=4), "name": self.optimizer}

    def _load_state_dict(self, state: dict[str, Any]) -> None:
        if state["name"] != self.optimizer:
            raise ValueError(f"load_state_dict: the checkpoint's strategy.options.optimizer is {state['name']}, "
                             f"this strategy's {self.optimizer}; build it with the checkpoint's optimizer")
        self.opt, self._pending = plain_loads(state["optimizer"], modules=PICKLE_MODULES)
