#!/bin/bash
# Chapter 06_checkpoint_failover on a PBS Pro / OpenPBS cluster: 2 nodes x 4 GPUs, one rank per GPU: checkpoints a requeued job resumes from (add --resume to its flags).
#   qsub 06_checkpoint_failover/jobs/pbs.sh
# Written by scripts/job_scripts.py from its table: change the table, then run it with `write`.
#PBS -N 06_checkpoint_failover
#PBS -l select=2:ncpus=32:ngpus=4:mpiprocs=4
#PBS -l walltime=00:30:00
#PBS -j oe
set -euo pipefail
cd "$PBS_O_WORKDIR"
export OPENBLAS_NUM_THREADS=1
ranks=$(wc -l < "$PBS_NODEFILE")   # one line per MPI process
mpirun -np "$ranks" --hostfile "$PBS_NODEFILE" --map-by ppr:4:node \
       build/release/06_checkpoint_failover/06_checkpoint_failover --backend nccl --steps 200 --ckpt-every 50 --ckpt-dir checkpoints_06 --verify \
       --metrics "06_checkpoint_failover_${PBS_JOBID}.jsonl"
