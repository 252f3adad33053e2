# Shared by the course scripts: where things are, and how to launch ranks on this machine.
COURSE_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
COURSE_BUILD=${COURSE_BUILD:-$COURSE_ROOT/build/release}
COURSE_CORES=$(nproc 2>/dev/null || echo 1)
# Tests run two to a core: much of a test's time is waiting, not computing (Open MPI's grace before it
# stops a job that fails on purpose, a rank waiting for another, a killed job's timeout). On two cores
# the README's suite took 135 s at four at a time against 202 s at two, the long tests 654 s against
# about 720, every test passing (2026-11-25).
COURSE_TEST_JOBS=$((2 * COURSE_CORES))

# mpirun with the flags this machine needs: --allow-run-as-root only as root, --oversubscribe only
# when the ranks outnumber the cores. Usage: course_mpirun RANKS PROGRAM [ARGS...]
course_mpirun() {
  local ranks=$1; shift
  local flags=()
  [ "$(id -u)" -eq 0 ] && flags+=(--allow-run-as-root)
  [ "$ranks" -gt "$COURSE_CORES" ] && flags+=(--oversubscribe)
  mpirun "${flags[@]}" -np "$ranks" "$@"
}

# A python3 that has matplotlib (Debian's, when the default python3 lacks it).
course_python() {
  local p
  for p in python3 /usr/bin/python3; do
    if command -v "$p" >/dev/null 2>&1 && "$p" -c "import matplotlib" >/dev/null 2>&1; then echo "$p"; return; fi
  done
  echo python3
}

# The built binary of a chapter, or one line naming what is missing (and a failing status, which
# `set -e` turns into an exit). Usage: bin=$(course_binary SCRIPT_NAME CHAPTER), e.g. 07_zero.
course_binary() {
  local bin="$COURSE_BUILD/$2/$2"
  [ -x "$bin" ] || { echo "$1: $bin is missing; run scripts/setup.sh first" >&2; return 1; }
  echo "$bin"
}
