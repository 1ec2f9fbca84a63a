"""Per-step latency model of ESSA vs gradient RL (GRPO) on W GPUs, after ESSA's Appendix B.

ESSA (arXiv 2507.04453, §3.4 and Appendix B) evaluates candidates independently: each GPU holds the
whole (possibly quantised) model and generates for its own candidates; after a step the workers
all-gather one (seed, reward) pair of 8 bytes per candidate and apply the same CMA-ES update, so
communication does not depend on model size. Gradient RL also generates, then runs forward and
backward passes, and synchronises the model: a reduce-scatter of gradients and an all-gather of
parameters (FSDP/ZeRO-3 style), each moving the whole model through every GPU's link.

The model (W GPUs; ring collectives, bandwidth-bound; Appendix B)::

    gen_s     = completion_tokens / gen_tokens_per_s                      # one sequence, one GPU, in batch
    fwd_bwd_s = fwd_bwd_multiple * 2 * params * seq_tokens / (peak_flops * mfu)
    T_essa(W) = population * prompts * gen_s / W  +  8 * population * (W - 1) / (W * bw)
    T_rl(W)   = rl_sequences * (fwd_bwd_s + gen_s) / W  +  2 * params * bytes_per_param * (W - 1) / (W * bw)

Both compute terms fall as 1/W; RL's communication tends to the constant K = 2 params bytes / bw,
ESSA's to E = 8 population / bw (bytes). So T_rl - T_essa = (C_rl - C_essa + (K - E)(W - 1)) / W
with C = the compute of one step on one GPU, and ESSA's step becomes the faster one beyond

    W* = 1 + (C_essa - C_rl) / (K - E)        (closed form; W* = 1 when ESSA is faster everywhere)

This is the "crossover" :func:`crossover_gpus` returns; it grows linearly with bandwidth and with
ESSA's extra compute. Times are per optimisation step; how many steps each method needs to reach a
target accuracy is an empirical input (``--rl-steps-per-essa-step``, default 1: equal steps).

Defaults: Qwen2.5-32B on H100 80GB GPUs with 400 Gb/s InfiniBand per GPU (assumptions, not
measurements; change them with the flags):

* params 32.5e9, bf16 (2 bytes per parameter);
* generation throughput 1500 tokens/s per GPU (vLLM, large batch, bf16 32B on one 80 GB GPU); for
  other model sizes the CLI scales it as 1 / params (decoding is bound by reading the weights);
* completions of 512 tokens after prompts of 256;
* fwd+bwd = 3 x forward, forward = 2 params FLOPs per token, at 40 % MFU of 989 TFLOP/s (H100 SXM
  dense bf16);
* ESSA: population 96, 100 prompts per step (the paper's defaults); RL: 128 prompts x 8 samples
  = 1024 sequences per step;
* bandwidth 400 Gb/s = 50 GB/s per GPU, no latency term (Appendix B has none).

Usage::

    python tools/scaling_model.py                       # the default table, GPUs 8..1024
    python tools/scaling_model.py --params-b 7 32.5 72 --bandwidth-gbps 100 400 3200
    python tools/scaling_model.py --gpus 16 128 --rl-steps-per-essa-step 4
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from dataclasses import dataclass

DEFAULT_GPUS = (8, 16, 32, 64, 128, 256, 512, 1024)
ESSA_RECORD_BYTES = 8  # one (seed, reward) pair per candidate, ESSA §3.4


@dataclass(frozen=True)
class ScalingInputs:
    """Inputs of the latency model (units in the names; defaults: Qwen2.5-32B on H100, see module doc).

    Attributes:
        params: model parameters (count).
        bytes_per_param: bytes per parameter in the synchronised model (2 = bf16).
        gen_tokens_per_s: generation throughput of one GPU serving a large batch (tokens/s).
        completion_tokens: mean generated tokens per sequence.
        prompt_tokens: mean prompt tokens per sequence (only fwd+bwd sees them).
        fwd_bwd_multiple: fwd+bwd cost as a multiple of one forward pass (3: backward = 2 forward).
        peak_tflops: peak dense bf16 TFLOP/s of one GPU.
        mfu: model FLOPs utilisation of the training step (0 < mfu <= 1).
        population: ESSA population size (candidates per step).
        prompts: ESSA prompts per candidate per step (the minibatch).
        rl_sequences: RL sequences (prompts x samples) per step.
        bandwidth_gbps: per-GPU interconnect bandwidth for collectives (Gbit/s).
        rl_steps_per_essa_step: RL steps worth one ESSA step of progress (time-to-target factor).
    """

    params: float = 32.5e9
    bytes_per_param: float = 2.0
    gen_tokens_per_s: float = 1500.0
    completion_tokens: float = 512.0
    prompt_tokens: float = 256.0
    fwd_bwd_multiple: float = 3.0
    peak_tflops: float = 989.0
    mfu: float = 0.4
    population: int = 96
    prompts: int = 100
    rl_sequences: int = 1024
    bandwidth_gbps: float = 400.0
    rl_steps_per_essa_step: float = 1.0

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"{f.name}={v!r}: must be a finite number > 0 (--{f.name.replace('_', '-')})")
        if self.mfu > 1:
            raise ValueError(f"mfu={self.mfu}: must be in (0, 1] (--mfu)")

    @property
    def bandwidth_bytes_per_s(self) -> float:
        """Link bandwidth in bytes/s (Gbit/s x 1e9 / 8)."""
        return self.bandwidth_gbps * 1e9 / 8


def gen_seconds(inp: ScalingInputs) -> float:
    """Seconds of one GPU's time to generate one sequence inside a large batch."""
    return inp.completion_tokens / inp.gen_tokens_per_s


