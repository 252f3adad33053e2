#!/usr/bin/env bash
# scripts/check_gpu.sh on a machine without a GPU: one line naming it, exit 2, the last machine's results
# untouched and nothing built. Skipped (77) where a GPU is present: there the script runs every check.
set -u
if nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -q .; then exit 77; fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo '{"check": "earlier"}' >"$out/results.jsonl"
err=$(COURSE_GPU_OUT="$out" COURSE_GPU_BUILD="$out/build" bash "$(dirname "$0")/../scripts/check_gpu.sh" 2>&1 >/dev/null)
code=$?
fail=0
[ $code -eq 2 ] || { echo "FAIL  exit $code, not 2"; fail=1; }
[ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ] && [[ $err == *"no GPU here"* ]] \
  || { echo "FAIL  not one line naming the missing GPU: $err"; fail=1; }
[ "$(cat "$out/results.jsonl")" = '{"check": "earlier"}' ] || { echo "FAIL  the earlier results were touched"; fail=1; }
[ ! -e "$out/build" ] || { echo "FAIL  it built"; fail=1; }
[ $fail -eq 0 ] && echo "PASSED"
exit $fail
