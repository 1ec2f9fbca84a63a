"""The genome a lab setting searches: the one ``essa train`` would search with the same ``strategy.genome``.

The lab's default ``landscape.dim`` is null: D is the run's, from ``strategy.genome`` (kind, alpha) and
the model's shapes (:func:`engine.search.genome_dim`):

* ``minibatch`` simulates essa's fitness on SmolLM2-135M-Instruct at lora.rank 8 (:data:`SIMULATED_MODEL`,
  the model the simulator was calibrated against, engine/lab/calibrate.py), one block of
  ``landscape.options.block`` (240 = 30 layers x 4 modules x 2 factors) coordinates per searched
  singular value: alpha 0.125 is D 240, alpha 0.5 D 960, alpha 1 D 1920. It models the relative genome
  (strategy=essa's, which it was calibrated on): ``mode: additive`` is searched at the run's D with one
  warning line. It does not simulate ``kind: lora`` (every LoRA entry, D 921600) nor ``kind: tinylora``
  (r x r projections in each update's SVD frame, not singular values): refused, unless ``landscape.dim``
  is set.
* ``sphere``, ``ellipsoid``, ``rastrigin``: any D; the run's svd_lora D on the same model (a lora genome
  needs ``landscape.dim``).
* ``likelihood``: the real model and codec of ``landscape.options.train`` (engine/lab/likelihood.py): D is
  the codec's, mode included.

A ``landscape.dim`` that differs from the run's D is searched as asked, with one warning line naming both.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

SIMULATED_MODEL = {"name": "SmolLM2-135M-Instruct", "hidden_size": 576, "num_attention_heads": 9,
                   "num_key_value_heads": 3, "head_dim": 64, "num_hidden_layers": 30}
"""The config.json fields of the model the minibatch simulator stands for (its default block, 240)."""
SIMULATED_RANK = 8
"""The lora.rank the simulator stands for (conf/train.yaml's; engine/lab/landscapes.py FULL_BLOCKS)."""
MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
"""essa train's default lora.target_modules (engine/config.py LoRAConfig)."""


@dataclass(frozen=True)
class LabGenome:
    """The genome of one lab setting.

    Attributes:
        kind, alpha, mode: ``strategy.genome``. run_dim: the D essa train searches with it (None: unknown
        until the likelihood landscape has built the codec). dim: the D the landscape searches (None: the
        likelihood landscape's codec decides). model: the model and rank run_dim is for. note: the one-line
        warning where the lab's search differs from the run's (None when it is the run's).
    """

    kind: str
    alpha: float
    mode: str
    run_dim: int | None
    dim: int | None
    model: str
    note: str | None = None

    def summary(self, landscape_dim: int) -> dict:
        """The ``genome`` entry of a setting in lab_summary.json (``landscape_dim``: the built landscape's D)."""
        run_dim = self.run_dim if self.run_dim is not None else landscape_dim
        return {"kind": self.kind, "alpha": self.alpha, "mode": self.mode, "run_dim": run_dim,
                "dim": landscape_dim, "model": self.model, "as_run": run_dim == landscape_dim and self.note is None,
                "note": self.note}


def _run_dim(genome, block: int) -> int:
    """D of ``genome`` on the simulated model: svd_lora ``block`` per searched singular value."""
    from engine.model import attention_shapes
    from engine.search import genome_dim

    if genome.kind == "svd_lora":  # floor(alpha r) blocks (strategies.genomes.searched_singular_values)
        return block * math.floor(genome.alpha * SIMULATED_RANK + 1e-9)
    return genome_dim(genome, SIMULATED_RANK, attention_shapes(SIMULATED_MODEL, MODULES))


def lab_genome(landscape, genome, options: dict) -> LabGenome:
    """The genome a setting searches on ``landscape`` (its config group) with ``strategy.genome`` ``genome``.

    Args:
        landscape: the ``landscape`` group (name, dim: null = the run's D). genome: ``strategy.genome``.
        options: ``landscape.options`` as a dict (minibatch: ``block``).

    Raises:
        ConfigError: a genome the landscape cannot search at the run's D without ``landscape.dim`` (one line
            naming both dimensions and the fix).
    """
    from engine.config import ConfigError
    from engine.search import genome_text

    kind, alpha, mode = str(genome.kind), float(genome.alpha), str(genome.mode)
    if landscape.name == "likelihood":
        dim = None if landscape.dim is None else int(landscape.dim)
        return LabGenome(kind, alpha, mode, None, dim, "landscape.options.train's model and lora.rank")
    block = int(options.get("block", 240)) if landscape.name == "minibatch" else 240
    run_dim = _run_dim(genome, block)
    model = f"{SIMULATED_MODEL['name']} at lora.rank {SIMULATED_RANK}"
    text = f"strategy.{genome_text(genome)} searches D {run_dim} in essa train ({model})"
    if landscape.dim is not None and int(landscape.dim) != run_dim:
        note = (f"landscape.dim={landscape.dim}: the lab searches D {landscape.dim}, while {text}; drop landscape.dim "
                "to lab the run's genome")
        return LabGenome(kind, alpha, mode, run_dim, int(landscape.dim), model, note)
    if kind == "tinylora" and landscape.dim is None:
        raise ConfigError(f"{text}; the {landscape.name} landscape does not model TinyLoRA's r x r "
                          f"projections: use landscape.name=likelihood (the real model and codec), or set "
                          f"landscape.dim={run_dim} to lab the strategy on the simulator at that D")
    if kind != "svd_lora" and landscape.dim is None:
        raise ConfigError(f"{text}; the {landscape.name} landscape simulates the svd_lora genome (D {block} per "
                          f"searched singular value, at most {8 * block}): set landscape.dim (e.g. landscape.dim="
                          f"{8 * block}) to lab the strategy at another D, or use landscape.name=likelihood")
    note = None
    if landscape.name == "minibatch" and mode != "relative":
        note = (f"strategy.genome.mode={mode}: the minibatch landscape models the relative genome it was calibrated "
                f"on; it searches the run's D {run_dim} but reads sigma0 and the genome as relative changes")
    return LabGenome(kind, alpha, mode, run_dim, run_dim, model, note)
