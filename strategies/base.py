"""The ask/tell contract every search strategy honours.

The caller owns evaluation (the pycma ask/tell interface, ``cma/interfaces.py``), which is
what a batched multi-LoRA evaluator needs::

    strategy = get_strategy("essa")(dim=D, x0=None, seed=0, population_size=P, sigma0=0.1)
    for _ in range(generations):
        genomes = strategy.ask()              # (P, D) float64
        fitness = evaluate(genomes)           # (P,)   float64, higher is better, NaN = failed
        strategy.tell(genomes, fitness)

Conventions (docs/ARCHITECTURE.md):

* Fitness is MAXIMISED everywhere. A back-end that minimises (pycma) negates inside its own
  adapter and nowhere else.
* A failed candidate has fitness NaN; it is ranked last (:func:`rank_nan_last`), never
  treated as a silent zero.
* Changing values live in :meth:`Strategy.state_dict`, which is picklable plain Python/numpy
  and restores the strategy exactly, random state included (resume neither replays nor skips
  randomness).
* Tied fitness gets tied treatment. With k/N accuracies most candidates tie; a rank-based
  strategy must give candidates of equal fitness equal weights (mid-ranks: the weights of the
  ranks a tied group occupies, averaged over the group, :func:`average_over_ties`), so that
  the update does not depend on where tied candidates happen to sit in the ask order. A
  library that ranks by argsort gives tied candidates unequal weights by position, which
  injects noise into every update; the CMA-ES adapters therefore average their libraries'
  weights over tied ranks for the duration of one tell (``strategy.options.ties``,
  :mod:`strategies.cma_es`), and OpenAI-ES shapes fitness into averaged centred ranks.
  Failed candidates (NaN) all tie below every finite one (:func:`rank_nan_last`).
* A fully tied generation carries no information: :meth:`Strategy.tell` then leaves the strategy as
  it is (``_tell`` is not called; the generation counter advances, :attr:`Strategy.tied` says so and
  one log line too). Told to a rank-based update, every candidate would get the same weight and the
  mean would move to the candidates' average, a random step of sigma sqrt(D / P) (measured with
  pycma 4.5.0, D 4, P 8, sigma 0.3: 0.21 rms over 200 seeds; LRA-CMA's mean reached norm 3.78 and
  its sigma grew in a real run with three all-zero generations). A partly tied generation moves the
  strategy only by what the ranks tell: the update is the same for any order of the told candidates
  and any increasing transformation of the fitness (:func:`strategies.testing.check_ties`).

The base class does the bookkeeping once (evosax's design, ``evosax/algorithms/base.py``):
argument validation, the generation counter, the best-so-far genome, the random generator
and its state; a strategy writes only its maths in ``_ask``/``_tell`` and its own state in
``_state_dict``/``_load_state_dict``.
"""

from __future__ import annotations

import abc
import io
import logging
import pickle
from typing import Any

import numpy as np

__all__ = ["Strategy", "average_over_ties", "rank_nan_last"]

log = logging.getLogger("essa.strategies")


def rank_nan_last(fitness: np.ndarray) -> np.ndarray:
    """Replace failed entries so that they rank below every real one.

    Args:
        fitness: (P,) float array, higher is better; NaN and -inf mark failed candidates.

    Returns:
        (P,) float64 copy in which every NaN/-inf entry equals ``min(finite) - 1 - spread``
        (spread = max(finite) - min(finite)), i.e. strictly worse than every finite entry, and
        all failed entries tie. If no entry is finite all entries become 0.0.

    Raises:
        ValueError: if any entry is +inf (a reward cannot be infinitely good; fix the reward).
    """
    f = np.array(fitness, dtype=np.float64, copy=True)
    if np.any(np.isposinf(f)):
        raise ValueError(
            "fitness contains +inf; fitness must be finite or NaN (failed candidate) - fix the reward/aggregation"
        )
    failed = ~np.isfinite(f)
    if failed.all():
        f[:] = 0.0
    elif failed.any():
        lo, hi = f[~failed].min(), f[~failed].max()
        f[failed] = lo - 1.0 - (hi - lo)
    return f


