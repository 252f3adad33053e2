#!/usr/bin/env python3
"""Every chapter's cluster job scripts, Slurm (NN/jobs/slurm.sbatch, for sbatch) and PBS (NN/jobs/pbs.sh, for
qsub), written from one table so that they never disagree with each other or with the chapters' flags.

  job_scripts.py write             (re)writes every chapter's two scripts
  job_scripts.py check BUILD_DIR   a dry run, as no scheduler is here: each script as written is the
                                   table's, passes bash -n, asks for nodes x ranks a node that agree with
                                   its launch line, names only flags its chapter's --help lists, and its
                                   command runs on this machine (under mpirun, on the CPU, 2 steps)
"""
import os
import re
import shlex
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# chapter, nodes, GPUs (ranks) a node, the chapter's flags on a cluster, and what the job shows.
CHAPTERS = [
    ("01_single_gpu", 1, 1, "--device cuda --model mlp --batch-size 32 --epochs 200", "the single-GPU training loop"),
    ("02_grad_accumulation", 1, 1, "--device cuda --accum 4 --epochs 20", "gradient accumulation against one big batch"),
    ("03_collectives", 2, 4, "--backend nccl --mode all -e 256M", "the collectives' bandwidth inside and across nodes"),
    ("04_ddp", 2, 4, "--backend nccl --global-batch 1024 --steps 200 --verify", "data parallelism, verified in lock-step"),
    ("05_bucketing_overlap", 2, 4, "--backend nccl --steps 100 --verify", "buckets overlapping backward"),
    ("06_checkpoint_failover", 2, 4, "--backend nccl --steps 200 --ckpt-every 50 --ckpt-dir checkpoints_06 --verify",
     "checkpoints a requeued job resumes from (add --resume to its flags)"),
    ("07_zero", 2, 4, "--backend nccl --stage 3 --steps 100 --verify", "ZeRO stage 3 across nodes"),
    ("08_tensor_pipeline", 2, 4, "--backend nccl --tp 4 --pp 2 --steps 100 --verify",
     "TP inside each node, PP across the two (the planner's rule)"),
]

SLURM = """#!/bin/bash
# Chapter {name} on a Slurm cluster: {shape}, one rank per GPU: {what}.
#   sbatch {name}/jobs/slurm.sbatch          (from the repository root, after scripts/setup.sh)
# Written by scripts/job_scripts.py from its table: change the table, then run it with `write`.
#SBATCH --job-name={name}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node={per_node}
#SBATCH --gpus-per-node={per_node}
#SBATCH --cpus-per-task=8
#SBATCH --time=00:30:00
#SBATCH --output={name}_%j.out
set -euo pipefail
export OPENBLAS_NUM_THREADS=1   # the CPU BLAS should not compete with the other ranks
# srun starts one task per rank; Open MPI reads the ranks and local ranks from Slurm.
# (If your Open MPI was built without Slurm support, use: mpirun -np $SLURM_NTASKS instead.)
srun --mpi=pmix build/release/{name}/{name} {flags} \\
     --metrics "{name}_${{SLURM_JOB_ID}}.jsonl"
"""

PBS = """#!/bin/bash
# Chapter {name} on a PBS Pro / OpenPBS cluster: {shape}, one rank per GPU: {what}.
#   qsub {name}/jobs/pbs.sh
# Written by scripts/job_scripts.py from its table: change the table, then run it with `write`.
#PBS -N {name}
#PBS -l select={nodes}:ncpus=32:ngpus={per_node}:mpiprocs={per_node}
#PBS -l walltime=00:30:00
#PBS -j oe
set -euo pipefail
cd "$PBS_O_WORKDIR"
export OPENBLAS_NUM_THREADS=1
ranks=$(wc -l < "$PBS_NODEFILE")   # one line per MPI process
mpirun -np "$ranks" --hostfile "$PBS_NODEFILE" --map-by ppr:{per_node}:node \\
       build/release/{name}/{name} {flags} \\
       --metrics "{name}_${{PBS_JOBID}}.jsonl"
"""


def scripts_of(name, nodes, per_node, flags, what):
    """{path: text}: one chapter's two scripts."""
    shape = f"{nodes} node{'s' if nodes > 1 else ''} x {per_node} GPU{'s' if per_node > 1 else ''}"
    fields = dict(name=name, nodes=nodes, per_node=per_node, flags=flags, what=what, shape=shape)
    return {os.path.join(name, "jobs", "slurm.sbatch"): SLURM.format(**fields),
            os.path.join(name, "jobs", "pbs.sh"): PBS.format(**fields)}


