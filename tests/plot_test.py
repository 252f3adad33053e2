#!/usr/bin/env python3
"""scripts/plot.py's scaling arithmetic and scripts/sweep.sh's settings, checked:

  plot_test.py speedup          medians, spreads, the noisy mark, speedup and efficiency, the threads per
                                rank, the efficiency axis, a point above ideal flagged with its reason;
                                the cost model's speedups and predicted/measured, with the reason where
                                they differ by more than 25%;
                                05's overlap slower than none and unequal compute flagged, each mode's
                                median over repeated runs and its spread; 03's benchmark summarised
                                with MPI's row as the library's; on recorded metrics (no run, no timing)
  plot_test.py schedules        08's schedules compared at equal p and m only; a stage off its theory
                                explained by the stages' measured work or by the transfers; zero bubble
                                idling more than 1F1B flagged with its reason (recorded metrics)
  plot_test.py sweep BUILD      sweep.sh runs every rank count, the 1-rank baseline too, REPEATS times
                                with the same threads per rank, prices each point of the MLP and the GPT
                                with the cost model, and refuses a bad setting (runs chapter 04)
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
import report  # noqa: E402
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
        check("no prediction beside these points" in drawn.stdout, "a chart without the model's prediction says why")
        model(folder, paths)


def model(folder, paths):
    """The cost model's prediction beside the measured points: its speedups, predicted/measured, the reason
    when they differ by more than 25%, and the chart with the calibration's date."""
    def plan(name, dp, seconds):
        path = Path(folder) / name
        path.write_text(json.dumps({"event": "plan", "dp": dp, "step_seconds": seconds}) + "\n")
        return str(path)
    strong = [plan("p1.jsonl", 1, 0.040), plan("p2.jsonl", 2, 0.020), plan("p4.jsonl", 4, 0.025)]
    def near(got, expected):
        return got.keys() == expected.keys() and all(abs(got[n] - expected[n]) < 1e-12 for n in got)
    check(near(plot.predicted_speedups("strong", strong), {1: 1.0, 2: 2.0, 4: 1.6}), "strong: t(1)/t(n)")
    check(near(plot.predicted_speedups("weak", strong), {1: 1.0, 2: 4.0, 4: 6.4}), "weak: n t(1)/t(n)")
    try:
        plot.predicted_speedups("strong", strong[1:])
        check(False, "a prediction without its 1-rank baseline is refused")
    except SystemExit as e:
        check("1-rank" in str(e), f"a prediction without its 1-rank baseline is refused: {e}")
    points = plot.scaling_points(paths)  # medians 100, 190 (noisy), 150 (4 ranks on 2 cores)
    rows, _ = plot.scaling(points, "strong")
    notes = plot.model_notes(rows, "strong", {1: 1.0, 2: 2.0, 4: 1.6})
    check(len(notes) == 2 and notes[0] == "strong at 2 ranks: measured 1.90x, the model 2.00x (predicted/measured 1.05)",
          f"within 25%: predicted/measured alone: {notes[:1]}")
    check(len(notes) == 2 and notes[1].startswith("strong at 4 ranks: measured 1.50x, the model 1.60x (predicted/measured 1.07)")
          and "off the model" not in notes[1], f"1.07 is within 25%: {notes[1:]}")
    notes = plot.model_notes(rows, "strong", {1: 1.0, 2: 2.0, 4: 2.0})
    check("off the model by +33%: more ranks than cores" in notes[1] and "spread" in notes[1],
          f"off by 33%, 4 ranks on 2 cores and noisy: both reasons: {notes[1:]}")
    quiet = plot.scaling_points([metrics(folder, f"q{r}_{k}.jsonl", r, v) for r, v in ((1, 100), (2, 120)) for k in range(3)])
    notes = plot.model_notes(plot.scaling(quiet, "weak")[0], "weak", {2: 1.8})
    check(len(notes) == 1 and "off the model by +50%: the ranks' MPI progress" in notes[0],
          f"off the model with neither noise nor oversubscription: the cores' competition named: {notes}")
    calibration = Path(folder) / "calibration.json"
    calibration.write_text("{}")
    os.utime(calibration, (1795086400, 1795086400))  # 2026-11-19 UTC
    drawn = subprocess.run([sys.executable, str(ROOT / "scripts" / "plot.py"), "speedup", str(Path(folder) / "p.png"),
                            "--strong", *paths, "--predicted-strong", *strong, "--calibration", str(calibration)],
                           capture_output=True, text=True)
    check(drawn.returncode == 0 and "calibrated on this machine on 2026-11-19" in drawn.stdout and
          "strong at 2 ranks: measured 1.90x, the model 2.00x" in drawn.stdout,
          f"the chart draws the prediction, its date and predicted/measured: {drawn.stdout[-600:]}{drawn.stderr[-600:]}")
    refused = subprocess.run([sys.executable, str(ROOT / "scripts" / "plot.py"), "speedup", str(Path(folder) / "r.png"),
                              "--strong", *paths, "--calibration", str(Path(folder) / "none.json")],
                             capture_output=True, text=True)
    check(refused.returncode == 2 and "--calibration" in refused.stderr and not (Path(folder) / "r.png").exists(),
          f"a missing calibration is refused, nothing drawn: {refused.returncode} {refused.stderr.strip()}")


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
    # Repeats: each mode's medians, the step's spread, the noisy marked; equal work, equal median compute.
    runs = [[mode("buckets", c, 8), mode("buckets+overlap", c + d, 3)] for c, d in ((20, 0), (30, 1), (21, -1), (19, 0), (22, 0))]
    merged = plot.mode_medians(runs)
    check([m["mode"] for m in merged] == ["buckets", "buckets+overlap"] and merged[0]["compute_ms"] == 21 and
          merged[1]["compute_ms"] == 20 and merged[0]["repeats"] == 5, f"each mode's median compute over the runs: {merged}")
    check(abs(merged[0]["spread"] - 11 / 29) < 1e-12 and merged[0]["step_ms"] == 29, "the step's spread around its median")
    notes = plot.overlap_notes(merged)
    check(len(notes) == 1 and notes[0].startswith("buckets, buckets+overlap NOISY"), f"both modes noisy, nothing else: {notes}")
    quiet = plot.overlap_notes(plot.mode_medians([[mode("flat", 20, 5), mode("buckets", c, 5)] for c in (26, 26.5, 25.5)]))
    check(any("DIFFERS by 30%" in n and "even the medians of 3 runs" in n for n in quiet),
          f"unequal compute after repeats says so: {quiet}")
    # The course's model beside each mode (--predict): predicted/measured, and past 25% the measured reason.
    def priced(name, compute, exposed, pc, pe, **more):
        return dict(mode(name, compute, exposed), predicted_compute_ms=pc, predicted_exposed_ms=pe, **more)
    said = plot.overlap_model_notes([priced("buckets", 30, 10, 30, 9), priced("buckets+overlap", 31, 9, 30, 1)])
    check(len(said) == 2 and said[0] == ("buckets: measured 40.0 ms a step (compute 30.0 + exposed 10.0), the model 39.0 "
                                         "(30.0 + 9.0): predicted/measured 0.97"),
          f"a mode on its model: predicted/measured, nothing more: {said}")
    check("off the model by -22%" not in said[1] and "predicted/measured 0.78" in said[1] and "off the model" not in said[1],
          f"22% off is within the model's 25%: {said}")
    said = plot.overlap_model_notes([priced("buckets", 30, 10, 30, 9), priced("buckets+overlap", 31, 10, 30, 1)])
    check("off the model by -24%" not in said[1] and "predicted/measured 0.76" in said[1], f"24% off, within: {said}")
    said = plot.overlap_model_notes([priced("buckets", 30, 10, 30, 9),
                                     priced("buckets+overlap", 32, 12, 30, 1, simulated_network=" (simulated)")])
    check("off the model by -30%" in said[1] and "overlap hid -20% of the bucketed communication where the model hides 89%"
          in said[1] and "the simulated network's wait costs no CPU" in said[1],
          f"overlap that hid less than the model: the measured fractions, and why: {said}")
    said = plot.overlap_model_notes([priced("flat", 50, 10, 30, 10, spread=0.3)])
    check("its compute took 50.0 ms against the model's 30.0" in said[0] and "spread by 30%" in said[0],
          f"a mode whose compute is off, noisy: {said}")
    check(plot.overlap_model_notes([mode("flat", 20, 10)]) == [], "no prediction, no line")
    with tempfile.TemporaryDirectory() as folder:
        paths = []
        for k, records in enumerate(runs):
            paths.append(Path(folder) / f"r{k}.jsonl")
            paths[-1].write_text("".join(json.dumps(dict(r, event="mode", ranks=2)) + "\n" for r in records))
        drawn = subprocess.run([sys.executable, str(ROOT / "scripts" / "plot.py"), "overlap", *map(str, paths),
                                str(Path(folder) / "o")], capture_output=True, text=True)
        caption = Path(folder) / "o_modes.caption.txt"
        check(drawn.returncode == 0 and (Path(folder) / "o_modes.png").is_file() and caption.is_file() and
              "NOISY" in caption.read_text(), f"the chart of five runs is drawn, its caption beside: {drawn.stderr[-500:]}")
        calibration = Path(folder) / "calibration.json"
        calibration.write_text("{}\n")
        paths[0].write_text("".join(json.dumps(priced(r["mode"], r["compute_ms"], r["exposed_ms"], 20, 5, event="mode",
                                                      ranks=2)) + "\n" for r in runs[0]))
        drawn = subprocess.run([sys.executable, str(ROOT / "scripts" / "plot.py"), "overlap", str(paths[0]),
                                str(Path(folder) / "p"), "--calibration", str(calibration)], capture_output=True, text=True)
        text = (Path(folder) / "p_modes.caption.txt").read_text() if drawn.returncode == 0 else ""
        check("buckets: measured 28.0 ms a step" in text and "calibrated on this machine on" in text,
              f"a run with --predict: the model's figures and the calibration's date in the caption: {drawn.stderr[-500:]}")
        refused = subprocess.run([sys.executable, str(ROOT / "scripts" / "plot.py"), "overlap", str(paths[0]),
                                  str(Path(folder) / "q"), "--calibration", str(Path(folder) / "none.json")],
                                 capture_output=True, text=True)
        check(refused.returncode == 2 and "--calibration" in refused.stderr, "a missing calibration file is refused")


