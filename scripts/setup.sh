#!/usr/bin/env bash
# Installs what the course needs (through apt when root; otherwise prints the exact packages to
# ask for), then configures and builds in Release: CUDA where nvcc finds a GPU, CPU only otherwise.
#   scripts/setup.sh                  packages, then the Release build
#   scripts/setup.sh --course         packages, then only what the course's run needs (the chapters, the
#                                     planner): run_course.sh's; run_tests.sh builds the rest
#   scripts/setup.sh --packages-only  packages alone
#   scripts/setup.sh --test-packages  also what only the tests use (Chromium, for the page's browser test)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
case "$#:${1:-}" in
  0: | 1:--course | 1:--packages-only | 1:--test-packages) ;;
  *) echo "setup: '$*' is not an argument it takes (none, --course, --packages-only or --test-packages)" >&2
     exit 2 ;;
esac

# ocl-icd-opencl-dev: oneDNN's CMake files look for OpenCL, which libdnnl-dev only recommends.
packages=(cmake g++ make libopenmpi-dev openmpi-bin libopenblas-dev libopenblas0-openmp libdnnl-dev ocl-icd-opencl-dev libcli11-dev nlohmann-json3-dev
          libgtest-dev libbenchmark-dev python3 python3-matplotlib)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ]; then
    echo "setup: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "setup: missing packages; ask your administrator to run:" >&2
    echo "  sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
fi

# What only a test uses: installed when asked, never a reason to stop (the test skips, saying why).
if [ "${1:-}" = "--test-packages" ] && ! dpkg-query -W -f='${Status}' chromium 2>/dev/null | grep -q "install ok installed"; then
  install_chromium() { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1; }
  if [ "$(id -u)" -eq 0 ] && { install_chromium || { apt-get update -qq >/dev/null 2>&1 && install_chromium; }; }; then
    echo "setup: installed chromium (the page's browser test)"
  else
    echo "setup: chromium is not installed (sudo apt-get install -y chromium); the page's browser test will skip" >&2
  fi
fi

[ "${1:-}" = "--packages-only" ] && exit 0

# nvcc often lives outside PATH; CMake finds it there too.
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="$PATH:/usr/local/cuda/bin"
mkdir -p "$(dirname "$COURSE_BUILD")"
cmake -S "$COURSE_ROOT" -B "$COURSE_BUILD" -DCMAKE_BUILD_TYPE=Release -DCOURSE_CUDA=AUTO >"$COURSE_BUILD.configure.log" 2>&1 \
  || { cat "$COURSE_BUILD.configure.log"; exit 1; }
grep "Course backends" "$COURSE_BUILD.configure.log" | sed 's/^-- /setup: /'
echo "setup: building in ${COURSE_BUILD#$COURSE_ROOT/} (log: ${COURSE_BUILD#$COURSE_ROOT/}.build.log)"
targets=()
[ "${1:-}" = "--course" ] && targets=(--target course)
cmake --build "$COURSE_BUILD" -j "$COURSE_CORES" ${targets[@]+"${targets[@]}"} >"$COURSE_BUILD.build.log" 2>&1 \
  || { tail -n 60 "$COURSE_BUILD.build.log"; echo "setup: build failed" >&2; exit 1; }
