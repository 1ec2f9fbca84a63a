"""The ``likelihood`` landscape: the real model and genome, a dense fitness, no simulator.

The genome is the one ``essa train`` evolves: the cached SFT warm start of the task's config
(engine.lora.sft.warm_start), SVD-decomposed into the ``strategy.genome`` codec (strategies/genomes.py),
genome zero = the warm start. A candidate's reward on a problem is the mean log-probability per token
of the problem's reference solution after its prompt (nats per token, <= 0), scored prefill-only for
the whole population in one multi-LoRA vLLM batch (engine/evaluation/prefill.py); the minibatch is
``engine.tasks.minibatch``'s, as in essa train. The fitness is dense: candidates almost never tie, so
this landscape shows what a strategy does with the same genome when the 0/1 greedy signal is replaced
by the supervised one (the gradient oracle of docs/results/genome-capacity.md optimises the same loss).

``true_fitness`` is the same score on the first ``true_problems`` held-out problems; ``held_out`` is
greedy accuracy on the task's held-out split (``max_tokens`` new tokens, the math reward), 0/1 per
problem, so the lab's paired test is essa train's. Both cost engine calls: the lab scores held-out
accuracy only at the start and the end (``held_out_each_generation = False``).

Build it with :func:`build_likelihood` (starts a vLLM engine; ``close()`` frees it).
"""
from __future__ import annotations

import itertools

import numpy as np

from engine.lab.base import Landscape


class LikelihoodLandscape(Landscape):
    """Mean log-likelihood per token of reference solutions under genome-decoded adapters.

    Args:
        evaluator: an ``engine.evaluation.population.PopulationEvaluator`` whose back-end serves
            ``prompt_logprobs`` and ``generate`` (its codec sets D) and whose reward scores answers.
        train, val: the task's problems (those with a worked solution are scored).
        prompts: N per generation. seed: unused (the task and warm start are the landscape).
        max_tokens: new tokens of the held-out greedy answers. true_problems: held-out problems of
            ``true_fitness``.

    Raises:
        ValueError: no train or held-out problem has a worked solution.
    """

    name = "likelihood"
    binary = False
    held_out_each_generation = False
    variable_prompts = True
    true_fitness_name = "held-out log-likelihood per token (nats)"

    def __init__(self, evaluator, train: list, val: list, prompts: int = 64, seed: int = 0, max_tokens: int = 96,
                 true_problems: int = 64):
        super().__init__(evaluator.codec.dim, seed)
        self.ev, self.prompts, self.max_tokens = evaluator, int(prompts), int(max_tokens)
        self.train = [p for p in train if p.solution]
        self.val = list(val)
        self.true_set = [p for p in val if p.solution][:true_problems]
        if not self.train or not self.true_set:
            raise ValueError("landscape.name=likelihood: the task has no worked solutions to score; use a task "
                             "whose rows carry solutions (task=arithmetic, gsm8k)")
        self._ids = itertools.count()  # adapter "generations": never reuse a vLLM adapter id

    def scores(self, genomes: np.ndarray, problems: list) -> np.ndarray:
        """Mean log-probability per token of each problem's solution under each genome: (P, N), nats/token
        (``PopulationEvaluator.solution_likelihood``, what ``essa train rollout.fitness=likelihood`` tells)."""
        genomes = np.atleast_2d(genomes)
        call = next(self._ids)
        refs = self.ev.write_candidates(genomes, call)
        try:
            return self.ev.solution_likelihood(refs, problems)[0]
        finally:
            self.ev.release(call)

    def rewards(self, genomes: np.ndarray, seed: int, generation: int, prompts: int | None = None) -> np.ndarray:
        """(P, N, 1) mean log-likelihood per token of the generation's minibatch (engine.tasks.minibatch; N =
        ``prompts`` or the landscape's own)."""
        from engine.tasks import minibatch

        return self.scores(genomes, minibatch(self.train, prompts or self.prompts, seed, generation))[:, :, None]

    def true_fitness(self, x: np.ndarray) -> float:
        """Mean log-likelihood per token of the first ``true_problems`` held-out solutions (nats/token)."""
        return float(self.scores(x, self.true_set).mean())

    def held_out(self, x: np.ndarray) -> np.ndarray:
        """Greedy 0/1 rewards of one genome (D,) on the held-out split (essa train's validation)."""
        from engine.backends import Sampling

        call = next(self._ids)
        refs = self.ev.write_candidates(np.atleast_2d(x), call)
        try:
            rewards = self.ev.score(refs, self.val, Sampling(max_tokens=self.max_tokens), use_tqdm=False)[0]
        finally:
            self.ev.release(call)
        return np.nan_to_num(rewards[0, :, 0])

    def close(self) -> None:
        """Free the vLLM engine and the adapter files."""
        backend = getattr(self.ev, "backend", None)
        if backend is not None:
            backend.close()
        self.ev.close()


def build_likelihood(groups: dict, genome, dim: int | None, prompts: int, seed: int = 0, adapters: int = 17,
                     max_tokens: int = 96, true_problems: int = 64) -> LikelihoodLandscape:
    """Start the real-model landscape from essa train's config groups.

    Args:
        groups: ``{"model", "task", "lora", "sft", "engine", "reward"}`` groups of a composed train config
            (conf/train.yaml). genome: the ``strategy.genome`` group. dim: ``landscape.dim``, which must be
            the genome's D; None = the genome's D. prompts: N. seed: the engine's. adapters: adapters per engine call (P + 1).
        max_tokens, true_problems: see :class:`LikelihoodLandscape`.

    Returns:
        The landscape, its engine started (minutes on a CPU; the warm start trains first if not cached).

    Raises:
        ValueError / FileNotFoundError: a missing model or task, no solutions, or ``landscape.dim`` that is
            not the genome's D (checked before the engine starts; one line each).
    """
    from transformers import AutoTokenizer

    from engine.evaluation.build import build_evaluator, task_reward
    from engine.hardware import resolve_dtype
    from engine.lora.files import AdapterMeta, read_adapter
    from engine.lora.sft import warm_start
    from engine.model import resolve_model_path, serving_model_path
    from engine.search import genome_kwargs
    from engine.tasks import load_task
    from strategies.genomes import make_genome

    model, task_cfg, lora = groups["model"], groups["task"], groups["lora"]
    model_path = resolve_model_path(model.path)
    task = load_task(task_cfg)
    sft_dtype, _ = resolve_dtype(model.dtype, purpose="training", log_choice=False)
    sft_dir = warm_start(model_path, task.train, groups["sft"], lora, task_cfg.system_prompt, dtype=sft_dtype)
    codec = make_genome(genome.kind, read_adapter(sft_dir)[0], **genome_kwargs(genome))
    if dim is not None and codec.dim != dim:
        raise ValueError(f"landscape.dim={dim}, but the genome (strategy.genome, lora.rank) has D {codec.dim}; "
                         f"drop landscape.dim (null: the genome's D)")
    dtype = resolve_dtype(model.dtype)[0]
    meta = AdapterMeta(lora.rank, lora.alpha, tuple(lora.target_modules), model_path)
    evaluator = build_evaluator(groups["engine"], model, serving_model_path(model_path, model.quantization, dtype),
                                codec, meta, AutoTokenizer.from_pretrained(model_path),
                                task_reward(task_cfg, groups["reward"]), task_cfg.system_prompt, seed, adapters_per_batch=adapters)
    try:
        return LikelihoodLandscape(evaluator, task.train, task.val, prompts, seed, max_tokens, true_problems)
    except BaseException:
        evaluator.backend.close()
        evaluator.close()
        raise