def zero_time():
    """07's step per stage over repeats beside the course's model (plot.py zero, --predict's records)."""
    def stage(k, step, predicted=5.0, prefetch=False):
        return {"event": "zero_prediction", "stage": k, "prefetch": prefetch, "ranks": 4, "step_ms": step,
                "predicted_step_ms": predicted}
    with tempfile.TemporaryDirectory() as folder:
        paths = []
        for k, steps in enumerate(((5.0, 6.0, 10.0), (5.2, 6.1, 11.0), (4.8, 5.9, 30.0))):
            paths.append(Path(folder) / f"r{k}.jsonl")
            paths[-1].write_text("".join(json.dumps(stage(i, t, prefetch=i == 2)) + "\n" for i, t in enumerate(steps)))
        rows = plot.stage_times([str(p) for p in paths])
        check([(r["stage"], r["prefetch"], r["step_ms"], r["step_low"], r["step_high"]) for r in rows] ==
              [(0, False, 5.0, 4.8, 5.2), (1, False, 6.0, 5.9, 6.1), (2, True, 11.0, 10.0, 30.0)],
              f"each stage's median, slowest and fastest over the runs: {rows}")
        notes = plot.stage_time_notes(rows, oversubscribed=False)
        check(notes[0] == "stage 0: measured 5.00 ms a step (median of 3), the model 5.00 ms: predicted/measured 1.00",
              f"a stage on the model: {notes[0]}")
        check("off the model" not in notes[1], f"17% off is within 25%: {notes[1]}")
        check("stage 2 prefetching" in notes[2] and "off the model by -55%" in notes[2] and "spread by 182%" in notes[2],
              f"a stage off the model, noisy: {notes[2]}")
        crowded = plot.stage_time_notes([dict(rows[2], spread=0.0)], oversubscribed=True)
        check("4 ranks on fewer cores" in crowded[0], f"oversubscribed, said: {crowded}")
        quiet = plot.stage_time_notes([dict(rows[2], spread=0.0)], oversubscribed=False)
        check("--compare's verification" in quiet[0], f"neither: the verification's hold, said: {quiet}")
        (Path(folder) / "m.jsonl").write_text(json.dumps({"event": "zero_stage", "stage": 0}) + "\n")
        try:
            plot.stage_times([str(paths[0]), str(Path(folder) / "m.jsonl")])
            check(False, "a run without --predict among the repeats is refused")
        except SystemExit as e:
            check("m.jsonl has no zero_prediction records" in str(e), f"a run without --predict is named: {e}")


