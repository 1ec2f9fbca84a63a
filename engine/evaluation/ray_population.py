"""Population evaluation on Ray: N actors, one vLLM engine each, the strategy in the driver.

ESSA (arXiv 2507.04453, §3.4 and Appendix B) scales by evaluating candidates independently: every
worker serves its own candidates and only tiny messages cross the network. Here:

* the driver holds the strategy; each generation it sends genome shards (P_k x D float64) and gets
  back rewards and rollout rows. The frozen genome codec (SVD bases U, V and singular values of the
  SFT adapter) is ``ray.put`` once and fetched once per node by every actor's constructor;
* each actor (:class:`EvaluatorActor`) owns one :class:`~engine.backends.vllm_local.VLLMBackend`
  wrapped in a :class:`~engine.evaluation.population.PopulationEvaluator`, decodes its shard locally, writes
  the adapters on its own node and serves the shard as ONE multi-LoRA batch;
* shards are contiguous and balanced (sizes differ by at most one candidate); shard k of a
  generation uses ``sampling.shifted(first_candidate_k x N)``, the seeds its requests get in the
  local engine's single batch. Greedy results equal those of an engine with the actors' setup
  (in-process engine core, ``cpus_per_actor`` cores) serving the same shards, checked by
  tests/test_ray_backend.py; a local run (one batch, every core) can differ in a few near-tie greedy
  tokens on CPU, since bf16 GEMM results depend on the batch and the thread count (docs/guide/ray.md);
* faults: when an actor dies mid-generation (killed, out of memory) its shard goes back to the
  queue and runs on the first actor that is free: a surviving one, or the dead one once Ray has
  restarted it (``max_restarts = engine.max_actor_restarts``). Finished shards are kept; the log
  names actor, generation and candidates. A shard that fails ``MAX_SHARD_ATTEMPTS`` times is
  scored NaN (status ``error``), so the run goes on (STYLE.md rule 3);
* accounting: ``EvalResult.timings`` holds the critical path of each phase (max over actors) plus
  ``actor{k}_tokens_per_s`` and ``actor{k}_idle_s`` (seconds of the generation's wall time that
  actor k had no work), ``ray_wall`` and ``shard_retries``.

Adapters named by path (:meth:`RayPopulationEvaluator.score`: the SFT warm start, the mean genome
written by :meth:`write_candidates`, exported adapters) live on the driver's file system. They are
shipped as file bytes through the object store (one ``ray.put`` per adapter: about 20 MB at rank 8
for a 7B model) and written to the actor's own adapter directory, so multi-node clusters need no
shared file system. Genomes are not re-decoded on the actors for these, because the SFT and exported
adapters need not be in the codec's image.
"""
from __future__ import annotations

import collections
import fcntl
import logging
import math
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import ray
import ray.exceptions

from engine.evaluation.population import AdapterMeta, EvalResult, PopulationEvaluator, default_adapter_root, reward_results
from engine.backends import AdapterRef, Completion, Sampling

log = logging.getLogger("essa.ray")

# Errors that mean "the process that ran the shard is gone", not "the shard is wrong".
RETRYABLE = tuple(e for e in (getattr(ray.exceptions, n, None) for n in (
    "RayActorError", "ActorDiedError", "ActorUnavailableError", "WorkerCrashedError",
    "OutOfMemoryError", "NodeDiedError", "ObjectLostError")) if e is not None)

MAX_SHARD_ATTEMPTS = 3
"""A shard whose actor dies this many times is scored NaN instead of killing a further actor."""

TEST_FAULT_ENV = "ESSA_RAY_TEST_FAULT"
"""TEST ONLY. ``"<actor>:<generation>"`` makes actor <actor> ``os._exit(1)`` the first time it is
asked to evaluate generation <generation> (once per run, remembered in a marker file on the
driver's node), so tests can kill an actor mid-generation deterministically. Never set it in runs."""

SLOT_DIR = Path(tempfile.gettempdir()) / "essa-ray-cpu-slots"

ROLLOUT_COLUMNS = ("generation", "candidate", "prompt_id", "sample", "completion", "extracted_answer",
                   "reward", "status", "n_tokens")


# ----------------------------------------------------------------------------- pure helpers
def balanced_shards(n: int, k: int) -> list[tuple[int, int]]:
    """Split ``range(n)`` into at most ``k`` contiguous non-empty ``(start, stop)`` ranges whose
    sizes differ by at most one (the first ``n mod k`` get the extra item).

    Raises:
        ValueError: k < 1 or n < 0.
    """
    if k < 1 or n < 0:
        raise ValueError(f"balanced_shards(n={n}, k={k}): need k >= 1 and n >= 0")
    q, r = divmod(n, k)
    out, start = [], 0
    for i in range(k):
        size = q + (i < r)
        if size:
            out.append((start, start + size))
        start += size
    return out


