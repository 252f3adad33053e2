#!/usr/bin/env bash
# Chapter 07's benchmark: the step time of every ZeRO stage against stage 0 (DDP), and of stage 3 with
# and without --prefetch, each ratio measured side by side in one --compare run; at 2 and 4 ranks, on
# this machine's own transport and on simulated networks (10 GbE, 1 GbE). Prints one table and keeps
# every run's output and metrics.
#   scripts/bench_zero.sh [OUT_DIR]        default: runs/bench_zero
# Environment: STEPS (30), BENCH_ARGS (extra flags for 07_zero, e.g. "--model gpt").
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
out=${1:-$COURSE_ROOT/runs/bench_zero}
bin=$(course_binary bench_zero 07_zero)
mkdir -p "$out"
for ranks in 2 4; do
  for network in none 10,1.25 50,0.125; do
    name="np${ranks}_${network/,/_}"
    sim=()
    [ "$network" = none ] || sim=(--sim-network "$network")
    rm -f "$out/$name.jsonl"
    course_mpirun "$ranks" "$bin" --compare --prefetch --steps "${STEPS:-30}" "${sim[@]}" ${BENCH_ARGS:-} \
      --metrics "$out/$name.jsonl" >"$out/$name.txt" 2>&1 || { echo "bench_zero: $name failed; see $out/$name.txt" >&2; exit 1; }
  done
done
python3 - "$out" <<'PY'
import glob, json, os, sys
print(f"{'ranks':>5}  {'network':<28}" + "".join(f"{s:>12}" for s in ("stage 0 ms", "1/0", "2/0", "3/0", "3p/0", "3p/3")))
for path in sorted(glob.glob(os.path.join(sys.argv[1], "np*.jsonl"))):
    rows = [r for r in map(json.loads, open(path)) if r.get("event") == "zero_stage"]
    by = {(r["stage"], r["prefetch"]): r["step_ms"] for r in rows}
    net = rows[0]["simulated_network"] or "this machine's MPI"
    base = by[(0, False)]
    ratios = [by[(1, False)] / base, by[(2, False)] / base, by[(3, False)] / base, by[(3, True)] / base,
              by[(3, True)] / by[(3, False)]]
    print(f"{rows[0]['ranks']:>5}  {net:<28}{base:>12.2f}" + "".join(f"{x:>12.2f}" for x in ratios))
PY
