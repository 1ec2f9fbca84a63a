"""The search a run evolves: the ``strategy`` config group -> strategy class, genome codec, strategy.

config -> strategy -> genome is the first leg of the data flow (docs/ARCHITECTURE.md). Everything
here takes the ``strategy`` group (engine/config.py ``StrategyConfig``) or plain values; the classes
come from ``strategies`` (built-ins, ``essa.strategies`` entry points, dotted paths).
"""
from __future__ import annotations

import math

from engine.config import ConfigError


def strategy_class(s):
    """The Strategy class the ``strategy`` group names: ``strategy._target_`` when set, else
    ``strategy.name``.

    Raises:
        ValueError: the name resolves to nothing (one line naming the field, ``strategies.get_strategy``).
    """
    from strategies import get_strategy

    return get_strategy(s._target_ or s.name, "strategy._target_" if s._target_ else "strategy.name")


def strategy_options(s) -> dict:
    """``strategy.options`` as a plain dict (the strategy class's keyword arguments)."""
    from omegaconf import OmegaConf

    return dict((OmegaConf.to_container(s.options, resolve=True) if OmegaConf.is_config(s.options) else s.options)
                or {})


def check_strategy_options(strategy_cls, s, seed: int) -> None:
    """Build the strategy once on a 2-dimensional problem so bad ``strategy.options``,
    ``strategy.population_size`` or ``strategy.sigma0`` fail before the SFT warm start (the real strategy
    needs the genome's dimension, known only after it).

    Raises:
        ConfigError: one line naming the field the class rejects: an option it has no parameter for (with
            the options it takes), ``strategy.population_size`` / ``strategy.sigma0`` when its message
            names them, the class's own line when it names one of the options, else ``strategy.options``.
    """
    options = strategy_options(s)
    try:
        strategy_cls(dim=2, x0=None, seed=seed, population_size=s.population_size, sigma0=s.sigma0, **options)
    except (TypeError, ValueError) as e:
        raise ConfigError(_rejection_line(strategy_cls, s, options, e)) from None


def _rejection_line(cls, s, options: dict, e: BaseException) -> str:
    """One line for a strategy class that refused its arguments: the field it refused and the fix."""
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    name = cls.__name__
    takes = class_options(cls)
    unknown = [k for k in options if k not in takes]
    if unknown and ("unexpected keyword" in msg or "unknown option" in msg):  # the Strategy base class's refusal
        import difflib

        near = {k: difflib.get_close_matches(k, takes, n=1, cutoff=0.5) for k in unknown}
        fix = " ".join(f"+strategy.options.{near[k][0]}={options[k]} in place of strategy.options.{k}?" if near[k]
                       else f"drop it: ~strategy.options.{k}" for k in unknown)
        return (f"{', '.join(f'strategy.options.{k}' for k in unknown)}: {name} takes no such option (its options: "
                f"{', '.join(takes) or 'none'}); {'did you mean ' if any(near.values()) else ''}{fix}")
    if "population_size" in msg:
        near = _nearest_population_size(cls, s, options)
        fix = f"e.g. strategy.population_size={near}" if near else "set strategy.population_size to a size it takes"
        return f"strategy.population_size={s.population_size}: {name} rejects it ({msg}); {fix}"
    if "sigma0" in msg:
        return f"strategy.sigma0={s.sigma0}: {name} rejects it ({msg}); set strategy.sigma0 to a value it takes"
    if any(f"strategy.options.{k}" in msg for k in options):  # the class named the option: its line, not the dict
        return f"{msg} ({name})"
    return f"strategy.options={options}: {name} rejects them ({msg})"


def _nearest_population_size(cls, s, options: dict) -> int | None:
    """The population size nearest ``strategy.population_size`` (within 8, larger first) that ``cls``
    accepts with the other arguments unchanged, or None."""
    p = int(s.population_size)
    for size in (q for d in range(1, 9) for q in (p + d, p - d) if q >= 2):
        try:
            cls(dim=2, x0=None, seed=0, population_size=size, sigma0=s.sigma0, **options)
            return size
        except (TypeError, ValueError):
            continue
    return None


