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
from engine.io import pid_dir_prefix, remove_dead_pid_dirs
from engine.lora.files import (AdapterMeta, adapter_bytes, adapter_root_with_space, default_adapter_root, is_no_space,
                               no_space_line, write_adapter)
from engine.prompts import build_prompt
from engine.tasks import Problem


@dataclass
class EvalResult:
    """Outcome of evaluating one population on one minibatch.

    Attributes:
        fitness: (P,) float64, mean reward per candidate; NaN when a candidate could not be scored.
        rewards: (P, N, G) float64 reward per completion (NaN = could not score).
        rollouts: column dict for the rollout log (one entry per completion, P*N*G rows).
        timings: seconds per phase (decode, write, generate, reward, and dense when scored).
        tokens: completion tokens generated.
        dense: (P, N, G) float64 log p(reference answer | prompt, the completion's own reasoning) per
            completion (nats, a sum over the answer's tokens and its closing brace token;
            :func:`dense_scores`), or None when the evaluator does not score it.
    """

    fitness: np.ndarray
    rewards: np.ndarray
    rollouts: dict[str, list]
    timings: dict[str, float] = field(default_factory=dict)
    tokens: int = 0
    dense: np.ndarray | None = None


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


def dense_tiebreak(fitness: np.ndarray, dense: np.ndarray) -> np.ndarray:
    """(P,) fitness with ties broken by a dense second key (P,), never changing a strict order: each
    candidate gains ``eps * u`` with u in [0, 1) its dense rank over the population and eps half the
    smallest gap between distinct fitness values (1 / (P + 1) when all tie). NaN stays NaN.
    Kwiatkowski et al. (arXiv 2602.03979) as the second key of a 0/1 fitness; es-levers: "ties"."""
    f = np.asarray(fitness, dtype=float)
    finite = np.unique(f[np.isfinite(f)])
    eps = 0.5 * np.diff(finite).min() if len(finite) > 1 else 1.0 / (len(f) + 1)
    d = np.nan_to_num(np.asarray(dense, dtype=float), nan=-np.inf)
    u = np.argsort(np.argsort(d, kind="stable"), kind="stable") / max(len(f), 1)  # [0, 1)
    return f + eps * u


def dense_weighted(fitness: np.ndarray, dense: np.ndarray, weight: float, prompts: int) -> np.ndarray:
    """(P,) fitness plus ``weight`` prompts' worth of accuracy per population standard deviation of the
    dense score: ``fitness + weight / prompts * z(dense)`` (z over the population; 0 where all equal).
    NaN stays NaN."""
    d = np.asarray(dense, dtype=float)
    sd = np.nanstd(d)
    z = np.zeros_like(d) if not sd > 0 else (d - np.nanmean(d)) / sd
    return np.asarray(fitness, dtype=float) + weight / max(prompts, 1) * np.nan_to_num(z)


def candidate_dense(dense: np.ndarray) -> np.ndarray:
    """(P, N, G) dense scores -> (P,) mean over scorable completions (NaN when none)."""
    return aggregate_fitness(np.asarray(dense, dtype=float))


def shaped_fitness(result: EvalResult, P: int, aggregate: str = "mean", dense: str = "off",
                   dense_weight: float = 1.0) -> np.ndarray:
    """The (P,) fitness a strategy is told: the candidates' mean reward (``aggregate="mean"``, ESSA §3.3)
    or their per-prompt z-scores (``question_z``), then, with the dense reward scored, ties broken by it
    (``dense="tiebreak"``, :func:`dense_tiebreak`) or its z-score added (``weighted``, :func:`dense_weighted`).
    Rows P.. of ``result`` (the centre) are left out."""
    shaped = result.fitness[:P] if aggregate == "mean" else question_z_fitness(result.rewards[:P])
    if dense == "off" or result.dense is None:
        return shaped
    d = candidate_dense(result.dense[:P])
    if dense == "tiebreak":
        return dense_tiebreak(shaped, d)
    return dense_weighted(shaped, d, dense_weight, result.rewards.shape[1] * result.rewards.shape[2])


