#!/usr/bin/env bash
# Checks a GPU machine for the course and measures it: the one command for every GPU check, for an
# instructor preparing a machine and for the course's own GPU work. Needs no network and installs nothing.
#   scripts/check_gpu.sh [CMAKE ARGUMENTS...]        e.g. -DCMAKE_CUDA_ARCHITECTURES=90
# In order, each bounded in time, each a line of the results file and of the summary:
#   1. configure and build with CUDA required (in $COURSE_GPU_BUILD, default build/gpu);
#   2. ctest -L '^gpu$': every CUDA kernel against the CPU's (bit for bit where they share a formula), the
#      host-read test, and every chapter with --device cuda, in lock-step, one rank on NCCL and ranks
#      sharing the GPU on MPI; a GPU test that skips on a GPU machine fails the check;
#   3. beside it (both only check correctness, so they share the GPU), compute-sanitizer where installed:
#      memcheck over the GPU kernel tests and one small GPT step in fp32 and bf16, racecheck over the
#      kernels and the same steps;
#   4. bench_step at GPT-2 124M's shape (12 x 768, 12 heads, 1024 tokens, 8 sequences, vocabulary 50304),
#      fp32 and bf16, timed, then once more with --profile (op by op, forward and backward); bf16 also
#      with the math attention kernel (--sdpa math), FlashAttention's figure beside it;
#   5. benchmarks/peer/peer_step.py --device cuda against PyTorch eager, fp32 and bf16, where PyTorch and
#      safetensors import (.venv-peer's python, else python3).
# Results: $COURSE_GPU_OUT (default runs/check_gpu)/results.jsonl, one JSON line per check with the date and
# the GPU; each step's log beside it. Exits 0 only when every check that ran passed.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

build=${COURSE_GPU_BUILD:-$COURSE_ROOT/build/gpu}
out=${COURSE_GPU_OUT:-$COURSE_ROOT/runs/check_gpu}
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="$PATH:/usr/local/cuda/bin"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
# No GPU: every check would skip after a CUDA build of many minutes. Say so before anything is written,
# and leave the last machine's results as they are.
if [ -z "$gpu" ]; then
  echo "check_gpu: no GPU here (nvidia-smi lists none): nothing checked, ${out#$COURSE_ROOT/} left as it was" >&2
  exit 2
fi
mkdir -p "$out"
results="$out/results.jsonl"
summary="$out/summary.txt"
: >"$results"
: >"$summary"
today=$(date +%F)

# record NAME STATUS SECONDS DETAIL [JSON FIELDS]: one line of results.jsonl and of summary.txt (appended
# whole, so that the checks running beside the GPU suite can record too).
record() {
  local name=$1 status=$2 seconds=$3 detail=$4 extra=${5:-}
  printf '{"check": "%s", "status": "%s", "seconds": %s, "detail": "%s", "gpu": "%s", "date": "%s"%s}\n' \
    "$name" "$status" "$seconds" "${detail//\"/\'}" "$gpu" "$today" "${extra:+, $extra}" >>"$results"
  printf '%-6s %-26s %6ss  %s\n' "$status" "$name" "$seconds" "$detail" >>"$summary"
  return 0
}

# step NAME LIMIT_SECONDS COMMAND...: runs it with its output in NAME.log; sets $status and $seconds.
step() {
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local code=$?
  seconds=$((SECONDS - start))
  status=PASS
  [ $code -ne 0 ] && status=FAIL
  [ $code -eq 124 ] && echo "check_gpu: $name ran past its ${limit} s" >>"$out/$name.log"
  return 0
}

echo "check_gpu: GPU $gpu, logs and results in ${out#$COURSE_ROOT/}"

# 1. The build.
# The arguments travel as they are (a CMAKE_PREFIX_PATH holds ';', which a shell string would split).
configure_and_build() {
  cmake -S "$COURSE_ROOT" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCOURSE_CUDA=ON "$@" &&
    cmake --build "$build" -j "$COURSE_CORES"
}
export -f configure_and_build
export COURSE_ROOT COURSE_CORES build
step build 900 bash -c 'configure_and_build "$@"' configure_and_build "$@"
record build "$status" "$seconds" "$(grep -m1 'Course backends' "$out/build.log" | sed 's/^-- //')"
if [ "$status" = FAIL ]; then
  tail -n 30 "$out/build.log"
  cat "$summary"
  exit 1
fi

# 3. compute-sanitizer beside the GPU suite: memcheck over the kernel tests and one small GPT step in
# each precision, racecheck over the kernels' shared memory.
sanitizer=$(command -v compute-sanitizer || true)
small_gpt=(--model gpt --n-layer 2 --n-head 4 --n-embd 128 --block-size 128 --vocab 512 --batch 2 --device cuda
           --warmup 0 --steps 1)
sanitize() {  # sanitize NAME TOOL COMMAND...
  local name=$1 tool=$2
  shift 2
  step "$name" "${COURSE_GPU_SANITIZER_LIMIT:-300}" "$sanitizer" --tool "$tool" --error-exitcode 1 "$@"
  record "$name" "$status" "$seconds" "$(grep -m1 'ERROR SUMMARY\|RACECHECK SUMMARY' "$out/$name.log" | sed 's/^=* *//')"
}
sanitizers=""
if [ -z "$sanitizer" ]; then
  record memcheck SKIP 0 "compute-sanitizer is not installed"
