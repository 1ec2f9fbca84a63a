"""Conformance checks of the ask/tell contract (:mod:`strategies.base`), for any strategy class.

A plugin author runs them from the plugin's own pytest (tests/plugin_example/test_conformance.py
is a copy-ready example)::

    from strategies.testing import check_strategy

    def test_my_strategy_honours_the_contract():
        check_strategy(MyStrategy, options={"my_option": 1})

or one check per test with ``@pytest.mark.parametrize("check", CHECKS)``. Each check builds
fresh strategies from ``cls(dim=, x0=, seed=, population_size=, sigma0=, **options)`` on a
small problem and raises ``AssertionError`` with one line naming the check and what it saw:

* :func:`check_ask`: ``ask()`` gives a (P, D) float64 finite array, a fresh copy (writing into
  it changes nothing in the strategy) and a new array on every call;
* :func:`check_seed`: the same seed gives the same candidates (before and after a tell), another
  seed different ones, and numpy's global random state is left alone;
* :func:`check_tell_shapes`: a wrong-shaped ``tell`` is refused with a one-line ``ValueError``
  and leaves the generation counter alone;
* :func:`check_no_mutation`: ``tell`` leaves the genomes and fitness it is given unchanged, and
  the constructor leaves ``x0`` unchanged;
* :func:`check_nan_last`: NaN fitness is ranked last without a crash (the update equals the one
  for :func:`strategies.base.rank_nan_last`'s values, the best-so-far ignores NaN) and an
  all-NaN tell is refused with ``ValueError``;
* :func:`check_ties`: a fully tied tell leaves the mean and sigma exactly where they were (and
  ``strategy.tied`` says so) and resumes exactly after it; a partly tied tell moves the strategy only
  by the ranks: the same candidates told in another order, with the fitness through an increasing
  transformation (3 f + 1), give the same mean, sigma and next candidates (to 1e-9);
* :func:`check_resume`: ``state_dict()`` survives pickle, names no class of the strategy's own
  package in any layer (nested pickles in its bytes included: moving that code would break every
  saved run), and a strategy loaded from it asks, is told and asks exactly what the original does
  (random state included), twice over;
* :func:`check_memory`: the ``state_dict`` pickle size and the tracemalloc peak of construct +
  ask + tell at D 8192 (P 4), returned as a dict; it fails only above the caller's limits. A
  strategy that refuses D 8192 with a one-line ``ValueError`` passes, reported as refused.

The fitness used is a sphere rounded to quarters, so that ties occur, as with k/N accuracies.
"""

from __future__ import annotations

import io
import pickle
import time
import tracemalloc
from typing import Any, Callable

import numpy as np

from strategies.base import Strategy, plain_loads, rank_nan_last

__all__ = ["CHECKS", "check_ask", "check_memory", "check_nan_last", "check_no_mutation", "check_resume",
           "check_seed", "check_strategy", "check_tell_shapes", "check_ties", "format_memory", "pickled_classes",
           "run_all"]


# --- helpers -------------------------------------------------------------------------------


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _fail(check: str, seen: str) -> None:
    raise AssertionError(_one_line(f"{check}: {seen}"))


def _call(check: str, what: str, fn: Callable[..., Any], *args: Any) -> Any:
    """Run strategy code; an exception becomes a one-line AssertionError naming the check."""
    try:
        return fn(*args)
    except Exception as err:  # noqa: BLE001 - any crash of the strategy is the finding
        raise AssertionError(_one_line(f"{check}: {what} raised {type(err).__name__}: {err}")) from err


def _build(check: str, cls: type[Strategy], seed: int, dim: int, population_size: int, sigma0: float,
           options: dict[str, Any] | None, x0: np.ndarray | None = None) -> Strategy:
    return _call(check, f"{cls.__name__}(dim={dim}, population_size={population_size}, seed={seed})",
                 lambda: cls(dim=dim, x0=x0, seed=seed, population_size=population_size, sigma0=sigma0,
                             **(options or {})))


def _fitness(genomes: np.ndarray) -> np.ndarray:
    """(P, D) -> (P,): -||x - 0.5||^2 rounded down to quarters, and the first two tied."""
    f = np.floor(-4.0 * np.sum((genomes - 0.5) ** 2, axis=1)) / 4.0
    f[1] = f[0]
    return f


def _ask(check: str, strategy: Strategy) -> np.ndarray:
    return _call(check, "ask()", strategy.ask)


