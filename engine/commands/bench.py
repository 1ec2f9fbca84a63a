"""``essa bench``: population evaluation against plain inference and the naive per-candidate loop.

ESSA's premise is that training costs about what inference costs: a generation of P candidates is
one multi-LoRA batch (Punica, arXiv 2310.18547; S-LoRA, arXiv 2311.03285). EGGROLL (arXiv
2511.16652) reports population evaluation at 91 % of pure batch-inference throughput. This
benchmark measures, on the same prompts (real GSM8K questions under the model's chat template)
and the same greedy sampling, in one process:

1. ``base``: the P x B requests on the base model (no adapter): the limit; measured on the same
   engine right before the population run, and with ``base_without_lora=true`` also on a separate
   engine started without LoRA support (the strict limit; runs first, costs a minute or two);
2. ``population``: one ES generation's generate call: P candidates x B prompts, P fresh adapters
   (ids never seen before, so vLLM loads them inside the call, as in training);
3. ``naive``: transformers + peft, one candidate at a time: load its adapter, ``generate`` over
   its B prompts, unload. Its cost per candidate does not depend on P, so ``naive.candidates`` of
   them are timed and the per-candidate mean is scaled to P (the output says so);

and the ratios population/base and population/naive (tokens/s). It also times every phase of one
ES generation (ask, genome -> adapter tensors, writing adapters, vLLM adapter load, generation,
reward scoring, tell) at ``phases_population`` so the non-generation share is visible. The adapter
load happens inside vLLM's generate call; a probe measures it (one 1-token request per adapter
under fresh ids, minus the same requests again).

The ``population`` and ``base`` runs of one P are adjacent, so a machine whose load drifts affects
both alike; ``repeats`` > 1 repeats the pair and reports the best of each (all samples are kept
in the JSON). Besides wall time, the CPU time of this process and vLLM's (child) processes is
recorded per run: other users' load inflates wall time much more than it inflates CPU time, so
the CPU-time ratio is a cross-check on a shared machine. The load average is recorded too.

The population run goes through the population evaluator ``essa train`` uses
(engine/evaluation/population.py: decode, write adapters, one generate call, reward), so the figures
are the training loop's own. Both runs use the same engine with prefix caching off (the base run repeats B prompts P times;
distinct adapters can never share a cached prompt) and LoRA restricted to the adapters' target
modules.

After the engine is closed, the roofline (engine/evaluation/roofline.py): torch's GEMM rate on the model's own
shapes in this process and dtype, and each run's share of it (``roofline`` and ``roofline_fraction`` in the JSON).

Output: a readable table on stdout and JSON at ``output`` (default ``<run dir>/bench.json``).
"""
from __future__ import annotations

import itertools
import json
import logging
import os
import platform
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine.backends import Sampling
from engine.commands.bench_config import validate
from engine.evaluation.roofline import prompt_tokens
from engine.tasks import Problem

log = logging.getLogger("essa.bench")


# ---------------------------------------------------------------------------------------------
# Inputs: prompts, genome, strategy
# ---------------------------------------------------------------------------------------------

def load_questions(path: str, n: int) -> list[tuple[str, str]]:
    """The first ``n`` (question, final answer) pairs of a GSM8K-format JSONL file.

    Relative paths resolve like task paths (cwd, the repository, ``$ESSA_DATA``).

    Raises:
        FileNotFoundError: no such file. ValueError: fewer than ``n`` usable rows, or a file that is
            not UTF-8 / not readable (the message names ``bench.data``).
    """
    from engine.tasks import READERS, _resolve_path, read_rows

    p = _resolve_path(path)
    if not p.exists():
        raise FileNotFoundError(f"bench.data={path!r} not found (looked in cwd, the repo and $ESSA_DATA)")
    out = []
    for row in read_rows(p, field="bench.data"):
        parsed = READERS["gsm8k"](row)
        if parsed:
            out.append((parsed[0], parsed[1]))
        if len(out) == n:
            return out
    raise ValueError(f"bench.data={path!r} has {len(out)} usable GSM8K rows; bench.prompts_per_candidate={n}")


def lora_shapes(model_path: str) -> dict[str, int]:
    """Layer count and q/k/v/o widths of a Hugging Face checkpoint (for ``random_lora``)."""
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(model_path)
    head = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return {"num_layers": c.num_hidden_layers, "hidden": c.hidden_size, "kv_dim": c.num_key_value_heads * head}


