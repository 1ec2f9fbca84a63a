#!/usr/bin/env bash
# Equal-clock comparison of ESSA, GRPO and F-GRPO on one task (issue #7), and the skeptic's baselines
# (issue 39): a 1-D search over the warm start's scale (strategy=scale_baseline) and random search
# (strategy=random_baseline, the best of as many random genomes at ESSA's sigma).
#
#   tools/compare_baselines.sh [BUDGET_S] [shared overrides...]
#   tools/compare_baselines.sh 600                 # default task (arithmetic), 10 minutes each
#   tools/compare_baselines.sh 1800 task=gsm8k     # overrides valid for both `essa train` and `essa grpo`
#
# Each method gets the same wall-clock budget (seconds), counted from right after the SFT warm start
# they share (cached: the first method builds it, the others reuse it) and including every
# validation. Each run stops after the first generation / optimiser step that ends past the
# budget, then validates and exports its adapter. The runs go one after another (never in
# parallel: they would share the cores). Output: $OUT/{essa,grpo,f-grpo,scale,random} run directories and
# $OUT/report (validation accuracy against wall-clock seconds, overlaid; report.md).
set -euo pipefail
cd "$(dirname "$0")/.."
BUDGET="${1:-600}"
[[ $# -gt 0 ]] && shift
[[ "$BUDGET" =~ ^[0-9]+([.][0-9]+)?$ ]] || { echo "compare_baselines: BUDGET_S must be seconds, got '$BUDGET'" >&2; exit 2; }
ESSA="${ESSA:-.venv/bin/essa}"
OUT="${OUT:-outputs/compare/$(date +%Y-%m-%d_%H-%M-%S)}"
GAMMA="${FOCAL_GAMMA:-0.5}"
mkdir -p "$OUT"

run() {  # run NAME CMD...: skip a method whose run already finished (rerun the script to resume)
  local name="$1"; shift
  if [[ -f "$OUT/$name/summary.json" ]]; then echo "== $name: already done ($OUT/$name)"; return; fi
  echo "== $name: $*"
  "$@" hydra.run.dir="$OUT/$name" 2>&1 | tee "$OUT/$name.log"
}

run essa   "$ESSA" train generations=100000 time_budget_s="$BUDGET" label=ESSA "$@"
run grpo   "$ESSA" grpo grpo.max_steps=100000 grpo.time_budget_s="$BUDGET" label=GRPO "$@"
run f-grpo "$ESSA" grpo grpo.max_steps=100000 grpo.time_budget_s="$BUDGET" grpo.focal_gamma="$GAMMA" \
    label="F-GRPO-gamma$GAMMA" "$@"
run scale  "$ESSA" train generations=100000 time_budget_s="$BUDGET" strategy=scale_baseline label=scale-baseline "$@"
run random "$ESSA" train generations=100000 time_budget_s="$BUDGET" strategy=random_baseline label=random-baseline "$@"
"$ESSA" report "$OUT/essa" "$OUT/grpo" "$OUT/f-grpo" "$OUT/scale" "$OUT/random" --out "$OUT/report"
echo "report: $OUT/report/report.md"
