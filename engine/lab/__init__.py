"""The strategy lab (``essa lab``): run any registered strategy for G generations on a chosen fitness
landscape, over several seeds, in one process, in seconds instead of the 20 minutes of a real run.

Modules, in the order data flows:

* :mod:`engine.lab.base`: the landscape contract;
* :mod:`engine.lab.landscapes`: the landscapes (``minibatch``, a simulator of essa's fitness calibrated
  against docs/results/evolution.md; classic test functions) and their registry;
* :mod:`engine.lab.likelihood`: the real model and genome, fitness the log-likelihood of reference
  solutions scored prefill-only through vLLM (engine/evaluation/prefill.py);
* :mod:`engine.lab.runner`: ask -> landscape rewards (P, N, 1) (and the dense score) -> essa train's shaped
  fitness (``rollout.dense``) -> tell -> the next N (``rollout.adaptive_prompts``), one row of diagnostics
  per generation;
* :mod:`engine.lab.summary`: per setting, the held-out gain over seeds, the paired test per seed, the
  difference to the reference setting;
* :mod:`engine.lab.output`: lab.parquet, lab_summary.json, lab_progress.png, the printed table;
* :mod:`engine.lab.calibrate`: the simulator's statistics beside the real default run's
  (``python -m engine.lab.calibrate``);
* :mod:`engine.lab.threads`: one BLAS thread while the lab runs.
"""
