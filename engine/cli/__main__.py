"""``python -m engine.cli``: the ``essa`` command."""
from engine.cli import main

main()
