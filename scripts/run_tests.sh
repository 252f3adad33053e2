#!/usr/bin/env bash
# Command 2: the test suite, after the same setup as the course. By default every test but the long
# ones (label long: training runs of 1000 steps, the README commands, the jobs killed on purpose; label
# flags: every flag of every chapter with bad values), which take most of the time: a few minutes on
# two cores. --long runs those alone, --all everything. Other arguments go to ctest (for example:
# ./scripts/run_tests.sh -L 04_ddp, which grades one chapter, long tests included).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
selection=(-LE "long|flags")
case "${1:-}" in
  --long) selection=(-L "long|flags"); shift ;;
  --all) selection=(); shift ;;
  "") ;;
  *) selection=() ;;  # the caller chooses
esac
# The long tests include the page's browser test: their setup installs Chromium too.
if [ ${#selection[@]} -eq 2 ] && [ "${selection[0]}" = "-LE" ]; then
  "$COURSE_ROOT/scripts/setup.sh"
else
  "$COURSE_ROOT/scripts/setup.sh" --test-packages
fi
ctest --test-dir "$COURSE_BUILD" --output-on-failure -j "$COURSE_TEST_JOBS" ${selection[@]+"${selection[@]}"} "$@"