def scripts():
    """{path: text} for every chapter's two scripts."""
    return {path: text for chapter in CHAPTERS for path, text in scripts_of(*chapter).items()}


def write():
    for path, text in scripts().items():
        full = os.path.join(ROOT, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as f:
            f.write(text)
        os.chmod(full, 0o755)
    return 0


def launch_line(text):
    """The launched command of a script: its binary and its flags (continuations joined)."""
    joined = text.replace("\\\n", " ")
    line = next(l for l in joined.splitlines() if "build/release/" in l and not l.lstrip().startswith("#"))
    words = shlex.split(line)
    at = next(i for i, w in enumerate(words) if w.startswith("build/release/"))
    return words[:at], words[at], words[at + 1:]


RUN = set()  # the commands already run


def check_script(path, text, chapter, build):
    """What is wrong with one script (an empty list when nothing is)."""
    name, nodes, per_node = chapter[:3]
    failures = []
    if subprocess.run(["bash", "-n", os.path.join(ROOT, path)]).returncode != 0:
        failures.append(f"{path}: bash -n fails")
    launcher, binary, args = launch_line(text)
    if path.endswith("slurm.sbatch"):
        asked = [int(re.search(pattern, text).group(1)) for pattern in (r"--nodes=(\d+)", r"--ntasks-per-node=(\d+)")]
        if launcher[:1] != ["srun"] or asked != [nodes, per_node]:
            failures.append(f"{path}: srun with {asked} does not start {nodes} x {per_node} ranks")
    else:
        asked = re.search(r"select=(\d+):.*mpiprocs=(\d+)", text)
        if not asked or [int(asked.group(1)), int(asked.group(2))] != [nodes, per_node] or \
                f"ppr:{per_node}:node" not in launcher:
            failures.append(f"{path}: select and --map-by do not give {nodes} x {per_node} ranks")
    exe = os.path.join(os.path.abspath(build), binary[len("build/release/"):])
    help_text = subprocess.run([exe, "--help"], capture_output=True, text=True).stdout
    listed = set(re.findall(r"(?:^|[ ,])(--?[a-z0-9][a-z0-9-]*)", help_text, re.M))
    for flag in (w for w in args if w.startswith("-")):
        if flag not in listed:
            failures.append(f"{path}: {flag} is not a flag of {name} (its --help)")
    # The command itself, on this machine: 2 ranks (the job's own count where its grid pins it, --tp or
    # --pp), the CPU and the MPI backend, 2 steps or epochs, small messages, the job's files in a scratch
    # folder; once for a chapter's two scripts.
    if (exe, tuple(args)) in RUN:
        return failures
    RUN.add((exe, tuple(args)))
    with tempfile.TemporaryDirectory() as scratch:
        local = list(args)
        replace = {"--steps": "2", "--epochs": "2", "-e": "64K", "--device": "cpu", "--backend": "mpi",
                   "--metrics": os.path.join(scratch, "metrics.jsonl"), "--ckpt-dir": os.path.join(scratch, "ckpt")}
        for i, w in enumerate(local[:-1]):
            if w in replace:
                local[i + 1] = replace[w]
        if "--device" not in local:
            local += ["--device", "cpu"]
        ranks = nodes * per_node if {"--tp", "--pp"} & set(args) else min(2, nodes * per_node)
        command = ["mpirun", "-np", str(ranks), "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
        run = subprocess.run(command + [exe] + local, capture_output=True, text=True, cwd=scratch, timeout=300)
        if run.returncode != 0:
            failures.append(f"{path}: its command fails here: {' '.join(local)}\n{run.stdout[-800:]}{run.stderr[-800:]}")
    return failures


def check(build):
    if not os.path.isfile(os.path.join(build, "04_ddp", "04_ddp")):
        print(f"error: {build}: not a build folder of the course (no 04_ddp/04_ddp in it)", file=sys.stderr)
        return 2
    failures = []
    for chapter in CHAPTERS:
        for path, expected in scripts_of(*chapter).items():
            where = os.path.join(ROOT, path)
            text = open(where).read() if os.path.exists(where) else ""
            if text != expected:
                failures.append(f"{path}: not what scripts/job_scripts.py writes (run it with `write`)")
                continue
            failures += check_script(path, text, chapter, build)
    for failure in failures:
        print(failure, file=sys.stderr)
    print(f"{len(scripts())} job scripts checked: " + ("PASSED" if not failures else f"{len(failures)} FAILED"))
    return 1 if failures else 0


def main(argv):
    if len(argv) == 2 and argv[1] == "write":
        return write()
    if len(argv) == 3 and argv[1] == "check":
        return check(argv[2])
    print(__doc__.strip(), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
