"""``essa``: the command line.

    essa train [overrides...]     SFT warm start + ES (default when no command is given)
    essa bench [overrides...]     population-evaluation throughput benchmark
    essa eval  [overrides...]     accuracy / pass@k of a model with or without adapters
    essa grpo  [overrides...]     GRPO / F-GRPO baseline (TRL)
    essa report RUN_DIR [...]     PNG figures + Markdown summary of run directories
    essa prepare-model            convert the embedded default model once

Hydra composes each command's config from conf/ (``conf/<command>.yaml``); every field is
overridable and ``-m`` runs sweeps. Bad configuration exits with status 2 and one line naming the
field and the fix.
"""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
HYDRA_COMMANDS = {"train": "train", "bench": "bench", "eval": "eval", "grpo": "grpo"}
USER_ERRORS = (ValueError, FileNotFoundError, KeyError)


def _fail(e: BaseException) -> None:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    print(f"essa: error: {msg}", file=sys.stderr)
    sys.exit(2)


def _run(command: str, cfg) -> None:
    from hydra.core.hydra_config import HydraConfig

    run_dir = HydraConfig.get().runtime.output_dir
    try:
        if command == "train":
            from .loop import run_train
            run_train(cfg, run_dir)
        elif command == "bench":
            from .bench import main as bench_main
            bench_main(cfg)
        elif command == "eval":
            from .evaluate import main as eval_main
            eval_main(cfg, run_dir)
        elif command == "grpo":
            from .grpo import main as grpo_main
            grpo_main(cfg, run_dir)
    except KeyboardInterrupt:
        sys.exit(130)
    except USER_ERRORS as e:
        if os.environ.get("ESSA_DEBUG"):
            raise
        _fail(e)


def _hydra(command: str, argv: list[str]) -> None:
    import hydra

    from .config import register_configs

    register_configs()

    @hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name=HYDRA_COMMANDS[command])
    def entry(cfg):
        _run(command, cfg)

    sys.argv = [f"essa {command}"] + argv
    entry()


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``essa`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s %(name)s] %(message)s", datefmt="%H:%M:%S")
    command = "train"
    if argv and argv[0] in (*HYDRA_COMMANDS, "report", "prepare-model", "help"):
        command = argv.pop(0)
    if argv[:1] in (["-h"], ["--help"]) and command == "train" or command == "help":
        print(__doc__)
        if command == "help":
            return
    if command == "report":
        from .report import cli as report_cli
        return report_cli(argv)
    if command == "prepare-model":
        from .model import prepare_embedded_model
        print(prepare_embedded_model(force="--force" in argv))
        return
    _hydra(command, argv)


if __name__ == "__main__":
    main()
