#!/bin/bash
# Chapter 01_single_gpu on a PBS Pro / OpenPBS cluster: 1 node x 1 GPU, one rank per GPU: the single-GPU training loop.
#   qsub 01_single_gpu/jobs/pbs.sh
# Written by scripts/job_scripts.py from its table: change the table, then run it with `write`.
#PBS -N 01_single_gpu
#PBS -l select=1:ncpus=32:ngpus=1:mpiprocs=1
#PBS -l walltime=00:30:00
#PBS -j oe
set -euo pipefail
cd "$PBS_O_WORKDIR"
export OPENBLAS_NUM_THREADS=1
ranks=$(wc -l < "$PBS_NODEFILE")   # one line per MPI process
mpirun -np "$ranks" --hostfile "$PBS_NODEFILE" --map-by ppr:1:node \
       build/release/01_single_gpu/01_single_gpu --device cuda --model mlp --batch-size 32 --epochs 200 \
       --metrics "01_single_gpu_${PBS_JOBID}.jsonl"
