#!/usr/bin/env bash
# Runs chapter 04 at several rank counts in strong scaling (fixed global batch) and weak scaling
# (fixed per-rank batch), then draws the speedup chart.
#   scripts/sweep.sh [OUT_DIR] [RANKS...]        default: runs/04_ddp 1 2 4
# Environment: STRONG_BATCH (240), WEAK_PER_RANK (60), STEPS (60), plus any extra flags in SWEEP_ARGS.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
out=${1:-$COURSE_ROOT/runs/04_ddp}
shift || true
ranks=("$@")
[ ${#ranks[@]} -gt 0 ] || ranks=(1 2 4)
bin=$(course_binary sweep 04_ddp)
mkdir -p "$out"
strong=() weak=()
for n in "${ranks[@]}"; do
  course_mpirun "$n" "$bin" --global-batch "${STRONG_BATCH:-240}" --steps "${STEPS:-60}" ${SWEEP_ARGS:-} \
    --metrics "$out/strong_np$n.jsonl" >"$out/strong_np$n.txt" 2>&1
  course_mpirun "$n" "$bin" --global-batch $(( ${WEAK_PER_RANK:-60} * n )) --steps "${STEPS:-60}" ${SWEEP_ARGS:-} \
    --metrics "$out/weak_np$n.jsonl" >"$out/weak_np$n.txt" 2>&1
  strong+=("$out/strong_np$n.jsonl"); weak+=("$out/weak_np$n.jsonl")
done
"$(course_python)" "$COURSE_ROOT/scripts/plot.py" speedup "$out/speedup.png" --strong "${strong[@]}" --weak "${weak[@]}"
echo "sweep: chart in $out/speedup.png"
