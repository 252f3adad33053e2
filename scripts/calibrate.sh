#!/usr/bin/env bash
# Calibrates the course's cost model (benchmarks/plan) on this machine: chapter 03's alpha-beta fit of the
# link between ranks at each rank count given above 1 (ranks sharing the cores pay for it in their
# messages), then `plan --calibrate` with the smallest count's fit (the ops' rates, the memory's bandwidth).
# The predictions drawn beside 04's speedups (scripts/sweep.sh) and 05's modes (--predict) read it.
#   scripts/calibrate.sh OUT_DIR [RANKS...]        default: 2
# Writes OUT_DIR/link_npN.jsonl (03's metrics) and OUT_DIR/calibration_npN.json (the machine with that
# link: what a chapter's --predict at N ranks reads) for each N above 1, and OUT_DIR/calibration.json (the
# smallest N's; what plan measured beside it in calibration.txt). LINK, when set, is 03's metrics to use at every rank count
# instead of measuring (an idle machine's fit; a test's). A bad argument: exit 2; a calibration that cannot
# be made (a busy machine's tilted fit; no rank count above 1): one line saying why, exit 1.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
[ $# -ge 1 ] || { echo "usage: scripts/calibrate.sh OUT_DIR [RANKS...]" >&2; exit 2; }
out=$1
shift
ranks=("$@")
[ ${#ranks[@]} -gt 0 ] || ranks=(2)
for n in "${ranks[@]}"; do
  [[ $n =~ ^[1-9][0-9]{0,3}$ ]] || { echo "calibrate.sh: a rank count must be a whole number from 1, not '$n'" >&2; exit 2; }
done
if [ -n "${LINK:-}" ] && ! grep -qs '"alpha_beta"' "$LINK"; then
  echo "calibrate.sh: LINK must be 03_collectives' metrics with its alpha-beta fit, not '$LINK'" >&2; exit 2
fi
plan=$COURSE_BUILD/benchmarks/plan
[ -x "$plan" ] || { echo "$plan is missing; run scripts/setup.sh first"; exit 1; }
collectives=$(course_binary calibrate.sh 03_collectives 2>&1) || { echo "$collectives"; exit 1; }
mkdir -p "$out"
first=
for n in $(printf '%s\n' "${ranks[@]}" | sort -nu); do
  [ "$n" -gt 1 ] || continue
  if [ -n "${LINK:-}" ]; then
    cp "$LINK" "$out/link_np$n.jsonl"
  elif ! course_mpirun "$n" "$collectives" --mode bench --ops all_reduce --maxbytes 4M --metrics "$out/link_np$n.jsonl" \
      >"$out/link_np$n.txt" 2>&1; then
    echo "03_collectives at $n ranks failed (see $out/link_np$n.txt)"; exit 1
  fi
  first=${first:-$n}
done
"$plan" --calibrate "$out/calibration.json" ${first:+--link "$out/link_np$first.jsonl"} >"$out/calibration.txt" 2>&1 \
  || { tail -1 "$out/calibration.txt"; exit 1; }
# A chapter's --predict reads one file: for each other rank count, the machine with that count's link.
for n in $(printf '%s\n' "${ranks[@]}" | sort -nu); do
  [ "$n" -gt 1 ] && [ "$n" != "$first" ] || continue
  "$plan" --calibrate "$out/calibration_np$n.json" --link "$out/link_np$n.jsonl" >"$out/calibration_np$n.txt" 2>&1 \
    || { tail -1 "$out/calibration_np$n.txt"; exit 1; }
done
[ -z "$first" ] || cp "$out/calibration.json" "$out/calibration_np$first.json"
