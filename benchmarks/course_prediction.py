#!/usr/bin/env python3
"""The planner against the course's own runs on this machine: step time and memory per rank.

Calibrates the planner on this machine (plan --calibrate: its ops' costs and the memory's bandwidth; the
link from chapter 03's alpha-beta fit, at each rank count the runs use), runs chapters 04, 07 and 08 at
their grids of 1 to 8 ranks under mpirun (one thread a rank), and prints each measured figure beside the
planner's prediction of it (plan --calibration) and their ratio. A benchmark, not a test: the figures
are timings of this machine.

    python3 benchmarks/course_prediction.py build/release [--out FILE.jsonl]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

# The chapters' GPT: 2 layers of 64 with 4 heads, on 2-digit additions (8 tokens, a vocabulary of 12).
SHAPE = "2,64,4,8,12"
MPIRUN = ["mpirun", "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])

# (label, chapter, ranks, flags, grid DP,TP,PP,CP, micro-batch, global batch, ZeRO stage)
RUNS = [
    ("04 DDP", "04_ddp", 1, ["--model", "gpt", "--global-batch", "48"], (1, 1, 1, 1), 48, 48, 0),
    ("04 DDP", "04_ddp", 2, ["--model", "gpt", "--global-batch", "48"], (2, 1, 1, 1), 24, 48, 0),
    ("04 DDP", "04_ddp", 3, ["--model", "gpt", "--global-batch", "48"], (3, 1, 1, 1), 16, 48, 0),
    ("04 DDP", "04_ddp", 4, ["--model", "gpt", "--global-batch", "48"], (4, 1, 1, 1), 12, 48, 0),
    ("08 one rank", "08_tensor_pipeline", 1, [], (1, 1, 1, 1), 12, 48, 0),
    ("08 TP 2", "08_tensor_pipeline", 2, ["--tp", "2"], (1, 2, 1, 1), 12, 48, 0),
    ("08 PP 2", "08_tensor_pipeline", 2, ["--pp", "2"], (1, 1, 2, 1), 12, 48, 0),
    ("08 CP 2", "08_tensor_pipeline", 2, ["--cp", "2"], (1, 1, 1, 2), 12, 48, 0),
    ("08 DP 2", "08_tensor_pipeline", 2, ["--dp", "2"], (2, 1, 1, 1), 6, 48, 0),
    ("08 TP 2 x PP 2", "08_tensor_pipeline", 4, ["--tp", "2", "--pp", "2"], (1, 2, 2, 1), 12, 48, 0),
    ("08 DP 2 x TP 2 x PP 2", "08_tensor_pipeline", 8, ["--dp", "2", "--tp", "2", "--pp", "2"], (2, 2, 2, 1), 6, 48, 0),
    ("07 ZeRO-1", "07_zero", 2, ["--model", "gpt", "--global-batch", "48", "--stage", "1"], (2, 1, 1, 1), 24, 48, 1),
    ("07 ZeRO-2", "07_zero", 3, ["--model", "gpt", "--global-batch", "48", "--stage", "2"], (3, 1, 1, 1), 16, 48, 2),
    ("07 ZeRO-3", "07_zero", 4, ["--model", "gpt", "--global-batch", "48", "--stage", "3"], (4, 1, 1, 1), 12, 48, 3),
]


def records(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def run(command):
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"course_prediction: {' '.join(command)} failed ({result.returncode}):\n{result.stdout}{result.stderr}")
    return result.stdout


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build", help="the build folder (build/release)")
    parser.add_argument("--out", help="write each comparison as a JSON line to FILE")
    args = parser.parse_args()
    binary = lambda name: os.path.join(args.build, name, name) if name[0].isdigit() else os.path.join(args.build, "benchmarks", name)
    with tempfile.TemporaryDirectory() as scratch:
        # Chapter 03's alpha-beta fit with as many ranks on the machine as each run has: more ranks than
        # cores wait for each other's turn on a core, which a message's latency then carries.
        links = {}
        for ranks in sorted({r[2] for r in RUNS if r[2] > 1}):
            links[ranks] = os.path.join(scratch, f"03_np{ranks}.jsonl")
            run(MPIRUN + ["-np", str(ranks), binary("03_collectives"), "--mode", "bench", "--ops", "all_reduce",
                          "--maxbytes", "4M", "--metrics", links[ranks]])
            fit = next(r for r in records(links[ranks]) if r.get("event") == "alpha_beta")
            print(f"link at {ranks} ranks: alpha {fit['alpha_us']:.1f} us, {fit['bandwidth_gbps']:.2f} GB/s")
        calibration = os.path.join(scratch, "calibration.json")
        print(run([binary("plan"), "--calibrate", calibration, "--link", links[2]]).strip())
        print(f"{'run':24} {'ranks':>5}  {'step ms':>8} {'predicted':>9} {'ratio':>6}   {'memory':28} {'MiB':>7} {'predicted':>9} {'ratio':>6}")
        rows = []
        for label, chapter, ranks, flags, grid, micro_batch, global_batch, zero in RUNS:
            metrics = os.path.join(scratch, f"{chapter}_{ranks}.jsonl")
            run(MPIRUN + ["-np", str(ranks), binary(chapter)] + flags + ["--metrics", metrics])
            got = records(metrics)
            predicted_path = os.path.join(scratch, "plan.jsonl")
            run([binary("plan"), "--calibration", calibration, "--shape", SHAPE, "--grid", ",".join(map(str, grid)),
                 "--micro-batch", str(micro_batch), "--global-batch", str(global_batch), "--precision", "fp32",
                 "--zero", str(zero), "--metrics", predicted_path] + (["--link", links[ranks]] if ranks > 1 else []))
            plan = records(predicted_path)[0]
            row = {"run": label, "ranks": ranks, "predicted_step_ms": 1e3 * plan["step_seconds"]}
            if chapter == "04_ddp":
                row["step_ms"] = next(r for r in got if r.get("event") == "ddp_summary")["step_ms"]
            elif chapter == "08_tensor_pipeline":
                throughput = next(r for r in got if r.get("event") == "throughput")
                row["step_ms"] = throughput["step_ms"]
                row["memory"], row["bytes"] = "peak activations (stage 0)", throughput["peak_activation_bytes"][0]
                row["predicted_bytes"] = plan["activations_bytes"]
            if chapter == "07_zero":
                stage = next(r for r in got if r.get("event") == "zero_stage" and r["stage"] == zero)
                row["memory"] = "parameters + gradients + Adam"
                row["bytes"] = stage["params_bytes"] + stage["grads_bytes"] + stage["adam_bytes"]
                row["predicted_bytes"] = plan["parameters_bytes"] + plan["gradients_bytes"] + plan["optimizer_bytes"]
            step = f"{row['step_ms']:8.2f} {row['predicted_step_ms']:9.2f} {row['predicted_step_ms'] / row['step_ms']:6.2f}" \
                if "step_ms" in row else f"{'':8} {'':9} {'':6}"
            memory = f"{row['memory']:28} {row['bytes'] / 2**20:7.3f} {row['predicted_bytes'] / 2**20:9.3f} " \
                     f"{row['predicted_bytes'] / row['bytes']:6.2f}" if "bytes" in row else ""
            print(f"{label:24} {ranks:5}  {step}   {memory}")
            rows.append(row)
        if args.out:
            with open(args.out, "w") as f:
                for row in rows:
                    f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
