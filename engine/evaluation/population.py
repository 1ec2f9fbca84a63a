"""Population evaluation: genomes (P, D) -> adapters -> one multi-LoRA generate -> rewards -> fitness (P,).

ESSA §3.3: every candidate of a generation is scored on the same minibatch of N prompts; the
fitness of a candidate is its mean reward. All P x N (x G samples) requests go into ONE back-end
call, each with its candidate's ``LoRARequest``, so vLLM batches the whole population together.

This module is the unit a distributed back-end replicates (engine/evaluation/ray_population.py): an
evaluator owns one generation back-end plus the frozen genome codec, so per generation only
genomes go in and rewards come out.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from engine.backends import AdapterRef, Sampling, lora_int_id
from engine.lora.files import AdapterMeta, default_adapter_root, write_adapter
from engine.prompts import build_prompt
from engine.tasks import Problem


@dataclass
class EvalResult:
    """Outcome of evaluating one population on one minibatch.

    Attributes:
        fitness: (P,) float64, mean reward per candidate; NaN when a candidate could not be scored.
        rewards: (P, N, G) float64 reward per completion (NaN = could not score).
        rollouts: column dict for the rollout log (one entry per completion, P*N*G rows).
        timings: seconds per phase (decode, write, generate, reward).
        tokens: completion tokens generated.
    """

    fitness: np.ndarray
    rewards: np.ndarray
    rollouts: dict[str, list]
    timings: dict[str, float] = field(default_factory=dict)
    tokens: int = 0


def reward_results(reward_fn: Callable, completions: list[str], references: list[str]):
    """Score completions; returns (rewards (R,) float64 with NaN for unscorable, extracted, status)."""
    results = reward_fn(completions, references)
    r = np.array([np.nan if res.status in ("error", "timeout") else float(res.reward) for res in results])
    return r, [res.extracted for res in results], [res.status for res in results]


def aggregate_fitness(rewards: np.ndarray) -> np.ndarray:
    """(P, N, G) rewards -> (P,) mean over scorable completions; NaN when none could be scored."""
    flat = rewards.reshape(rewards.shape[0], -1)
    ok = ~np.isnan(flat)
    n = ok.sum(axis=1)
    total = np.where(ok, flat, 0.0).sum(axis=1)
    return np.where(n > 0, total / np.maximum(n, 1), np.nan)


def question_z_fitness(rewards: np.ndarray) -> np.ndarray:
    """(P, N, G) rewards -> (P,) mean of per-prompt z-scores across the population (EGGROLL, arXiv
    2511.16652, §4: rewards normalised per question before averaging).

    Each prompt's rewards (over candidates and samples) are centred and divided by their standard
    deviation; prompts on which every candidate scores the same contribute 0. NaN (unscorable)
    stays NaN and is skipped like in :func:`aggregate_fitness`.
    """
    r = np.asarray(rewards, dtype=float)
    mu = np.nanmean(r, axis=(0, 2), keepdims=True)  # (1, N, 1)
    sd = np.nanstd(r, axis=(0, 2), keepdims=True)
    z = np.where(sd > 0, (r - mu) / np.where(sd > 0, sd, 1.0), np.where(np.isnan(r), np.nan, 0.0))
    return aggregate_fitness(z)


class PopulationEvaluator:
    """Turns genomes into fitness with one back-end call per generation.

    Args:
        backend: object with ``generate(prompts, adapters, sampling) -> list[list[Completion]]``.
        codec: genome codec (strategies.genomes), ``decode_batch((P, D)) -> list[LoRA state]``.
        reward_fn: ``f(completions, references) -> list[RewardResult]`` (rewards.reward).
        meta: adapter metadata written into every adapter_config.json.
        tokenizer: the base model's tokenizer (chat template).
        system_prompt: system message of every prompt.
        adapter_root: parent directory for this evaluator's adapter files (a private subdir is made).
    """

    def __init__(self, backend, codec, reward_fn: Callable, meta: AdapterMeta, tokenizer, system_prompt: str,
                 adapter_root: str | Path | None = None):
        self.backend, self.codec, self.reward_fn, self.meta = backend, codec, reward_fn, meta
        self.tokenizer, self.system_prompt = tokenizer, system_prompt
        self.root = Path(tempfile.mkdtemp(prefix="essa-adapters-", dir=default_adapter_root(
            str(adapter_root) if adapter_root else None)))

    def prompts(self, problems: Sequence[Problem]) -> list[str]:
        """Chat-templated prompt strings, one per problem."""
        return [build_prompt(self.tokenizer, p.question, self.system_prompt) for p in problems]

    def write_candidates(self, genomes: np.ndarray, generation: int, first_candidate: int = 0,
                         timings: dict | None = None) -> list[AdapterRef]:
        """Decode genomes (P, D) and write one PEFT adapter per candidate; ids from ``lora_int_id``."""
        t0 = time.perf_counter()
        loras = self.codec.decode_batch(np.atleast_2d(genomes))
        t1 = time.perf_counter()
        gen_dir = self.root / f"gen_{generation:06d}"
        refs = []
        for k, lora in enumerate(loras):
            idx = first_candidate + k
            path = write_adapter(gen_dir / f"cand_{idx:04d}", lora, self.meta.rank, self.meta.lora_alpha,
                                 self.meta.base_model, self.meta.target_modules)
            refs.append(AdapterRef(f"g{generation}c{idx}", lora_int_id(generation, idx), str(path)))
        if timings is not None:
            timings["decode"] = timings.get("decode", 0.0) + t1 - t0
            timings["write"] = timings.get("write", 0.0) + time.perf_counter() - t1
        return refs

    def release(self, generation: int) -> None:
        """Delete a generation's adapter files (vLLM has loaded them; ids are never reused)."""
        shutil.rmtree(self.root / f"gen_{generation:06d}", ignore_errors=True)

    def score(self, adapters: Sequence[AdapterRef | None], problems: Sequence[Problem], sampling: Sampling,
              timings: dict | None = None, use_tqdm: bool = True):
        """Generate for every (adapter, problem) pair in one call and score it.

        Returns:
            (rewards (A, N, G), completions nested [A][N][G] of Completion, extracted, status) where
            A = len(adapters); extracted/status are flat lists in (A, N, G) order.
        """
        timings = timings if timings is not None else {}
        prompts = self.prompts(problems)
        A, N, G = len(adapters), len(problems), sampling.n
        flat_prompts = [p for _ in range(A) for p in prompts]
        flat_adapters = [a for a in adapters for _ in range(N)]
        t0 = time.perf_counter()
        outs = self.backend.generate(flat_prompts, flat_adapters, sampling, use_tqdm=use_tqdm)
        t1 = time.perf_counter()
        texts = [c.text for out in outs for c in out]
        refs = [problems[i % N].answer for i in range(A * N) for _ in range(G)]
        rewards, extracted, status = reward_results(self.reward_fn, texts, refs)
        timings["generate"] = timings.get("generate", 0.0) + t1 - t0
        timings["reward"] = timings.get("reward", 0.0) + time.perf_counter() - t1
        completions = [outs[a * N:(a + 1) * N] for a in range(A)]
        return rewards.reshape(A, N, G), completions, extracted, status

    def evaluate(self, genomes: np.ndarray, problems: Sequence[Problem], generation: int, sampling: Sampling,
                 first_candidate: int = 0, use_tqdm: bool = True) -> EvalResult:
        """Fitness of a population (ESSA §3.3): mean reward over the shared minibatch.

        Args:
            genomes: (P, D) float64.
            problems: the generation's minibatch (N problems).
            generation: index used for adapter ids and directories.
            sampling: decoding settings (G = sampling.n samples per prompt).
            first_candidate: global index of genomes[0] (a shard of a larger population).

        Returns:
            EvalResult with fitness (P,) and P*N*G rollout rows.
        """
        timings: dict[str, float] = {}
        refs = self.write_candidates(genomes, generation, first_candidate, timings)
        try:
            rewards, completions, extracted, status = self.score(refs, problems, sampling, timings, use_tqdm)
        finally:
            self.release(generation)
        P, N, G = rewards.shape
        fitness = aggregate_fitness(rewards)
        rows: dict[str, list] = {k: [] for k in ("generation", "candidate", "prompt_id", "sample", "completion",
                                                 "extracted_answer", "reward", "status", "n_tokens")}
        i = 0
        for p in range(P):
            for n in range(N):
                for g, c in enumerate(completions[p][n]):
                    rows["generation"].append(generation)
                    rows["candidate"].append(first_candidate + p)
                    rows["prompt_id"].append(problems[n].id)
                    rows["sample"].append(g)
                    rows["completion"].append(c.text)
                    rows["extracted_answer"].append(extracted[i])
                    rows["reward"].append(float(rewards[p, n, g]))
                    rows["status"].append(status[i])
                    rows["n_tokens"].append(c.n_tokens)
                    i += 1
        tokens = int(sum(rows["n_tokens"]))
        return EvalResult(fitness, rewards, rows, timings, tokens)

    def close(self) -> None:
        """Remove this evaluator's adapter directory."""
        shutil.rmtree(self.root, ignore_errors=True)
