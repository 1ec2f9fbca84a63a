"""Start-up self-check of LoRA on a quantized base (``model.quantization``): is the adapter applied?

LoRA on a quantized base has failed silently in vLLM before: adapters accepted and served, the
output that of the base model (vllm issues 9120, 42488). An ES run on such an engine evaluates P
copies of the same model and learns nothing, with no error anywhere. So every engine that serves
adapters on a quantized base scores one short fixed chat (a question and its answer, ~40 tokens,
prefill only) three times in one multi-LoRA call: on the base, under an adapter whose B factors are
zero (it must change nothing) and under an adapter known to move the output (random factors at
:data:`MOVE_SCALE`), and compares log-probabilities of the same tokens (not greedy strings: a weak
adapter can leave two greedy strings equal, issue 29). It costs one prefill of three sequences and
two small adapter files, a fraction of a second on a 135M model.

``build_evaluator`` (train, via :func:`selfchecked`), ``essa eval`` and ``essa bench`` call it when
``model.quantization`` is set; a failure stops the run with one line naming ``model.quantization``.
"""
from __future__ import annotations

import logging
import math
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.backends import AdapterRef, lora_int_id
from engine.lora.files import DEFAULT_TARGET_MODULES, default_adapter_root, write_adapter
from engine.prompts import build_prompt

log = logging.getLogger("essa.selfcheck")

QUESTION = "Tom has 3 apples and buys 4 more. How many apples does he have?"
SYSTEM_PROMPT = "Answer briefly."
ANSWER = "He has 3 + 4 = 7 apples. The final answer is \\boxed{7}."
ZERO_MAX_NATS = 0.1
"""Largest |log p(zero adapter) - log p(base)| allowed on any scored token: B = 0 adds exactly 0, so
only the arithmetic of a different batch row may differ (bf16 rounding, below 0.05 measured)."""
MOVE_MIN_NATS = 0.2
"""Smallest mean |log p(moving adapter) - log p(base)| over the scored tokens that counts as applied."""
MOVE_SCALE = 0.5
"""The moving adapter: A ~ N(0, 1/d_in), B ~ N(0, MOVE_SCALE^2 / r), so with lora_alpha / r the
update B A x is about ``MOVE_SCALE x alpha / r`` times the input's RMS per output: as large as the
layer's own output, which moves every token's log-probability (measured: several nats)."""
PROBE_CANDIDATES = (65534, 65535)
"""Candidate slots of generation -1 (fixed adapters) the two probe adapters are served under: no
other adapter of essa uses them (the SFT warm start is candidate 0, essa eval's conditions 0..k)."""


@dataclass(frozen=True)
class LoRAServingCheck:
    """What the self-check measured.

    Attributes:
        tokens: scored answer tokens.
        zero_max: max over them of |log p(B = 0 adapter) - log p(base)| (nats).
        moved_mean: mean over them of |log p(moving adapter) - log p(base)| (nats).
        seconds: wall time of the check (files, engine call).
    """

    tokens: int
    zero_max: float
    moved_mean: float
    seconds: float

    @property
    def ok(self) -> bool:
        """The zero adapter changed nothing (<= ZERO_MAX_NATS) and the moving one moved (>= MOVE_MIN_NATS)."""
        return bool(self.zero_max <= ZERO_MAX_NATS and self.moved_mean >= MOVE_MIN_NATS)

    def line(self) -> str:
        """The numbers in one phrase (logs and the failure message)."""
        return (f"an adapter that must change the output moved log-probabilities by {self.moved_mean:.3g} nats/token "
                f"(needs >= {MOVE_MIN_NATS:g}), one with B = 0 by up to {self.zero_max:.3g} (must be <= "
                f"{ZERO_MAX_NATS:g}) over {self.tokens} tokens")


def probe_loras(template: dict, seed: int = 29) -> tuple[dict, dict]:
    """The two probe adapters in the shapes of ``template`` (a LoRA state: PEFT keys, A (r, in), B (out, r)).

    Returns:
        (zero, moving): ``zero`` has the moving adapter's A and B = 0 (so only B decides); ``moving``
        has A ~ N(0, 1/in) and B ~ N(0, MOVE_SCALE^2 / r), float32, from ``seed``.
    """
    import torch

    g = torch.Generator().manual_seed(seed)
    moving = {}
    for key in sorted(template):
        shape = tuple(template[key].shape)
        scale = 1 / math.sqrt(shape[1]) if ".lora_A." in key else MOVE_SCALE / math.sqrt(shape[1])
        moving[key] = torch.randn(shape, generator=g) * scale
    zero = {k: (torch.zeros_like(v) if ".lora_B." in k else v) for k, v in moving.items()}
    return zero, moving


