"""``essa``: the command line.

    essa [command] [overrides...]

Commands (engine/commands/__init__.py, one table):
    train          SFT warm start + ES (the default when no command is given)
    bench          population-evaluation throughput benchmark
    eval           accuracy / pass@k of a model with or without adapters
    grpo           GRPO / F-GRPO baseline (TRL)
    lab            strategy lab: strategies on a simulated fitness landscape (compare=[{...},{...}])
    report         PNG figures + Markdown summary: essa report RUN_DIR [...] [--out DIR]
    prepare-model  convert the embedded default model once; write quantized copies
                   (--quantization int8,int4 --model PATH --force)

Hydra composes each Hydra command's config from conf/ (``conf/<command>.yaml``); every field is
overridable and ``-m`` runs sweeps. Bad configuration exits with status 2 and one line naming the
field and the fix.
"""
from __future__ import annotations

import logging
import sys

from engine.commands import COMMANDS

from .completion import is_completion, route_query
from .hydra_app import USER_ERRORS, fail, run_hydra
from .pipes import closed_pipe_ends_quietly


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``essa`` console script: dispatch to the command named first (train by default).

    Hydra commands leave logging to Hydra (its job log, ``--info``'s own handler); the other commands
    log ``[time name] message`` lines to stderr. Output into a pipe whose reader stopped early
    (``essa help | head -1``) ends the command quietly (engine/cli/pipes.py)."""
    with closed_pipe_ends_quietly():
        dispatch(argv)


def dispatch(argv: list[str] | None = None) -> None:
    """Run the command ``argv`` (default ``sys.argv[1:]``) names: :func:`main` without the pipe guard."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = route_query(argv, COMMANDS, "train") or "train"
    named = bool(argv) and argv[0] in (*COMMANDS, "help")
    if named:
        command = argv.pop(0)
    elif argv and not argv[0].startswith(("-", "+", "~")) and "=" not in argv[0]:
        fail(ValueError(unknown_command(argv[0])))  # not an override either: Hydra said "missing EQUAL"
    if argv[:1] in (["-h"], ["--help"]) and not named or command == "help":  # then train's own --help
        print(__doc__)
        if command == "help":
            return
    c = COMMANDS[command]
    if c.hydra:
        return run_hydra(command, argv)
    if is_completion(argv):
        return  # report and prepare-model take no overrides to complete
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s %(name)s] %(message)s", datefmt="%H:%M:%S")
    try:
        c.runner()(argv)
    except USER_ERRORS as e:
        fail(e)


def unknown_command(word: str) -> str:
    """The one-line refusal of a first word that is neither a command nor an override (a mistyped command)."""
    import difflib

    close = difflib.get_close_matches(word, COMMANDS, n=1)
    hint = f"did you mean essa {close[0]}? " if close else ""
    return (f"{word!r} is not a command of essa ({', '.join(COMMANDS)}) nor an override (key=value); "
            f"{hint}essa help lists them")


if __name__ == "__main__":
    main()
