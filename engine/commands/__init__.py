"""The commands of ``essa``, one table: name -> schema module and run function.

A Hydra command (train, grpo, eval, bench, lab) has a light ``<name>_config.py`` with its schema
(``SCHEMA``), ``register()`` and ``validate``; its run function ``run(cfg, run_dir) -> float | None``
returns the value a Hydra sweeper optimises (held-out accuracy) or None. The other commands (report,
prepare-model) take their own argv. The CLI imports a command's run module only when that command
runs, so checking overrides never imports torch or vLLM.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Command:
    """One ``essa`` command.

    Attributes:
        name: the word after ``essa``.
        summary: one line for ``essa help``.
        run: ``"module:function"``; Hydra commands: ``function(cfg, run_dir) -> float | None``, others
            ``function(argv: list[str]) -> None``.
        config: module of the schema (``register()``, ``SCHEMA``); None = not a Hydra command.
        yaml: the primary config in conf/ (``conf/<yaml>.yaml``).
    """

    name: str
    summary: str
    run: str
    config: str | None = None
    yaml: str | None = None

    @property
    def hydra(self) -> bool:
        """Whether Hydra composes this command's config."""
        return self.config is not None

    def runner(self) -> Callable:
        """The run function (imports its module now)."""
        module, function = self.run.split(":")
        return getattr(importlib.import_module(module), function)

    def schema(self) -> type | None:
        """The schema dataclass (``SCHEMA`` of the config module), or None."""
        return importlib.import_module(self.config).SCHEMA if self.config else None


def _hydra(name: str, summary: str) -> Command:
    return Command(name, summary, f"engine.commands.{name}:run", f"engine.commands.{name}_config", name)


COMMANDS: dict[str, Command] = {c.name: c for c in (
    Command("train", "SFT warm start + ES (the default when no command is given); rounds.count=R: in rounds",
            "engine.commands.train_rounds:run", "engine.commands.train_config", "train"),
    _hydra("bench", "population-evaluation throughput benchmark"),
    _hydra("eval", "accuracy / pass@k of a model with or without adapters"),
    _hydra("grpo", "GRPO / F-GRPO baseline (TRL)"),
    _hydra("lab", "strategy lab: strategy settings on a simulated fitness landscape, seconds per comparison"),
    Command("report", "PNG figures + Markdown summary of run directories: essa report RUN_DIR [...]",
            "engine.results.report:cli"),
    Command("prepare-model", "convert the embedded default model once; write quantized copies "
            "(--quantization int8,int4 --model PATH --force)", "engine.commands.prepare_model:main"),
)}


def hydra_commands() -> dict[str, Command]:
    """The commands whose config Hydra composes."""
    return {k: c for k, c in COMMANDS.items() if c.hydra}


def register_configs() -> None:
    """Store every Hydra command's schema in Hydra's ConfigStore (before composing any config)."""
    for c in hydra_commands().values():
        importlib.import_module(c.config).register()