def schedules():
    def stage(schedule, s, bubble, simulated, theory, work=(1.0, 2.0, 0.0), m=8):
        return {"event": "pipeline_stage", "schedule": schedule, "stage": s, "stages": 2, "micro_batches": m,
                "virtual_stages": 1, "bubble": bubble, "simulated": simulated, "theory": theory,
                "forward_ms": work[0], "backward_ms": work[1], "weight_ms": work[2]}
    one = [stage("1f1b", 0, 0.20, 0.19, 0.111), stage("1f1b", 1, 0.115, 0.11, 0.111)]
    zero = [stage("zero-bubble", 0, 0.25, 0.05, 0.04, (1, 1, 1)), stage("zero-bubble", 1, 0.041, 0.04, 0.04, (1, 1, 1))]
    notes = plot.schedule_notes([one, zero])
    check(len(notes) == 2, f"one note for each stage more than 10% off its theory (2 of 4): {notes}")
    check(notes and notes[0].startswith("1f1b stage 0: idles 0.200, +80% off the theory's 0.111") and
          "(3.00, 3.00 ms a micro-batch) gives 0.190: their unequal work is the difference" in notes[0],
          f"a stage off its theory, explained by the stages' measured work: {notes[:1]}")
    check(len(notes) > 1 and "zero-bubble stage 0" in notes[1] and "gives 0.050, the other +0.200 is the transfers" in notes[1],
          f"a stage the measured work does not explain: the rest named: {notes[1:2]}")
    check("ABOVE 1F1B" not in " ".join(notes), f"zero bubble below 1F1B (0.146 against 0.158) is not flagged: {notes}")
    zero[0]["bubble"] = 0.359  # now its mean, 0.200, is above 1F1B's 0.158
    notes = plot.schedule_notes([one, zero])
    flagged = [n for n in notes if "ABOVE 1F1B" in n]
    check(len(flagged) == 1 and flagged[0].startswith(
        "zero-bubble idles 0.200 (mean of the stages), ABOVE 1F1B's 0.158 at equal p and m: with the stages' measured "
        "work the schedules give 0.045 against 0.150, so the extra idle time is the transfers"),
        f"zero bubble above 1F1B flagged, with the reason the measured work gives: {notes}")
    check(flagged and report.FLAGGED.search(flagged[0]), "the page marks the flagged line")
    with tempfile.TemporaryDirectory() as folder:
        paths = []
        for name, rows in (("a", one), ("b", [dict(r, micro_batches=4) for r in zero])):
            path = Path(folder) / f"{name}.jsonl"
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
            paths.append(str(path))
        try:
            plot.schedule_rows(paths)
            check(False, "schedules at unequal m are refused")
        except SystemExit as e:
            check("compare schedules at equal p and m" in str(e) and "2 stages x 4" in str(e), f"unequal m refused: {e}")