def average_over_ties(sorted_values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Average per-rank weights over each run of tied values (mid-rank weights).

    A tied group occupies contiguous places of the sorted order; giving each member the mean of
    the weights of those places is the expectation of the weights under a uniformly random
    tie-break: the mid-rank convention of rank statistics (Kendall, "Rank Correlation Methods",
    1948, ch. 3), which Information-Geometric Optimization also uses for its rank-based weights
    of tied samples (Ollivier, Arnold, Auger, Hansen, JMLR 18(18), 2017, the definition of the
    IGO algorithm's weights).

    Args:
        sorted_values: (P,) float values in sorted order (ascending or descending); equal
            values must be contiguous, as sorting makes them.
        weights: (P,) float weights, one per sorted place.

    Returns:
        (P,) float64: every entry of a tied run replaced by the run's mean weight; the sum and
        the order of the weights are preserved; untied entries are returned unchanged.

    Raises:
        ValueError: if the two arrays are not 1-D of one length.
    """
    values = np.asarray(sorted_values, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    if values.ndim != 1 or w.shape != values.shape:
        raise ValueError(f"average_over_ties: values {values.shape} and weights {w.shape} must be (P,) each")
    starts = np.r_[0, np.flatnonzero(values[1:] != values[:-1]) + 1]  # first place of each run
    counts = np.diff(np.r_[starts, len(values)])
    return np.repeat(np.add.reduceat(w, starts) / counts, counts) if len(w) else w.copy()


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


class Strategy(abc.ABC):
    """Abstract ask/tell search strategy over real vectors of length D (maximises fitness).

    Args:
        dim: D, the genome length (>= 1).
        x0: (D,) initial mean, any float dtype (stored as float64); None means zeros, which for
            the genome codecs of :mod:`strategies.genomes` is the input (SFT) adapter.
        seed: seed of ``self.rng`` (a ``np.random.Generator``), the strategy's only random
            source; its state is part of :meth:`state_dict`.
        population_size: P, candidates per generation (>= 2; ESSA uses 24-96, default 96).
        sigma0: initial step size (> 0), in genome units.
        **options: strategy-specific options; a subclass consumes its own and passes the rest
            here, where any left over raises ValueError.

    Raises:
        ValueError: on a bad argument, with a one-line message naming the field and the fix.

    Subclasses implement ``_ask() -> (P, D)``, ``_tell(genomes, fitness)`` (fitness already
    passed through :func:`rank_nan_last`), the ``sigma`` and ``mean`` properties and, if they
    hold state beyond ``self.rng``, ``_state_dict``/``_load_state_dict``.
    """

    def __init__(
        self,
        dim: int,
        x0: np.ndarray | None,
        seed: int,
        population_size: int,
        sigma0: float,
        **options: Any,
    ) -> None:
        if options:
            raise ValueError(
                f"unknown option(s) for strategy {type(self).__name__}: {', '.join(sorted(options))}; "
                "remove them from the strategy config"
            )
        if not _is_int(dim) or dim < 1:
            raise ValueError(f"strategy dim must be an integer >= 1 (got {dim!r}); it is the genome codec's .dim")
        if not _is_int(population_size) or population_size < 2:
            raise ValueError(
                f"strategy.population_size must be >= 2 (got {population_size!r}); ESSA uses 24-96"
            )
        if not (isinstance(sigma0, (int, float, np.floating, np.integer)) and np.isfinite(sigma0) and sigma0 > 0):
            raise ValueError(f"strategy.sigma0 must be a finite number > 0 (got {sigma0!r})")
        if x0 is None:
            x0 = np.zeros(dim)
        x0 = np.asarray(x0, dtype=np.float64)
        if x0.shape != (dim,):
            raise ValueError(f"strategy x0 has shape {x0.shape}, expected ({dim},); pass codec.x0() or None")
        if not np.all(np.isfinite(x0)):
            raise ValueError("strategy x0 contains NaN/inf; pass a finite initial mean or None")
        self.dim = int(dim)
        self.seed = int(seed)
        self.sigma0 = float(sigma0)
        self.x0 = x0.copy()
        self._population_size = int(population_size)
        self.rng = np.random.default_rng(self.seed)
        self._generation = 0
        self.best_genome: np.ndarray | None = None
        self.best_fitness: float = -np.inf
        self.tied = False

    # --- the maths, per strategy -------------------------------------------------------
    @abc.abstractmethod
    def _ask(self) -> np.ndarray:
        """Return this generation's candidates, (P, D)."""

    @abc.abstractmethod
    def _tell(self, genomes: np.ndarray, fitness: np.ndarray) -> None:
        """Update from (P, D) float64 genomes and (P,) finite float64 fitness (maximised)."""

    @property
    @abc.abstractmethod
    def sigma(self) -> float:
        """Current overall step size (float)."""

    @property
    @abc.abstractmethod
    def mean(self) -> np.ndarray:
        """Current distribution mean, (D,) float64 (the 'mean' adapter of a run)."""

    def _state_dict(self) -> dict[str, Any]:
        """Strategy-specific state (plain python/numpy, picklable); override if any."""
        return {}

    def _load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`_state_dict` returned; override if any."""

    # --- the public contract -------------------------------------------------------------
    @property
    def population_size(self) -> int:
        """P, candidates per generation."""
        return self._population_size

    @property
    def generation(self) -> int:
        """Number of completed ``tell`` calls."""
        return self._generation

    tied: bool
    """True when the last :meth:`tell`'s fitness was all tied, so that it left the strategy as it was."""

    def ask(self) -> np.ndarray:
        """Sample this generation's candidates.

        Returns:
            (P, D) float64 array, a fresh copy the caller may modify.
        """
        genomes = np.array(self._ask(), dtype=np.float64, copy=True)
        if genomes.shape != (self.population_size, self.dim):
            raise RuntimeError(
                f"{type(self).__name__}._ask returned shape {genomes.shape}, expected "
                f"({self.population_size}, {self.dim}); fix the strategy"
            )
        if not np.isfinite(genomes).all():
            raise RuntimeError(f"{type(self).__name__}._ask returned non-finite genomes (NaN/inf); fix the strategy")
        return genomes

    def checked_mean(self) -> np.ndarray:
        """The distribution's centre, checked: a (D,) float64 copy of :attr:`mean`.

        Raises:
            RuntimeError: ``mean`` has another shape or holds NaN/inf (one line naming the class).
        """
        mean = np.array(self.mean, dtype=np.float64, copy=True)
        if mean.shape != (self.dim,) or not np.isfinite(mean).all():
            raise RuntimeError(f"{type(self).__name__}.mean is {'non-finite' if mean.shape == (self.dim,) else f'shape {mean.shape}'}, "
                               f"expected ({self.dim},) finite values; fix the strategy")
        return mean

    def tell(self, genomes: np.ndarray, fitness: np.ndarray) -> None:
        """Update the search distribution with evaluated candidates.

        Args:
            genomes: (P, D) the candidates returned by the last :meth:`ask`.
            fitness: (P,) higher is better; NaN (or -inf) marks a failed candidate, which is
                ranked below every finite one.

        Raises:
            ValueError: on wrong shapes, +inf fitness, or when every entry is NaN (the whole
                generation failed; that is an evaluator fault, not a ranking).

        Every entry equal (a fully tied generation): only the counter and the best-so-far move
        (module docstring, :attr:`tied`).
        """
        genomes = np.asarray(genomes, dtype=np.float64)
        fitness = np.asarray(fitness, dtype=np.float64)
        P, D = self.population_size, self.dim
        if genomes.shape != (P, D):
            raise ValueError(
                f"tell: genomes have shape {genomes.shape}, expected ({P}, {D}); pass the array from ask()"
            )
        if fitness.shape != (P,):
            raise ValueError(
                f"tell: fitness has shape {fitness.shape}, expected ({P},); aggregate rewards to one value per candidate"
            )
        finite = np.isfinite(fitness)
        if not finite.any():
            raise ValueError(
                f"tell: all {P} fitness values are NaN (every candidate failed) at generation {self.generation}; "
                "fix the evaluator or skip this tell"
            )
        ranked = rank_nan_last(fitness)
        self.tied = bool(np.all(ranked == ranked[0]))
        if self.tied:  # no candidate is better than another: nothing to learn, nothing moves
            log.info("generation %d: all %d candidates tied at fitness %.6g; the search distribution is left as "
                     "it is", self.generation, P, fitness[0])
        else:
            self._tell(genomes, ranked)
        top = np.flatnonzero(fitness == np.nanmax(fitness))  # tied best: the first by genome bytes, not by place
        best = int(min(top, key=lambda i: genomes[i].tobytes()))
        if fitness[best] > self.best_fitness:
            self.best_fitness = float(fitness[best])
            self.best_genome = genomes[best].copy()
        self._generation += 1

    def shrink_mean(self, factor: float) -> None:
        """Anchored weight decay: pull the distribution mean toward the initial mean x0 (genome zero, the
        warm start), ``mean <- x0 + factor (mean - x0)``. Called after a tell, it is es-awd's anchored
        decay ``theta <- theta0 + (1 - a lambda)(theta - theta0)`` (Schweighofer et al., arXiv
        2605.30148, §3): ES moves along directions the fitness does not constrain, and the decay
        undoes that drift at no evaluation cost.

        Args:
            factor: in [0, 1]; 1 leaves the mean where it is, 0 puts it back on x0.

        Raises:
            ValueError: factor outside [0, 1]. NotImplementedError: the strategy cannot move its mean
                (a plugin that does not override :meth:`_set_mean`).
        """
        if not 0.0 <= factor <= 1.0:
            raise ValueError(f"shrink_mean: factor={factor} must be in [0, 1] (1 - strategy.mean_decay)")
        if factor != 1.0:
            self._set_mean(self.x0 + factor * (self.mean - self.x0))

    def _set_mean(self, mean: np.ndarray) -> None:
        """Replace the distribution mean by ``mean`` ((D,) float64); override to support :meth:`shrink_mean`."""
        raise NotImplementedError(f"{type(self).__name__} cannot move its mean; strategy.mean_decay needs it to "
                                  "override Strategy._set_mean, or set strategy.mean_decay=0")

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly where this strategy is.

        Returns:
            A picklable dict of plain python/numpy values: ``class`` (qualified class name),
            ``dim``, ``population_size``, ``generation``, ``rng`` (``bit_generator.state``),
            ``best_genome`` ((D,) float64 or None), ``best_fitness`` and ``strategy`` (the
            subclass's own state). Only plain data reads back from a checkpoint
            (:class:`PlainUnpickler`): no objects of the subclass's own classes (bytes of a library's
            own pickle, like pycma's, are read by the subclass).
        """
        return {
            "class": f"{type(self).__module__}.{type(self).__qualname__}",
            "dim": self.dim,
            "population_size": self.population_size,
            "generation": self._generation,
            "rng": self.rng.bit_generator.state,
            "best_genome": None if self.best_genome is None else self.best_genome.copy(),
            "best_fitness": self.best_fitness,
            "strategy": self._state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` into a strategy built with the same arguments.

        Raises:
            ValueError: if the state comes from another class, dimension or population size.
        """
        cls = f"{type(self).__module__}.{type(self).__qualname__}"
        if state.get("class") != cls:
            raise ValueError(
                f"load_state_dict: state is for {state.get('class')!r}, this is {cls!r}; build the same strategy"
            )
        for field in ("dim", "population_size"):
            if state[field] != getattr(self, field):
                raise ValueError(
                    f"load_state_dict: state has {field}={state[field]}, this strategy {getattr(self, field)}; "
                    f"build it with the checkpoint's {field}"
                )
        self._generation = int(state["generation"])
        self.rng.bit_generator.state = state["rng"]
        self.best_genome = None if state["best_genome"] is None else np.array(state["best_genome"], dtype=np.float64)
        self.best_fitness = float(state["best_fitness"])
        self._load_state_dict(state["strategy"])

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(dim={self.dim}, population_size={self.population_size}, "
            f"generation={self.generation}, sigma={self.sigma:.3g})"
        )


# What a checkpoint may name when it is read back: plain data only, so resuming a run directory
# someone else wrote cannot run code (pickle calls whatever class or function a file names).
_PLAIN_BUILTINS = frozenset({"set", "frozenset", "slice", "range", "complex", "bytearray", "bytes", "dict", "list",
                             "tuple", "int", "float", "str", "bool", "object"})
_PLAIN = frozenset({("numpy._core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "_reconstruct"),
                    ("numpy._core.multiarray", "scalar"), ("numpy.core.multiarray", "scalar"), ("numpy", "ndarray"),
                    ("numpy", "dtype"), ("_codecs", "encode"), ("copyreg", "_reconstructor"),
                    ("collections", "OrderedDict")})
_PLAIN_MODULES = ("numpy.random", "numpy.dtypes")


class PlainUnpickler(pickle.Unpickler):
    """Unpickler for checkpoints: builtins containers and numbers, numpy arrays, dtypes and random
    generators, and the classes of ``modules`` (e.g. ``("cma",)`` for pycma's own state) or of ``classes``
    (``(module, name) -> class``: classes pickled under a path that has moved since). Anything else
    raises ``pickle.UnpicklingError`` naming it.
    """

    def __init__(self, f, classes: dict | None = None, modules: tuple[str, ...] = ()):
        super().__init__(f)
        self.classes, self.modules = classes or {}, modules

    def find_class(self, module: str, name: str):
        if (module, name) in self.classes:
            return self.classes[(module, name)]
        ok = ((module == "builtins" and name in _PLAIN_BUILTINS) or (module, name) in _PLAIN
              or any(module == m or module.startswith(m + ".") for m in (*_PLAIN_MODULES, *self.modules)))
        if not ok:
            raise pickle.UnpicklingError(f"{module}.{name} is not plain data (a checkpoint holds dicts, lists, "
                                         f"numbers, strings, bytes and numpy arrays)")
        return super().find_class(module, name)


def plain_loads(data: bytes, modules: tuple[str, ...] = ()) -> Any:
    """``pickle.loads`` through :class:`PlainUnpickler` (raises ``pickle.UnpicklingError`` on other classes)."""
    return PlainUnpickler(io.BytesIO(data), modules=modules).load()


class FixedSigmaCentre:
    """Mixin for strategies that sample around a centre ``self._mean`` (D,) float64 at a fixed step size
    ``self.sigma0`` (OpenAI-ES, arXiv 1703.03864; the perturb-select-fold strategies of strategies/perturb.py):
    ``sigma``, ``mean`` and ``_set_mean`` of the :class:`Strategy` contract. Put it before ``Strategy``."""

    @property
    def sigma(self) -> float:
        """The fixed sampling standard deviation, sigma0 (genome units)."""
        return self.sigma0

    @property
    def mean(self) -> np.ndarray:
        """(D,) float64 copy of the centre."""
        return self._mean.copy()

    def _set_mean(self, mean: np.ndarray) -> None:
        self._mean = np.array(mean, dtype=np.float64)
