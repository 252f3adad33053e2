#!/usr/bin/env bash
# Command 2: the whole test suite, after the same setup as the course. Extra arguments go to ctest
# (for example: ./scripts/run_tests.sh -L 04_ddp).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
"$COURSE_ROOT/scripts/setup.sh"
ctest --test-dir "$COURSE_BUILD" --output-on-failure -j "$COURSE_CORES" "$@"
