#!/usr/bin/env bash
# Checks a GPU machine for the course and measures it: the one command for every GPU check, for an
# instructor preparing a machine and for the course's own GPU work. Needs no network and installs nothing.
#   scripts/check_gpu.sh [CMAKE ARGUMENTS...]        e.g. -DCMAKE_CUDA_ARCHITECTURES=90
# In order, each bounded in time, each a line of the results file and of the summary:
#   1. configure and build with CUDA required (in $COURSE_GPU_BUILD, default build/gpu);
#   2. ctest -L '^gpu$': every CUDA kernel against the CPU's (bit for bit where they share a formula), the
#      host-read test, and every chapter with --device cuda, in lock-step, one rank on NCCL and ranks
#      sharing the GPU on MPI; a GPU test that skips on a GPU machine fails the check;
#   3. compute-sanitizer memcheck over the GPU kernel tests, where the tool is installed;
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
mkdir -p "$out"
results="$out/results.jsonl"
: >"$results"
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="$PATH:/usr/local/cuda/bin"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
gpu=${gpu:-none found}
today=$(date +%F)
summary=()
failed=0

# record NAME STATUS SECONDS DETAIL [JSON FIELDS]: one line of results.jsonl and of the summary.
record() {
  local name=$1 status=$2 seconds=$3 detail=$4 extra=${5:-}
  printf '{"check": "%s", "status": "%s", "seconds": %s, "detail": "%s", "gpu": "%s", "date": "%s"%s}\n' \
    "$name" "$status" "$seconds" "${detail//\"/\'}" "$gpu" "$today" "${extra:+, $extra}" >>"$results"
  summary+=("$(printf '%-6s %-22s %6ss  %s' "$status" "$name" "$seconds" "$detail")")
  [ "$status" = FAIL ] && failed=1
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
step build 900 bash -c "cmake -S '$COURSE_ROOT' -B '$build' -DCMAKE_BUILD_TYPE=Release -DCOURSE_CUDA=ON $* && \
                        cmake --build '$build' -j $COURSE_CORES"
record build "$status" "$seconds" "$(grep -m1 'Course backends' "$out/build.log" | sed 's/^-- //')"
if [ "$status" = FAIL ]; then
  tail -n 30 "$out/build.log"
  printf '%s\n' "${summary[@]}"
  exit 1
fi

# 2. The GPU suite. Every test in it skips where no GPU is usable; here none may.
step gpu_tests 420 ctest --test-dir "$build" -L '^gpu$' --output-on-failure -j 4
counts=$(grep -E '% tests passed' "$out/gpu_tests.log" | tail -n 1)
skipped=$(grep -c '\*\*\*Skipped' "$out/gpu_tests.log")
if [ "$status" = PASS ] && [ "$skipped" -gt 0 ]; then
  status=FAIL
  counts="$counts; $skipped skipped on a GPU machine (reasons in gpu_tests.log)"
fi
record gpu_tests "$status" "$seconds" "${counts:-no ctest summary}" "\"skipped\": $skipped"

# 3. compute-sanitizer's memcheck over the kernel tests.
sanitizer=$(command -v compute-sanitizer || true)
if [ -z "$sanitizer" ]; then
  record memcheck SKIP 0 "compute-sanitizer is not installed"
else
  for t in "kernel_parity_test" "half_test --gtest_filter=*Cuda*" "host_transfers_test --gtest_filter=*RunsOnTheGpu*"; do
    name="memcheck_${t%% *}"
    # shellcheck disable=SC2086
    step "$name" 300 "$sanitizer" --tool memcheck --error-exitcode 1 "$build"/tests/$t
    record "$name" "$status" "$seconds" "$(grep -m1 'ERROR SUMMARY' "$out/$name.log" | sed 's/^=* *//')"
  done
fi

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
printf '%s\n' "${summary[@]}"
echo "check_gpu: $( [ $failed -eq 0 ] && echo PASSED || echo FAILED ) on $gpu ($today); results in ${results#$COURSE_ROOT/}"
exit $failed
