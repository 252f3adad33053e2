#!/usr/bin/env bash
# The test suite built with AddressSanitizer and UndefinedBehaviorSanitizer (Debug, CPU only; the
# asan preset): a memory error or undefined behaviour anywhere fails the test that hit it. The files
# the suite spends its time in compile at -O1, as AddressSanitizer's documentation advises for speed,
# the rest at -O0 (common/CMakeLists.txt); the chapter tests' sweeps over more grids run in Release only
# (SANITIZER_SKIP in tests/CMakeLists.txt). The
# table-driven flag tests (label flags) and the long runs (label long: training runs, and the chapter
# tests that start dozens of jobs) run only in the Release suite: the sanitizers slow them several-fold
# and find nothing there that the shorter tests of the same code do not. Extra arguments go to ctest.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
"$COURSE_ROOT/scripts/setup.sh" --packages-only
cd "$COURSE_ROOT"
mkdir -p build
cmake --preset asan >build/asan.configure.log 2>&1 || { cat build/asan.configure.log; exit 1; }
echo "sanitizers: building in build/asan (log: build/asan.build.log)"
cmake --build --preset asan -j "$COURSE_CORES" >build/asan.build.log 2>&1 \
  || { tail -n 60 build/asan.build.log; echo "sanitizers: build failed" >&2; exit 1; }
ctest --preset asan -j "$COURSE_TEST_JOBS" -LE "flags|long" "$@"
