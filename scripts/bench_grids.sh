#!/usr/bin/env bash
# Chapter 08's benchmark: tokens/s of the GPT on every grid of 8 ranks (with and without sequence
# parallelism where there is TP), against data parallelism alone,
# each grid with the same global batch and micro-batches; then the bubble against m (--sweep) at 2 stages.
#   scripts/bench_grids.sh [OUT_DIR]       default: runs/bench_grids
# Environment: STEPS (10), BENCH_ARGS (extra flags for 08_tensor_pipeline, e.g. "--n-embd 128").
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
out=${1:-$COURSE_ROOT/runs/bench_grids}
bin=$(course_binary bench_grids 08_tensor_pipeline)
mkdir -p "$out"
grids=("--dp 8" "--tp 2 --dp 4" "--tp 2 --dp 4 --sequence-parallel" "--pp 2 --dp 4" "--tp 4 --dp 2"
       "--tp 4 --dp 2 --sequence-parallel" "--pp 4 --dp 2" "--tp 2 --pp 2 --dp 2" "--tp 2 --pp 2 --dp 2 --sequence-parallel")
for grid in "${grids[@]}"; do
  name=$(echo "$grid" | tr -d ' -' )
  course_mpirun 8 "$bin" $grid --n-layer 4 --n-head 4 --global-batch 128 --micro-batches 4 --steps "${STEPS:-10}" \
    ${BENCH_ARGS:-} --metrics "$out/$name.jsonl" >"$out/$name.txt" 2>&1 || { echo "bench_grids: $grid failed; see $out/$name.txt" >&2; exit 1; }
done
python3 - "$out" "${grids[@]}" <<'PY'
import json, os, sys
out, grids = sys.argv[1], sys.argv[2:]
rows = []
for grid in grids:
    name = grid.replace(" ", "").replace("-", "")
    record = [r for r in map(json.loads, open(os.path.join(out, name + ".jsonl"))) if r.get("event") == "throughput"][0]
    rows.append((record["grid"] + (" + SP" if record.get("sequence_parallel") else ""), record["tokens_per_s"], record["step_ms"]))
    network = record.get("simulated_network") or ""
base = rows[0][1]
if network:
    print(network.replace("simulated ", "simulated network ") + " (ALPHA_US,GBPS): every message delayed by the alpha-beta model")
print(f"{'grid (8 ranks)':<26}{'tokens/s':>12}{'step ms':>10}{'vs DP alone':>14}")
for grid, tps, ms in rows:
    print(f"{grid:<26}{tps:>12.0f}{ms:>10.2f}{tps / base:>14.2f}")
PY
