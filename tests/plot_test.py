#!/usr/bin/env python3
"""scripts/plot.py's scaling arithmetic and scripts/sweep.sh's settings, checked:

  plot_test.py speedup          medians, spreads, the noisy mark, speedup and efficiency, the threads per
                                rank, the efficiency axis, a point above ideal flagged with its reason;
                                05's overlap slower than none and unequal compute flagged; on recorded
                                metrics (no run, no timing)
  plot_test.py sweep BUILD      sweep.sh runs every rank count, the 1-rank baseline too, REPEATS times
                                with the same threads per rank, and refuses a bad setting (runs chapter 04)
Exit code 0 when all hold, 1 otherwise.
"""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import plot  # noqa: E402
from checks import check, failures  # noqa: E402  (tests/, beside this file)


def metrics(folder, name, ranks, samples_per_s, threads=1, cores=2, **more):
    path = Path(folder) / name
    path.write_text(json.dumps({"event": "cpu_cores", "threads": threads}) + "\n" +
                    json.dumps({"event": "ddp_summary", "ranks": ranks, "samples_per_s": samples_per_s,
                                "local_size": ranks, "cores": cores, **more}) + "\n")
    return str(path)


def speedup():
    with tempfile.TemporaryDirectory() as folder:
        runs = {1: [100, 102, 98, 101, 99], 2: [190, 195, 185, 200, 180], 4: [150, 120, 160, 140, 155]}
        paths = [metrics(folder, f"np{r}_{k}.jsonl", r, v) for r, values in runs.items() for k, v in enumerate(values)]
        points = plot.scaling_points(paths)
        check([p.ranks for p in points] == [1, 2, 4], "repeats are grouped by rank count, sorted")
        check([p.median for p in points] == [100, 190, 150], f"medians {[p.median for p in points]}")
        check(abs(points[1].spread - 20 / 190) < 1e-12 and points[1].noisy, "a spread of 10.5% of the median is noisy")
        check(abs(points[0].spread - 0.04) < 1e-12 and not points[0].noisy, "a spread of 4% is not")
        check(points[2].oversubscribed and not points[1].oversubscribed, "4 ranks on 2 cores are oversubscribed")
        rows, lines = plot.scaling(points, "strong")
        check(abs(rows[1][1] - 1.9) < 1e-12 and abs(rows[1][2] - 0.95) < 1e-12, "speedup and efficiency of the medians")
        check("NOISY" in lines[1] and "NOISY" not in lines[0] and "median of 5" in lines[1], f"the lines say so: {lines}")
        even = plot.ScalingPoint(1)
        even.samples_per_s = [4, 1, 3, 2]
        check(even.median == 2.5, "an even count's median is the middle two's mean")
        check(plot.threads_per_rank({"strong": points}) == 1, "one thread per rank everywhere")
        check(plot.efficiency_top({"strong": points}) == 1.2, "the efficiency axis keeps its 1.2 when every point is below")
        fast = [metrics(folder, "fast1.jsonl", 1, 100), metrics(folder, "fast2.jsonl", 2, 300)]
        fast_points = plot.scaling_points(fast)
        check(abs(plot.efficiency_top({"weak": fast_points}) - 1.65) < 1e-12, "a super-linear point widens the axis")
        rows, _ = plot.scaling(fast_points, "weak")
        flagged = plot.contradictions(rows, "weak", True)
        check(len(flagged) == 1 and "ABOVE IDEAL (efficiency 1.50)" in flagged[0] and "2 ranks" in flagged[0],
              f"a super-linear point is flagged with its reason: {flagged}")
        check("different threads" in plot.contradictions(rows, "weak", False)[0], "threads that differ are the reason given")
        check(plot.contradictions(plot.scaling(points, "strong")[0], "strong", True) == [], "no flag at or below ideal")
        sized = [metrics(folder, f"gpt{k}.jsonl", 1, 10, parameters=1234567, step_ms=ms) for k, ms in enumerate((30, 31, 90))]
        check(plot.workload({"strong": plot.scaling_points(sized)}) == "1,234,567 parameters, one rank's step 31.0 ms",
              "the chart names the model's size and one rank's median step")
        mixed = paths[:5] + [metrics(folder, "threads2.jsonl", 2, 190, threads=2)]
        check(plot.threads_per_rank({"strong": plot.scaling_points(mixed)}) is None, "threads that differ are found")
        # The chart itself: drawn, with the setting and the noisy points named.
        drawn = subprocess.run([sys.executable, str(ROOT / "scripts" / "plot.py"), "speedup", str(Path(folder) / "s.png"),
                                "--strong", *paths], capture_output=True, text=True)
        check(drawn.returncode == 0 and (Path(folder) / "s.png").is_file(), f"the chart is drawn: {drawn.stderr[-500:]}")
        check("1 thread per rank at every rank count" in drawn.stdout and "2 of 3 point(s) NOISY" in drawn.stdout,
              f"the chart's summary names the threads and the noisy points:\n{drawn.stdout}")
        caption = Path(folder) / "s.caption.txt"
        check(caption.is_file() and "NOISY" in caption.read_text(), "the caption file holds the chart's notes")
        victim = Path(folder) / "victim.txt"
        victim.write_text("keep me")
        caption.unlink()
        caption.symlink_to(victim)
        subprocess.run([sys.executable, str(ROOT / "scripts" / "plot.py"), "speedup", str(Path(folder) / "s.png"),
                        "--strong", *paths], capture_output=True, text=True)
        check(victim.read_text() == "keep me" and not caption.is_symlink(), "a caption that is a link is replaced, not followed")
        drawn = subprocess.run([sys.executable, str(ROOT / "scripts" / "plot.py"), "speedup", str(Path(folder) / "m.png"),
                                "--strong", *mixed], capture_output=True, text=True)
        check("THREADS PER RANK DIFFER" in drawn.stdout, "a sweep whose points differ in threads says so")


