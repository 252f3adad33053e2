#!/usr/bin/env bash
# Runs chapter 04 at several rank counts in strong scaling (fixed global batch) and weak scaling
# (fixed per-rank batch), then draws the speedup chart.
#   scripts/sweep.sh [OUT_DIR] [RANKS...]        default: runs/04_ddp 1 2 4
# Environment: WORKLOAD (mlp, or gpt), STRONG_BATCH, WEAK_PER_RANK, STEPS, REPEATS (5), THREADS_PER_RANK (1),
# LINK (03's metrics whose alpha-beta fit the prediction uses at every rank count, in place of measuring it
# here), CALIBRATION (a folder scripts/calibrate.sh made for these rank counts, in place of calibrating
# here), plus any extra flags in SWEEP_ARGS. WORKLOAD=mlp is 04's house-price MLP (70k parameters, a step under a
# millisecond: communication-bound; batches 240 and 60 a rank, 400 steps); WORKLOAD=gpt a GPT of 4 blocks of
# width 128 (796k parameters, about 30 ms a step on one core: compute-bound, where data parallelism pays;
# batches 64 and 32 a rank, 20 steps).
# Every run, the 1-rank baseline too, computes with THREADS_PER_RANK threads (OMP_NUM_THREADS and
# OPENBLAS_NUM_THREADS): the speedup then measures ranks, not threads (one rank left to itself would use
# every core, two ranks one each). Each rank count runs REPEATS times, strong and weak in turn; the chart
# draws each point's median with its spread, and marks a point whose repeats spread by more than 10%.
# The runs go to OUT_DIR/sweep/, the chart to OUT_DIR/speedup.png, its notes to OUT_DIR/speedup.caption.txt
# (the results page shows them under the chart). The course's cost model (benchmarks/plan, calibrated on
# this machine by scripts/calibrate.sh) predicts every point, drawn beside it.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
out=${1:-$COURSE_ROOT/runs/04_ddp}
shift || true
ranks=("$@")
[ ${#ranks[@]} -gt 0 ] || ranks=(1 2 4)
for name in REPEATS THREADS_PER_RANK STEPS STRONG_BATCH WEAK_PER_RANK; do
  value=${!name:-1}
  if ! [[ $value =~ ^[1-9][0-9]{0,5}$ ]]; then
    echo "sweep.sh: $name must be a whole number from 1, not '$value'" >&2; exit 2
  fi
done
for n in "${ranks[@]}"; do
  [[ $n =~ ^[1-9][0-9]{0,3}$ ]] || { echo "sweep.sh: a rank count must be a whole number from 1, not '$n'" >&2; exit 2; }
done
if [ -n "${LINK:-}" ] && ! grep -qs '"alpha_beta"' "$LINK"; then
  echo "sweep.sh: LINK must be 03_collectives' metrics with its alpha-beta fit, not '$LINK'" >&2; exit 2
fi
if [ -n "${CALIBRATION:-}" ] && ! [ -f "$CALIBRATION/calibration.json" ]; then
  echo "sweep.sh: CALIBRATION must be a folder scripts/calibrate.sh made, not '$CALIBRATION'" >&2; exit 2
fi
case ${WORKLOAD:-mlp} in
  mlp) model=() defaults=(240 60 400)
       shape=16,256,2 ;;  # features, hidden width, hidden layers (04's defaults)
  gpt) model=(--model gpt --n-layer 4 --n-embd 128 --n-head 4) defaults=(64 32 20)
       shape=4,128,4,8,12 ;;  # layers, width, heads, sequence (2-digit additions: 8 tokens), vocabulary
  *) echo "sweep.sh: WORKLOAD must be mlp or gpt, not '$WORKLOAD'" >&2; exit 2 ;;
esac
STRONG_BATCH=${STRONG_BATCH:-${defaults[0]}} WEAK_PER_RANK=${WEAK_PER_RANK:-${defaults[1]}} STEPS=${STEPS:-${defaults[2]}}
bin=$(course_binary sweep 04_ddp)
threads=${THREADS_PER_RANK:-1}
points=$out/sweep
mkdir -p "$points"
strong=() weak=()
for n in "${ranks[@]}"; do
  for k in $(seq 1 "${REPEATS:-5}"); do
    OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads course_mpirun "$n" "$bin" \
      --global-batch "$STRONG_BATCH" --steps "$STEPS" ${model[@]+"${model[@]}"} ${SWEEP_ARGS:-} \
      --metrics "$points/strong_np${n}_r$k.jsonl" >"$points/strong_np${n}_r$k.txt" 2>&1
    OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads course_mpirun "$n" "$bin" \
      --global-batch $(( WEAK_PER_RANK * n )) --steps "$STEPS" ${model[@]+"${model[@]}"} ${SWEEP_ARGS:-} \
      --metrics "$points/weak_np${n}_r$k.jsonl" >"$points/weak_np${n}_r$k.txt" 2>&1
    strong+=("$points/strong_np${n}_r$k.jsonl"); weak+=("$points/weak_np${n}_r$k.jsonl")
  done
done
# The course's own prediction of every point: benchmarks/plan calibrated on this machine now (its ops'
# rates, and chapter 03's alpha-beta fit at each rank count), pricing the MLP or the GPT as the runs ran.
# SWEEP_ARGS may change the model: then no prediction.
predicted=()
predict() {
  local plan=$COURSE_BUILD/benchmarks/plan n mode batch micro calibration=${CALIBRATION:-$points}
  if [ -z "${CALIBRATION:-}" ]; then
    "$COURSE_ROOT/scripts/calibrate.sh" "$points" "${ranks[@]}" || return 1
  fi
  predicted=(--calibration "$calibration/calibration.json")
  for mode in strong weak; do
    predicted+=(--predicted-$mode)
    for n in "${ranks[@]}"; do
      if [ "${WORKLOAD:-mlp}" = mlp ]; then
        batch=$STRONG_BATCH; [ $mode = strong ] || batch=$(( WEAK_PER_RANK * n ))
        priced=(--mlp "$shape" --global-batch "$batch" --threads "$threads")
      else  # the largest share sets the step where the batch does not divide
        if [ $mode = strong ]; then micro=$(( (STRONG_BATCH + n - 1) / n )); else micro=$WEAK_PER_RANK; fi
        priced=(--shape "$shape" --micro-batch "$micro" --global-batch $(( micro * n )) --threads "$threads")
      fi
      [ "$n" -eq 1 ] || priced+=(--link "$calibration/link_np$n.jsonl")
      "$plan" --calibration "$calibration/calibration.json" "${priced[@]}" --grid "$n,1,1,1" \
        --metrics "$points/predicted_${mode}_np$n.jsonl" 2>&1 >/dev/null || return 1
      predicted+=("$points/predicted_${mode}_np$n.jsonl")
    done
  done
}
if [ -n "${SWEEP_ARGS:-}" ]; then
  echo "sweep: no prediction: SWEEP_ARGS changes the model the cost model would price"
elif ! predict >"$points/prediction.txt"; then  # a busy machine's link fit, say: the chart goes on without
  echo "sweep: no prediction: $(tail -1 "$points/prediction.txt")"
  predicted=()
fi
"$(course_python)" "$COURSE_ROOT/scripts/plot.py" speedup "$out/speedup.png" --strong "${strong[@]}" --weak "${weak[@]}" \
  ${predicted[@]+"${predicted[@]}"}
echo "sweep: chart in $out/speedup.png"