def _tell(check: str, strategy: Strategy, genomes: np.ndarray, fitness: np.ndarray) -> None:
    _call(check, "tell()", strategy.tell, genomes, fitness)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return np.shape(a) == np.shape(b) and np.array_equal(a, b, equal_nan=True)


def _diff(a: np.ndarray, b: np.ndarray) -> str:
    if np.shape(a) != np.shape(b):
        return f"shapes {np.shape(a)} and {np.shape(b)}"
    return f"max |difference| {np.nanmax(np.abs(np.asarray(a) - np.asarray(b))):.3g}"


def _state_bytes(check: str, strategy: Strategy) -> bytes:
    return _call(check, "pickle.dumps(state_dict())", lambda: pickle.dumps(strategy.state_dict(), protocol=4))


# --- the checks ----------------------------------------------------------------------------


def check_ask(cls: type[Strategy], *, dim: int = 8, population_size: int = 8, sigma0: float = 0.3,
              options: dict[str, Any] | None = None, seed: int = 0) -> None:
    """``ask()`` returns a fresh (P, D) float64 finite array.

    Raises:
        AssertionError: ``check_ask: ...`` on a crash (e.g. the base class's RuntimeError for a
            wrong ``_ask`` shape), a wrong type/shape/dtype, NaN/inf, an array that is read-only,
            aliases the strategy's state (writing into it changes ``state_dict``) or is returned
            again by the next ``ask``.
    """
    check, P, D = "check_ask", population_size, dim
    strategy = _build(check, cls, seed, dim, population_size, sigma0, options)
    genomes = _ask(check, strategy)
    if not isinstance(genomes, np.ndarray):
        _fail(check, f"ask() returned {type(genomes).__name__}, expected a numpy array")
    if genomes.shape != (P, D) or genomes.dtype != np.float64:
        _fail(check, f"ask() returned shape {genomes.shape} dtype {genomes.dtype}, expected ({P}, {D}) float64")
    if not np.all(np.isfinite(genomes)):
        _fail(check, f"ask() returned {int(np.sum(~np.isfinite(genomes)))} NaN/inf entries")
    if not genomes.flags.writeable:
        _fail(check, "ask() returned a read-only array; return a fresh copy the caller may modify")
    before = _state_bytes(check, strategy)
    genomes[...] = 1e9
    if _state_bytes(check, strategy) != before:
        _fail(check, "writing into the array ask() returned changed state_dict(); return a fresh copy")
    again = _ask(check, strategy)
    if np.shares_memory(again, genomes):
        _fail(check, "two ask() calls returned the same memory; return a fresh copy")


def check_seed(cls: type[Strategy], *, dim: int = 8, population_size: int = 8, sigma0: float = 0.3,
               options: dict[str, Any] | None = None, seed: int = 0) -> None:
    """The seed alone decides the candidates; numpy's global random state is not touched.

    Raises:
        AssertionError: ``check_seed: ...`` if two strategies with one seed ask different
            candidates (at the first ask or after an identical tell), two seeds ask the same, or
            construct/ask/tell consumed ``np.random``'s global state.
    """
    check = "check_seed"
    global_state = np.random.get_state()
    a = _build(check, cls, seed, dim, population_size, sigma0, options)
    b = _build(check, cls, seed, dim, population_size, sigma0, options)
    ga, gb = _ask(check, a), _ask(check, b)
    if not _same(ga, gb):
        _fail(check, f"two strategies with seed {seed} asked different candidates ({_diff(ga, gb)}); "
                     "draw every random number from self.rng")
    _tell(check, a, ga, _fitness(ga))
    _tell(check, b, ga, _fitness(ga))
    ga, gb = _ask(check, a), _ask(check, b)
    if not _same(ga, gb):
        _fail(check, f"after the same tell, two strategies with seed {seed} asked different candidates "
                     f"({_diff(ga, gb)}); draw every random number from self.rng")
    other = _ask(check, _build(check, cls, seed + 1, dim, population_size, sigma0, options))
    if _same(other, _ask(check, _build(check, cls, seed, dim, population_size, sigma0, options))):
        _fail(check, f"seeds {seed} and {seed + 1} asked identical candidates; seed self.rng from seed")
    now = np.random.get_state()
    if not (now[0] == global_state[0] and np.array_equal(now[1], global_state[1]) and now[2:] == global_state[2:]):
        _fail(check, "construct/ask/tell consumed numpy's global random state (np.random.*); use self.rng")


