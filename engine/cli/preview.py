"""``essa <command> --cfg job``: the preview refuses what the run would refuse, before Hydra prints the config.

Hydra prints the composed config for ``--cfg`` without running the job, so the checks a run makes before it
loads anything (the command's ``validate``, and for train and lab the strategy class, its options and a
strategy picked by ``strategy.name=`` over another option's options) would not run, and a plugin that does
not import would print a config the run then refuses. The command's config module may define
``preview(cfg, choice)`` (train, lab: the checks, then one log line naming the strategy and the genome it
searches); the others run their ``validate``.
"""
from __future__ import annotations

import importlib

from engine.commands import COMMANDS
from engine.config import CONF_DIR

FLAGS = ("--cfg", "-c")
SWEEP_FLAGS = ("-m", "--multirun")


def previewing(argv: list[str]) -> bool:
    """Whether ``argv`` asks Hydra to print the config of a single run (``--cfg job``, ``-c all``, ``--cfg=job``)."""
    return any(a in FLAGS or a.startswith("--cfg=") for a in argv) and not any(a in SWEEP_FLAGS for a in argv)


def preview(command: str, argv: list[str], cfg=None) -> None:
    """Run the checks ``essa <command>`` makes before it loads anything on the config ``argv`` composes
    (``cfg``, with its ``hydra`` node, when the caller composed it already: engine/cli/overrides.py
    composes as Hydra will, ``--config-dir`` and ``hydra.searchpath`` included).

    Raises:
        ConfigError / ValueError: the run's own one-line refusal (e.g. a plugin whose import fails).
    """
    from hydra import compose, initialize_config_dir
    from hydra._internal.utils import get_args_parser

    try:
        if cfg is None:
            args, _ = get_args_parser().parse_known_args(argv)
            with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
                cfg = compose(config_name=COMMANDS[command].yaml, overrides=args.overrides, return_hydra_config=True)
    except BaseException:  # noqa: BLE001 - a malformed command line or composition: Hydra's own error says which
        return
    module = importlib.import_module(COMMANDS[command].config)
    if hasattr(module, "preview"):
        module.preview(cfg, cfg.hydra.runtime.choices.get("strategy"))
    elif hasattr(module, "validate"):
        module.validate(cfg)