def fwd_bwd_seconds(inp: ScalingInputs) -> float:
    """Seconds of one GPU's time for forward + backward over one sequence (prompt + completion)."""
    flops = inp.fwd_bwd_multiple * 2.0 * inp.params * (inp.prompt_tokens + inp.completion_tokens)
    return flops / (inp.peak_tflops * 1e12 * inp.mfu)


def essa_compute(inp: ScalingInputs) -> float:
    """C_essa: GPU-seconds of generation in one ESSA step (population x prompts sequences)."""
    return inp.population * inp.prompts * gen_seconds(inp)


def rl_compute(inp: ScalingInputs) -> float:
    """C_rl: GPU-seconds of generation + fwd/bwd in one RL step."""
    return inp.rl_sequences * (fwd_bwd_seconds(inp) + gen_seconds(inp))


def essa_comm_coeff(inp: ScalingInputs) -> float:
    """E: seconds of ESSA's all-gather of 8-byte records as W -> infinity (population x 8 bytes / bw)."""
    return ESSA_RECORD_BYTES * inp.population / inp.bandwidth_bytes_per_s


def rl_comm_coeff(inp: ScalingInputs) -> float:
    """K: seconds of RL's reduce-scatter + all-gather of the model as W -> infinity (2 model bytes / bw)."""
    return 2.0 * inp.params * inp.bytes_per_param / inp.bandwidth_bytes_per_s


def _check_gpus(gpus: float) -> None:
    if not gpus >= 1:
        raise ValueError(f"gpus={gpus}: need at least 1 GPU")


def essa_step_seconds(inp: ScalingInputs, gpus: float) -> float:
    """T_essa(W): population x prompts x gen_s / W + ring all-gather of 8-byte records (seconds).

    Valid while W <= population x prompts (every GPU has at least one sequence to generate).
    """
    _check_gpus(gpus)
    return essa_compute(inp) / gpus + essa_comm_coeff(inp) * (gpus - 1) / gpus


def rl_step_seconds(inp: ScalingInputs, gpus: float) -> float:
    """T_rl(W): rl_sequences (fwd_bwd_s + gen_s) / W + 2 x model bytes x (W - 1) / (W x bw) (seconds)."""
    _check_gpus(gpus)
    return rl_compute(inp) / gpus + rl_comm_coeff(inp) * (gpus - 1) / gpus


def crossover_gpus(inp: ScalingInputs) -> float:
    """W*, the GPU count beyond which an ESSA step is faster than an RL step (continuous W).

    W* = 1 + (C_essa - C_rl) / (K - E). Returns 1.0 when ESSA is at least as fast at every W >= 1,
    ``math.inf`` when it never is (K <= E and C_essa > C_rl).
    """
    c_diff = essa_compute(inp) - rl_compute(inp)
    if c_diff <= 0:
        return 1.0
    k_minus_e = rl_comm_coeff(inp) - essa_comm_coeff(inp)
    if k_minus_e <= 0:
        return math.inf
    return 1.0 + c_diff / k_minus_e


def table(inp: ScalingInputs, gpus: tuple[int, ...] = DEFAULT_GPUS) -> list[dict]:
    """One row per GPU count: step times (s), each method's speed-up over the first GPU count, and
    ESSA's advantage = rl_steps_per_essa_step x T_rl / T_essa (> 1: ESSA reaches the target sooner)."""
    rows = []
    e0, r0 = essa_step_seconds(inp, gpus[0]), rl_step_seconds(inp, gpus[0])
    for w in gpus:
        te, tr = essa_step_seconds(inp, w), rl_step_seconds(inp, w)
        rows.append({"gpus": w, "essa_s": te, "rl_s": tr, "essa_speedup": e0 / te, "rl_speedup": r0 / tr,
                     "essa_advantage": inp.rl_steps_per_essa_step * tr / te,
                     "rl_comm_share": rl_comm_coeff(inp) * (w - 1) / w / tr})
    return rows


