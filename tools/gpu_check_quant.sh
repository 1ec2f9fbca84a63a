#!/usr/bin/env bash
# GPU check of quantized base models (model.quantization, issue 14): run on a machine with a CUDA GPU
# and the repository's venv (tools/setup_env.sh installs vLLM's GPU build there). About 10 minutes on
# one GPU with the embedded SmolLM2-135M model. Writes everything under outputs/gpu_check_quant/.
#
#   bash tools/gpu_check_quant.sh            # int8 (W8A8, CUTLASS) and int4 (W4A16, Marlin/Machete)
#
# 1. writes both quantized copies of the embedded model ($ESSA_CACHE/models/*-W8A8, *-W4A16);
# 2. the quantizer and LoRA-on-quantized-base tests (the integration test starts one engine per
#    precision and checks that a zero adapter reproduces the base and a random one changes it);
# 3. essa bench for bf16, int8 and int4 (population of 16 adapters vs the base, tok/s);
# 4. a tiny end-to-end essa train on each quantized base.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
OUT=outputs/gpu_check_quant
mkdir -p "$OUT"
"$BIN/python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA GPU visible: this is the GPU check')"
"$BIN/essa" prepare-model --quantization int8,int4
"$BIN/python" -m pytest -q -p no:cacheprovider tests/test_quantization.py 2>&1 | tee "$OUT/tests.log"
for q in null int8 int4; do
  "$BIN/essa" bench populations=[16] naive.enabled=false model.quantization=$q hydra.run.dir="$OUT/bench_$q" \
    2>&1 | tee "$OUT/bench_$q.log" | grep -E "^P=|error" || true
done
for q in int8 int4; do
  "$BIN/essa" train model.quantization=$q +experiment=tiny hydra.run.dir="$OUT/train_$q" 2>&1 | tail -n 20 \
    | tee "$OUT/train_$q.log"
done
echo "bench.json files: $OUT/bench_*/bench.json"