def sweep(build):
    env = dict(os.environ, COURSE_BUILD=build, STEPS="3", REPEATS="2", STRONG_BATCH="16", WEAK_PER_RANK="8",
               SWEEP_ARGS="--hidden 8 --layers 2")
    for name, value in (("REPEATS", "0"), ("THREADS_PER_RANK", "two"), ("STEPS", "-1"), ("WORKLOAD", "cnn"),
                        ("LINK", "/nonexistent/link.jsonl"), ("CALIBRATION", "/nonexistent")):
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
        check("no prediction beside these points" in caption.read_text() and "SWEEP_ARGS changes the model" in ran.stdout,
              "a sweep of a changed model says why it has no prediction")
    # The GPT: the cost model calibrated on this machine predicts every point of both modes.
    gpt = dict(env, WORKLOAD="gpt", REPEATS="1", STRONG_BATCH="8", WEAK_PER_RANK="4")
    gpt.pop("SWEEP_ARGS")
    said = priced(gpt, "the GPT", lambda plan, mode, ranks: plan["micro_batch"] == (8 // ranks if mode == "strong" else 4))
    check("strong at 2 ranks: measured" in said and "calibrated on this machine on" in said,
          f"the chart's notes give predicted/measured and the calibration's date: {said[-800:]}")
    # A calibration made once (scripts/calibrate.sh, as run_course.sh makes it) is used, not made again.
    with tempfile.TemporaryDirectory() as folder:
        link = Path(folder) / "link.jsonl"
        link.write_text(json.dumps({"event": "alpha_beta", "alpha_us": 5.0, "beta_s_per_byte": 2e-10}) + "\n")
        made = subprocess.run([str(ROOT / "scripts" / "calibrate.sh"), str(Path(folder) / "c"), "2"],
                              env=dict(gpt, LINK=str(link)), capture_output=True, text=True)
        check(made.returncode == 0 and (Path(folder) / "c" / "calibration.json").is_file() and
              (Path(folder) / "c" / "link_np2.jsonl").is_file(), f"calibrate.sh writes the calibration: {made.stdout}{made.stderr}")
        ran = subprocess.run([str(ROOT / "scripts" / "sweep.sh"), str(Path(folder) / "s"), "1", "2"],
                             env=dict(gpt, CALIBRATION=str(Path(folder) / "c")), capture_output=True, text=True)
        points = Path(folder) / "s" / "sweep"
        check(ran.returncode == 0 and (points / "predicted_strong_np2.jsonl").is_file() and
              not (points / "calibration.json").exists(), f"the sweep prices with the calibration given: {ran.stdout[-600:]}")
    # No prediction that can be made (one rank: no link to fit): the chart is drawn without, saying why.
    alone = dict(env, REPEATS="1")
    alone.pop("SWEEP_ARGS")
    with tempfile.TemporaryDirectory() as folder:
        ran = subprocess.run([str(ROOT / "scripts" / "sweep.sh"), folder, "1"], env=alone, capture_output=True, text=True)
        caption = Path(folder) / "speedup.caption.txt"
        check(ran.returncode == 0 and "sweep: no prediction: error: --calibrate: needs --link" in ran.stdout and
              caption.is_file() and "no prediction beside these points" in caption.read_text(),
              f"a prediction that fails leaves the chart without it, saying why ({ran.stdout[-600:]}{ran.stderr[-600:]})")
    # The MLP as 04 runs it (no SWEEP_ARGS): priced too, at each mode's global batch.
    priced(alone, "the MLP", lambda plan, mode, ranks: plan["model"] == "mlp" and
           plan["global_batch"] == (16 if mode == "strong" else 8 * ranks))


def priced(env, what, batch_of):
    """sweep.sh at 1 and 2 ranks under ENV; each point's prediction must be the model's of its rank count,
    at the batch BATCH_OF(plan, mode, ranks) accepts. The link's fit is given (LINK), not measured: a
    busy machine tilts a fit past any use, and this checks the sweep, not the machine. Returns what the
    sweep printed."""
    with tempfile.TemporaryDirectory() as folder:
        link = Path(folder) / "link.jsonl"
        link.write_text(json.dumps({"event": "alpha_beta", "alpha_us": 5.0, "beta_s_per_byte": 2e-10}) + "\n")
        ran = subprocess.run([str(ROOT / "scripts" / "sweep.sh"), folder, "1", "2"], env=dict(env, LINK=str(link)),
                             capture_output=True, text=True)
        check(ran.returncode == 0, f"sweep.sh runs {what} ({ran.stdout[-1000:]}{ran.stderr[-1000:]})")
        for mode in ("strong", "weak"):
            for ranks in (1, 2):
                path = Path(folder) / "sweep" / f"predicted_{mode}_np{ranks}.jsonl"
                plan = plot.events(plot.read(path), "plan") if path.is_file() else []
                check(plan and plan[-1]["dp"] == ranks and batch_of(plan[-1], mode, ranks),
                      f"{path.name}: the model priced {what} at {ranks} rank(s) and the run's batch")
        return ran.stdout


def collectives():
    """03's benchmark summarised: the library's row (named after the backend) is MPI's, never the library's
    ordered ring, and one core's memcpy stands beside it."""
    bench = [{"event": "bench", "op": "all_reduce", "algorithm": a, "bytes": 64 << 20, "busbw_gbps": g, "wrong": 0}
             for a, g in (("ring", 3.1), ("pipe", 3.6), ("tree", 1.5), ("naive", 1.6), ("ordered", 5.7), ("mpi", 2.1))]
    text = plot.summary_of([{"event": "memcpy_bandwidth", "bytes": 64 << 20, "gbps": 9.0}] + bench)
    check(text == "6 rows, #wrong 0; all_reduce 64 MiB busbw ring 3.10, pipelined 3.60, ordered 5.70 vs mpi 2.10 GB/s"
                  " (memcpy 9.00)", f"03's summary names each row: {text}")


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "speedup":
        speedup()
        overlap()
        zero_time()
        collectives()
    elif len(sys.argv) >= 2 and sys.argv[1] == "schedules":
        schedules()
    elif len(sys.argv) >= 3 and sys.argv[1] == "sweep":
        sweep(sys.argv[2])
    else:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    print(f"{'PASSED' if not failures else 'FAILED'}: {len(failures)} failure(s)")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