ADAPTER_DIR_PREFIX = "essa-adapters-"
"""Name prefix of an evaluator's adapter directory (``essa-adapters-<pid>-<random>``, :func:`engine.io.pid_dir_prefix`)."""


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
        dense: also score every rollout's dense reward (:meth:`dense_scores`) in :meth:`evaluate`.
        n_adapters: adapters written at once (P + 2); when given, the adapter root is checked for
            their space first (:func:`engine.lora.files.adapter_root_with_space`: the temp dir on
            disk with one warning, or one line naming ``engine.adapter_dir``).

    Raises:
        ValueError: the adapters fit in no directory (one line naming ``engine.adapter_dir``).
    """

    def __init__(self, backend, codec, reward_fn: Callable, meta: AdapterMeta, tokenizer, system_prompt: str,
                 adapter_root: str | Path | None = None, dense: bool = False, n_adapters: int | None = None):
        self.backend, self.codec, self.reward_fn, self.meta = backend, codec, reward_fn, meta
        self.tokenizer, self.system_prompt, self.dense = tokenizer, system_prompt, dense
        self.root = Path(tempfile.mkdtemp(prefix=pid_dir_prefix(ADAPTER_DIR_PREFIX),
                                          dir=self._adapter_parent(adapter_root, n_adapters)))

    def _adapter_parent(self, adapter_root, n_adapters: int | None) -> Path:
        """The directory this evaluator's own adapter directory goes in, after removing the ones killed
        runs left there; checked for the space of ``n_adapters`` adapters of the codec's shape."""
        configured = str(adapter_root) if adapter_root else None
        remove_dead_pid_dirs(default_adapter_root(configured), ADAPTER_DIR_PREFIX)
        if n_adapters is None or self.codec is None:
            return default_adapter_root(configured)
        need = n_adapters * adapter_bytes(self.codec.decode(self.codec.x0()))
        return adapter_root_with_space(configured, need, n_adapters)

    def _no_space(self, loras: list) -> ValueError:
        """The one-line error for a device that filled up while writing the candidates ``loras``."""
        parent = self.root.parent
        need = sum(adapter_bytes(lora) for lora in loras)
        return ValueError(no_space_line(parent, need, len(loras), {parent: shutil.disk_usage(parent).free}))

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
            try:
                path = write_adapter(gen_dir / f"cand_{idx:04d}", lora, self.meta.rank, self.meta.lora_alpha,
                                     self.meta.base_model, self.meta.target_modules)
            except Exception as e:  # safetensors reports a full device as its own error type
                if not is_no_space(e):
                    raise
                shutil.rmtree(gen_dir, ignore_errors=True)
                raise self._no_space(loras) from None
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
        dense = None
        try:
            rewards, completions, extracted, status = self.score(refs, problems, sampling, timings, use_tqdm)
            if self.dense:
                dense = self.dense_scores(refs, problems, completions, timings)
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
        if dense is not None:
            rows["dense"] = [float(x) for x in dense.reshape(-1)]
        tokens = int(sum(rows["n_tokens"]))
        return EvalResult(fitness, rewards, rows, timings, tokens, dense)

    def solution_likelihood(self, adapters: Sequence[AdapterRef | None], problems: Sequence[Problem],
                            timings: dict | None = None) -> tuple[np.ndarray, int]:
        """The mean log-probability per token of each problem's worked solution after its prompt, under
        each adapter, prefill-only in one multi-LoRA batch (engine/evaluation/prefill.py): a dense,
        supervised fitness (the loss of the warm start and of the gradient oracle, docs/results/genome-capacity.md;
        zeroth-order likelihood search as in EA4LLM, arXiv 2510.10603, and MeZO).

        Returns:
            ((A, N) float64 nats per token, <= 0; the number of scored solution tokens).

        Raises:
            ValueError: a problem without a worked solution (one line naming rollout.fitness).
        """
        from engine.evaluation.prefill import encode_pairs, target_logprobs

        if any(not p.solution for p in problems):
            raise ValueError("rollout.fitness=likelihood: the task's problems need worked solutions (task=arithmetic, "
                             "gsm8k); use rollout.fitness=reward for this task")
        t0 = time.perf_counter()
        pairs = encode_pairs(self.tokenizer, self.prompts(problems), [p.solution for p in problems])
        lps = target_logprobs(self.backend, [pr for _ in adapters for pr in pairs], [a for a in adapters for _ in pairs])
        if timings is not None:
            timings["generate"] = timings.get("generate", 0.0) + time.perf_counter() - t0
        scores = np.asarray([lp.mean() for lp in lps], dtype=float).reshape(len(adapters), len(problems))
        return scores, int(sum(len(lp) for lp in lps))

    def evaluate_likelihood(self, genomes: np.ndarray, problems: Sequence[Problem], generation: int,
                            first_candidate: int = 0) -> EvalResult:
        """Fitness of a population as the mean log-likelihood per token of the minibatch's worked solutions
        (:meth:`solution_likelihood`): ``rewards`` (P, N, 1) per problem, ``fitness`` (P,) their mean,
        rollout rows without completions (status ``likelihood``), ``tokens`` the scored solution tokens;
        ``timings["generate"]`` is the prefill call."""
        timings: dict[str, float] = {}
        refs = self.write_candidates(genomes, generation, first_candidate, timings)
        try:
            scores, tokens = self.solution_likelihood(refs, problems, timings)
        finally:
            self.release(generation)
        P, N = scores.shape
        rows = {"generation": [generation] * (P * N), "candidate": [first_candidate + p for p in range(P) for _ in range(N)],
                "prompt_id": [q.id for _ in range(P) for q in problems], "sample": [0] * (P * N),
                "completion": [""] * (P * N), "extracted_answer": [None] * (P * N),
                "reward": [float(x) for x in scores.reshape(-1)], "status": ["likelihood"] * (P * N),
                "n_tokens": [0] * (P * N)}
        return EvalResult(scores.mean(axis=1), scores[:, :, None], rows, timings, tokens)

    def dense_scores(self, adapters: Sequence[AdapterRef | None], problems: Sequence[Problem], completions,
                     timings: dict | None = None) -> np.ndarray:
        """The dense reward of every completion: log p(reference answer, then the completion's own closing
        brace token | prompt, the completion's own reasoning up to its answer) under the adapter that wrote
        it (Kwiatkowski et al., arXiv 2602.03979; rewards/likelihood.py), one prefill-only pass through the
        same multi-LoRA batch (engine/evaluation/prefill.py).

        Args:
            adapters: A adapter refs. problems: N problems. completions: nested [A][N][G] Completion.

        Returns:
            (A, N, G) float64 nats (a sum over the answer's tokens and the closing brace token; 0 is certainty).
        """
        from engine.evaluation.prefill import encode_answer_pairs, target_logprobs
        from rewards.likelihood import answer_context

        t0 = time.perf_counter()
        prompts = self.prompts(problems)
        A, N, G = len(adapters), len(problems), len(completions[0][0])
        cut = [answer_context(c.text, problems[n].answer) for a in range(A) for n in range(N) for c in completions[a][n]]
        prefixes = [prompts[(i // G) % N] + ctx for i, (ctx, _, _) in enumerate(cut)]
        pairs = encode_answer_pairs(self.tokenizer, prefixes, [a for _, a, _ in cut], [c for _, _, c in cut])
        flat_adapters = [adapters[i // (N * G)] for i in range(A * N * G)]
        scores = np.array([lp.sum() for lp in target_logprobs(self.backend, pairs, flat_adapters)])
        if timings is not None:
            timings["dense"] = timings.get("dense", 0.0) + time.perf_counter() - t0
        return scores.reshape(A, N, G)

    def close(self) -> None:
        """Remove this evaluator's adapter directory and close its back-end (the engine's processes and
        KV cache): a run ends with its engine, also when several runs share a process (Hydra multirun)."""
        shutil.rmtree(self.root, ignore_errors=True)
        close = getattr(self.backend, "close", None)
        if close is not None:
            close()