class Population:
    """Genomes -> LoRA states through ESSA's SVD-LoRA codec and CMA-ES (strategies/), if present.

    The reference adapter is ``strategies.genomes.random_lora`` (A at PEFT's init scale, B at the
    scale a short SFT leaves), so candidates are realistic ES perturbations of an SFT adapter.
    Without ``strategies`` the candidates are independent random LoRA states and ask/tell are
    reported as unavailable.
    """

    def __init__(self, shapes: dict[str, int], rank: int, sigma0: float, seed: int):
        self.note = ""
        try:
            from strategies.cma_es import CMAES
            from strategies.genomes import SVDLoRAGenome, random_lora
        except ImportError as e:  # pragma: no cover - strategies/ ships with the repo
            self.codec, self.note = None, f"strategies unavailable ({e}); random LoRA states, no ask/tell"
            self.shapes, self.rank, self.seed = shapes, rank, seed
            return
        self.codec = SVDLoRAGenome(random_lora(rank=rank, seed=seed, **shapes))
        self._cmaes, self.sigma0, self.seed = CMAES, sigma0, seed

    def strategy(self, population_size: int):
        """A fresh CMA-ES over the codec's genome as ``strategy=essa`` builds it: full covariance up
        to D 2000, separable above (strategies/cma_es.py); ``None`` without strategies/."""
        if self.codec is None:
            return None
        return self._cmaes(dim=self.codec.dim, x0=self.codec.x0(), seed=self.seed,
                           population_size=population_size, sigma0=self.sigma0, diagonal="auto")

    def random_states(self, n: int, offset: int) -> list[dict]:
        """Fallback candidates: independent random LoRA states (only without strategies/)."""
        import torch

        out = []
        for k in range(n):
            g = torch.Generator().manual_seed(self.seed * 100003 + offset + k)
            d = {}
            for layer in range(self.shapes["num_layers"]):
                for m in ("q_proj", "k_proj", "v_proj", "o_proj"):
                    width = self.shapes["kv_dim"] if m in ("k_proj", "v_proj") else self.shapes["hidden"]
                    pre = f"base_model.model.model.layers.{layer}.self_attn.{m}"
                    d[f"{pre}.lora_A.weight"] = (torch.rand(self.rank, self.shapes["hidden"], generator=g) * 2 - 1) / self.shapes["hidden"] ** 0.5
                    d[f"{pre}.lora_B.weight"] = 0.01 * torch.randn(width, self.rank, generator=g)
            out.append(d)
        return out


def bench_codec(shapes: dict[str, int], rank: int, seed: int):
    """ESSA's SVD-LoRA genome over ``strategies.genomes.random_lora`` (A at PEFT's init scale, B at the
    scale a short SFT leaves), so candidates are realistic ES perturbations of an SFT adapter."""
    from strategies.genomes import SVDLoRAGenome, random_lora

    return SVDLoRAGenome(random_lora(rank=rank, seed=seed, **shapes))


def bench_strategy(codec, population_size: int, sigma0: float, seed: int):
    """A fresh CMA-ES over the codec's genome as ``strategy=essa`` builds it: full covariance up to
    D 2000, separable above (strategies/cma_es.py)."""
    from strategies.cma_es import CMAES

    return CMAES(dim=codec.dim, x0=codec.x0(), seed=seed, population_size=population_size, sigma0=sigma0,
                 diagonal="auto")


# ---------------------------------------------------------------------------------------------
# Measurements
# ---------------------------------------------------------------------------------------------

def _rate(tokens: int, seconds: float) -> dict[str, float]:
    return {"tokens": int(tokens), "seconds": round(seconds, 3), "tokens_per_s": round(tokens / seconds, 1) if seconds > 0 else 0.0}


