#!/bin/bash
# Chapter 04_ddp on a PBS Pro / OpenPBS cluster: 2 nodes x 4 GPUs, one rank per GPU: data parallelism, verified in lock-step.
#   qsub 04_ddp/jobs/pbs.sh
# Written by scripts/job_scripts.py from its table: change the table, then run it with `write`.
#PBS -N 04_ddp
#PBS -l select=2:ncpus=32:ngpus=4:mpiprocs=4
#PBS -l walltime=00:30:00
#PBS -j oe
set -euo pipefail
cd "$PBS_O_WORKDIR"
export OPENBLAS_NUM_THREADS=1
ranks=$(wc -l < "$PBS_NODEFILE")   # one line per MPI process
mpirun -np "$ranks" --hostfile "$PBS_NODEFILE" --map-by ppr:4:node \
       build/release/04_ddp/04_ddp --backend nccl --global-batch 1024 --steps 200 --verify \
       --metrics "04_ddp_${PBS_JOBID}.jsonl"