def class_options(cls) -> list[str]:
    """The keyword arguments a strategy class takes beyond the Strategy contract's (dim, x0, seed,
    population_size, sigma0): what ``strategy.options`` may set. Each ``__init__`` up the class's MRO
    adds its own, as long as it passes the rest on with ``**options`` (strategies/base.py: the base
    class refuses what is left over)."""
    import inspect

    from strategies import Strategy

    fixed, names = ("self", "dim", "x0", "seed", "population_size", "sigma0"), []
    for klass in cls.__mro__:
        if klass is Strategy or not issubclass(klass, Strategy):
            break
        if "__init__" not in vars(klass):
            continue
        try:
            params = inspect.signature(klass.__init__).parameters.values()
        except (TypeError, ValueError):
            break
        names += [p.name for p in params if p.name not in fixed and p.name not in names
                  and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            break
    return names


def build_error(strategy_cls, s, seed: int, options: dict) -> tuple[str, bool] | None:
    """Why ``strategy_cls`` cannot be built from the ``strategy`` group ``s`` with ``options`` (on a
    2-dimensional problem): None when it can, else (the class's first line, whether the options are to
    blame: False when the class refuses the same way without them, e.g. ``strategy.population_size``)."""
    def error(opts: dict) -> str | None:
        try:
            strategy_cls(dim=2, x0=None, seed=seed, population_size=s.population_size, sigma0=s.sigma0, **opts)
        except (TypeError, ValueError) as e:
            return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return None

    msg = error(options)
    if msg is None:
        return None
    return msg, not options or error({}) != msg


def genome_kwargs(genome) -> dict:
    """Keyword arguments of ``strategies.genomes.make_genome`` from the ``strategy.genome`` group."""
    if genome.kind == "svd_lora":
        return {"alpha": genome.alpha, "mode": genome.mode}
    if genome.kind == "tinylora":
        return {"u": int(genome.u), "tied": bool(genome.tied)}
    return {}


def genome_dim(genome, rank: int, shapes: list[tuple[int, int]]) -> int:
    """D of the ``strategy.genome`` codec over a rank-``rank`` LoRA of the modules ``shapes``.

    Args:
        genome: the ``strategy.genome`` group (kind, alpha). rank: ``lora.rank``.
        shapes: (in, out) features of every adapted projection, one per (layer, module)
            (``engine.model.attention_shapes``).

    Returns:
        svd_lora: modules x 2 factors x floor(alpha r) (strategies.genomes.SVDLoRAGenome);
        tinylora: u, or u x modules untied (strategies.genomes.TinyLoRAGenome);
        lora: sum of r (in + out) (strategies.genomes.LoRAGenome).
    """
    if genome.kind == "lora":
        return sum(rank * (i + o) for i, o in shapes)
    if genome.kind == "tinylora":
        return int(genome.u) * (1 if genome.tied else len(shapes))
    return len(shapes) * 2 * math.floor(genome.alpha * rank + 1e-9)  # strategies.genomes.searched_singular_values


def genome_text(genome, dim: int | None = None, rank: int | None = None, layers: int | None = None,
                modules: int | None = None) -> str:
    """The resolved ``strategy.genome`` in words and, where known, its D and how it is made up, e.g.
    ``genome svd_lora (alpha 0.5, mode relative): D 960 = 30 layers x 4 modules x 2 factors x 4 singular
    values (lora.rank 8)``."""
    what = {"svd_lora": f"genome svd_lora (alpha {genome.alpha:g}, mode {genome.mode})",
            "tinylora": f"genome tinylora (u {genome.u}, {'tied' if genome.tied else 'one vector per module'})"
            }.get(genome.kind, f"genome {genome.kind} (every LoRA entry)")
    if dim is None:
        return what
    if genome.kind == "svd_lora" and rank and layers and modules:
        k = math.floor(genome.alpha * rank + 1e-9)
        return (f"{what}: D {dim} = {layers} layers x {modules} modules x 2 factors x {k} singular values "
                f"(lora.rank {rank})")
    return f"{what}: D {dim}"


def strategy_text(s, cls) -> str:
    """``strategy random_search (essa_plugin_example.RandomSearch): P 8, sigma0 0.05, options {}``."""
    return (f"strategy {s._target_ or s.name} ({cls.__module__}.{cls.__qualname__}): P {s.population_size}, "
            f"sigma0 {s.sigma0:g}, options {strategy_options(s)}")


def search_line(s, cls, lora, model_config: dict | None = None) -> str:
    """The one line a run logs at start: the strategy (:func:`strategy_text`) and the genome it searches
    (:func:`genome_text`), with D when the model's ``config.json`` dict ``model_config`` is given
    (``engine.model.local_model_config``) and names every ``lora.target_modules`` projection."""
    from engine.model import attention_shapes

    shapes = attention_shapes(model_config, lora.target_modules) if model_config else None
    if not shapes:
        return f"{strategy_text(s, cls)}; {genome_text(s.genome)}"
    dim = genome_dim(s.genome, lora.rank, shapes)
    layers = int(model_config["num_hidden_layers"])
    return f"{strategy_text(s, cls)}; {genome_text(s.genome, dim, lora.rank, layers, len(lora.target_modules))}"


def method_name(s) -> str:
    """The run's method in run.json, validation rows and reports: ``essa`` for CMA-ES (``essa``, ``cma_es``)
    over the SVD-LoRA genome (ESSA's algorithm), else the strategy's name (``openai_es``, ``lra_cma``, a plugin)."""
    return "essa" if s.genome.kind == "svd_lora" and s.name in ("essa", "cma_es") else str(s.name)


def build_search(s, lora: dict, seed: int, strategy_cls=None):
    """The genome codec over the warm start ``lora`` and a fresh strategy over it.

    Args:
        s: the ``strategy`` group. lora: the SFT adapter's LoRA state (engine/lora/files.py).
        seed: the strategy's seed. strategy_cls: the class (default :func:`strategy_class`).

    Returns:
        ``(codec, strategy)``: codec.dim = D, strategy mean = genome zero (the warm start).
    """
    from strategies.genomes import make_genome

    codec = make_genome(s.genome.kind, lora, **genome_kwargs(s.genome))
    cls = strategy_cls or strategy_class(s)
    strategy = cls(dim=codec.dim, x0=codec.x0(), seed=seed, population_size=s.population_size, sigma0=s.sigma0,
                   **strategy_options(s))
    return codec, strategy