def cpu_seconds() -> float:
    """CPU time (user + system, s) of this process and all its descendants (vLLM's engine core
    and workers). Other users' load inflates wall time, much less this; OpenMP spin-waiting
    still counts, so it is a contention-robust cross-check, not a replacement for wall time."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for p in (me, *me.children(recursive=True)):
        try:
            c = p.cpu_times()
            total += c.user + c.system
        except psutil.Error:  # a child that just exited
            pass
    return total


class TimedBackend:
    """A back-end whose ``generate`` calls are timed: ``last`` holds the latest call's tokens, seconds
    (wall) and CPU seconds of this process and its children (:func:`cpu_seconds`)."""

    def __init__(self, backend):
        self.backend, self.tokenizer, self.last = backend, backend.tokenizer, {}

    def generate(self, prompts, adapters, sampling, use_tqdm=True):
        c0, t0 = cpu_seconds(), time.perf_counter()
        outs = self.backend.generate(prompts, adapters, sampling, use_tqdm=False)
        dt, cpu = time.perf_counter() - t0, cpu_seconds() - c0
        self.last = _rate(sum(c.n_tokens for o in outs for c in o), dt)
        self.last["cpu_s"] = round(cpu, 3)
        self.last["tokens_per_cpu_s"] = round(self.last["tokens"] / cpu, 1) if cpu > 0 else 0.0
        # after the clock: the prompt tokens of the roofline's FLOPs
        self.last["prompt_tokens"] = prompt_tokens(self.tokenizer, list(prompts))
        return outs

    def close(self) -> None:
        self.backend.close()


def _timed_generate(timed: TimedBackend, prompts, adapters, sampling) -> dict:
    """One timed generate call; its rate (tokens, seconds, tokens/s, CPU seconds)."""
    timed.generate(prompts, adapters, sampling)
    return dict(timed.last)


def load_probe(backend, prompt: str, refs: list, generation_ids: list[int]) -> float:
    """Seconds vLLM spends loading P adapters: a 1-token request per adapter under fresh ids
    (loaded from the files) minus the same requests again (already resident). Short calls, so the
    difference is not drowned in generation noise."""
    from engine.backends import AdapterRef, Sampling

    fresh = [AdapterRef(r.name + "-probe", i, r.path) for r, i in zip(refs, generation_ids)]
    one = Sampling(max_tokens=1)
    t0 = time.perf_counter()
    backend.generate([prompt] * len(fresh), fresh, one, use_tqdm=False)
    t1 = time.perf_counter()
    backend.generate([prompt] * len(fresh), fresh, one, use_tqdm=False)
    return max(0.0, (t1 - t0) - (time.perf_counter() - t1))


def one_generation(evaluator, timed: TimedBackend, strategy, problems: list[Problem], sampling: Sampling,
                   generation: int, probe_generation: int | None = None) -> dict[str, Any]:
    """One ES generation at population size P = ``strategy.population_size``, every phase timed (seconds),
    through the population evaluator the training loop uses.

    Adapter ids are ``lora_int_id(generation, k)`` (and ``lora_int_id(probe_generation, k)`` for the
    load probe): the caller passes a generation index no other call of the process used, because
    vLLM serves its cached weights for an id it has seen, whatever the path (see :func:`main`).

    Phases: ask, decode (genome -> LoRA tensors), write (PEFT files), generate (the one vLLM call,
    adapter load included), load (vLLM loading the P adapters, measured by :func:`load_probe` only
    with ``probe_generation``; part of generate's time), reward (the reward on every completion),
    tell. ``non_generation_share`` = (ask + decode + write + load + reward + tell) / (ask + decode +
    write + generate + reward + tell).
    """
    t: dict[str, float] = {}
    notes = []
    t0 = time.perf_counter()
    genomes = strategy.ask()
    t["ask"] = time.perf_counter() - t0
    result = evaluator.evaluate(genomes, problems, generation, sampling, use_tqdm=False)
    gen = dict(timed.last)
    t.update({k: result.timings[k] for k in ("decode", "write", "generate", "reward")})
    if probe_generation is not None:  # adapters written again under ids no call has served
        refs = evaluator.write_candidates(genomes, probe_generation)
        t["load"] = load_probe(timed, evaluator.prompts(problems[:1])[0], refs, [r.lora_int_id for r in refs])
        evaluator.release(probe_generation)
        notes.append("load: 1-token requests under fresh adapter ids minus the same requests again; it happens "
                     "inside the generate call, so it is part of 'generate' and counted as outside generation")
    t0 = time.perf_counter()
    if np.isfinite(result.fitness).any():  # as the training loop: no update from a generation nothing scored
        strategy.tell(genomes, result.fitness)
    t["tell"] = time.perf_counter() - t0
    outside = sum(v for k, v in t.items() if k != "generate")  # load is inside generate's time
    total = sum(v for k, v in t.items() if k != "load")
    return {"population": gen, "phases_s": {k: round(v, 4) for k, v in t.items()},
            "non_generation_s": round(outside, 4), "generation_total_s": round(total, 4),
            "non_generation_share": round(outside / total, 4) if total > 0 else None,
            "accuracy": round(float(np.nanmean(result.fitness)), 4), "notes": notes}


def naive_per_candidate(model_path: str, adapter_dirs: list[str], prompts: list[str], max_tokens: int,
                        dtype: str) -> dict[str, Any]:
    """transformers + peft, one candidate at a time: load adapter, greedy ``generate`` over its B
    prompts (one left-padded batch), unload. Returns per-candidate tokens and seconds."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype))
    model.eval()
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    samples = []
    for d in adapter_dirs:
        t0 = time.perf_counter()
        peft_model = PeftModel.from_pretrained(model, d)
        with torch.inference_mode():
            out = peft_model.generate(**enc, max_new_tokens=max_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
        new = out[:, enc["input_ids"].shape[1]:]
        # tokens up to and including the first EOS, like vLLM's count
        eos = (new == tok.eos_token_id).int()
        first = torch.where(eos.any(1), eos.argmax(1) + 1, torch.full((new.shape[0],), new.shape[1]))
        model = peft_model.unload()
        samples.append((int(first.sum()), time.perf_counter() - t0))
    tokens = sum(s[0] for s in samples) / len(samples)
    seconds = sum(s[1] for s in samples) / len(samples)
    return {"candidates_timed": len(samples), "tokens_per_candidate": tokens, "seconds_per_candidate": round(seconds, 3),
            "samples": [{"tokens": a, "seconds": round(b, 3)} for a, b in samples]}


def machine_info(device=None) -> dict[str, Any]:
    """CPU model, cores, the ISA flags that decide the dtype (engine/hardware.py), GPU, library versions.

    Args:
        device: ``engine.hardware.DeviceInfo`` (default: detected).
    """
    import torch

    from engine.hardware import detect_device

    dev = device if device is not None else detect_device()
    info = {"cpu": dev.cpu.model, "cores": dev.cpu.cores, "isa": dev.cpu.isa, "native_bf16": dev.cpu.native_bf16,
            "flags": dev.cpu.summary()["flags"], "flags_capped_by": dev.cpu.capped_by,
            "gpu": None if dev.gpu is None else dev.gpu.name, "torch": torch.__version__,
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(), "python": platform.python_version(),
            "cuda": torch.cuda.is_available()}
    try:
        import vllm
        info["vllm"] = vllm.__version__
    except ImportError:  # pragma: no cover
        info["vllm"] = None
    return info


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------

def format_table(result: dict) -> str:
    """The benchmark as a fixed-width table (one row per P) plus the phase breakdown."""
    s = result["settings"]
    lines = [f"essa bench: {s['model']}  B={s['prompts_per_candidate']} prompts/candidate  max_tokens={s['max_tokens']}  "
             f"greedy  rank={s['rank']}  fast_lora={s['fast_lora']}",
             f"machine: {result['machine']['cpu']}, {result['machine']['cores']} cores, vLLM {result['machine']['vllm']}, "
             f"torch {result['machine']['torch']}",
             f"flags: {_flags_line(result['machine'])}; dtype {s.get('dtype', '?')} ({s.get('dtype_reason', 'not recorded')})",
             "",
             f"{'P':>4} {'seqs':>5} | {'base tok/s':>10} {'pop tok/s':>10} {'naive tok/s':>11} | {'pop/base':>8} {'pop/naive':>9} "
             f"{'(cpu-time pop/base)':>19} | {'base s':>7} {'pop s':>7} {'naive s':>8}"]
    nan = float("nan")
    for r in result["rows"]:
        nv = r.get("naive") or {}
        lines.append(
            f"{r['P']:>4} {r['sequences']:>5} | {r['base']['tokens_per_s']:>10.1f} {r['population']['tokens_per_s']:>10.1f} "
            f"{nv.get('tokens_per_s', nan):>11.1f} | {r['ratio_pop_base']:>8.3f} {(r.get('ratio_pop_naive') or nan):>9.2f} "
            f"{(r.get('ratio_pop_base_cpu') or nan):>19.3f} | {r['base']['seconds']:>7.1f} {r['population']['seconds']:>7.1f} "
            f"{nv.get('seconds', nan):>8.1f}")
    if any("base_without_lora" in r for r in result["rows"]):
        lines.append("")
        for r in result["rows"]:
            if "base_without_lora" in r:
                lines.append(f"P={r['P']}: base on an engine without LoRA support {r['base_without_lora']['tokens_per_s']:.1f} "
                             f"tok/s; population / that = {r['ratio_pop_base_without_lora']:.3f}")
    ph = result.get("phases")
    if ph:
        lines += ["", f"one ES generation at P={ph['P']} (seconds):"]
        order = ["ask", "decode", "write", "load", "generate", "reward", "tell"]
        lines.append("  " + "  ".join(f"{k}={'n/a' if ph['phases_s'].get(k) is None else format(ph['phases_s'][k], '.3f')}"
                                      for k in order if k in ph["phases_s"]))
        lines.append(f"  outside generation: {ph['non_generation_s']:.3f} s = {100 * ph['non_generation_share']:.1f} % of "
                     f"the generation's {ph['generation_total_s']:.1f} s (load runs inside vLLM's generate call and "
                     "is counted as outside generation)")
        for n in ph.get("notes", []):
            lines.append(f"  note: {n}")
    if result.get("roofline"):
        lines += ["", roofline_line(result)]
    if result.get("placebo"):
        from engine.evaluation.numerics import PlaceboResult

        lines += ["", "numerics floor (identical adapters in one batch): " + PlaceboResult(**result["placebo"]).line()]
    if result.get("notes"):
        lines += [""] + [f"note: {n}" for n in result["notes"]]
    return "\n".join(lines)


def _flags_line(machine: dict) -> str:
    """``avx2 avx512f -avx512_bf16 ...`` (``-`` = absent) plus the ISA and any environment cap."""
    flags = " ".join(f if on else f"-{f}" for f, on in machine.get("flags", {}).items())
    cap = f", capped by {machine['flags_capped_by']}" if machine.get("flags_capped_by") else ""
    return f"{flags} -> {machine.get('isa', '?')}{cap}"


# ---------------------------------------------------------------------------------------------
# Entry point: the phases of one benchmark
# ---------------------------------------------------------------------------------------------

@dataclass
class Bench:
    """What the phases of one ``essa bench`` share (filled in phase order)."""

    cfg: Any
    populations: list[int]
    B: int
    T: int
    phases_p: int
    result: dict = field(default_factory=dict)
    float_model: str = ""
    model: str = ""
    dtype: str = ""
    problems: list[Problem] = field(default_factory=list)
    codec: Any = None
    root: Path | None = None

    @property
    def sampling(self) -> Sampling:
        return Sampling(max_tokens=self.T, temperature=0.0)

    def engine_kwargs(self, max_loras: int, enable_lora: bool = True) -> dict:
        """The engine's arguments from the ``engine`` group (prefix caching off: the base run repeats B
        prompts P times, while candidates, distinct LoRA ids, cannot share cached prompts; LoRA only
        where the adapters have weights, vLLM would also wrap the MLP)."""
        from engine.backends.vllm_local import backend_kwargs

        c = self.cfg
        kw = backend_kwargs(c.engine, max_lora_rank=int(c.lora.rank), max_loras=max_loras,
                            max_model_len=int(c.model.max_model_len), dtype=self.dtype, seed=int(c.seed),
                            enable_lora=enable_lora)
        kw["extra"].update({"enable_prefix_caching": False}
                           | ({"lora_target_modules": list(c.lora.target_modules)} if enable_lora else {}))
        kw["fast_lora"] = kw["fast_lora"] and enable_lora
        return kw


def prepare(cfg) -> Bench:
    """Checked settings, the dtype, the model vLLM serves, the prompts, the genome, the machine record."""
    from omegaconf import OmegaConf

    from engine.backends.vllm_local import is_cpu_platform
    from engine.hardware import detect_device, resolve_dtype
    from engine.model import resolve_model_path, serving_model_path

    b = Bench(cfg, *validate(cfg))
    device = detect_device()
    b.dtype, dtype_reason = resolve_dtype(cfg.model.dtype, device)  # logs one line
    b.float_model = resolve_model_path(cfg.model.path)
    b.model = serving_model_path(b.float_model, cfg.model.quantization, b.dtype)  # float or quantized copy
    b.problems = [Problem(f"bench-{i}", q, a) for i, (q, a) in enumerate(load_questions(cfg.data, b.B))]
    b.codec = bench_codec(lora_shapes(b.model), int(cfg.lora.rank), int(cfg.seed))
    settings = {"model": cfg.model.path, "model_path": b.model, "populations": b.populations,
                "prompts_per_candidate": b.B, "max_tokens": b.T, "rank": int(cfg.lora.rank),
                "lora_alpha": float(cfg.lora.alpha), "sigma0": float(cfg.sigma0),
                "fast_lora": bool(cfg.engine.fast_lora) and is_cpu_platform(), "repeats": int(cfg.repeats),
                "engine": OmegaConf.to_container(cfg.engine, resolve=True), "data": str(cfg.data), "sampling": "greedy",
                "seed": int(cfg.seed), "prefix_caching": False, "lora_target_modules": list(cfg.lora.target_modules),
                "dtype": b.dtype, "dtype_reason": dtype_reason, "dtype_requested": str(cfg.model.dtype),
                "quantization": cfg.model.quantization}
    b.result = {"machine": machine_info(device), "settings": settings, "rows": [], "notes": [],
                "loadavg_start": os.getloadavg()}
    b.root = bench_root()
    return b


BENCH_DIR_PREFIX = "essa-bench-"


def bench_root(parent: Path | None = None) -> Path:
    """This bench's adapter directory ``essa-bench-<pid>-<random>`` in ``parent`` (default /dev/shm, else
    the temp dir), after removing the ones of benches that were killed (SIGKILL, or the OOM killer)
    before their ``finally`` ran (:func:`engine.io.remove_dead_pid_dirs`). SIGTERM unwinds :func:`main`
    (:func:`engine.interrupts.sigterm_unwinds`) and a dead engine raises, so then ``main``'s ``finally``
    removes the directory itself."""
    from engine.io import pid_dir_prefix, remove_dead_pid_dirs

    if parent is None:
        parent = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else Path(tempfile.gettempdir())
    for stale in remove_dead_pid_dirs(parent, BENCH_DIR_PREFIX):
        log.info("removed %s, left by a bench that was killed", stale)
    return Path(tempfile.mkdtemp(prefix=pid_dir_prefix(BENCH_DIR_PREFIX), dir=parent))


def base_without_lora(b: Bench) -> dict[int, dict]:
    """The strict limit, with ``base_without_lora``: the base model on an engine without LoRA support at
    all (vLLM's LoRA layer wrappers and per-step mapping cost a little even when no request has an
    adapter). Returns ``{P: rate}``."""
    from engine.backends.vllm_local import VLLMBackend
    from engine.prompts import build_prompt

    plain: dict[int, dict] = {}
    if not b.cfg.base_without_lora:
        return plain
    eng = TimedBackend(VLLMBackend(b.model, **b.engine_kwargs(1, enable_lora=False)))
    try:
        prompts = [build_prompt(eng.tokenizer, p.question, b.cfg.system_prompt) for p in b.problems]
        eng.generate(prompts[:2], [None, None], Sampling(max_tokens=8))
        for P in b.populations:
            flat = [p for _ in range(P) for p in prompts]
            plain[P] = _timed_generate(eng, flat, [None] * len(flat), b.sampling)
            print(f"P={P}: base without LoRA support {plain[P]['tokens_per_s']:.1f} tok/s", flush=True)
    finally:
        eng.close()
    return plain


def population_rows(b: Bench, plain: dict[int, dict]) -> None:
    """For every P: the base model and one ES generation on the same engine, adjacent, ``repeats`` times
    (best of each kept); every phase at ``phases_population``. One generation index per adapter set
    (warm-up, every (P, repeat), the load probe), so no lora_int_id is ever reused for other weights:
    vLLM would serve the cached adapter."""
    import rewards
    from engine.backends.vllm_local import VLLMBackend
    from engine.evaluation.population import PopulationEvaluator
    from engine.lora.files import AdapterMeta

    cfg = b.cfg
    timed = TimedBackend(VLLMBackend(b.model, **b.engine_kwargs(max(b.populations))))
    b.result["engine_startup_s"] = round(timed.backend.startup_s, 1)
    meta = AdapterMeta(int(cfg.lora.rank), float(cfg.lora.alpha), tuple(cfg.lora.target_modules), b.model)
    evaluator = PopulationEvaluator(timed, b.codec, lambda texts, refs: rewards.reward(texts, refs), meta,
                                    timed.tokenizer, cfg.system_prompt, b.root)
    try:
        from engine.evaluation.selfcheck import check_served
        check_served(timed.backend, cfg.model.quantization, b.model, int(cfg.lora.rank))  # LoRA must apply
        prompts = evaluator.prompts(b.problems)
        generations = itertools.count()
        # warm-up: the first LoRA batch and the first base batch pay one-off costs (allocator, kernels)
        one_generation(evaluator, timed, bench_strategy(b.codec, 2, float(cfg.sigma0), int(cfg.seed)), b.problems[:2],
                       Sampling(max_tokens=8), next(generations))
        timed.generate(prompts[:2], [None, None], Sampling(max_tokens=8))
        for P in b.populations:
            b.result["rows"].append(_row(b, evaluator, timed, prompts, P, generations, plain))
        placebo(b, evaluator, generations)
    finally:
        evaluator.close()
        timed.close()


def _row(b: Bench, evaluator, timed: TimedBackend, prompts, P: int, generations, plain: dict) -> dict:
    """One P's row: best base and population runs of ``repeats``, their ratios, all samples kept."""
    cfg = b.cfg
    flat = [p for _ in range(P) for p in prompts]
    base_runs, pop_runs = [], []
    for rep in range(max(1, int(cfg.repeats))):
        la = os.getloadavg()[0]
        base = _timed_generate(timed, flat, [None] * len(flat), b.sampling)
        probe = P == b.phases_p and rep == 0
        strategy = bench_strategy(b.codec, P, float(cfg.sigma0), int(cfg.seed))
        gen_index = next(generations)
        pop_runs.append(one_generation(evaluator, timed, strategy, b.problems, b.sampling, gen_index,
                                       probe_generation=next(generations) if probe else None))
        base_runs.append({**base, "loadavg": la})
        log.info("P=%d rep %d: base %.1f tok/s, population %.1f tok/s", P, rep, base["tokens_per_s"],
                 pop_runs[-1]["population"]["tokens_per_s"])
    base = max(base_runs, key=lambda r: r["tokens_per_s"])
    best = max(pop_runs, key=lambda r: r["population"]["tokens_per_s"])
    row = {"P": P, "sequences": P * b.B, "base": base, "population": best["population"],
           "ratio_pop_base": round(best["population"]["tokens_per_s"] / base["tokens_per_s"], 4),
           "ratio_pop_base_cpu": (round(best["population"]["tokens_per_cpu_s"] / base["tokens_per_cpu_s"], 4)
                                  if base.get("tokens_per_cpu_s") else None),
           "samples": {"base": base_runs, "population": [r["population"] for r in pop_runs]}}
    if P in plain:
        row["base_without_lora"] = plain[P]
        row["ratio_pop_base_without_lora"] = round(best["population"]["tokens_per_s"] / plain[P]["tokens_per_s"], 4)
    if P == b.phases_p:
        b.result["phases"] = {"P": P, **{k: v for k, v in pop_runs[0].items() if k != "population"}}
    print(f"P={P}: base {base['tokens_per_s']:.1f} tok/s, population {best['population']['tokens_per_s']:.1f} tok/s "
          f"({row['ratio_pop_base']:.3f} of base)", flush=True)
    return row


def placebo(b: Bench, evaluator, generations) -> None:
    """The numerics floor at the bench's shape (``placebo.enabled``): ``phases_population`` copies of the
    reference adapter (genome zero) as one generation on the B prompts, and ``placebo.alone`` requests
    alone against inside that batch (engine/evaluation/numerics.py); ``result["placebo"]``, printed."""
    from engine.evaluation.numerics import placebo_generation

    if not b.cfg.placebo.enabled:
        return
    g = next(generations)
    next(generations)  # the alone probe's adapter ids
    res = placebo_generation(evaluator, b.codec.x0(), b.phases_p, b.problems, b.sampling, g,
                             alone=int(b.cfg.placebo.alone))
    b.result["placebo"] = res.as_dict()
    print(res.line(), flush=True)


def naive(b: Bench) -> None:
    """The naive loop (``naive.enabled``): transformers + peft over ``naive.candidates`` candidates, scaled to P."""
    from engine.lora.files import write_adapter
    from engine.prompts import build_prompt

    cfg = b.cfg
    if not cfg.naive.enabled:
        return
    k = max(1, int(cfg.naive.candidates))
    strategy = bench_strategy(b.codec, max(2, k), float(cfg.sigma0), int(cfg.seed))  # CMA-ES needs P >= 2
    dirs = [str(write_adapter(b.root / "naive" / f"cand_{i}", lora, int(cfg.lora.rank), float(cfg.lora.alpha), b.model))
            for i, lora in enumerate(b.codec.decode_batch(strategy.ask()[:k]))]
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(b.float_model)
    prompts = [build_prompt(tok, p.question, cfg.system_prompt) for p in b.problems]
    nv = naive_per_candidate(b.float_model, dirs, prompts, b.T, b.dtype)
    b.result["naive"] = nv
    b.result["notes"].append(f"naive: transformers+peft, {nv['candidates_timed']} candidate(s) timed (load adapter, "
                             f"generate over B={b.B} prompts, unload); P candidates = P x the per-candidate mean "
                             "(extrapolated)")
    for row in b.result["rows"]:
        P = row["P"]
        row["naive"] = _rate(round(nv["tokens_per_candidate"] * P), nv["seconds_per_candidate"] * P)
        row["naive"]["extrapolated_from"] = nv["candidates_timed"]
        row["ratio_pop_naive"] = round(row["population"]["tokens_per_s"] / row["naive"]["tokens_per_s"], 3)


def roofline(b: Bench, seconds: float = 1.5) -> None:
    """The GEMM limit (engine/evaluation/roofline.py), measured once in this process after the engine is
    closed: torch's rate on the model's matmul shapes at M = the largest run's sequences (capped by
    ``engine.max_num_seqs``, the tokens of one decode step) in the run's dtype; ``result["roofline"]`` and
    each run's ``roofline_fraction`` (achieved GEMM FLOP/s of prompt and completion tokens over that rate)."""
    from engine.evaluation.roofline import ModelShapes, gemm_rate, generation_flops, roofline_fraction
    from engine.model import local_model_config

    config = local_model_config(b.float_model)
    if config is None:
        b.result["notes"].append(f"roofline: no local config.json for {b.float_model}; not measured")
        return
    shapes = ModelShapes.from_config(config)
    rows = min(max(b.populations) * b.B, int(b.cfg.engine.max_num_seqs))
    rate = gemm_rate(shapes, rows, b.dtype, seconds)
    b.result["roofline"] = {**rate, "gemm_params_per_token": shapes.layer_params,
                            "lm_head_params": shapes.hidden * shapes.vocab}
    for row in b.result["rows"]:
        for run in (row[k] for k in ("base", "population", "base_without_lora") if k in row):
            flops = generation_flops(shapes, run.get("prompt_tokens", 0), run["tokens"])
            run["roofline_fraction"] = round(roofline_fraction(flops, run["seconds"], rate["gflops"]), 4)
    print(roofline_line(b.result), flush=True)


def roofline_line(result: dict) -> str:
    """``roofline: torch GEMM ... GFLOP/s ...; P=16: base at 41.0 %, population at 39.2 % of the GEMM limit``."""
    r = result["roofline"]
    runs = "; ".join(f"P={row['P']}: base at {100 * row['base'].get('roofline_fraction', float('nan')):.1f} %, "
                     f"population at {100 * row['population'].get('roofline_fraction', float('nan')):.1f} %"
                     for row in result["rows"])
    return (f"roofline: torch GEMM {r['gflops']:.1f} GFLOP/s on the model's shapes ({r['dtype']}, M {r['rows']}, "
            f"{r['threads']} threads, this process); {runs} of the GEMM limit (prompt and completion tokens' FLOPs)")


def write_result(b: Bench, out_path: Path) -> None:
    """The load-average note, the JSON file, the printed table."""
    res = b.result
    res["loadavg_end"] = os.getloadavg()
    if max(res["loadavg_start"][0], res["loadavg_end"][0]) > 1.5 * (os.cpu_count() or 1):
        res["notes"].append(f"the machine was loaded by other processes (load average {res['loadavg_start'][0]:.1f} -> "
                            f"{res['loadavg_end'][0]:.1f} on {os.cpu_count()} cores): absolute numbers are noisy, "
                            "ratios of adjacent runs less so")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(res, indent=2, default=float))
    print(format_table(res))
    print(f"\nJSON: {out_path}")


def main(cfg, run_dir: str | Path | None = None) -> dict:
    """Run the benchmark described by ``cfg`` (conf/bench.yaml); print the table, write JSON.

    Returns:
        The result dict that is written to ``cfg.output`` (default ``<run dir>/bench.json``).

    Raises:
        ValueError: bad settings (:func:`engine.commands.bench_config.validate`), unreadable ``data``.
    """
    from engine.backends import require_vllm
    from engine.interrupts import sigterm_unwinds

    require_vllm()
    with sigterm_unwinds():  # a SIGTERM also runs the finally below: no essa-bench-* left in /dev/shm
        b = prepare(cfg)
        try:
            plain = base_without_lora(b)
            population_rows(b, plain)
            roofline(b)
            naive(b)
        finally:
            shutil.rmtree(b.root, ignore_errors=True)
    write_result(b, Path(cfg.output) if cfg.get("output") else Path(run_dir or os.getcwd()) / "bench.json")
    return b.result


def run(cfg, run_dir) -> None:
    """``essa bench``'s command function."""
    main(cfg, run_dir)
