#!/usr/bin/env bash
# Command 1: sets up, then runs every chapter with its default settings under mpirun, on the GPU
# when one is usable and on the CPU otherwise. Prints one line per chapter and writes each
# chapter's output, metrics and charts under runs/, then the page that shows them all,
# runs/index.html (scripts/report.py).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
"$COURSE_ROOT/scripts/setup.sh" --course || exit 1
RUNS=${COURSE_RUNS:-$COURSE_ROOT/runs}
PY=$(course_python)
mkdir -p "$RUNS"
failed=0

# summary_line LABEL STATUS DIR: the run's line, from the metrics in DIR.
summary_line() {
  printf '%-24s %-7s %s   (%s)\n' "$1" "$2" \
    "$("$PY" "$COURSE_ROOT/scripts/plot.py" summary "$3/metrics.jsonl" 2>/dev/null || echo "no metrics")" "${3#$COURSE_ROOT/}"
}

# record_run DIR STATUS SECONDS RANKS: the verdict, time and rank count report.py puts beside the metrics.
record_run() {
  printf '{"status": "%s", "seconds": %s, "ranks": %s, "date": "%s"}\n' "$2" "$3" "$4" "$(date '+%F %T')" >"$1/run.json"
}

# run_chapter NAME RANKS [ARGS...]: runs one chapter, then prints its summary line.
run_chapter() {
  local name=$1 ranks=$2; shift 2
  local dir="$RUNS/$name" bin="$COURSE_BUILD/$name/$name" status=PASSED start=$SECONDS
  [ -x "$bin" ] || return 0
  mkdir -p "$dir"
  course_mpirun "$ranks" "$bin" --metrics "$dir/metrics.jsonl" "$@" >"$dir/output.txt" 2>&1 || { status=FAILED; failed=1; }
  record_run "$dir" "$status" $((SECONDS - start)) "$ranks"
  "$PY" "$COURSE_ROOT/scripts/plot.py" loss "$dir/metrics.jsonl" "$dir/loss.png" >/dev/null 2>&1 || true
  summary_line "$name" "$status" "$dir"
}

# run_variant LABEL NAME SUBDIR RANKS [ARGS...]: one more run of a chapter, into SUBDIR of its folder.
run_variant() {
  local label=$1 name=$2 sub=$3 ranks=$4; shift 4
  local dir="$RUNS/$name/$sub" bin="$COURSE_BUILD/$name/$name" status=PASSED start=$SECONDS
  [ -x "$bin" ] || return 0
  rm -rf "$dir"; mkdir -p "$dir"
  course_mpirun "$ranks" "$bin" --metrics "$dir/metrics.jsonl" "$@" >"$dir/output.txt" 2>&1 || { status=FAILED; failed=1; }
  record_run "$dir" "$status" $((SECONDS - start)) "$ranks"
  summary_line "$label" "$status" "$dir"
}

echo "== Running the course (outputs under ${RUNS#$COURSE_ROOT/}/) =="
run_chapter 01_single_gpu 1
run_chapter 02_grad_accumulation 1
run_chapter 03_collectives 4
run_chapter 04_ddp 4 --verify --drift
# The course's cost model calibrated on this machine once (chapter 03's link fit at 2 and 4 ranks, the ops'
# rates): its predictions are drawn beside 05's modes and 04's speedups. A busy machine's fit can fail:
# the charts then go without, saying why.
calibration="$RUNS/calibration"
rm -rf "$calibration"
predict=()
if "$COURSE_ROOT/scripts/calibrate.sh" "$calibration" 2 4 >"$RUNS/calibration.txt" 2>&1; then
  predict=(--predict "$calibration/calibration.json")
  printf '%-24s %-7s %s\n' "cost model" "written" "calibrated on this machine (${calibration#$COURSE_ROOT/})"
else
  printf '%-24s %-7s %s\n' "cost model" "none" "$(tail -1 "$RUNS/calibration.txt"): the charts go without its prediction"