def cpu_bind(slot: int, cores_per_actor: int, n_cores: int) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` value of CPU slot ``slot``: cores [slot c, (slot + 1) c) modulo
    the node's cores, e.g. ``cpu_bind(1, 1, 2) == "1"``, ``cpu_bind(1, 4, 16) == "4-7"``.
    An actor that wants every core (c >= n_cores) gets ``"0-{n-1}"``."""
    c = max(1, int(cores_per_actor))
    if c >= n_cores:
        return f"0-{n_cores - 1}" if n_cores > 1 else "0"
    per_node = n_cores // c
    lo = (slot % per_node) * c
    return str(lo) if c == 1 else f"{lo}-{lo + c - 1}"


def bind_cores(bind: str) -> list[int]:
    """The cores of a :func:`cpu_bind` value: ``"3"`` -> [3], ``"4-7"`` -> [4, 5, 6, 7]."""
    lo, _, hi = bind.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def pin_to_cores(cores: Sequence[int]) -> int:
    """Compute on ``cores`` only, with one torch/OpenMP thread per core; returns the thread count.

    Needed for an engine core inside this process (an actor's, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``):
    vLLM 0.32 applies ``VLLM_CPU_OMP_THREADS_BIND`` only to the worker processes of its multi-process
    executor, so such an engine computed with the threads the process already had, torch's default
    (every core) or Ray's ``OMP_NUM_THREADS`` (``floor(num_cpus)``, unless the driver's environment
    set it), on whichever cores the kernel chose. The thread count changes the bf16 GEMM results and
    so greedy near-ties: an actor's completions depended on how the driver was started.

    Sets ``OMP_NUM_THREADS`` (for OpenMP runtimes started later), ``torch.set_num_threads`` and the
    CPU affinity of every thread the process has (threads started later inherit it). Linux only for
    the affinity; elsewhere only the thread count is set.
    """
    import torch

    n = len(cores)
    os.environ["OMP_NUM_THREADS"] = str(n)
    torch.set_num_threads(n)
    if hasattr(os, "sched_setaffinity"):
        tids = [int(t) for t in os.listdir("/proc/self/task")] if os.path.isdir("/proc/self/task") else [0]
        for tid in tids:
            try:
                os.sched_setaffinity(tid, set(cores))
            except OSError:  # a thread that just exited, or a core outside this process's cpuset
                pass
    return n


def claim_cpu_slot(max_slots: int = 1024):
    """Claim the lowest free CPU slot on this node: an ``flock`` on ``SLOT_DIR/slot-<i>.lock`` held
    for the life of the process (the kernel drops it when the process dies, so a restarted actor
    can take its slot back). Shared by every essa actor on the node, of any run.

    Returns:
        (slot index, open file descriptor that holds the lock).
    """
    SLOT_DIR.mkdir(parents=True, exist_ok=True)
    for i in range(max_slots):
        fd = os.open(SLOT_DIR / f"slot-{i}.lock", os.O_CREAT | os.O_RDWR, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return i, fd
        except OSError:
            os.close(fd)
    raise RuntimeError(f"no free CPU slot among {max_slots} in {SLOT_DIR}")


def merge_rollouts(parts: Sequence[dict[str, list]]) -> dict[str, list]:
    """Concatenate rollout column dicts (shards already in candidate order); the optional ``dense``
    column is kept when any shard has it (NaN for the rows of a shard without it: a failed one)."""
    merged = {k: [v for p in parts for v in p[k]] for k in ROLLOUT_COLUMNS}
    if any("dense" in p for p in parts):
        merged["dense"] = [v for p in parts for v in p.get("dense", [float("nan")] * len(p["candidate"]))]
    return merged


def merge_dense(parts: Sequence[EvalResult]) -> np.ndarray | None:
    """The shards' (P_k, N, G) dense scores as one (P, N, G) array (NaN for a shard without them), or
    None when no shard scored them."""
    if all(p.dense is None for p in parts):
        return None
    return np.concatenate([p.dense if p.dense is not None else np.full(p.rewards.shape, np.nan) for p in parts])


def failed_shard(genomes: np.ndarray, problems: Sequence, generation: int, first_candidate: int,
                 samples: int) -> EvalResult:
    """EvalResult of a shard that could not be evaluated: NaN fitness and rewards, status ``error``."""
    P, N, G = len(genomes), len(problems), samples
    rows: dict[str, list] = {k: [] for k in ROLLOUT_COLUMNS}
    for p in range(P):
        for n in range(N):
            for g in range(G):
                for k, v in zip(ROLLOUT_COLUMNS, (generation, first_candidate + p, problems[n].id, g, "", None,
                                                  float("nan"), "error", 0)):
                    rows[k].append(v)
    return EvalResult(np.full(P, np.nan), np.full((P, N, G), np.nan), rows, {}, 0)


def read_adapter_files(path: str | Path) -> dict[str, bytes]:
    """The files of a PEFT adapter directory as ``{file name: bytes}`` (what crosses to actors)."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"adapter directory {path} does not exist")
    return {f.name: f.read_bytes() for f in sorted(path.iterdir()) if f.is_file()}


# ----------------------------------------------------------------------------- the actor
class EvaluatorActor:
    """One vLLM engine and its PopulationEvaluator; run as a Ray actor (``ray.remote(EvaluatorActor)``).

    Args:
        index: actor number k (logs, metrics, test hook).
        model_path: checkpoint directory on the driver; used when it exists on this node, else
            ``model_spec`` is resolved here (``embedded:`` models are converted once per node).
        model_spec: ``model.path`` as configured.
        quantization: ``model.quantization``; with ``model_spec`` it rebuilds the quantized copy
            that ``model_path`` names when that is not on this node.
        codec: the genome codec (arrives from the object store, fetched once per node).
        reward_fn: picklable ``f(completions, references) -> list[RewardResult]``.
        meta: adapter metadata.
        system_prompt: system message of every prompt.
        dense: the actors also score every rollout's dense reward (``PopulationEvaluator.dense_scores``).
        engine_kwargs: ``VLLMBackend`` keyword arguments (``engine.backends.vllm_local.backend_kwargs``).
        adapter_root: parent of this actor's adapter directory (None = /dev/shm or temp).
        run_token: unique per driver; names this actor's adapter directory.
        cpu_cores: cores per actor on the CPU back-end: a claimed slot's cores, one thread each
            (:func:`pin_to_cores`; ``VLLM_CPU_OMP_THREADS_BIND`` for vLLM's worker processes).
        fault: TEST ONLY ``(actor, generation, marker path)``, see ``TEST_FAULT_ENV``.

    The constructor re-runs on every Ray restart, so a restarted actor rebuilds the engine and
    clears whatever adapters its dead predecessor left behind.
    """

    def __init__(self, index: int, model_path: str, model_spec: str, codec, reward_fn: Callable,
                 meta: AdapterMeta, system_prompt: str, engine_kwargs: dict, adapter_root: str | None,
                 run_token: str, cpu_cores: int = 1, fault: tuple | None = None, quantization: str | None = None,
                 dense: bool = False):
        t0 = time.perf_counter()
        self.index, self.fault = index, fault
        from engine.backends.vllm_local import VLLMBackend, is_cpu_platform

        self.cpu_slot, self._slot_fd, self.cpu_bind, self.threads = None, None, None, None
        tp = int((engine_kwargs.get("extra") or {}).get("tensor_parallel_size", 1))
        if is_cpu_platform():
            # our own cores, not the node-wide 0-(n-1) default of configure_cpu_env (setdefault: ours win)
            self.cpu_slot, self._slot_fd = claim_cpu_slot()
            self.cpu_bind = cpu_bind(self.cpu_slot, cpu_cores, os.cpu_count() or 1)
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = self.cpu_bind  # vLLM's worker processes (tp > 1)
            os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
            if tp == 1:  # the engine core computes in this process: bind it here (pin_to_cores)
                self.threads = pin_to_cores(bind_cores(self.cpu_bind))
        if tp == 1:
            # engine core inside the actor process: a killed actor leaves no orphan engine behind
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        root = Path(default_adapter_root(adapter_root)) / f"essa-ray-{run_token}-a{index}"
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        self.root = root
        if not Path(model_path).exists():
            from engine.model import resolve_model_path
            model_path = resolve_model_path(model_spec, quantization)
        from transformers import AutoTokenizer

        self.backend = VLLMBackend(model_path, **engine_kwargs)
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.evaluator = PopulationEvaluator(self.backend, codec, reward_fn, meta, tokenizer, system_prompt, root,
                                             dense=dense)
        self.startup_s = time.perf_counter() - t0

    def info(self) -> dict:
        """Where this actor runs: index, pid, node, CPU binding and compute threads, engine start-up seconds."""
        return {"index": self.index, "pid": os.getpid(), "node": ray.get_runtime_context().get_node_id(),
                "cpu_bind": self.cpu_bind, "threads": self.threads, "startup_s": self.startup_s}

    def pid(self) -> int:
        """The actor's process id (tests kill it)."""
        return os.getpid()

    def _maybe_fault(self, generation: int) -> None:
        if self.fault is None:
            return
        actor, gen, marker = self.fault
        if actor == self.index and gen == generation and not os.path.exists(marker):
            Path(marker).touch()
            logging.getLogger("essa.ray").warning("TEST FAULT: actor %d exits during generation %d", actor, gen)
            os._exit(1)

    def evaluate(self, genomes: np.ndarray, problems, generation: int, sampling: Sampling,
                 first_candidate: int) -> tuple[EvalResult, dict]:
        """Evaluate a shard (P_k, D) as one multi-LoRA batch; returns (EvalResult, {busy_s})."""
        t0 = time.perf_counter()
        self._maybe_fault(generation)
        genomes = np.array(genomes, dtype=np.float64)  # own, writable copy of the object-store buffer
        res = self.evaluator.evaluate(genomes, problems, generation, sampling, first_candidate, use_tqdm=False)
        return res, {"busy_s": time.perf_counter() - t0}

    def score_pairs(self, pairs: list[tuple[int, int]], adapters: list, problems, sampling: Sampling):
        """Generate and score a flat list of (adapter index, problem index) requests in one batch.

        Args:
            pairs: R (a, n) index pairs into ``adapters`` / ``problems``.
            adapters: A entries, each None (base model) or ``(AdapterRef, ObjectRef of file bytes)``.
            problems: N problems.
            sampling: settings; the requests' seeds are ``sampling.request_seeds``.

        Returns:
            (rewards (R, G), completions R lists of G Completion, extracted, status (R*G), stats).
        """
        t0 = time.perf_counter()
        shipped = self.root / f"shipped-{uuid.uuid4().hex[:8]}"
        try:
            local: dict[int, AdapterRef] = {}
            for a in sorted({a for a, _ in pairs}):
                if adapters[a] is None:
                    continue
                ref, files_ref = adapters[a]
                d = shipped / f"{ref.lora_int_id}"
                d.mkdir(parents=True)
                for name, data in ray.get(files_ref).items():
                    (d / name).write_bytes(data)
                local[a] = AdapterRef(ref.name, ref.lora_int_id, str(d))
            ev = self.evaluator
            prompts = ev.prompts(problems)
            t1 = time.perf_counter()
            outs = self.backend.generate([prompts[n] for _, n in pairs], [local.get(a) for a, _ in pairs],
                                         sampling, use_tqdm=False)
            t2 = time.perf_counter()
            texts = [c.text for out in outs for c in out]
            refs = [problems[n].answer for _, n in pairs for _ in range(sampling.n)]
            rewards, extracted, status = reward_results(ev.reward_fn, texts, refs)
        finally:
            shutil.rmtree(shipped, ignore_errors=True)
        stats = {"busy_s": time.perf_counter() - t0, "generate": t2 - t1, "reward": time.perf_counter() - t2,
                 "tokens": sum(c.n_tokens for out in outs for c in out)}
        return rewards.reshape(len(pairs), sampling.n), outs, extracted, status, stats

    def close(self) -> None:
        """Free the engine and this actor's adapter directory."""
        self.backend.close()
        shutil.rmtree(self.root, ignore_errors=True)


# ----------------------------------------------------------------------------- the driver side
def running_cluster_address() -> str | None:
    """Address of the Ray cluster a bare ``ray.init()`` would join: ``RAY_ADDRESS`` when set and not
    empty, else the cluster of the last ``ray start`` on this machine; None when there is none.

    Uses Ray's own lookup (``ray._private.services.canonicalize_bootstrap_address``, Ray 2.x), so
    the answer is the one ``ray.init`` acts on; falls back to ``RAY_ADDRESS`` alone if that moves.
    """
    try:
        from ray._private.services import canonicalize_bootstrap_address
    except ImportError:  # pragma: no cover - a Ray without the private helper
        return os.environ.get("RAY_ADDRESS") or None
    return canonicalize_bootstrap_address(None)


def connect_ray(address: str | None, num_cpus: int) -> bool:
    """Connect this driver to Ray; return True when it started a local instance it must shut down.

    Ray refuses ``ray.init(num_cpus=...)`` when it finds a running cluster ("When connecting to an
    existing cluster, num_cpus and num_gpus must not be provided"), so:

    * ``address`` set (``engine.address``: ``"auto"`` or ``host:port``): connect there;
    * else a running cluster (:func:`running_cluster_address`: ``RAY_ADDRESS``, or ``ray start --head``
      on this machine): connect to it and log that, since its resources, not ``num_cpus``, apply;
    * else start a local instance with ``num_cpus`` logical CPUs (no dashboard).

    Args:
        address: ``engine.address``; empty or None = find a running cluster or start one.
        num_cpus: logical CPUs of a new local instance.

    Raises:
        ConnectionError: the named or found cluster cannot be reached (Ray's error).
    """
    if address:
        ray.init(address=address, log_to_driver=True)
        log.info("Ray: connected to the cluster at engine.address=%s", address)
        return False
    found = running_cluster_address()
    if found:
        ray.init(address=found, log_to_driver=True)
        log.info("Ray: engine.address is empty and a cluster is running (%s): connected to it at %s and use its "
                 "resources; unset RAY_ADDRESS or run `ray stop` to get a local instance instead",
                 "RAY_ADDRESS" if os.environ.get("RAY_ADDRESS") else "ray start", found)
        return False
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=True)
    log.info("Ray: no running cluster found; started a local instance with %d CPUs", num_cpus)
    return True


class RayPopulationEvaluator:
    """The ``engine=ray`` population evaluator: same interface as :class:`PopulationEvaluator`.

    Args:
        engine: the ``engine`` config group (``num_actors``, ``address``, ``cpus_per_actor``,
            ``gpus_per_actor``, ``tensor_parallel_size``, ``max_actor_restarts``, ``adapter_dir``).
        engine_kwargs: every actor's ``VLLMBackend`` arguments (``engine.backends.vllm_local.backend_kwargs``).
        model_path: resolved base model directory (or HF id) on the driver.
        model_spec, quantization: ``model.path`` and ``model.quantization``, to rebuild the model on a
            node that lacks ``model_path``.
        codec: genome codec; ``ray.put`` once, decoded on the actors.
        meta: adapter metadata.
        reward_fn: picklable reward function (rewards.MathReward).
        system_prompt: system message of every prompt.
        dense: the actors also score every rollout's dense reward (``PopulationEvaluator.dense_scores``).

    Connects to Ray with :func:`connect_ray`: ``engine.address`` when set (``"auto"`` or
    ``host:port``), else a running cluster (``RAY_ADDRESS`` or ``ray start``) when there is one, else
    a new local instance with ``num_actors x cpus_per_actor`` logical CPUs (at least the cores); starts
    ``engine.num_actors`` actors, each with ``cpus_per_actor`` CPUs and, when the cluster has GPUs,
    ``tensor_parallel_size`` GPUs if that is > 1 else ``gpus_per_actor`` (fractional = several
    engines share a GPU; lower ``engine.gpu_memory_utilization`` to match).

    Raises:
        ValueError: the cluster lacks the CPUs/GPUs the actors ask for (message names the fix).
        RuntimeError: an actor's engine failed to start (the actor's error is chained).
    """

    def __init__(self, engine, engine_kwargs: dict, model_path: str, model_spec: str, quantization: str | None,
                 codec, meta: AdapterMeta, reward_fn: Callable, system_prompt: str, dense: bool = False):
        e = engine
        self.num_actors = int(e.num_actors)
        self._owns_ray = False
        if not ray.is_initialized():
            self._owns_ray = connect_ray(e.address, max(os.cpu_count() or 1, math.ceil(self.num_actors * e.cpus_per_actor)))
        res = ray.cluster_resources()
        gpus_total = float(res.get("GPU", 0.0))
        gpus = (float(e.tensor_parallel_size) if e.tensor_parallel_size > 1 else float(e.gpus_per_actor)) \
            if gpus_total > 0 else 0.0
        need_cpu, need_gpu = self.num_actors * float(e.cpus_per_actor), self.num_actors * gpus
        if need_cpu > float(res.get("CPU", 0.0)) + 1e-9 or need_gpu > gpus_total + 1e-9:
            self._shutdown_ray()
            raise ValueError(
                f"engine.num_actors={self.num_actors} actors need {need_cpu:g} CPUs and {need_gpu:g} GPUs but the Ray "
                f"cluster has {res.get('CPU', 0):g} CPUs and {gpus_total:g} GPUs: lower engine.num_actors, "
                f"engine.cpus_per_actor or engine.gpus_per_actor, or add nodes (ray start --address=...)")
        if gpus_total == 0 and e.tensor_parallel_size > 1:
            log.warning("engine.tensor_parallel_size=%d on a CPU-only cluster is untested: each actor asks vLLM's "
                        "CPU back-end for that many workers", e.tensor_parallel_size)

        # driver-side adapters (write_candidates for validation); no engine
        self._writer = PopulationEvaluator(None, codec, reward_fn, meta, None, "", e.adapter_dir)
        self._run_token, self._adapter_dir = uuid.uuid4().hex[:10], e.adapter_dir
        fault = None
        if os.environ.get(TEST_FAULT_ENV):
            a, g = (int(x) for x in os.environ[TEST_FAULT_ENV].split(":"))
            fault = (a, g, str(self._writer.root / f"fault-{a}-{g}.done"))
            log.warning("%s=%s: TEST fault hook active (actor %d exits in generation %d)", TEST_FAULT_ENV,
                        os.environ[TEST_FAULT_ENV], a, g)
        codec_ref = ray.put(codec)  # the frozen SVD basis, shipped once
        self._codec_ref = codec_ref  # keep it pinned: restarted actors fetch it again
        actor_cls = ray.remote(EvaluatorActor)
        self.actors = [
            actor_cls.options(num_cpus=float(e.cpus_per_actor), num_gpus=gpus, max_restarts=int(e.max_actor_restarts),
                              max_task_retries=0, name=f"essa-{self._run_token}-a{k}").remote(
                k, str(model_path), str(model_spec), codec_ref, reward_fn, meta, str(system_prompt),
                engine_kwargs, e.adapter_dir, self._run_token, max(1, int(round(e.cpus_per_actor))), fault,
                quantization=quantization, dense=dense)
            for k in range(self.num_actors)]
        self._alive = set(range(self.num_actors))
        self._recovering: dict[int, ray.ObjectRef] = {}  # actor -> info() ping submitted after a death
        t0 = time.perf_counter()
        try:
            infos = ray.get([a.info.remote() for a in self.actors])
        except Exception as exc:
            self.close()
            raise RuntimeError(f"a Ray actor failed to start its vLLM engine: {exc}") from exc
        for i in infos:
            log.info("Ray actor %d: pid %d, node %s, cpu bind %s (%s threads), engine up in %.1fs", i["index"],
                     i["pid"], i["node"][:12], i["cpu_bind"], i["threads"], i["startup_s"])
        log.info("%d Ray actors ready in %.1fs (%s GPUs each)", self.num_actors, time.perf_counter() - t0, gpus)
        self.shard_retries = 0

    # -- scheduling -------------------------------------------------------------------------
    def _after_death(self, kind: str, k: int, s, cause: str, attempts: list, finished: list, pending, inflight: dict,
                     what: str, describe: Callable[[int], str]) -> None:
        """Actor ``k`` died running shard ``s`` (``kind`` "shard": queue the shard again, or score it NaN
        after MAX_SHARD_ATTEMPTS, and ping the actor until Ray has restarted it) or while being pinged
        after a death (``kind`` "ping": it is gone for good)."""
        if kind == "shard":
            self.shard_retries += 1
            if attempts[s] >= MAX_SHARD_ATTEMPTS:
                log.error("%s: shard %s failed on %d actors in a row; scoring it NaN", what, describe(s), attempts[s])
                finished[s] = True
            else:
                log.warning("%s: Ray actor %d died (%s) while evaluating %s; re-running the shard on the next free "
                            "actor (attempt %d)", what, k, cause, describe(s), attempts[s] + 1)
                pending.appendleft(s)
            # resolves once Ray has restarted the actor, fails with ActorDiedError when it cannot
            self._recovering[k] = self.actors[k].info.options(max_task_retries=-1).remote()
            inflight[self._recovering[k]] = ("ping", k, None)
        else:
            log.error("Ray actor %d is gone for good (%s: restarts exhausted or restart failed); continuing "
                      "with %d actors", k, cause, len(self._alive) - 1)
            self._alive.discard(k)
            self._recovering.pop(k, None)

    def _dispatch(self, submit: Callable, n_shards: int, what: str, describe: Callable[[int], str]) -> list:
        """Run ``n_shards`` shards on the actors, re-running a shard whose actor died.

        Args:
            submit: ``submit(actor_handle, shard) -> ObjectRef``.
            what: label for logs ("generation 3", "validation").
            describe: ``describe(shard) -> str`` for logs (e.g. "candidates 4-7").

        Returns:
            Per shard ``(value, actor index)``, or ``None`` for a shard that failed MAX_SHARD_ATTEMPTS times.

        Raises:
            RuntimeError: every actor is dead (restarts exhausted).
        """
        results: list = [None] * n_shards
        finished = [False] * n_shards
        attempts = [0] * n_shards
        pending = collections.deque(range(n_shards))
        inflight: dict = {}  # ObjectRef -> ("shard" | "ping", actor, shard)
        free = [k for k in sorted(self._alive) if k not in self._recovering]
        for k in list(self._recovering):
            # a fresh ping: the one sent when the actor died may sit in Ray's retry back-off long
            # after the restarted actor is serving, leaving it idle for this whole call
            self._recovering[k] = ref = self.actors[k].info.options(max_task_retries=-1).remote()
            inflight[ref] = ("ping", k, None)
        while not all(finished):
            while pending and free:
                k, s = free.pop(0), pending.popleft()
                attempts[s] += 1
                inflight[submit(self.actors[k], s)] = ("shard", k, s)
            if not inflight:
                raise RuntimeError(f"{what}: all {self.num_actors} Ray actors are dead (engine.max_actor_restarts="
                                   f"exhausted); {sum(not f for f in finished)} shards unevaluated")
            [ref], _ = ray.wait(list(inflight), num_returns=1)
            kind, k, s = inflight.pop(ref)
            try:
                value = ray.get(ref)
            except RETRYABLE as exc:
                self._after_death(kind, k, s, type(exc).__name__, attempts, finished, pending, inflight, what, describe)
                continue
            if kind == "shard":
                results[s], finished[s] = (value, k), True
            else:
                self._recovering.pop(k, None)
                log.warning("Ray actor %d is back (pid %d, engine restarted in %.1fs)", k, value["pid"],
                            value["startup_s"])
            free.append(k)
        return results

    # -- the evaluator interface ----------------------------------------------------------------
    def evaluate(self, genomes: np.ndarray, problems: list, generation: int, sampling: Sampling,
                 first_candidate: int = 0, use_tqdm: bool = True) -> EvalResult:
        """Fitness of a population, shards evaluated in parallel on the actors.

        Args:
            genomes: (P, D) float64.
            problems: the generation's minibatch (N problems).
            generation: index used for adapter ids and directories.
            sampling: decoding settings (G = sampling.n); shard k uses ``sampling.shifted(first_k x N)``.
            first_candidate: global index of genomes[0].
            use_tqdm: ignored (actors run without progress bars).

        Returns:
            EvalResult: fitness (P,), rewards (P, N, G), P*N*G rollout rows in candidate order, timings
            (``decode, write, generate, reward``: max over actors; ``ray_wall``, ``shard_retries``,
            ``actor{k}_tokens_per_s``, ``actor{k}_idle_s``), tokens.
        """
        genomes = np.atleast_2d(np.asarray(genomes, dtype=np.float64))
        N = len(problems)
        shards = balanced_shards(len(genomes), self.num_actors)
        t0 = time.perf_counter()
        retries0 = self.shard_retries

        def submit(actor, s):
            a, b = shards[s]
            shard_sampling = sampling.shifted(a * N)  # local batch's seeds
            return actor.evaluate.remote(genomes[a:b], problems, generation, shard_sampling, first_candidate + a)

        def describe(s):
            a, b = shards[s]
            return f"candidates {first_candidate + a}-{first_candidate + b - 1}"

        out = self._dispatch(submit, len(shards), f"generation {generation}", describe)
        wall = time.perf_counter() - t0
        parts, per_actor = [], collections.defaultdict(lambda: {"busy_s": 0.0, "tokens": 0, "generate": 0.0,
                                                                "decode": 0.0, "write": 0.0, "reward": 0.0,
                                                                "dense": 0.0})
        for s, r in enumerate(out):
            if r is None:
                a, b = shards[s]
                parts.append(failed_shard(genomes[a:b], problems, generation, first_candidate + a, sampling.n))
                continue
            (res, stats), k = r
            parts.append(res)
            acc = per_actor[k]
            acc["busy_s"] += stats["busy_s"]
            acc["tokens"] += res.tokens
            for key in ("generate", "decode", "write", "reward", "dense"):
                acc[key] += res.timings.get(key, 0.0)
        timings = {key: max((acc[key] for acc in per_actor.values()), default=0.0)
                   for key in ("decode", "write", "generate", "reward", "dense")}
        timings.update(self._actor_timings(per_actor, wall))
        timings["shard_retries"] = float(self.shard_retries - retries0)
        return EvalResult(np.concatenate([p.fitness for p in parts]), np.concatenate([p.rewards for p in parts]),
                          merge_rollouts([p.rollouts for p in parts]), timings, int(sum(p.tokens for p in parts)),
                          merge_dense(parts))

    def _actor_timings(self, per_actor: dict, wall: float) -> dict[str, float]:
        """``ray_wall`` and per actor ``actor{k}_tokens_per_s`` / ``actor{k}_idle_s`` (all actors, every call,
        so metric columns stay the same when an actor dies)."""
        out = {"ray_wall": wall}
        for k in range(self.num_actors):
            acc = per_actor.get(k, {"busy_s": 0.0, "tokens": 0, "generate": 0.0})
            out[f"actor{k}_tokens_per_s"] = acc["tokens"] / acc["generate"] if acc["generate"] > 0 else 0.0
            out[f"actor{k}_idle_s"] = max(0.0, wall - acc["busy_s"])
        return out

    def write_candidates(self, genomes: np.ndarray, generation: int, first_candidate: int = 0,
                         timings: dict | None = None) -> list[AdapterRef]:
        """Decode genomes (P, D) and write PEFT adapters on the driver (for :meth:`score`)."""
        return self._writer.write_candidates(genomes, generation, first_candidate, timings)

    def score(self, adapters: Sequence[AdapterRef | None], problems: Sequence, sampling: Sampling,
              timings: dict | None = None, use_tqdm: bool = True):
        """Generate for every (adapter, problem) pair and score it, spread over the actors.

        The A x N requests are flattened in (adapter, problem) order and cut into balanced contiguous
        chunks, one per actor; chunk starting at request i0 uses ``sampling.shifted(i0)``, so every
        request gets the seed it has in the local engine's single batch. Adapter files are read on
        the driver and shipped as bytes (one ``ray.put`` each).

        Returns:
            (rewards (A, N, G), completions nested [A][N] of G Completion, extracted, status) with
            extracted/status flat in (A, N, G) order, as ``PopulationEvaluator.score``.
        """
        A, N, G = len(adapters), len(problems), sampling.n
        pairs = [(a, n) for a in range(A) for n in range(N)]
        payload = [None if ref is None else (ref, ray.put(read_adapter_files(ref.path))) for ref in adapters]
        chunks = balanced_shards(len(pairs), self.num_actors)
        problems = list(problems)
        t0 = time.perf_counter()

        def submit(actor, s):
            i0, i1 = chunks[s]
            return actor.score_pairs.remote(pairs[i0:i1], payload, problems,
                                            sampling.shifted(i0))

        out = self._dispatch(submit, len(chunks), "validation", lambda s: f"requests {chunks[s][0]}-{chunks[s][1] - 1}")
        rewards = np.full((A * N, G), np.nan)
        comps: list = [[Completion("", 0)] * G for _ in range(A * N)]
        extracted: list = [None] * (A * N * G)
        status: list = ["error"] * (A * N * G)
        gen_s = rew_s = 0.0
        for (i0, i1), r in zip(chunks, out):
            if r is None:
                continue
            (rw, outs, ex, st, stats), _ = r
            rewards[i0:i1] = rw
            comps[i0:i1] = outs
            extracted[i0 * G:i1 * G], status[i0 * G:i1 * G] = ex, st
            gen_s, rew_s = max(gen_s, stats["generate"]), max(rew_s, stats["reward"])
        if timings is not None:
            timings["generate"] = timings.get("generate", 0.0) + gen_s
            timings["reward"] = timings.get("reward", 0.0) + rew_s
            timings["ray_wall"] = timings.get("ray_wall", 0.0) + time.perf_counter() - t0
        completions = [comps[a * N:(a + 1) * N] for a in range(A)]
        return rewards.reshape(A, N, G), completions, extracted, status

    def release(self, generation: int) -> None:
        """Delete the driver-side adapters of a generation (actors delete theirs after each shard)."""
        self._writer.release(generation)

    def pids(self) -> list[int]:
        """Process ids of the actors (tests); waits for actors that are restarting."""
        return ray.get([a.pid.options(max_task_retries=-1).remote() for a in self.actors])

    def close(self) -> None:
        """Stop the actors (their engines and adapter directories), and Ray if this object started it."""
        actors, self.actors = getattr(self, "actors", []), []
        if actors:
            try:
                ray.get([a.close.remote() for a in actors], timeout=60)
            except Exception:  # noqa: BLE001 - dead or hung actors are killed below anyway
                pass
            for a in actors:
                try:
                    ray.kill(a, no_restart=True)
                except Exception:  # noqa: BLE001
                    pass
        if getattr(self, "_writer", None) is not None:
            self._writer.close()
            # directories of actors that died without cleaning up, where they share the driver's node
            for d in Path(default_adapter_root(self._adapter_dir)).glob(f"essa-ray-{self._run_token}-a*"):
                shutil.rmtree(d, ignore_errors=True)
        self._shutdown_ray()

    def _shutdown_ray(self) -> None:
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()
        self._owns_ray = False
