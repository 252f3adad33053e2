#!/usr/bin/env bash
# Runs a chapter across two "nodes" on this one machine, as mpirun --hostfile runs it across two real
# ones: a hostfile of two hosts (127.0.0.2 and 127.0.0.3, addresses of this machine's loopback that Open
# MPI takes for other machines), an Open MPI daemon started for each through an rsh agent that runs the
# command here instead of over ssh, and TCP between every pair of ranks (Open MPI's tcp transport; the
# shared-memory one would mistake the two "nodes" for one). Each "node" gets half the ranks, in order:
# ranks 0 .. N/2-1 on the first, like a hostfile with N/2 slots a node.
#   scripts/two_nodes.sh N PROGRAM [ARGS...]      e.g. scripts/two_nodes.sh 4 build/release/04_ddp/04_ddp --verify
# Not a network: both "nodes" share this machine's cores and memory, and TCP runs over the loopback.
set -euo pipefail
if [[ $# -lt 2 || ! "$1" =~ ^[0-9]+$ || $(( $1 % 2 )) -ne 0 || "$1" -lt 2 ]]; then
  echo "usage: scripts/two_nodes.sh N PROGRAM [ARGS...]  (N even, at least 2: N/2 ranks a node)" >&2
  exit 2
fi
ranks=$1
shift
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf '127.0.0.2 slots=%d\n127.0.0.3 slots=%d\n' $((ranks / 2)) $((ranks / 2)) >"$work/hosts"
# The rsh agent: Open MPI calls it as `agent [options] HOST COMMAND...` to start a daemon on HOST. Each
# "node" keeps its session folders apart, as separate machines would (two daemons creating the same
# folder at once make one of them fail).
cat >"$work/rsh" <<AGENT
#!/bin/sh
while [ "\$#" -gt 0 ]; do case "\$1" in -*) shift ;; *) break ;; esac; done
mkdir -p "$work/\$1"
export OMPI_MCA_orte_tmpdir_base="$work/\$1"
shift
exec /bin/sh -c "\$*"
AGENT
chmod +x "$work/rsh"
flags=()
[[ $(id -u) -eq 0 ]] && flags+=(--allow-run-as-root)
(( ranks > $(nproc) )) && flags+=(--oversubscribe)
# rtc ^hwloc: two daemons on one machine would share hwloc's topology segment (and crash writing it).
mpirun "${flags[@]}" -np "$ranks" --hostfile "$work/hosts" --mca plm_rsh_agent "$work/rsh" --mca rtc ^hwloc \
       --mca btl self,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo "$@"
