#!/bin/bash
# Chapter 08_tensor_pipeline on a PBS Pro / OpenPBS cluster: 2 nodes x 4 GPUs, one rank per GPU: TP inside each node, PP across the two (the planner's rule).
#   qsub 08_tensor_pipeline/jobs/pbs.sh
# Written by scripts/job_scripts.py from its table: change the table, then run it with `write`.
#PBS -N 08_tensor_pipeline
#PBS -l select=2:ncpus=32:ngpus=4:mpiprocs=4
#PBS -l walltime=00:30:00
#PBS -j oe
set -euo pipefail
cd "$PBS_O_WORKDIR"
export OPENBLAS_NUM_THREADS=1
ranks=$(wc -l < "$PBS_NODEFILE")   # one line per MPI process
mpirun -np "$ranks" --hostfile "$PBS_NODEFILE" --map-by ppr:4:node \
       build/release/08_tensor_pipeline/08_tensor_pipeline --backend nccl --tp 4 --pp 2 --steps 100 --verify \
       --metrics "08_tensor_pipeline_${PBS_JOBID}.jsonl"
