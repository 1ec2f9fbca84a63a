"""The search a run evolves: the ``strategy`` config group -> strategy class, genome codec, strategy.

config -> strategy -> genome is the first leg of the data flow (docs/ARCHITECTURE.md). Everything
here takes the ``strategy`` group (engine/config.py ``StrategyConfig``) or plain values; the classes
come from ``strategies`` (built-ins, ``essa.strategies`` entry points, dotted paths).
"""
from __future__ import annotations

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
    """Build the strategy once on a 2-dimensional problem so bad ``strategy.options`` fail before the
    SFT warm start (the real strategy needs the genome's dimension, known only after it).

    Raises:
        ConfigError: the class rejects the options (one line naming ``strategy.options``).
    """
    options = strategy_options(s)
    try:
        strategy_cls(dim=2, x0=None, seed=seed, population_size=s.population_size, sigma0=s.sigma0, **options)
    except (TypeError, ValueError) as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"strategy.options={options}: {strategy_cls.__name__} rejects them ({msg})") from None


def genome_kwargs(genome) -> dict:
    """Keyword arguments of ``strategies.genomes.make_genome`` from the ``strategy.genome`` group."""
    return {"alpha": genome.alpha, "mode": genome.mode} if genome.kind == "svd_lora" else {}


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
