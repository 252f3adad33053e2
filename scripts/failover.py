#!/usr/bin/env python3
"""Runs an mpirun job and restarts it after a failure, as torchrun --max-restarts does.

    scripts/failover.py --np 4 --max-restarts 3 [--min-ranks 2] -- PROGRAM [ARGS...]

Each attempt runs `mpirun -np N PROGRAM ARGS` with COURSE_RESTART_COUNT set to the attempt number
(0 first; chapter 06 injects its faults on attempt 0 only). After a failure the job is started again,
with --resume when its --ckpt-dir holds a checkpoint, so it continues from the newest good one. With
--min-ranks below --np the restart is elastic: it assumes the failed rank's machine is gone and
restarts with one rank fewer each time, never fewer than --min-ranks. A usage error (exit code 2)
is not retried: the same flags would fail again; nor is a job that mpirun could not start at all (a
missing program, too few slots), nor one that ran to a FAILED verdict (its check found a wrong result:
not a crash, and a restart would repeat it). SIGTERM and SIGINT sent to the launcher go to the job, as torchrun
passes them to its workers, and end the launcher without a restart. Standard library only.
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys

RESUMED = re.compile(r"resumed from step (\d+)")
# A chapter's verdict, its last line (rank 0's log): the job ran to the end and checked its result.
VERDICT = re.compile(r"^(PASSED|FAILED)$")
# What mpirun says when it cannot start the job at all (its exit code then means nothing of signals).
LAUNCH_FAILED = re.compile(r"mpirun was unable to (launch|find)|processes failed to start|not enough slots available|"
                           r"mpirun could not find")

# The job in flight, and the signal that asked the launcher to stop.
current_job = None
stopping = None


def forward(signum, _frame):
    global stopping
    stopping = signum
    if current_job is not None and current_job.poll() is None:
        current_job.send_signal(signum)


def say(text):
    print(f"failover: {text}", flush=True)


def mpirun_command(mpirun, ranks, program):
    command = [mpirun, "-np", str(ranks), "-x", "COURSE_RESTART_COUNT"]
    if os.geteuid() == 0:
        command.append("--allow-run-as-root")
    if ranks > (os.cpu_count() or 1):
        command.append("--oversubscribe")
    return command + program


def checkpoint_folder(program):
    """The job's --ckpt-dir, if it names one."""
    for i, arg in enumerate(program):
        if arg == "--ckpt-dir" and i + 1 < len(program):
            return program[i + 1]
        if arg.startswith("--ckpt-dir="):
            return arg.split("=", 1)[1]
    return None


def has_checkpoint(folder):
    if not folder or not os.path.isdir(folder):
        return False
    return any(name == "latest" or (name.startswith("step_") and name.endswith(".safetensors"))
               for name in os.listdir(folder))


def describe_exit(code):
    if code < 0:
        return f"killed by signal {-code} ({signal.Signals(-code).name})"
    if code > 128 and code - 128 in signal.valid_signals():
        return f"exit code {code}: a rank was killed by signal {code - 128} ({signal.Signals(code - 128).name})"
    return f"exit code {code}"


def run_attempt(command, attempt):
    """Runs one attempt, passing its output through; returns (exit code, step resumed from or None,
    whether mpirun could not start it, its verdict or None)."""
    global current_job
    env = dict(os.environ, COURSE_RESTART_COUNT=str(attempt))
    resumed, launch_failed, verdict = None, False, None
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
                          bufsize=1) as job:
        current_job = job
        if stopping is not None:  # a signal that came between two attempts
            job.send_signal(stopping)
        for line in job.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            match = RESUMED.search(line)
            if match:
                resumed = int(match.group(1))
            launch_failed = launch_failed or LAUNCH_FAILED.search(line) is not None
            found = VERDICT.match(line.strip())
            if found:
                verdict = found.group(1)
    current_job = None
    return job.returncode, resumed, launch_failed, verdict


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     usage="%(prog)s --np N [--max-restarts R] [--min-ranks M] -- PROGRAM [ARGS...]")
    parser.add_argument("--np", type=int, required=True, help="ranks of the first attempt")
    parser.add_argument("--max-restarts", type=int, default=3, help="restarts after failures (default 3)")
    parser.add_argument("--min-ranks", type=int, help="restart with fewer ranks, never below M (default: --np)")
    parser.add_argument("--mpirun", default=shutil.which("mpirun") or "mpirun", help="the launcher to run")
    parser.add_argument("program", nargs=argparse.REMAINDER, help="-- PROGRAM [ARGS...]")
    args = parser.parse_args()
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    min_ranks = args.np if args.min_ranks is None else args.min_ranks
    if not program:
        parser.error("no program: give it after --")
    if args.np < 1:
        parser.error(f"--np: {args.np} must be at least 1")
    if args.max_restarts < 0:
        parser.error(f"--max-restarts: {args.max_restarts} must be 0 or more")
    if not 1 <= min_ranks <= args.np:
        parser.error(f"--min-ranks: {min_ranks} must be between 1 and --np {args.np}")
    if shutil.which(args.mpirun) is None:
        parser.error(f"--mpirun: {args.mpirun} is not a program that can be run")

    ranks, folder = args.np, checkpoint_folder(program)
    history = []
    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    for attempt in range(args.max_restarts + 1):
        command = program
        if attempt > 0 and has_checkpoint(folder) and "--resume" not in program:
            command = program + ["--resume"]
        say(f"attempt {attempt + 1} of {args.max_restarts + 1}: {ranks} ranks: {' '.join(command)}")
        code, resumed, launch_failed, verdict = run_attempt(mpirun_command(args.mpirun, ranks, command), attempt)
        if resumed is not None:
            say(f"attempt {attempt + 1} resumed from step {resumed}")
            history.append(f"attempt {attempt + 1} resumed from step {resumed} at {ranks} ranks")
        if code == 0:
            restarts = f"{attempt} restart{'s' if attempt != 1 else ''}"
            say(f"finished after {restarts}" + (f" ({'; '.join(history)})" if history else ""))
            return 0
        if stopping is not None:
            say(f"stopped by {signal.Signals(stopping).name}, passed to the job (exit code {code}); not restarting")
            return 128 + stopping
        if code == 2:
            say("the job rejected its flags (exit code 2); restarting would not help")
            return 2
        if verdict == "FAILED":
            say(f"the job ran to its verdict, FAILED (exit code {code}): its check found a wrong result, which is "
                "not a crash; restarting would repeat it")
            return code if code != 0 else 1
        if launch_failed:
            say(f"mpirun could not start the job (exit code {code}; see its message above); restarting would not help")
            return code
        say(f"attempt {attempt + 1} failed: {describe_exit(code)}")
        if attempt == args.max_restarts:
            break
        if ranks > min_ranks:
            ranks -= 1
            say(f"restarting with {ranks} ranks (elastic: the failed rank's machine is assumed lost; "
                f"--min-ranks {min_ranks})")
        else:
            say(f"restarting with {ranks} ranks, from the newest good checkpoint" if has_checkpoint(folder)
                else f"restarting with {ranks} ranks, from the start (no checkpoint yet)")
    say(f"gave up after {args.max_restarts} restarts")
    return 1


if __name__ == "__main__":
    sys.exit(main())