def measure_lora_serving(backend, template: dict, rank: int, lora_alpha: float, base_model: str,
                         root: str | Path, target_modules=DEFAULT_TARGET_MODULES) -> LoRAServingCheck:
    """Score the fixed answer on the base and under the two probe adapters in one engine call.

    Args:
        backend: an engine with ``tokenizer`` and ``prompt_logprobs`` (``VLLMBackend``) serving LoRA.
        template: a LoRA state whose keys and shapes the probes take (the run's adapter shape).
        rank, lora_alpha, base_model, target_modules: written into the probes' adapter_config.json.
        root: directory for the two probe adapters (removed afterwards).

    Returns:
        :class:`LoRAServingCheck`.
    """
    from engine.evaluation.prefill import encode_pairs, target_logprobs

    t0 = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="essa-selfcheck-", dir=root))
    try:
        refs: list[AdapterRef | None] = [None]
        for name, lora, cand in zip(("zero", "moving"), probe_loras(template), PROBE_CANDIDATES):
            path = write_adapter(root / name, lora, rank, lora_alpha, base_model, target_modules)
            refs.append(AdapterRef(f"selfcheck-{name}", lora_int_id(-1, cand), str(path)))
        prefix = build_prompt(backend.tokenizer, QUESTION, SYSTEM_PROMPT)
        pairs = encode_pairs(backend.tokenizer, [prefix] * 3, [ANSWER] * 3)
        base, zero, moving = target_logprobs(backend, pairs, refs)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return LoRAServingCheck(tokens=len(base), zero_max=float(np.max(np.abs(zero - base))),
                            moved_mean=float(np.mean(np.abs(moving - base))), seconds=time.perf_counter() - t0)


def check_lora_serving(backend, quantization: str, template: dict, rank: int, lora_alpha: float, base_model: str,
                       root: str | Path | None = None, target_modules=DEFAULT_TARGET_MODULES) -> LoRAServingCheck:
    """:func:`measure_lora_serving`, then stop the run unless LoRA is applied on this quantized base.

    Args:
        quantization: ``model.quantization`` (named in the message).
        root: where the probe adapters go; None = ``engine.lora.files.default_adapter_root``.
        Others: :func:`measure_lora_serving`.

    Returns:
        The passing :class:`LoRAServingCheck` (also logged in one line).

    Raises:
        ValueError: the check failed (one line naming ``model.quantization`` and what to use instead).
    """
    res = measure_lora_serving(backend, template, rank, lora_alpha, base_model,
                               root if root is not None else default_adapter_root(None), target_modules)
    if not res.ok:
        raise ValueError(f"model.quantization={quantization}: LoRA self-check failed on the quantized base ({res.line()}), "
                         "so this engine would not apply the population's adapters; use model.quantization=null "
                         "(the float base)")
    log.info("LoRA self-check on the %s base passed in %.2fs: %s", quantization, res.seconds, res.line())
    return res


def selfchecked(evaluator, quantization: str | None):
    """``evaluator`` after :func:`check_lora_serving` on its engine when ``quantization`` is set.

    The probes take the shape of the evaluator's genome at its centre (``codec.decode(codec.x0())``;
    without a codec the model's q/k/v/o, :func:`model_lora_template`) and its adapter metadata. An evaluator without a local engine (Ray: the engines live in the
    actors) is returned unchecked with one warning.

    Raises:
        ValueError: the check failed; the evaluator (and its engine) is closed first.
    """
    if quantization is None:
        return evaluator
    backend = getattr(evaluator, "backend", None)
    if backend is None or not hasattr(backend, "prompt_logprobs"):
        log.warning("model.quantization=%s: the LoRA self-check runs on local engines only; not run for %s",
                    quantization, type(evaluator).__name__)
        return evaluator
    meta, codec = evaluator.meta, evaluator.codec
    try:
        template = codec.decode(codec.x0()) if codec is not None else model_lora_template(meta.base_model, meta.rank)
        check_lora_serving(backend, quantization, template, meta.rank, meta.lora_alpha, meta.base_model,
                           evaluator.root, meta.target_modules if codec is not None else DEFAULT_TARGET_MODULES)
    except BaseException:
        evaluator.close()
        backend.close()
        raise
    return evaluator


def model_lora_template(model_path: str, rank: int) -> dict:
    """A q/k/v/o LoRA state (``strategies.genomes.random_lora``) in the shapes of a Hugging Face
    checkpoint's attention projections: the probes' template where no genome codec exists (essa eval)."""
    from transformers import AutoConfig

    from strategies.genomes import random_lora

    c = AutoConfig.from_pretrained(model_path)
    head = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return random_lora(num_layers=c.num_hidden_layers, rank=rank, hidden=c.hidden_size,
                       kv_dim=c.num_key_value_heads * head)


def check_served(backend, quantization: str | None, model_path: str, rank: int) -> LoRAServingCheck | None:
    """The self-check for an engine built outside an evaluator (``essa eval``, ``essa bench``): probes in
    the checkpoint's q/k/v/o shapes (:func:`model_lora_template`) at ``rank``; nothing to check without
    ``quantization`` or when the engine serves no adapters (``backend.max_loras == 0``).

    Raises:
        ValueError: the check failed (:func:`check_lora_serving`); ``backend`` is closed first.
    """
    if quantization is None or not getattr(backend, "max_loras", 0):
        return None
    try:
        return check_lora_serving(backend, quantization, model_lora_template(model_path, rank), rank, 2.0 * rank,
                                  model_path)
    except BaseException:
        backend.close()
        raise
