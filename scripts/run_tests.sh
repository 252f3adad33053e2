#!/usr/bin/env bash
# Command 2: the test suite, after the same setup as the course. By default every test but the long
# ones (label long: training runs of 1000 steps, the README commands, the jobs killed on purpose; label
# flags: every flag of every chapter with bad values), which take most of the time: a few minutes on
# two cores. --long runs those alone, --all everything. Other arguments go to ctest (for example:
# ./scripts/run_tests.sh -L 04_ddp, which grades one chapter, long tests included).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
selection=(-LE "long|flags") jobs=$((4 * COURSE_CORES))  # the short tests: four a core (below)
case "${1:-}" in
  --long) selection=(-L "long|flags") jobs=$COURSE_TEST_JOBS; shift ;;
  --all) selection=() jobs=$COURSE_TEST_JOBS; shift ;;
  "") ;;
  *) selection=() jobs=$COURSE_TEST_JOBS ;;  # the caller chooses
esac
# The long tests include the page's browser test: their setup installs Chromium too.
if [ ${#selection[@]} -eq 2 ] && [ "${selection[0]}" = "-LE" ]; then
  "$COURSE_ROOT/scripts/setup.sh"
else
  "$COURSE_ROOT/scripts/setup.sh" --test-packages
fi
# The suite runs many MPI jobs at once, most of them waiting (launches, messages) more than computing: a
# rank that waits gives its core to the others (Open MPI does so by itself only when one job has more
# ranks than cores), and the short tests run four a core. The default selection on 2 cores, 2026-11-30:
# 168 and 173 s, against 190-197 s with two a core and the ranks spinning.
export OMPI_MCA_mpi_yield_when_idle="${OMPI_MCA_mpi_yield_when_idle:-1}"
ctest --test-dir "$COURSE_BUILD" --output-on-failure -j "$jobs" ${selection[@]+"${selection[@]}"} "$@"