else
  (
    sanitize memcheck_kernels memcheck "$build/tests/kernel_parity_test" &
    sanitize memcheck_half memcheck "$build/tests/half_test" --gtest_filter='*Cuda*' &
    sanitize memcheck_host_transfers memcheck "$build/tests/host_transfers_test" --gtest_filter='*RunsOnTheGpu*' &
    sanitize memcheck_gpt_fp32 memcheck "$build/benchmarks/bench_step" "${small_gpt[@]}" --precision fp32 &
    sanitize memcheck_gpt_bf16 memcheck "$build/benchmarks/bench_step" "${small_gpt[@]}" --precision bf16 &
    # racecheck runs FlashAttention's kernels (their shared tiles) through the small GPT steps: the parity
    # test's many long sequences under racecheck take many minutes.
    sanitize racecheck_kernels racecheck "$build/tests/kernel_parity_test" --gtest_filter='-*FlashAttentionIsTheSameBits*' &
    sanitize racecheck_gpt_fp32 racecheck "$build/benchmarks/bench_step" "${small_gpt[@]}" --precision fp32 &
    sanitize racecheck_gpt_bf16 racecheck "$build/benchmarks/bench_step" "${small_gpt[@]}" --precision bf16 &
    wait
  ) &
  sanitizers=$!
fi

# 2. The GPU suite. Every test in it skips where no GPU is usable; here none may.
# --timeout bounds a test that hangs (a kernel that never returns), not a slow one.
step gpu_tests 420 ctest --test-dir "$build" -L '^gpu$' --output-on-failure -j 4 --timeout 300
counts=$(grep -E '% tests passed' "$out/gpu_tests.log" | tail -n 1)
skipped=$(grep -c '\*\*\*Skipped' "$out/gpu_tests.log")
if [ "$status" = PASS ] && [ "$skipped" -gt 0 ]; then
  status=FAIL
  counts="$counts; $skipped skipped on a GPU machine (reasons in gpu_tests.log)"
fi
record gpu_tests "$status" "$seconds" "${counts:-no ctest summary}" "\"skipped\": $skipped"

[ -n "$sanitizers" ] && wait "$sanitizers"

# 4. The course's step at GPT-2 124M's shape.
shape=(--model gpt --n-layer 12 --n-head 12 --n-embd 768 --block-size 1024 --vocab 50304 --batch 8 --device cuda)
for run in fp32 bf16 bf16_math; do
  precision=${run%_math}
  extra=()
  [ "$run" = bf16_math ] && extra=(--sdpa math)
  step "bench_step_$run" 180 "$build/benchmarks/bench_step" "${shape[@]}" --precision "$precision" \
    --warmup 2 --steps 5 --json "${extra[@]}"
  line=$(tail -n 1 "$out/bench_step_$run.log")
  ms=$(printf '%s' "$line" | python3 -c 'import json, sys; print(round(json.load(sys.stdin)["step_ms"], 1))' 2>/dev/null)
  mfu=$(printf '%s' "$line" | python3 -c 'import json, sys; print(round(json.load(sys.stdin).get("mfu", 0), 3))' 2>/dev/null)
  attention=$(printf '%s' "$line" | python3 -c 'import json, sys; print(json.load(sys.stdin)["attention"])' 2>/dev/null)
  [ -z "$ms" ] && status=FAIL
  record "bench_step_$run" "$status" "$seconds" \
    "GPT-2 124M, batch 8 x 1024, ${attention:-?}: ${ms:-?} ms a step, MFU ${mfu:-?}" \
    "\"step_ms\": ${ms:-null}, \"mfu\": ${mfu:-null}, \"attention\": \"${attention:-}\""
  [ "$run" = bf16_math ] && continue
  step "bench_step_${precision}_profile" 180 "$build/benchmarks/bench_step" "${shape[@]}" --precision "$precision" \
    --warmup 1 --steps 2 --profile
  record "bench_step_${precision}_profile" "$status" "$seconds" "op by op in bench_step_${precision}_profile.log"
done

# 5. Against PyTorch eager, where it is installed.
python=""
for p in "$COURSE_ROOT/.venv-peer/bin/python" python3; do
  if "$p" -c "import torch, safetensors" >/dev/null 2>&1; then python=$p; break; fi
done
if [ -z "$python" ]; then
  record peer_step SKIP 0 "PyTorch with safetensors is not importable (scripts/setup_peer.sh)"
else
  for precision in fp32 bf16; do
    step "peer_step_$precision" 420 "$python" "$COURSE_ROOT/benchmarks/peer/peer_step.py" --device cuda \
      --bench "$build/benchmarks/bench_step" --precision "$precision" --rounds 2 \
      --cases "gpt 3x96,gpt 6x384,gpt 4x768,gpt2 124M" --metrics "$out/peer_step.jsonl"
    record "peer_step_$precision" "$status" "$seconds" "$(grep -m1 '^gpt2 124M' "$out/peer_step_$precision.log" | tr -s ' ')"
  done
fi

echo
cat "$summary"
failed=0
grep -q '"status": "FAIL"' "$results" && failed=1
echo "check_gpu: $( [ $failed -eq 0 ] && echo PASSED || echo FAILED ) on $gpu ($today); results in ${results#$COURSE_ROOT/}"
exit $failed
