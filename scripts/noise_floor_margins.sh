#!/usr/bin/env bash
# The measurements behind the lock-step factors of common/verify/compare.h, from chapter 08 with --verify.
#   float32 (kNoiseFloorFactor, kLossNoiseFloorFactor): every grid 08 offers (TP, SP, CP ring and Ulysses,
#     PP under 1F1B and interleaved (GPipe and zero-bubble add the same micro-batches in the same order as
#     1F1B, to the bit), DP, and their products; the GPT and the MLP), each at its default learning rate
#     and at ten times it (two seeds): the largest number of noise floors a correct step came from the
#     unsharded reference, per grid and overall.
#   --sixteen-bit (kWholeModelFloorFactor, kWholeModelLossFloorFactor): every grid whose 16-bit check runs
#     the split layers (TP, SP, CP, the MLP), in bf16 with its sums in bf16 and in fp16 at ten times the
#     learning rate: the largest number of 16-bit floors a correct step came from the whole float32 model;
#     beside it, every 16-bit grid's check by parts (the share of its bound, and of RoundingBias's), and
#     the split layers in float32 against the whole model (the share of kSplitFloat32FloorShare's bound).
#   scripts/noise_floor_margins.sh [--sixteen-bit] [OUT_DIR]     default: runs/noise_floor_margins[_16]
# Environment: STEPS (1000).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
sixteen=0
if [ "${1:-}" = --sixteen-bit ]; then sixteen=1; shift; fi
out=${1:-$COURSE_ROOT/runs/noise_floor_margins$([ $sixteen = 1 ] && echo _16)}
bin=$(course_binary noise_floor_margins 08_tensor_pipeline)
mkdir -p "$out"
steps=${STEPS:-1000}
# ranks|flags
if [ $sixteen = 0 ]; then
  grids=("2|--tp 2" "3|--tp 3 --n-head 3 --n-embd 48" "2|--tp 2 --sequence-parallel" "4|--tp 4 --sequence-parallel"
         "2|--cp 2" "2|--cp 2 --cp-method ulysses" "2|--pp 2" "3|--pp 3 --n-layer 3"
         "2|--pp 2 --n-layer 4 --schedule interleaved --virtual-stages 2" "3|--dp 3" "4|--tp 2 --pp 2"
         "4|--dp 2 --tp 2 --sequence-parallel" "4|--tp 2 --cp 2"
         "2|--model mlp --tp 2" "3|--model mlp --tp 3 --hidden 192" "4|--model mlp --tp 2 --dp 2")
  runs=("--seed 7" "--seed 42 --lr 0.03")
  ratios=("gradient_ratio" "noise_floor_factor" "loss_ratio" "loss_floor_factor")
else
  grids=("2|--tp 2" "3|--tp 3 --n-head 3 --n-embd 48" "2|--tp 2 --sequence-parallel" "4|--tp 4 --sequence-parallel"
         "2|--cp 2" "2|--cp 2 --cp-method ulysses" "4|--tp 2 --cp 2" "4|--dp 2 --tp 2 --sequence-parallel"
         "4|--tp 2 --pp 2" "2|--model mlp --tp 2" "3|--model mlp --tp 3 --hidden 192" "4|--model mlp --tp 2 --dp 2"
         "3|--model mlp --dp 3" "2|--pp 2" "3|--dp 3")  # the last two: the parts alone, against the whole GPT
  runs=("--seed 7 --precision bf16 --reduce-dtype bf16" "--seed 42 --lr 0.03 --precision fp16")
  ratios=("whole_ratio" "whole_floor_factor" "whole_loss_ratio" "whole_loss_floor_factor")
fi
for grid in "${grids[@]}"; do
  ranks=${grid%%|*} flags=${grid#*|}
  for run in "${runs[@]}"; do
    # --reduce-dtype is the type of the data- and context-parallel averages: refused on a grid without them.
    case " $flags " in *" --dp "* | *" --cp "*) ;; *) run=${run/ --reduce-dtype bf16/} ;; esac
    name=$(echo "$flags $run" | tr -d ' -.')
    [ -s "$out/$name.jsonl" ] && continue  # measured already: a rerun goes on where it stopped
    # A correct run that fails its check is a measurement too (FAILED below); a run that ends otherwise is not.
    course_mpirun "$ranks" "$bin" $flags $run --steps "$steps" --verify --log-every 1000000 \
      --metrics "$out/$name.tmp" >"$out/$name.txt" 2>&1 ||
      grep -q '"event":"verify"' "$out/$name.tmp" 2>/dev/null ||
      { echo "noise_floor_margins: $flags $run failed; see $out/$name.txt" >&2; exit 1; }
    mv "$out/$name.tmp" "$out/$name.jsonl"
  done
done
python3 - "$out" "$steps" "${ratios[@]}" <<'PY'
import glob, json, os, sys
out, steps = sys.argv[1], sys.argv[2]
gradient_ratio, gradient_factor, loss_ratio, loss_factor = sys.argv[3:7]
worst_gradient = worst_loss = worst_split = (0, "")
print(f"{'grid and run':<72}{'gradient':>10}{'loss':>8}{'parts':>8}{'lean':>8}{'kernels':>9}{'split':>8}   (floors, the"
      f" worst step of {steps}; parts and lean: of their bounds; kernels: the 16-bit parts from the emulated, of the"
      f" tolerance; split: the split layers in float32, of their bound)")
for path in sorted(glob.glob(os.path.join(out, "*.jsonl"))):
    record = [r for r in map(json.loads, open(path)) if r.get("event") == "verify"][0]
    g, l = record[gradient_ratio] * record[gradient_factor], record[loss_ratio] * record[loss_factor]
    label = os.path.basename(path)[:-6]
    parts = f"{record['gradient_ratio']:>8.3f}{record['rounding_bias_ratio']:>8.3f}" if record["by_parts"] else f"{'':>16}"
    parts += f"{record['emulated_ratio']:>9.3f}" if "emulated_ratio" in record else f"{'':>9}"
    split = record.get("split_ratio", 0) if record.get("split_reference") else 0
    parts += f"{split:>8.3f}" if record.get("split_reference") else f"{'':>8}"
    worst_split = max(worst_split, (split, label))
    print(f"{label:<72}{g:>10.2f}{l:>8.2f}{parts}{'' if record['passed'] else '   FAILED'}")
    worst_gradient, worst_loss = max(worst_gradient, (g, label)), max(worst_loss, (l, label))
print(f"the worst correct step: gradient {worst_gradient[0]:.2f} floors ({worst_gradient[1]}), "
      f"loss {worst_loss[0]:.2f} ({worst_loss[1]})" +
      (f"; the split layers in float32 {worst_split[0]:.3f} of their bound ({worst_split[1]})" if worst_split[1] else ""))
PY
