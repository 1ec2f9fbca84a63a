"""One vLLM engine in this process, serving a whole population as LoRA adapters.

Population evaluation as in ESSA §3.3 and EGGROLL: every (candidate, prompt) pair becomes one
request with its own ``LoRARequest`` and the whole list goes into ONE ``LLM.generate`` call, so
vLLM batches all candidates together (multi-LoRA batching, Punica/S-LoRA).
"""
from __future__ import annotations

import logging
import os
import sys
import time
from typing import Sequence

from engine import interrupts
from engine.backends import AdapterRef, Completion, Sampling
from engine.config import VLLM_LORA_RANKS

log = logging.getLogger("essa.engine")


def round_lora_rank(rank: int) -> int:
    """Smallest rank vLLM accepts that is >= ``rank``.

    Raises:
        ValueError: rank < 1 or above vLLM's largest (512).
    """
    for r in VLLM_LORA_RANKS:
        if r >= rank:
            return r
    raise ValueError(f"lora.rank={rank} exceeds vLLM's max_lora_rank {VLLM_LORA_RANKS[-1]}; use a smaller rank")


def backend_kwargs(engine, *, max_lora_rank: int, max_loras: int, max_model_len: int, dtype: str, seed: int,
                   enable_lora: bool = True) -> dict:
    """:class:`VLLMBackend` keyword arguments from an ``engine`` config group (engine/config.py
    ``EngineConfig``) and plain values: the one mapping from config to engine, for every engine of a
    run (local, each Ray actor, essa eval, essa bench), so they all run the same kernels.

    ``max_loras`` is what the caller needs resident (e.g. P + 2); ``engine.max_loras`` overrides it.
    ``engine.tensor_parallel_size`` > 1 becomes vLLM's ``tensor_parallel_size`` with the ``mp`` executor.
    """
    from omegaconf import OmegaConf

    extra = OmegaConf.to_container(engine.extra, resolve=True) if OmegaConf.is_config(engine.extra) else engine.extra
    extra = dict(extra or {})
    if engine.tensor_parallel_size > 1:
        extra.setdefault("tensor_parallel_size", int(engine.tensor_parallel_size))
        extra.setdefault("distributed_executor_backend", "mp")
    return dict(max_lora_rank=max_lora_rank, max_loras=engine.max_loras or max_loras, max_model_len=max_model_len,
                dtype=dtype, seed=seed, gpu_memory_utilization=engine.gpu_memory_utilization,
                kv_cache_gib=engine.kv_cache_gib, enforce_eager=engine.enforce_eager, enable_lora=enable_lora,
                max_num_seqs=engine.max_num_seqs, fast_lora=engine.fast_lora,
                numerics=getattr(engine, "numerics", "auto"), extra=extra)


def is_cpu_platform() -> bool:
    """True when vLLM runs on its CPU back-end (no CUDA/ROCm device visible)."""
    try:
        import torch
        return not torch.cuda.is_available()
    except Exception:  # pragma: no cover
        return True


def no_adapter_plan(cpu: bool, fast_lora: bool, enforce_eager: bool) -> str:
    """How this process's next engine keeps requests without an adapter on the base model beside
    adapter requests: ``"gpu"``, ``"mask"``, ``"fast"`` or ``"split"``
    (:func:`engine.backends.fast_lora.plugin.no_adapter_plan`). Call after ``LLM(...)`` started: vLLM loads
    essa's plugin in this process too, so whether vLLM's CPU ops are masked here tells whether
    they are in the engine's processes."""
    from engine.backends.fast_lora import plugin

    if not cpu:
        return "gpu"
    fast = fast_lora and plugin.vllm_version() in plugin.TESTED_VLLM_VERSIONS  # what register() installs
    return plugin.no_adapter_plan(cpu, plugin.no_lora_mask_installed(), fast, enforce_eager)


def configure_cpu_env(threads: int | None = None, kv_cache_gib: float | None = None) -> None:
    """Set vLLM's CPU environment knobs before the engine starts (../shared/notes/vllm-cpu.md).

    Gives the model every core (vLLM reserves one by default) and bounds the KV cache (GiB).
    Values already in the environment win.
    """
    n = threads or os.cpu_count() or 1
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{n - 1}" if n > 1 else "0")
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    if kv_cache_gib is not None:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(int(max(1, kv_cache_gib))))