def check_tell_shapes(cls: type[Strategy], *, dim: int = 8, population_size: int = 8, sigma0: float = 0.3,
                      options: dict[str, Any] | None = None, seed: int = 0) -> None:
    """A wrong-shaped tell is refused with a one-line ValueError and changes nothing.

    Raises:
        AssertionError: ``check_tell_shapes: ...`` if a tell with genomes (P-1, D) or (P, D+1),
            or fitness (P+1,) or (P, 1), raises anything but a one-line ValueError, raises
            nothing, or advances the generation counter; or if a correct tell then fails.
    """
    check, P, D = "check_tell_shapes", population_size, dim
    strategy = _build(check, cls, seed, dim, population_size, sigma0, options)
    genomes = _ask(check, strategy)
    fitness = _fitness(genomes)
    cases = [(genomes[:-1], fitness), (np.zeros((P, D + 1)), fitness),
             (genomes, np.r_[fitness, 0.0]), (genomes, fitness[:, None])]
    for bad_genomes, bad_fitness in cases:
        seen = f"tell(genomes {bad_genomes.shape}, fitness {bad_fitness.shape})"
        try:
            strategy.tell(bad_genomes, bad_fitness)
        except ValueError as err:
            if "\n" in str(err).strip() or not str(err).strip():
                _fail(check, f"{seen} raised a ValueError whose message is not one line: {str(err)[:200]!r}")
        except Exception as err:  # noqa: BLE001
            _fail(check, f"{seen} raised {type(err).__name__}: {err}; expected a one-line ValueError")
        else:
            _fail(check, f"{seen} was accepted; expected a one-line ValueError")
        if strategy.generation != 0:
            _fail(check, f"{seen} advanced the generation counter to {strategy.generation}")
    _tell(check, strategy, genomes, fitness)


def check_no_mutation(cls: type[Strategy], *, dim: int = 8, population_size: int = 8, sigma0: float = 0.3,
                      options: dict[str, Any] | None = None, seed: int = 0) -> None:
    """``tell`` and the constructor leave their array arguments unchanged.

    Raises:
        AssertionError: ``check_no_mutation: ...`` naming the argument that changed (x0 after
            construct/ask/tell, genomes or fitness after tell).
    """
    check = "check_no_mutation"
    x0 = np.random.default_rng(seed).normal(0.0, 0.1, dim)
    x0_copy = x0.copy()
    strategy = _build(check, cls, seed, dim, population_size, sigma0, options, x0=x0)
    for generation in range(2):
        genomes = _ask(check, strategy)
        fitness = _fitness(genomes)  # ties included: an in-place sort would show
        genomes_copy, fitness_copy = genomes.copy(), fitness.copy()
        _tell(check, strategy, genomes, fitness)
        if not _same(genomes, genomes_copy):
            _fail(check, f"tell() changed the genomes it was given ({_diff(genomes, genomes_copy)}); "
                         "copy before writing")
        if not _same(fitness, fitness_copy):
            _fail(check, f"tell() changed the fitness it was given ({_diff(fitness, fitness_copy)}); "
                         "copy before sorting")
    if not _same(x0, x0_copy):
        _fail(check, f"the constructor's x0 changed ({_diff(x0, x0_copy)}); keep a copy")