def overlap():
    def mode(name, compute, exposed):
        return {"mode": name, "compute_ms": compute, "exposed_ms": exposed, "step_ms": compute + exposed}
    notes = plot.overlap_notes([mode("flat", 20, 10), mode("buckets", 20, 8), mode("buckets+overlap", 26, 4)])
    check(len(notes) == 2 and "SLOWER THAN buckets" in notes[0] and "compute took 30% longer" in notes[0] and
          "DIFFERS by 30%" in notes[1], f"overlap slower than none, by its compute, and unequal compute: {notes}")
    notes = plot.overlap_notes([mode("buckets", 20, 8), mode("buckets+overlap", 21, 9)])
    check(len(notes) == 1 and "exposed communication was longer (9.0 against 8.0 ms)" in notes[0],
          f"overlap slower by its exposed communication: {notes}")
    check(plot.overlap_notes([mode("buckets", 20, 8), mode("buckets+overlap", 20, 3)]) == [], "no note when overlap pays")


def sweep(build):
    env = dict(os.environ, COURSE_BUILD=build, STEPS="3", REPEATS="2", STRONG_BATCH="16", WEAK_PER_RANK="8",
               SWEEP_ARGS="--hidden 8 --layers 2")
    for name, value in (("REPEATS", "0"), ("THREADS_PER_RANK", "two"), ("STEPS", "-1"), ("WORKLOAD", "cnn")):
        with tempfile.TemporaryDirectory() as folder:
            refused = subprocess.run([str(ROOT / "scripts" / "sweep.sh"), folder, "1"], env=dict(env, **{name: value}),
                                     capture_output=True, text=True)
            check(refused.returncode == 2 and name in refused.stderr and not os.listdir(folder),
                  f"sweep.sh refuses {name}={value} before running ({refused.returncode}: {refused.stderr.strip()})")
    with tempfile.TemporaryDirectory() as folder:
        ran = subprocess.run([str(ROOT / "scripts" / "sweep.sh"), folder, "1", "2"], env=env, capture_output=True, text=True)
        check(ran.returncode == 0, f"sweep.sh runs ({ran.stdout[-1000:]}{ran.stderr[-1000:]})")
        for mode in ("strong", "weak"):
            for ranks in (1, 2):
                for k in (1, 2):
                    path = Path(folder) / "sweep" / f"{mode}_np{ranks}_r{k}.jsonl"
                    records = plot.read(path) if path.is_file() else []
                    cores = plot.events(records, "cpu_cores")
                    summary = plot.events(records, "ddp_summary")
                    check(cores and all(c["threads"] == 1 for c in cores) and summary and summary[-1]["ranks"] == ranks,
                          f"{path.name}: {ranks} rank(s), each with 1 thread")
        check("1 thread per rank at every rank count" in ran.stdout, "the chart says the threads per rank")
        caption = Path(folder) / "speedup.caption.txt"
        check(caption.is_file() and "1 thread per rank" in caption.read_text(), "the chart's caption is written beside it")


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "speedup":
        speedup()
        overlap()
    elif len(sys.argv) >= 3 and sys.argv[1] == "sweep":
        sweep(sys.argv[2])
    else:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    print(f"{'PASSED' if not failures else 'FAILED'}: {len(failures)} failure(s)")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
