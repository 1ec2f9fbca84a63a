"""Reference results for tests/test_ray_backend.py: one Ray actor's engine, without Ray.

``python -m tests.actor_like_engine JOBS OUT`` builds an :class:`engine.evaluation.ray_population.EvaluatorActor`
as a plain object in this process (in-process vLLM engine core on one claimed CPU slot, exactly as on an
actor), runs the jobs pickled in JOBS one after the other and pickles their results to OUT.

Why a separate process: greedy completions on CPU depend on the engine's arithmetic, which depends on
the batch (rows per GEMM call), the thread count and the engine-core setup (an in-process engine core
schedules differently from vLLM's multi-process default; measured: 3 of 8 completions of the same shard
differed on one core). An exact reference for the Ray actors must run their setup, and an in-process
vLLM engine would pin and patch the test process itself (``torch.set_num_threads``, thread binding).

JOBS holds ``{"actor": dict of EvaluatorActor keyword arguments, "jobs": [...]}`` with jobs
``("evaluate", genomes, problems, generation, sampling, first_candidate)`` -> EvalResult and
``("score", adapters, problems, sampling)`` -> PopulationEvaluator.score's tuple.
"""
from __future__ import annotations

import os
import pickle
import sys


def main(jobs_path: str, out_path: str) -> None:
    with open(jobs_path, "rb") as f:
        spec = pickle.load(f)
    from engine.evaluation.ray_population import EvaluatorActor

    actor = EvaluatorActor(**spec["actor"])
    results = []
    try:
        for job in spec["jobs"]:
            if job[0] == "evaluate":
                res, _ = actor.evaluate(*job[1:])
                results.append(res)
            elif job[0] == "score":
                results.append(actor.evaluator.score(*job[1:], use_tqdm=False))
            else:
                raise ValueError(f"unknown job {job[0]!r}")
        results.append({"cpu_bind": actor.cpu_bind, "multiprocessing": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")})
    finally:
        actor.close()
    with open(out_path, "wb") as f:
        pickle.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