def check_nan_last(cls: type[Strategy], *, dim: int = 8, population_size: int = 8, sigma0: float = 0.3,
                   options: dict[str, Any] | None = None, seed: int = 0) -> None:
    """NaN fitness (a failed candidate) is ranked last, and an all-NaN tell is refused.

    Two strategies with one seed are told the same genomes, one with the two best fitness values
    replaced by NaN, the other with :func:`strategies.base.rank_nan_last` of that (the failed
    candidates tied below every finite one): their next asks and means must be identical.

    Raises:
        AssertionError: ``check_nan_last: ...`` if tell crashes on NaN, the two differ, the
            best-so-far is not the best finite candidate, the mean turns NaN, or a tell with
            every entry NaN is not refused with ValueError (or advances the generation).
    """
    check = "check_nan_last"
    a = _build(check, cls, seed, dim, population_size, sigma0, options)
    b = _build(check, cls, seed, dim, population_size, sigma0, options)
    genomes, other = _ask(check, a), _ask(check, b)
    if not _same(genomes, other):
        _fail(check, "two strategies with one seed asked different candidates; fix check_seed first")
    fitness = -np.sum((genomes - 0.5) ** 2, axis=1)
    failed = fitness.copy()
    failed[np.argsort(fitness)[-2:]] = np.nan  # the two best failed: they must not pull the strategy
    _tell(check, a, genomes.copy(), failed.copy())
    _tell(check, b, genomes.copy(), rank_nan_last(failed))
    if a.best_fitness != np.nanmax(failed) or not _same(a.best_genome, genomes[np.nanargmax(failed)]):
        _fail(check, f"best_fitness {a.best_fitness} after a tell with NaN, expected the best finite "
                     f"{np.nanmax(failed)}")
    mean = _call(check, "mean", lambda: np.asarray(a.mean))
    if not np.all(np.isfinite(mean)):
        _fail(check, "the mean has NaN/inf after a tell with NaN fitness")
    next_a, next_b = _ask(check, a), _ask(check, b)
    if not (_same(next_a, next_b) and _same(mean, np.asarray(b.mean))):
        _fail(check, f"NaN candidates moved the strategy differently from candidates ranked last "
                     f"({_diff(next_a, next_b)} in the next ask); rank NaN last (the base class's rank_nan_last)")
    try:
        a.tell(next_a, np.full(population_size, np.nan))
    except ValueError:
        pass
    except Exception as err:  # noqa: BLE001
        _fail(check, f"tell with all fitness NaN raised {type(err).__name__}: {err}; expected ValueError")
    else:
        _fail(check, "tell with all fitness NaN was accepted; expected ValueError (the whole generation failed)")
    if a.generation != 1:
        _fail(check, f"a refused all-NaN tell moved the generation counter to {a.generation}")


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    return np.shape(a) == np.shape(b) and bool(np.allclose(a, b, rtol=1e-9, atol=1e-12))


def check_ties(cls: type[Strategy], *, dim: int = 8, population_size: int = 8, sigma0: float = 0.3,
               options: dict[str, Any] | None = None, seed: int = 0) -> None:
    """A fully tied generation moves nothing; a partly tied one moves the strategy only by the ranks.

    After one ordinary generation, a tell with every fitness equal (no candidate better than another,
    none better than the best so far) must leave ``mean`` and ``sigma`` exactly as they were and set ``strategy.tied``; the strategy
    checkpointed after it continues exactly. Then two strategies with one seed are told the same
    partly tied generation, one in the ask order, the other permuted and with the fitness mapped by
    3 f + 1 (same ranks, same ties): their means, sigmas and next asks must agree to 1e-9.

    Raises:
        AssertionError: ``check_ties: ...`` naming what moved (the mean's or sigma's change after a
            fully tied tell, ``tied`` not set, a resume that differs after it) or what the partly tied
            update depended on besides the ranks.
    """
    check, P = "check_ties", population_size
    strategy = _build(check, cls, seed, dim, population_size, sigma0, options)
    first = _ask(check, strategy)
    _tell(check, strategy, first, _fitness(first))
    mean, sigma = np.asarray(strategy.mean).copy(), strategy.sigma
    _tell(check, strategy, _ask(check, strategy), np.full(P, _fitness(first).min()))  # none beats the best so far
    if not _same(np.asarray(strategy.mean), mean) or strategy.sigma != sigma:
        _fail(check, f"a fully tied tell moved the mean ({_diff(np.asarray(strategy.mean), mean)}) or sigma ({sigma} -> "
                     f"{strategy.sigma}); with every fitness equal leave the strategy as it is (Strategy.tell does)")
    if not getattr(strategy, "tied", False):
        _fail(check, "strategy.tied is not True after a fully tied tell; set it as Strategy.tell does")
    restored = _build(check, cls, seed, dim, population_size, sigma0, options)
    _call(check, "load_state_dict() after a fully tied tell", restored.load_state_dict,
          plain_loads(pickle.dumps(strategy.state_dict(), protocol=4)))
    if not all(_same(x, y) for x, y in zip(_run(check, strategy, 1), _run(check, restored, 1))):
        _fail(check, "after a fully tied tell a restored strategy asks other candidates than the original")
    a = _build(check, cls, seed, dim, population_size, sigma0, options)
    b = _build(check, cls, seed, dim, population_size, sigma0, options)
    genomes, _ = _ask(check, a), _ask(check, b)
    fitness = _fitness(genomes)  # ties, as with k/N accuracies
    perm = np.random.default_rng(seed).permutation(P)
    _tell(check, a, genomes.copy(), fitness.copy())
    _tell(check, b, genomes[perm], 3.0 * fitness[perm] + 1.0)
    next_a, next_b = _ask(check, a), _ask(check, b)
    if not (_close(np.asarray(a.mean), np.asarray(b.mean)) and np.isclose(a.sigma, b.sigma, rtol=1e-9)
            and _close(next_a, next_b)):
        _fail(check, f"a partly tied tell moved the strategy by more than the ranks: the same candidates told in "
                     f"another order with fitness 3 f + 1 gave another update (mean {_diff(np.asarray(a.mean), np.asarray(b.mean))}, "
                     f"sigma {a.sigma} vs {b.sigma}); weight candidates by rank, ties equally")


