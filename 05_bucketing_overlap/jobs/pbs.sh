#!/bin/bash
# Chapter 05_bucketing_overlap on a PBS Pro / OpenPBS cluster: 2 nodes x 4 GPUs, one rank per GPU: buckets overlapping backward.
#   qsub 05_bucketing_overlap/jobs/pbs.sh
# Written by scripts/job_scripts.py from its table: change the table, then run it with `write`.
#PBS -N 05_bucketing_overlap
#PBS -l select=2:ncpus=32:ngpus=4:mpiprocs=4
#PBS -l walltime=00:30:00
#PBS -j oe
set -euo pipefail
cd "$PBS_O_WORKDIR"
export OPENBLAS_NUM_THREADS=1
ranks=$(wc -l < "$PBS_NODEFILE")   # one line per MPI process
mpirun -np "$ranks" --hostfile "$PBS_NODEFILE" --map-by ppr:4:node \
       build/release/05_bucketing_overlap/05_bucketing_overlap --backend nccl --steps 100 --verify \
       --metrics "05_bucketing_overlap_${PBS_JOBID}.jsonl"