def apply_numerics(requested: str, dtype: str) -> str:
    """Set the environment of ``engine.numerics`` (:func:`engine.hardware.resolve_numerics`) for the engine's
    processes, which vLLM starts from this one and which inherit it; logs one line. Returns the mode."""
    from engine.hardware import resolve_numerics

    mode, env, reason = resolve_numerics(requested, dtype)
    os.environ.update(env)
    log.info("numerics %s: %s", mode, reason)
    return mode


class VLLMBackend:
    """A vLLM ``LLM`` that lives for the whole run and serves prompts under LoRA adapters.

    Args:
        model: HF id or checkpoint directory.
        max_lora_rank: LoRA rank of the adapters; rounded up to a value vLLM accepts.
        max_loras: adapters resident in one batch; must cover the population (P).
        max_model_len: context length in tokens (prompt + completion).
        dtype: "bfloat16", "float16", "float32" or "auto" (resolved here, silently, by
            :func:`engine.hardware.resolve_dtype` on this machine, not vLLM's "the checkpoint's dtype";
            entry points resolve and log it themselves and pass the result).
        seed: engine seed.
        gpu_memory_utilization: on GPU the usual fraction; ignored on CPU (see kv_cache_gib).
        kv_cache_gib: CPU back-end KV cache size in GiB.
        enforce_eager: skip CUDA graphs / compilation.
        enable_lora: False for base-model-only benchmarks.
        max_num_seqs: sequences per scheduler step.
        fast_lora: on CPU, install essa's fast multi-LoRA kernels in vLLM's worker processes
            (engine/fast_lora, through the ``ESSA_FAST_LORA`` environment variable); GPUs keep vLLM's.
        numerics: ``engine.numerics`` (auto | fast | invariant): kernels whose answers do not move with a
            request's batch slot (:func:`engine.hardware.resolve_numerics`; set for the engine's processes).
        extra: further ``LLM(...)`` keyword arguments (e.g. tensor_parallel_size, quantization).

    Attributes:
        no_adapter: how a request without an adapter is kept on the base model when it shares a
            batch with adapter requests (:func:`no_adapter_plan`; logged at start): ``"gpu"``,
            ``"mask"``, ``"fast"`` (the engine guarantees it) or ``"split"`` (this back-end serves
            such requests in a ``generate`` call of their own); ``"none"`` without LoRA.

    Must be created under ``if __name__ == "__main__":`` in scripts (vLLM spawns processes).
    """

    def __init__(self, model: str, max_lora_rank: int = 8, max_loras: int = 16, max_model_len: int = 1024,
                 dtype: str = "auto", seed: int = 0, gpu_memory_utilization: float = 0.85,
                 kv_cache_gib: float = 2.0, enforce_eager: bool = True, enable_lora: bool = True,
                 max_num_seqs: int = 256, fast_lora: bool = True, numerics: str = "auto", extra: dict | None = None):
        if max_loras < 1:
            raise ValueError(f"engine.max_loras={max_loras} must be >= 1 (it must cover the population)")
        self.cpu = is_cpu_platform()
        if self.cpu:
            configure_cpu_env(kv_cache_gib=kv_cache_gib)
        # read by engine.backends.fast_lora.plugin in every vLLM process (the plugin entry point)
        os.environ["ESSA_FAST_LORA"] = "1" if (fast_lora and self.cpu) else "0"
        from vllm import LLM

        if dtype == "auto":  # e.g. Ray actors: each resolves on its own node
            from engine.hardware import resolve_dtype
            dtype, _ = resolve_dtype("auto", log_choice=False)
        self.dtype = dtype
        self.numerics = apply_numerics(numerics, dtype)
        kwargs = dict(model=model, dtype=dtype, seed=seed, max_model_len=max_model_len,
                      enforce_eager=enforce_eager, max_num_seqs=max_num_seqs)
        if not self.cpu:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        if enable_lora:
            kwargs.update(enable_lora=True, max_lora_rank=round_lora_rank(max_lora_rank),
                          max_loras=max_loras, max_cpu_loras=max_loras)
        if self.cpu:
            # vLLM 0.32 CPU: a seeded request whose prompt is split across scheduler steps kills the
            # engine ("CPU Generator does not use offset"); whole-prompt prefill avoids it.
            kwargs["enable_chunked_prefill"] = False
            kwargs["max_num_batched_tokens"] = max(4096, max_model_len, max_num_seqs)
        kwargs.update(extra or {})
        t0 = time.perf_counter()
        with interrupts.redelivered():  # vLLM swallows a Ctrl-C during its engine's start-up handshake
            self.llm = LLM(**kwargs)
        self.startup_s = time.perf_counter() - t0
        self.tokenizer = self.llm.get_tokenizer()
        self.max_loras = max_loras if enable_lora else 0
        # how requests without an adapter stay on the base model in a mixed batch (issue 17)
        self.no_adapter = "none"
        if enable_lora:
            self.no_adapter = no_adapter_plan(self.cpu, fast_lora, bool(kwargs.get("enforce_eager")))
            from engine.backends.fast_lora.plugin import NO_ADAPTER_PLAN_TEXT
            log.info("vLLM engine up (dtype %s): requests without an adapter: %s", self.dtype,
                     NO_ADAPTER_PLAN_TEXT[self.no_adapter])

    def generate(self, prompts: Sequence[str], adapters: Sequence[AdapterRef | None], sampling: Sampling,
                 use_tqdm: bool = True) -> list[list[Completion]]:
        """Generate for every (prompt, adapter) pair in ONE vLLM call (two when ``no_adapter`` is
        ``"split"``: the no-adapter requests, then the adapter requests).

        Args:
            prompts: R prompt strings (chat template already applied).
            adapters: R adapter refs (None = base model), aligned with prompts.
            sampling: decoding settings; ``sampling.n`` completions per request.

        Returns:
            R lists of ``sampling.n`` completions, in request order.
        """
        from vllm import SamplingParams
        from vllm.lora.request import LoRARequest

        if len(prompts) != len(adapters):
            raise ValueError(f"{len(prompts)} prompts but {len(adapters)} adapters")
        params = [SamplingParams(max_tokens=sampling.max_tokens, temperature=sampling.temperature,
                                 top_p=sampling.top_p, n=sampling.n, seed=seed,
                                 logprobs=0 if sampling.logprobs else None)  # 0: the sampled token only
                  for seed in sampling.request_seeds(prompts, adapters)]
        loras = [None if a is None else LoRARequest(a.name, a.lora_int_id, a.path) for a in adapters]
        outs = self._generate(list(prompts), params, loras, use_tqdm)
        if not sampling.logprobs:
            return [[Completion(o.text, len(o.token_ids)) for o in out.outputs] for out in outs]
        return [[_with_logprobs(o, out.prompt_token_ids) for o in out.outputs] for out in outs]

    def prompt_logprobs(self, token_ids: Sequence[Sequence[int]], adapters: Sequence[AdapterRef | None],
                        use_tqdm: bool = True) -> list[list[float]]:
        """Log-probability of every token of each sequence given the tokens before it, prefill only
        (vLLM ``prompt_logprobs=0``: the sequence's own tokens; one token is generated and dropped), all
        R sequences in ONE multi-LoRA call (two when ``no_adapter`` is ``"split"``).

        Args:
            token_ids: R token-id sequences (length T_r >= 2), chat template already applied.
            adapters: R adapter refs (None = base model), aligned with token_ids.

        Returns:
            R lists of T_r - 1 natural-log probabilities (float), entry t = log p(token t+1 | tokens <= t),
            computed by the engine in its dtype with the raw (untempered) distribution, never from KV
            blocks cached by an earlier request (prefix caching stays on for generation).

        Raises:
            ValueError: lengths differ, or a sequence has fewer than 2 tokens.
            RuntimeError: vLLM returned no or too few prompt log-probabilities.
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.lora.request import LoRARequest

        if len(token_ids) != len(adapters):
            raise ValueError(f"{len(token_ids)} sequences but {len(adapters)} adapters")
        if any(len(ids) < 2 for ids in token_ids):
            raise ValueError("every scored sequence needs at least 2 tokens (a context and a scored token)")
        # No cached prefix is read: every scored token is computed in this call (the pinned vLLM 0.32 skips the read
        # for prompt_logprobs requests by default; said here so a changed default cannot change a score).
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False,
                                skip_reading_prefix_cache=True)
        prompts = [TokensPrompt(prompt_token_ids=list(map(int, ids))) for ids in token_ids]
        loras = [None if a is None else LoRARequest(a.name, a.lora_int_id, a.path) for a in adapters]
        outs = self._generate(prompts, [params] * len(prompts), loras, use_tqdm)
        return [_prompt_token_logprobs(o, ids) for o, ids in zip(outs, token_ids)]

    def _generate(self, prompts: list, params: list, loras: list, use_tqdm: bool) -> list:
        """``LLM.generate``, in two calls (no-adapter requests first) when the engine cannot keep them
        on the base model beside adapter requests (``self.no_adapter == "split"``); request order kept.
        vLLM's progress bars only on a terminal: in a redirected log their carriage returns bury essa's lines."""
        use_tqdm = use_tqdm and sys.stderr.isatty()
        base = [i for i, lora in enumerate(loras) if lora is None]
        if self.no_adapter != "split" or not base or len(base) == len(loras):
            return self.llm.generate(prompts, params, lora_request=loras, use_tqdm=use_tqdm)
        outs: list = [None] * len(prompts)
        for part in (base, [i for i, lora in enumerate(loras) if lora is not None]):
            got = self.llm.generate([prompts[i] for i in part], [params[i] for i in part],
                                    lora_request=[loras[i] for i in part], use_tqdm=use_tqdm)
            for i, o in zip(part, got):
                outs[i] = o
        return outs

    def close(self) -> None:
        """Free the engine (its worker processes and KV cache)."""
        llm = getattr(self, "llm", None)
        self.llm = None
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception:
                pass
            del llm


def _prompt_token_logprobs(out, token_ids: Sequence[int]) -> list[float]:
    """log p of tokens 1..T-1 of ``token_ids`` from a vLLM ``RequestOutput`` with ``prompt_logprobs=0``
    (position 0 has none; each later position holds a ``{token id: Logprob}`` with the prompt's own token).

    Raises:
        RuntimeError: a position lacks the prompt token's log-probability.
    """
    lps = out.prompt_logprobs
    if lps is None or len(lps) != len(token_ids):
        raise RuntimeError(f"vLLM returned {0 if lps is None else len(lps)} prompt logprobs for {len(token_ids)} tokens")
    values = []
    for pos in range(1, len(token_ids)):
        entry = lps[pos] or {}
        lp = entry.get(int(token_ids[pos]))
        if lp is None:
            raise RuntimeError(f"vLLM's prompt logprobs lack token {token_ids[pos]} at position {pos}")
        values.append(float(lp.logprob))
    return values


def _with_logprobs(out, prompt_token_ids) -> Completion:
    """A ``Completion`` with token ids and sampled-token log-probabilities from a vLLM ``CompletionOutput``.

    ``out.logprobs`` holds one ``{token id: Logprob}`` per generated position (``logprobs=0``: the
    sampled token only); NaN becomes None (TRL maps None back to NaN and leaves such tokens uncorrected).

    Raises:
        RuntimeError: vLLM returned no log-probabilities or a different number than tokens.
    """
    ids = list(out.token_ids)
    if out.logprobs is None or len(out.logprobs) != len(ids):
        raise RuntimeError(f"vLLM returned {0 if out.logprobs is None else len(out.logprobs)} logprobs for "
                           f"{len(ids)} tokens; the engine must run with logprobs enabled")
    lps = [float(pos[t].logprob) for pos, t in zip(out.logprobs, ids)]
    return Completion(out.text, len(ids), ids, [None if lp != lp else lp for lp in lps], list(prompt_token_ids))