def _values(obj: Any):
    """``obj`` and every value nested in its dicts, lists and tuples."""
    yield obj
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _values(item)


def pickled_classes(data: bytes) -> set[str]:
    """Every ``module.name`` a pickle names (classes, functions), in it and in the pickles held in its
    bytes values (a library's own pickle, like pycma's), recursively. Loads ``data``: trusted input only."""
    seen: set[str] = set()

    class Recorder(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            seen.add(f"{module}.{name}")
            return super().find_class(module, name)

        def persistent_load(self, pid: Any) -> None:
            return None

    for value in _values(Recorder(io.BytesIO(data)).load()):
        if isinstance(value, bytes) and value[:1] == b"\x80":  # a pickle (protocol 2+)
            try:
                seen |= pickled_classes(value)
            except Exception:  # noqa: BLE001 - bytes that only look like a pickle
                pass
    return seen


def _run(check: str, strategy: Strategy, generations: int) -> list[np.ndarray]:
    asked = []
    for _ in range(generations):
        genomes = _ask(check, strategy)
        _tell(check, strategy, genomes, _fitness(genomes))
        asked.append(genomes)
    asked.append(_ask(check, strategy))
    return asked


def check_resume(cls: type[Strategy], *, dim: int = 8, population_size: int = 8, sigma0: float = 0.3,
                 options: dict[str, Any] | None = None, seed: int = 0) -> None:
    """A strategy restored from a pickled ``state_dict`` continues exactly.

    Two generations, checkpoint (pickle round trip), then the original and a fresh strategy
    loaded from the checkpoint each ask, are told, and ask again; then the restored one is
    checkpointed and restored once more.

    Raises:
        AssertionError: ``check_resume: ...`` if state_dict/pickle/load_state_dict fails, the state
            names a class of the strategy's own package (at any nesting level), or the
            restored strategy's candidates, mean, sigma or generation differ from the original's
            (e.g. a random generator that is not in ``state_dict``).
    """
    check = "check_resume"
    original = _build(check, cls, seed, dim, population_size, sigma0, options)
    _run(check, original, 2)
    package = cls.__module__.split(".")[0]
    own = sorted(p for p in pickled_classes(_state_bytes(check, original)) if p.split(".")[0] == package)
    if own:
        _fail(check, f"state_dict() names {', '.join(own)} (in it or in a pickle it holds); moving or renaming "
                     f"that code would break every saved run: keep plain data, or pickle a library's object with "
                     f"your own objects as persistent ids (strategies.cma_es.dumps_es)")
    for round_ in (1, 2):
        state = _call(check, "state_dict() read back as a checkpoint is (plain data only: PlainUnpickler)",
                      lambda: plain_loads(pickle.dumps(original.state_dict(), protocol=4)))
        restored = _build(check, cls, seed, dim, population_size, sigma0, options)
        _call(check, "load_state_dict()", restored.load_state_dict, state)
        if restored.generation != original.generation:
            _fail(check, f"restored generation {restored.generation}, original {original.generation}")
        for g, (x, y) in enumerate(zip(_run(check, original, 1), _run(check, restored, 1))):
            if not _same(x, y):
                _fail(check, f"round {round_}: ask {g + 1} after load_state_dict differs from the original's "
                             f"({_diff(x, y)}); put every changing value, random generators included, in state_dict")
        if not (_same(np.asarray(original.mean), np.asarray(restored.mean)) and original.sigma == restored.sigma):
            _fail(check, f"round {round_}: mean or sigma differ after resume "
                         f"(sigma {original.sigma} vs {restored.sigma})")
        original = restored


def check_memory(cls: type[Strategy], *, dim: int = 8192, population_size: int = 4, sigma0: float = 0.3,
                 options: dict[str, Any] | None = None, seed: int = 0, max_state_mb: float | None = 256.0,
                 max_peak_mb: float | None = 1024.0) -> dict[str, Any]:
    """State size and peak memory of one generation at a large D.

    Measures ``len(pickle.dumps(state_dict()))`` after one tell, and the tracemalloc peak (numpy
    buffers included) of construct + ask + tell, at D ``dim`` (8192, a 7B model's rank-8 genome
    is larger still) with P ``population_size``.

    Returns:
        ``{"dim", "population_size", "state_mb", "peak_mb", "seconds"}`` (MB = 1e6 bytes), or
        ``{"dim", "population_size", "refused": message}`` when the constructor refuses the
        dimension with a one-line ValueError.

    Raises:
        AssertionError: ``check_memory: ...`` above ``max_state_mb`` or ``max_peak_mb`` (None =
            no limit), on a crash, or on a multi-line refusal.
    """
    check = "check_memory"
    started, t0 = not tracemalloc.is_tracing(), time.perf_counter()
    if started:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    try:
        try:
            strategy = cls(dim=dim, x0=None, seed=seed, population_size=population_size, sigma0=sigma0,
                           **(options or {}))
        except ValueError as err:  # a documented refusal of this D
            if "\n" in str(err).strip():
                _fail(check, f"D {dim} refused with a multi-line message: {str(err)[:200]!r}")
            return {"dim": dim, "population_size": population_size, "refused": str(err)}
        except Exception as err:  # noqa: BLE001
            _fail(check, f"construction at D {dim} raised {type(err).__name__}: {err}")
        genomes = _ask(check, strategy)
        _tell(check, strategy, genomes, _fitness(genomes))
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        if started:
            tracemalloc.stop()
    report = {"dim": dim, "population_size": population_size,
              "state_mb": len(_state_bytes(check, strategy)) / 1e6, "peak_mb": peak / 1e6,
              "seconds": time.perf_counter() - t0}
    for key, limit in (("state_mb", max_state_mb), ("peak_mb", max_peak_mb)):
        if limit is not None and report[key] > limit:
            _fail(check, f"{key} {report[key]:.1f} at D {dim}, P {population_size} is above the limit {limit}")
    return report


CHECKS: tuple[Callable[..., Any], ...] = (check_ask, check_seed, check_tell_shapes, check_no_mutation,
                                          check_nan_last, check_resume, check_ties, check_memory)
"""Every check, in the order :func:`check_strategy` runs them (cheap and basic first)."""


def check_strategy(cls: type[Strategy], *, dim: int = 8, population_size: int = 8, sigma0: float = 0.3,
                   options: dict[str, Any] | None = None, seed: int = 0, memory_dim: int = 8192,
                   max_state_mb: float | None = 256.0, max_peak_mb: float | None = 1024.0,
                   verbose: bool = True) -> dict[str, Any]:
    """Run every check of :data:`CHECKS` on ``cls``; the first failure raises.

    Args:
        cls: the Strategy subclass.
        dim: D of the small problem the checks build it on.
        population_size: P of that problem (it must suit the strategy, e.g. even for openai_es).
        sigma0: the initial step size.
        options: keyword options passed to ``cls`` (its ``strategy.options``).
        seed: the seed of the strategies the checks build.
        memory_dim: :func:`check_memory`'s D (at P 4).
        max_state_mb: :func:`check_memory`'s limit on the pickled ``state_dict`` (MB; None: no limit).
        max_peak_mb: :func:`check_memory`'s limit on the tracemalloc peak (MB; None: no limit).
        verbose: print the memory figures (one line).

    Returns:
        :func:`check_memory`'s report.

    Raises:
        AssertionError: the first failing check's one-line message.
    """
    kwargs = dict(dim=dim, population_size=population_size, sigma0=sigma0, options=options, seed=seed)
    for check in CHECKS[:-1]:
        check(cls, **kwargs)
    report = check_memory(cls, dim=memory_dim, sigma0=sigma0, options=options, seed=seed,
                          max_state_mb=max_state_mb, max_peak_mb=max_peak_mb)
    if verbose:
        print(f"{cls.__name__}: {format_memory(report)}")
    return report


run_all = check_strategy


def format_memory(report: dict[str, Any]) -> str:
    """One line for a :func:`check_memory` report."""
    where = f"D {report['dim']}, P {report['population_size']}"
    if "refused" in report:
        return f"refuses {where}: {report['refused']}"
    return (f"{where}: state_dict {report['state_mb']:.2f} MB, peak {report['peak_mb']:.1f} MB "
            f"(construct + ask + tell, {report['seconds']:.1f} s)")
