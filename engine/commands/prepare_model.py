"""``essa prepare-model``: convert the embedded default model once; write quantized copies."""
from __future__ import annotations

import argparse

from engine.model import DEFAULT_MODEL, get_quantization, prepare_embedded_model, quantized_model_path, resolve_model_path


def main(argv: list[str]) -> None:
    """The float checkpoint (embedded default, or ``--model``), then one quantized copy per
    ``--quantization`` value (int8, int4; comma-separated or repeated); prints each directory.

    Raises:
        ValueError / FileNotFoundError: an unknown quantization or model (one line, via the CLI).
    """
    ap = argparse.ArgumentParser(prog="essa prepare-model", description=main.__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL, help="model.path: HF id, directory or embedded:... (default)")
    ap.add_argument("--quantization", action="append", default=[], help="int8 and/or int4 (comma-separated)")
    ap.add_argument("--force", action="store_true", help="rebuild even when a finished copy exists")
    args = ap.parse_args(argv)
    names = [get_quantization(q).name for arg in args.quantization for q in arg.split(",") if q]
    if args.model == DEFAULT_MODEL:
        path = str(prepare_embedded_model(force=args.force))
    else:
        path = resolve_model_path(args.model)
    print(path)
    for name in names:
        print(quantized_model_path(path, name, force=args.force))