fi
run_chapter 05_bucketing_overlap 2 --verify --trace "$RUNS/05_bucketing_overlap/trace.json"
if [ -f "$RUNS/05_bucketing_overlap/metrics.jsonl" ]; then
  # The same chapter on a simulated 10 GbE network, with the bucket sweep; then the charts.
  dir="$RUNS/05_bucketing_overlap"
  course_mpirun 2 "$COURSE_BUILD/05_bucketing_overlap/05_bucketing_overlap" --sim-network 10,1.25 --sweep-buckets \
    --bucket-mb 2 ${predict[@]+"${predict[@]}"} --metrics "$dir/simulated.jsonl" --trace "$dir/trace_simulated.json" \
    >"$dir/simulated.txt" 2>&1 || failed=1
  # Five more runs of the modes, timed without --verify's work (a few seconds each): the chart draws each
  # mode's median of the five, with its spread, and the cost model's price of each beside it.
  mkdir -p "$dir/repeats"
  for k in 1 2 3 4 5; do
    course_mpirun 2 "$COURSE_BUILD/05_bucketing_overlap/05_bucketing_overlap" ${predict[@]+"${predict[@]}"} \
      --metrics "$dir/repeats/r$k.jsonl" >"$dir/repeats/r$k.txt" 2>&1 || failed=1
  done
  dated=(); [ ${#predict[@]} -eq 0 ] || dated=(--calibration "$calibration/calibration.json")
  "$PY" "$COURSE_ROOT/scripts/plot.py" overlap "$dir"/repeats/r{1,2,3,4,5}.jsonl "$dir/overlap" ${dated[@]+"${dated[@]}"} \
    >/dev/null 2>&1 || failed=1
  "$PY" "$COURSE_ROOT/scripts/plot.py" overlap "$dir/simulated.jsonl" "$dir/simulated" ${dated[@]+"${dated[@]}"} \
    >/dev/null 2>&1 || failed=1
  "$PY" "$COURSE_ROOT/scripts/plot.py" timeline "$dir/trace_simulated.json" "$dir/timeline.png" >/dev/null 2>&1 || failed=1
  printf '%-24s %-7s %s\n' "05 simulated 10 GbE" "written" \
    "$("$PY" "$COURSE_ROOT/scripts/plot.py" summary "$dir/simulated.jsonl" 2>/dev/null)   (charts in ${dir#$COURSE_ROOT/})"
fi
if [ -x "$COURSE_BUILD/06_checkpoint_failover/06_checkpoint_failover" ]; then
  # Chapter 06 under the restarting launcher, with rank 1 killed at step 50: the job fails once,
  # resumes from its step-40 checkpoint and must finish bit-identical to the uninterrupted run.
  dir="$RUNS/06_checkpoint_failover"
  rm -rf "$dir"; mkdir -p "$dir"
  start=$SECONDS
  if "$PY" "$COURSE_ROOT/scripts/failover.py" --np 2 --max-restarts 2 -- \
      "$COURSE_BUILD/06_checkpoint_failover/06_checkpoint_failover" --ckpt-dir "$dir/checkpoints" \
      --fail-at-step 50 --fail-rank 1 --verify --metrics "$dir/metrics.jsonl" >"$dir/output.txt" 2>&1; then
    status=PASSED
  else
    status=FAILED; failed=1
  fi
  record_run "$dir" "$status" $((SECONDS - start)) 2
  printf '%-24s %-7s %s   (%s)\n' 06_checkpoint_failover "$status" \
    "$(grep -c '^failover: attempt [0-9]* failed' "$dir/output.txt") failure(s), $("$PY" "$COURSE_ROOT/scripts/plot.py" summary "$dir/metrics.jsonl" 2>/dev/null || echo "no metrics")" \
    "${dir#$COURSE_ROOT/}"
fi
if [ -x "$COURSE_BUILD/04_ddp/04_ddp" ]; then
  # Activation recomputation on the GPT (--recompute): each run verified in lock-step, its activations
  # at their peak side by side.
  dir="$RUNS/04_ddp/recompute"
  mkdir -p "$dir"
  status=PASSED peaks=""
  for r in none selective full; do
    course_mpirun 2 "$COURSE_BUILD/04_ddp/04_ddp" --model gpt --steps 20 --verify --recompute "$r" \
      --metrics "$dir/$r.jsonl" >"$dir/$r.txt" 2>&1 || { status=FAILED; failed=1; }
    peaks="$peaks $r $(grep -o 'activations at their peak [0-9.]* MiB' "$dir/$r.txt" | grep -o '[0-9.]* MiB'),"
  done
  printf '%-24s %-7s %s   (%s)\n' "04 --recompute" "$status" "peak activations per rank:${peaks%,}" "${dir#$COURSE_ROOT/}"
fi
predict4=(); [ ${#predict[@]} -eq 0 ] || predict4=(--predict "$calibration/calibration_np4.json")
run_chapter 07_zero 4 --compare ${predict4[@]+"${predict4[@]}"}
if [ -f "$RUNS/07_zero/metrics.jsonl" ]; then
  # Four more runs of the stages, each with the cost model's price: the time chart draws each stage's median
  # of the five beside it. Then zero_memory.png, zero_communication.png (and zero_time.png).
  dir="$RUNS/07_zero"
  repeats=()
  if [ ${#predict4[@]} -gt 0 ]; then
    mkdir -p "$dir/repeats"
    for k in 2 3 4 5; do
      course_mpirun 4 "$COURSE_BUILD/07_zero/07_zero" --compare "${predict4[@]}" --metrics "$dir/repeats/r$k.jsonl" \
        >"$dir/repeats/r$k.txt" 2>&1 || failed=1
      repeats+=("$dir/repeats/r$k.jsonl")
    done
    repeats+=(--calibration "$calibration/calibration_np4.json")
  fi
  "$PY" "$COURSE_ROOT/scripts/plot.py" zero "$dir/metrics.jsonl" ${repeats[@]+"${repeats[@]}"} "$dir/zero" >/dev/null 2>&1 || failed=1
fi
# ZeRO-Offload (--offload optimizer): every stage verified in lock-step, its model states on the device
# and on the host side by side.
run_variant "07 --offload" 07_zero offload 2 --compare --offload optimizer --precision bf16
run_chapter 08_tensor_pipeline 2 --pp 2 --n-layer 4 --micro-batches 8 --verify --trace "$RUNS/08_tensor_pipeline/trace.json"
# Interleaved 1F1B: two chunks of the layers per stage, verified in lock-step, its bubble beside the theory.
run_variant "08 interleaved" 08_tensor_pipeline interleaved 2 --pp 2 --n-layer 4 --micro-batches 8 \
  --schedule interleaved --virtual-stages 2 --verify --trace "$RUNS/08_tensor_pipeline/interleaved/trace.json"
# Zero bubble: backward split into the activations' half and the weights', the latter filling the idle
# time; verified in lock-step, its bubble beside the theory.
run_variant "08 zero-bubble" 08_tensor_pipeline zero_bubble 2 --pp 2 --n-layer 4 --micro-batches 8 \
  --schedule zero-bubble --verify --trace "$RUNS/08_tensor_pipeline/zero_bubble/trace.json"
# The three schedules side by side at the same p and m: each stage's bubble, the theory's and what the
# stages' measured work gives; the caption says what the theory leaves out.
if "$PY" "$COURSE_ROOT/scripts/plot.py" schedules "$RUNS/08_tensor_pipeline/schedules.png" "$RUNS/08_tensor_pipeline/metrics.jsonl" \
  "$RUNS/08_tensor_pipeline/interleaved/metrics.jsonl" "$RUNS/08_tensor_pipeline/zero_bubble/metrics.jsonl" \
  >"$RUNS/08_tensor_pipeline/schedules.txt" 2>&1; then
  printf '%-24s %-7s %s\n' "08 schedules" "written" "${RUNS#$COURSE_ROOT/}/08_tensor_pipeline/schedules.png"
else
  printf '%-24s %-7s %s\n' "08 schedules" "FAILED" "see ${RUNS#$COURSE_ROOT/}/08_tensor_pipeline/schedules.txt"; failed=1
fi
# Context parallelism: every sequence split across two ranks, attention by the ring, verified in
# lock-step, its bytes beside the formula.
run_variant "08 --cp" 08_tensor_pipeline context 2 --cp 2 --verify
# 04's scaling, two workloads: the tiny MLP (communication-bound) and a GPT whose step is compute-bound
# (scripts/sweep.sh: one thread per rank, five repeats, each point's median and spread).
if [ -x "$COURSE_BUILD/04_ddp/04_ddp" ]; then
  for workload in mlp gpt; do
    folder=04_ddp; [ "$workload" = mlp ] || folder=04_ddp/$workload
    calibrated=(); [ ${#predict[@]} -eq 0 ] || calibrated=(CALIBRATION="$calibration")
    if env ${calibrated[@]+"${calibrated[@]}"} WORKLOAD=$workload "$COURSE_ROOT/scripts/sweep.sh" "$RUNS/$folder" 1 2 4 \
        >"$RUNS/04_ddp/sweep_$workload.txt" 2>&1; then
      printf '%-24s %-7s %s\n' "04 speedup, $workload" "written" "${RUNS#$COURSE_ROOT/}/$folder/speedup.png"
    else
      printf '%-24s %-7s %s\n' "04 speedup, $workload" "FAILED" "see ${RUNS#$COURSE_ROOT/}/04_ddp/sweep_$workload.txt"; failed=1
    fi
  done
fi
# The page: every chapter's verdict, figures, charts and timelines (open it in a browser, from the disk).
if "$PY" "$COURSE_ROOT/scripts/report.py" "$RUNS" >/dev/null; then
  printf '%-24s %-7s %s\n' "the course's page" "written" "${RUNS#$COURSE_ROOT/}/index.html"
else
  printf '%-24s %-7s %s\n' "the course's page" "FAILED" "scripts/report.py ${RUNS#$COURSE_ROOT/}"; failed=1
fi
exit $failed
