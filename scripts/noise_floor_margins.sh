#!/usr/bin/env bash
# The measurement behind verify::kNoiseFloorFactor and kLossNoiseFloorFactor (common/verify/compare.h): chapter 08 with --verify,
# in float32, over every grid it offers (TP, SP, CP ring and Ulysses, PP under 1F1B and interleaved (GPipe
# and zero-bubble add the same micro-batches in the same order as 1F1B, to the bit), DP, and
# their products; the GPT and the MLP), each at its default learning rate and at ten times it (two seeds), and the
# largest number of noise floors a correct step came from the unsharded reference, per grid and overall.
#   scripts/noise_floor_margins.sh [OUT_DIR]       default: runs/noise_floor_margins
# Environment: STEPS (1000).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
out=${1:-$COURSE_ROOT/runs/noise_floor_margins}
bin=$(course_binary noise_floor_margins 08_tensor_pipeline)
mkdir -p "$out"
steps=${STEPS:-1000}
# ranks|flags
grids=("2|--tp 2" "3|--tp 3 --n-head 3 --n-embd 48" "2|--tp 2 --sequence-parallel" "4|--tp 4 --sequence-parallel" "2|--cp 2"
       "2|--cp 2 --cp-method ulysses" "2|--pp 2" "3|--pp 3 --n-layer 3"
       "2|--pp 2 --n-layer 4 --schedule interleaved --virtual-stages 2" "3|--dp 3" "4|--tp 2 --pp 2"
       "4|--dp 2 --tp 2 --sequence-parallel" "4|--tp 2 --cp 2"
       "2|--model mlp --tp 2" "3|--model mlp --tp 3 --hidden 192" "4|--model mlp --tp 2 --dp 2")
runs=("--seed 7" "--seed 42 --lr 0.03")
for grid in "${grids[@]}"; do
  ranks=${grid%%|*} flags=${grid#*|}
  for run in "${runs[@]}"; do
    name=$(echo "$flags $run" | tr -d ' -.')
    [ -s "$out/$name.jsonl" ] && continue  # measured already: a rerun goes on where it stopped
    course_mpirun "$ranks" "$bin" $flags $run --steps "$steps" --verify --log-every 1000000 \
      --metrics "$out/$name.tmp" >"$out/$name.txt" 2>&1 || { echo "noise_floor_margins: $flags $run failed; see $out/$name.txt" >&2; exit 1; }
    mv "$out/$name.tmp" "$out/$name.jsonl"
  done
done
python3 - "$out" "$steps" <<'PY'
import glob, json, os, sys
out, steps = sys.argv[1], sys.argv[2]
worst_gradient = worst_loss = (0, "")
print(f"{'grid and run':<72}{'gradient':>10}{'loss':>8}   (noise floors, the worst step of {steps})")
for path in sorted(glob.glob(os.path.join(out, "*.jsonl"))):
    record = [r for r in map(json.loads, open(path)) if r.get("event") == "verify"][0]
    g, l = record["gradient_ratio"] * record["noise_floor_factor"], record["loss_ratio"] * record["loss_floor_factor"]
    label = os.path.basename(path)[:-6]
    print(f"{label:<72}{g:>10.2f}{l:>8.2f}{'' if record['passed'] else '   FAILED'}")
    worst_gradient, worst_loss = max(worst_gradient, (g, label)), max(worst_loss, (l, label))
print(f"the worst correct step: gradient {worst_gradient[0]:.2f} noise floors ({worst_gradient[1]}), "
      f"loss {worst_loss[0]:.2f} ({worst_loss[1]})")
PY
