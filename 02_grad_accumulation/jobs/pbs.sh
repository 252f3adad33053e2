#!/bin/bash
# Chapter 02_grad_accumulation on a PBS Pro / OpenPBS cluster: 1 node x 1 GPU, one rank per GPU: gradient accumulation against one big batch.
#   qsub 02_grad_accumulation/jobs/pbs.sh
# Written by scripts/job_scripts.py from its table: change the table, then run it with `write`.
#PBS -N 02_grad_accumulation
#PBS -l select=1:ncpus=32:ngpus=1:mpiprocs=1
#PBS -l walltime=00:30:00
#PBS -j oe
set -euo pipefail
cd "$PBS_O_WORKDIR"
export OPENBLAS_NUM_THREADS=1
ranks=$(wc -l < "$PBS_NODEFILE")   # one line per MPI process
mpirun -np "$ranks" --hostfile "$PBS_NODEFILE" --map-by ppr:1:node \
       build/release/02_grad_accumulation/02_grad_accumulation --device cuda --accum 4 --epochs 20 \
       --metrics "02_grad_accumulation_${PBS_JOBID}.jsonl"