def format_table(inp: ScalingInputs, gpus: tuple[int, ...] = DEFAULT_GPUS) -> str:
    """The printed table for one (model size, bandwidth) setting."""
    head = (f"params {inp.params / 1e9:g}B x {inp.bytes_per_param:g} B, bandwidth {inp.bandwidth_gbps:g} Gb/s | "
            f"gen {gen_seconds(inp):.3f} s/seq, fwd+bwd {fwd_bwd_seconds(inp):.3f} s/seq | "
            f"ESSA {inp.population} x {inp.prompts} seq/step, RL {inp.rl_sequences} seq/step")
    lines = [head, f"{'GPUs':>6}{'ESSA s/step':>13}{'RL s/step':>12}{'ESSA x':>9}{'RL x':>8}"
                   f"{'RL comm':>9}{'ESSA adv':>10}"]
    for r in table(inp, gpus):
        lines.append(f"{r['gpus']:>6}{r['essa_s']:>13.2f}{r['rl_s']:>12.2f}{r['essa_speedup']:>9.1f}"
                     f"{r['rl_speedup']:>8.1f}{r['rl_comm_share']:>8.0%} {r['essa_advantage']:>9.2f}")
    w = crossover_gpus(inp)
    lines.append(f"crossover W* = {w:.1f} GPUs (ESSA step faster beyond it); RL step floor "
                 f"{rl_comm_coeff(inp):.2f} s (communication), ESSA comm floor {essa_comm_coeff(inp) * 1e6:.3f} us")
    if max(gpus) > inp.population * inp.prompts:
        lines.append(f"warning: W > population x prompts = {inp.population * inp.prompts}: idle GPUs, ESSA "
                     "times are optimistic")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    d = ScalingInputs()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--gpus", type=int, nargs="+", default=list(DEFAULT_GPUS), help="GPU counts W")
    p.add_argument("--params-b", type=float, nargs="+", default=[d.params / 1e9], help="model sizes (billions)")
    p.add_argument("--bandwidth-gbps", type=float, nargs="+", default=[d.bandwidth_gbps],
                   help="per-GPU interconnect bandwidths (Gbit/s)")
    p.add_argument("--bytes-per-param", type=float, default=d.bytes_per_param)
    p.add_argument("--gen-tokens-per-s", type=float, default=d.gen_tokens_per_s,
                   help="generation tokens/s of one GPU (large batch) for a model of --gen-ref-params-b")
    p.add_argument("--gen-ref-params-b", type=float, default=d.params / 1e9,
                   help="model size (billions) --gen-tokens-per-s was measured for; others scale as 1/params")
    p.add_argument("--completion-tokens", type=float, default=d.completion_tokens)
    p.add_argument("--prompt-tokens", type=float, default=d.prompt_tokens)
    p.add_argument("--fwd-bwd-multiple", type=float, default=d.fwd_bwd_multiple, help="fwd+bwd / forward")
    p.add_argument("--peak-tflops", type=float, default=d.peak_tflops, help="dense bf16 TFLOP/s per GPU")
    p.add_argument("--mfu", type=float, default=d.mfu, help="training model FLOPs utilisation")
    p.add_argument("--population", type=int, default=d.population, help="ESSA candidates per step")
    p.add_argument("--prompts", type=int, default=d.prompts, help="ESSA prompts per candidate per step")
    p.add_argument("--rl-sequences", type=int, default=d.rl_sequences, help="RL sequences per step")
    p.add_argument("--rl-steps-per-essa-step", type=float, default=d.rl_steps_per_essa_step,
                   help="RL steps that make the progress of one ESSA step")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if min(args.params_b) <= 0 or args.gen_ref_params_b <= 0:
            raise ValueError("--params-b and --gen-ref-params-b must be > 0")
        blocks = []
        for pb in args.params_b:
            for bw in args.bandwidth_gbps:
                inp = ScalingInputs(params=pb * 1e9, bandwidth_gbps=bw, bytes_per_param=args.bytes_per_param,
                                    gen_tokens_per_s=args.gen_tokens_per_s * args.gen_ref_params_b / pb,
                                    completion_tokens=args.completion_tokens,
                                    prompt_tokens=args.prompt_tokens, fwd_bwd_multiple=args.fwd_bwd_multiple,
                                    peak_tflops=args.peak_tflops, mfu=args.mfu, population=args.population,
                                    prompts=args.prompts, rl_sequences=args.rl_sequences,
                                    rl_steps_per_essa_step=args.rl_steps_per_essa_step)
                blocks.append(format_table(inp, tuple(sorted(args.gpus))))
    except ValueError as e:
        print(f"scaling_model: error: {e}", file=sys.stderr)
        return 2
    print("\n\n".join(blocks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
