#!/usr/bin/env bash
# Optional: PyTorch (CPU build), safetensors and NumPy in a virtual environment of their own, for the
# peer benchmark (benchmarks/peer/) alone. Neither the course's build, its two README commands nor its
# tests need any of it.
#   scripts/setup_peer.sh            creates .venv-peer/ in the repository root
#   COURSE_PEER_VENV=DIR scripts/setup_peer.sh
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

venv="${COURSE_PEER_VENV:-$COURSE_ROOT/.venv-peer}"
python=/usr/bin/python3
[ -x "$python" ] || python="$(command -v python3)"
if ! "$python" -c 'import venv, ensurepip' 2>/dev/null; then
  if [ "$(id -u)" -eq 0 ]; then
    echo "setup_peer: installing python3-venv"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
  else
    echo "setup_peer: python3 cannot make a virtual environment; ask for: sudo apt-get install -y python3-venv" >&2
    exit 1
  fi
fi
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
# PyTorch's CPU wheel when its index is reachable (smaller); otherwise PyPI's, which also runs on the CPU.
if ! "$venv/bin/pip" install -q --retries 0 --timeout 15 torch --index-url https://download.pytorch.org/whl/cpu 2>/dev/null; then
  echo "setup_peer: the CPU wheel index is out of reach; installing torch from the package registry"
  "$venv/bin/pip" install -q torch
fi
"$venv/bin/pip" install -q numpy safetensors
"$venv/bin/python" -c 'import torch; print("setup_peer: torch", torch.__version__, "in '"${venv#$COURSE_ROOT/}"'")'
