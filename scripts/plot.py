#!/usr/bin/env python3
"""Reads the chapters' JSON-lines metrics: one-line summaries and charts (PNG).

  plot.py summary METRICS              the key figure of a run, in one line
  plot.py loss METRICS OUT.png         loss per epoch (or per step)
  plot.py overlap METRICS... OUT_PREFIX [--calibration FILE]
                                       chapter 05: OUT_PREFIX_modes.png (step time by mode; several runs are
                                       repeats: each mode's median, its spread drawn and the noisy marked;
                                       runs with --predict: the course's cost model beside each mode, its
                                       calibration FILE dated on the chart) and, after --sweep-buckets,
                                       OUT_PREFIX_buckets.png (step time by bucket cap, the first run's)
  plot.py timeline TRACE.json OUT.png  a Chrome trace (chapter 05's trace.json) as a picture: one row per
                                       rank and lane
  plot.py zero METRICS... OUT_PREFIX [--calibration FILE]
                                       chapter 07 --compare: OUT_PREFIX_memory.png (model states per rank by
                                       category and stage, the formula marked) and OUT_PREFIX_communication.png
                                       (the first run's); runs with --predict: OUT_PREFIX_time.png, each stage's
                                       median step over the runs beside the course's cost model
  plot.py pipeline METRICS OUT_PREFIX  chapter 08 --sweep: OUT_PREFIX_bubble.png (bubble against micro-batches,
                                       with the theory) and OUT_PREFIX_activations.png (per stage, GPipe and 1F1B)
  plot.py schedules OUT.png METRICS...  chapter 08's runs of several schedules at the same p and m: each
                                       stage's bubble beside the theory's and the schedule simulated with
                                       the stages' measured work; OUT.caption.txt explains what differs
  plot.py plan METRICS OUT.png        the planner (benchmarks/plan --metrics): the ranked configurations'
                                       predicted step time by part and memory per GPU by category
  plot.py speedup OUT.png --strong M... [--weak W...]
                                       speedup against ideal and parallel efficiency, from runs of
                                       chapter 04 at several rank counts (strong: fixed global batch;
                                       weak: fixed per-rank batch); several runs at one rank count are
                                       repeats: the point is their median, drawn with their spread
      [--predicted-strong P... --predicted-weak P... --calibration FILE]
                                       the course's cost model's prediction of each point
                                       (benchmarks/plan --metrics, one a rank count) and its calibration
"""
import datetime
import json
import re
import os
import sys


def read(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def events(records, name):
    return [r for r in records if r.get("event") == name]


def summary(path):
    return summary_of(read(path))


def summary_of(records):
    """summary's line from records already read."""
    final = (events(records, "final") or [None])[-1]
    acc = (events(records, "accumulation") or [None])[-1]
    ddp = (events(records, "ddp_summary") or [None])[-1]
    overlap = (events(records, "overlap_summary") or [None])[-1]
    failover = (events(records, "failover_summary") or [None])[-1]
    pipeline = events(records, "pipeline_stage")
    verify = (events(records, "verify") or [None])[-1]
    if pipeline:
        first = pipeline[0]
        chunks = f" of {first['virtual_stages']} chunks" if first.get("virtual_stages", 1) > 1 else ""
        text = (f"{first['stages']} stages{chunks}, {first['micro_batches']} micro-batches, {first['schedule']}: bubble "
                + ", ".join(f"{r['bubble']:.2f}" for r in pipeline) + f" (theory {first['theory']:.2f})")
        if verify:
            text += (f"; {verify['steps']} steps in lock-step with the unsharded GPT, at most "
                     f"{verify['gradient_ratio']:.2g} of the noise-floor tolerance")
        return text
    context = (events(records, "context_parallel") or [None])[-1]
    if context:
        activations = (events(records, "activations") or [{}])[-1]
        text = (f"CP {context['cp']}, {context['method']}, {context['sequence']} tokens: "
                f"{context['bytes_per_step'] / 2**20:.2f} MiB per step to the CP group per rank "
                f"({context['bytes_per_step'] / max(1, context['formula_bytes_per_step']):.3f} of the formula)")
        if "peak_activation_bytes" in activations:
            text += f", peak activations {activations['peak_activation_bytes'] / 2**20:.2f} MiB"
        if verify:
            text += (f"; {verify['steps']} steps in lock-step with the unsharded GPT, at most "
                     f"{verify['gradient_ratio']:.2g} of the noise-floor tolerance")
        return text
    stages = events(records, "zero_stage")
    if stages:
        first, last = stages[0], stages[-1]
        total = lambda r: r["params_bytes"] + r["grads_bytes"] + r["adam_bytes"]
        formula = lambda r: r["formula_params"] + r["formula_grads"] + r["formula_adam"]
        text = f"{first['ranks']} ranks, stages {', '.join(str(r['stage']) for r in stages)}: model states per rank "
        text += ", ".join(f"{total(r) / 2**20:.2f}" for r in stages) + " MiB"
        text += f" (measured/formula {min(total(r) / formula(r) for r in stages):.3f}-{max(total(r) / formula(r) for r in stages):.3f})"
        if any(r.get("host_bytes", 0) for r in stages):
            text += (f" on the device, " + ", ".join(f"{r['host_bytes'] / 2**20:.2f}" for r in stages)
                     + f" MiB offloaded to the host (measured/formula "
                     + f"{min(r['host_bytes'] / r['formula_host'] for r in stages):.3f}-"
                     + f"{max(r['host_bytes'] / r['formula_host'] for r in stages):.3f})")
        if first["ring_bytes"] > 0:
            text += f"; stage {last['stage']} sends {last['ring_bytes'] / first['ring_bytes']:.2f}x stage {first['stage']}"
        return text
    if failover:
        text = f"{failover['ranks']} ranks, {failover['steps']} steps"
        if failover["resumed_from"]:
            text += f", resumed from step {failover['start_step']} after restart {failover['restart_count']}"
        text += f", {failover['checkpoints']} checkpoints at {failover['write_mb_per_s']:.0f} MB/s"
        if failover["verified"]:
            text += ", every step in lock-step" if failover["lockstep_passed"] else (
                f", lock-step FAILED at step {failover['first_failed_step']}")
            if failover["same_world"]:
                text += ", bit-identical to the uninterrupted run" if failover["passed"] else ", NOT bit-identical"
            else:
                text += f" (world sizes {failover['world_history']})"
        return text
    if overlap:
        modes = {r["mode"]: r for r in events(records, "mode")}
        text = ", ".join(f"{m} {r['step_ms']:.1f} ms" for m, r in modes.items())
        text += f"; overlap leaves {overlap['exposed_fraction']:.2f} of the communication exposed"
        return text + (" (simulated network)" if overlap.get("simulated_network") else "")
    if ddp:
        text = (f"{ddp['ranks']} ranks, {ddp['samples_per_s']:.0f} samples/s, step {ddp['step_ms']:.2f} ms "
                f"(communication {ddp['comm_ms']:.2f})")
        if ddp["verified"]:
            text += f", lock-step {ddp['gradient_bound_ratio']:.2f} of the fp32 bound"
        if ddp["noise_floor"] > 0:  # --drift
            text += f", final drift {ddp['drift_ratio']:.2f}x noise floor"
        return text
    bench = events(records, "bench")
    if bench:
        largest = max(r["bytes"] for r in bench)
        rows = {r["algorithm"]: r for r in bench if r["op"] == "all_reduce" and r["bytes"] == largest}
        # The library's own call is the row named after the backend; the others are the chapter's algorithms.
        lib = next((r for a, r in rows.items() if a not in ("ring", "pipe", "tree", "naive", "ordered")), None)
        wrong = sum(r["wrong"] for r in bench)
        text = f"{len(bench)} rows, #wrong {wrong}"
        if "ring" in rows and lib and lib["busbw_gbps"] > 0:
            text += (f"; all_reduce {largest / 2**20:.0f} MiB busbw ring {rows['ring']['busbw_gbps']:.2f}"
                     + (f", pipelined {rows['pipe']['busbw_gbps']:.2f}" if "pipe" in rows else "")
                     + (f", ordered {rows['ordered']['busbw_gbps']:.2f}" if "ordered" in rows else "")
                     + f" vs {lib['algorithm']} {lib['busbw_gbps']:.2f} GB/s")
            memcpy = (events(records, "memcpy_bandwidth") or [None])[-1]
            if memcpy and memcpy["gbps"] > 0:
                text += f" (memcpy {memcpy['gbps']:.2f})"
        return text
    if acc:
        return (f"lock-step {acc['gradient_bound_ratio']:.2f} of the fp32 bound, final drift "
                f"{acc['drift_ratio']:.2f}x noise floor, peak activations "
                f"{acc['peak_activation_bytes_accumulated'] / 1024:.0f} KiB vs "
                f"{acc['peak_activation_bytes_big_batch'] / 1024:.0f} KiB")
    if final and "weights" in final:
        w = ", ".join(f"{x:.3f}" for x in final["weights"])
        t = ", ".join(f"{x:g}" for x in final["true_weights"])
        return f"loss {final['loss']:.4f}, w = ({w}) b = {final['bias']:.3f} vs true ({t}) b = {final['true_bias']:g}"
    if final:
        return f"loss {final['loss']:.4f}, {final.get('samples_per_s', 0):.0f} samples/s"
    return "no summary record"


def verdict(records):
    """PASSED or FAILED from the run's last record that carries a verdict; None when none does."""
    judged = [r for r in records if isinstance(r.get("passed"), bool)]
    return None if not judged else ("PASSED" if judged[-1]["passed"] else "FAILED")


def size(n):
    """A byte count as people read it: B, KiB, MiB or GiB."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def figures(records):
    """The few figures that carry a run's lesson, each beside what it is measured against:
    (what, measured, expected) rows, from the same records as summary()."""
    rows = []
    final = (events(records, "final") or [None])[-1]
    if final and "true_weights" in final:
        rows.append(("weights, bias", ", ".join(f"{x:.3f}" for x in final["weights"]) + f"; {final['bias']:.3f}",
                     ", ".join(f"{x:g}" for x in final["true_weights"]) + f"; {final['true_bias']:g} (the data's)"))
    acc = (events(records, "accumulation") or [None])[-1]
    if acc:
        rows.append(("accumulated gradient against one big batch", f"{acc['gradient_bound_ratio']:.2f} of the fp32 bound",
                     "at most 1"))
    bench = events(records, "bench")
    if bench:
        rows.append(("collectives with a wrong result", str(sum(r["wrong"] for r in bench)), "0"))
    ddp = (events(records, "ddp_summary") or [None])[-1]
    if ddp:
        if ddp["verified"]:
            rows.append(("averaged gradients against one rank's", f"{ddp['gradient_bound_ratio']:.2f} of the fp32 bound",
                         "at most 1"))
        rows.append(("parameters identical on every rank", "yes" if ddp["identical"] else "no", "yes"))
    for mode in events(records, "mode"):
        rows.append((f"{mode['mode']}: step", f"{mode['step_ms']:.2f} ms", ""))
    overlap = (events(records, "overlap_summary") or [None])[-1]
    if overlap:
        rows.append(("communication left exposed by overlap", f"{overlap['exposed_fraction']:.2f}", "below 1"))
    failover = (events(records, "failover_summary") or [None])[-1]
    if failover:
        rows.append(("resumed from step", str(failover["start_step"]) if failover["resumed_from"] else "none", ""))
        if failover["verified"] and failover["same_world"]:
            rows.append(("bit-identical to the uninterrupted run", "yes" if failover["passed"] else "no", "yes"))
    for r in events(records, "zero_stage"):
        measured = r["params_bytes"] + r["grads_bytes"] + r["adam_bytes"]
        formula = r["formula_params"] + r["formula_grads"] + r["formula_adam"]
        rows.append((f"stage {r['stage']}: model states per rank", size(measured), f"{size(formula)} (the ZeRO paper's formula)"))
    for r in events(records, "pipeline_stage"):
        rows.append((f"stage {r.get('stage', '?')}: bubble", f"{r['bubble']:.3f}", f"{r['theory']:.3f} (theory)"))
    context = (events(records, "context_parallel") or [None])[-1]
    if context:
        rows.append(("bytes per step to the CP group", size(context["bytes_per_step"]),
                     f"{size(context['formula_bytes_per_step'])} (formula)"))
    verify = (events(records, "verify") or [None])[-1]
    if verify and "gradient_ratio" in verify:
        rows.append((f"{verify['steps']} steps in lock-step", f"{verify['gradient_ratio']:.2g} of the tolerance",
                     "at most 1"))
    return rows


def loss_chart(path, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    records = read(path)
    points = [(r["epoch"], r["loss"]) for r in events(records, "epoch")]
    if not points:
        points = [(r["step"], r["loss"]) for r in events(records, "step")]
    if not points:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([p[0] for p in points], [p[1] for p in points], marker="o")
    ax.set_yscale("log")
    ax.set_xlabel("epoch" if events(records, "epoch") else "step")
    summary = (events(records, "ddp_summary") or [{}])[-1]
    gpt = summary.get("model") == "gpt"
    ax.set_ylabel("loss (cross-entropy)" if gpt else "loss (MSE)")
    evaluation = (events(records, "evaluation") or [None])[-1]
    title = "GPT" if gpt else (path.split("/")[-2] if "/" in path else path)
    if evaluation and "metric" in evaluation:
        title += f": {evaluation['metric']} {evaluation['value']:.3f}"
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def plt_module():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


# Compute that differs by more than this between 05's modes, which do the same work, is the machine's noise.
EQUAL_WORK_SPREAD = 0.10


def median(values):
    v = sorted(values)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def mode_medians(runs):
    """05's modes over repeated runs (each run's "mode" records): per mode, in the first run's order, the
    median compute, exposed communication and step, and the step's spread ((max - min) / median)."""
    names = [r["mode"] for r in runs[0]]
    merged = []
    for name in names:
        rows = [r for records in runs for r in records if r["mode"] == name]
        step = [r["step_ms"] for r in rows]
        merged.append(dict(rows[0], compute_ms=median([r["compute_ms"] for r in rows]),
                           exposed_ms=median([r["exposed_ms"] for r in rows]), step_ms=median(step),
                           spread=(max(step) - min(step)) / median(step) if median(step) else 0.0, repeats=len(rows),
                           step_low=min(step), step_high=max(step)))
    return merged


def overlap_notes(modes):
    """05's modes chart's caption: a figure that contradicts the lesson, with the reason its data give."""
    by = {r["mode"]: r for r in modes}
    notes = []
    overlap, plain = by.get("buckets+overlap"), by.get("buckets")
    if overlap and plain and overlap["step_ms"] > plain["step_ms"]:
        slower = overlap["compute_ms"] / plain["compute_ms"] - 1 if plain["compute_ms"] else 0.0
        why = (f"its compute took {100 * slower:.0f}% longer ({overlap['compute_ms']:.1f} against "
               f"{plain['compute_ms']:.1f} ms): the communication's progress competes with the computation it "
               "overlaps for the cores" if slower > EQUAL_WORK_SPREAD else
               f"its exposed communication was longer ({overlap['exposed_ms']:.1f} against {plain['exposed_ms']:.1f} ms)")
        notes.append(f"buckets+overlap ({overlap['step_ms']:.1f} ms a step) is SLOWER THAN buckets without overlap "
                     f"({plain['step_ms']:.1f} ms): {why}")
    compute = [r["compute_ms"] for r in modes if r.get("compute_ms")]
    if len(compute) > 1 and (max(compute) - min(compute)) / min(compute) > EQUAL_WORK_SPREAD:
        repeats = min(r.get("repeats", 1) for r in modes)
        notes.append(f"compute DIFFERS by {100 * (max(compute) - min(compute)) / min(compute):.0f}% between modes that do "
                     "the same work: the machine's noise moved these figures, " +
                     ("one run a mode" if repeats == 1 else f"even the medians of {repeats} runs"))
    noisy = [r["mode"] for r in modes if r.get("spread", 0) > NOISY_SPREAD]
    if noisy:
        notes.append(f"{', '.join(noisy)} NOISY: the step's repeats spread by more than {100 * NOISY_SPREAD:.0f}% of "
                     "their median; the machine was too busy for these figures to carry the lesson")
    return notes


def off_model(ratio, why, otherwise):
    """A prediction's line past OFF_MODEL: how far off, and the reasons the measured data give (WHY), or
    OTHERWISE where they give none."""
    return f", off the model by {100 * (ratio - 1):+.0f}%: " + "; ".join(why or [otherwise])


def noise_reason(spread, what="repeats"):
    return f"its {what} spread by {100 * spread:.0f}%: the machine's noise"


def overlap_model_notes(modes):
    """Each mode's predicted/measured step (runs with --predict); past OFF_MODEL, the reason the measured
    data give."""
    by = {r["mode"]: r for r in modes}
    plain = by.get("buckets")
    lines = []
    for r in modes:
        if "predicted_compute_ms" not in r:
            continue
        pc, pe = r["predicted_compute_ms"], r["predicted_exposed_ms"]
        ratio = (pc + pe) / r["step_ms"] if r["step_ms"] else 0.0
        line = (f"{r['mode']}: measured {r['step_ms']:.1f} ms a step (compute {r['compute_ms']:.1f} + exposed "
                f"{r['exposed_ms']:.1f}), the model {pc + pe:.1f} ({pc:.1f} + {pe:.1f}): predicted/measured {ratio:.2f}")
        if abs(ratio - 1) > OFF_MODEL:
            why = []
            if r["compute_ms"] and abs(pc / r["compute_ms"] - 1) > OFF_MODEL:
                why.append(f"its compute took {r['compute_ms']:.1f} ms against the model's {pc:.1f}")
            if r["mode"] == "buckets+overlap" and plain and plain["exposed_ms"] > 0 and plain.get("predicted_exposed_ms"):
                hidden = 1 - r["exposed_ms"] / plain["exposed_ms"]
                modelled = 1 - pe / plain["predicted_exposed_ms"]
                if modelled - hidden > OFF_MODEL:
                    why.append(f"overlap hid {100 * hidden:.0f}% of the bucketed communication where the model hides "
                               f"{100 * modelled:.0f}%: the model lets backward and the all-reduces run side by side, "
                               "but a rank's one core takes turns between backward and the all-reduce's own work "
                               "(MPI's copies and its sum)" +
                               ("; the simulated network's wait costs no CPU, the real all-reduce beneath it does"
                                if r.get("simulated_network") else ""))
            elif pe and abs(r["exposed_ms"] / pe - 1) > OFF_MODEL:
                why.append(f"its communication took {r['exposed_ms']:.1f} ms against the model's {pe:.1f}: what MPI's "
                           "all-reduce costs beyond 03's ping-pong fit and the sum's passes over memory")
            if r.get("spread", 0) > NOISY_SPREAD:
                why.append(noise_reason(r["spread"]))
            line += off_model(ratio, why, "the ranks' MPI progress and the machine's own work compete with compute for "
                                          "the cores, which the model leaves out")
        lines.append(line)
    return lines


def calibration_day(calibration):
    """The day CALIBRATION (benchmarks/plan --calibrate's file) was written, for the chart."""
    return calibration and datetime.datetime.fromtimestamp(os.path.getmtime(calibration),
                                                           datetime.timezone.utc).date().isoformat()


def overlap_charts(paths, prefix, calibration=None):
    plt = plt_module()
    records = read(paths[0])
    runs = [events(read(path), "mode") for path in paths]
    if any(runs) and not all(runs):
        raise SystemExit("overlap: " + ", ".join(p for p, r in zip(paths, runs) if not r) + " has no mode records")
    if runs[0]:
        modes = mode_medians(runs)
        fig, ax = plt.subplots(figsize=(7, 4))
        names = [r["mode"] for r in modes]
        compute = [r["compute_ms"] for r in modes]
        exposed = [r["exposed_ms"] for r in modes]
        ax.bar(names, compute, label="compute")
        ax.bar(names, exposed, bottom=compute, label="exposed communication")
        if len(runs) > 1:  # the step's slowest and fastest repeat around the median's bar
            steps = [r["step_ms"] for r in modes]
            ax.errorbar(names, steps, yerr=[[s - r["step_low"] for s, r in zip(steps, modes)],
                                            [r["step_high"] - s for s, r in zip(steps, modes)]],
                        fmt="none", ecolor="black", capsize=4, label="step, slowest to fastest run")
        priced = [r for r in modes if "predicted_compute_ms" in r]
        if priced:  # the course's cost model: its step, and its compute within it
            ax.scatter([r["mode"] for r in priced], [r["predicted_compute_ms"] + r["predicted_exposed_ms"] for r in priced],
                       marker="_", s=900, color="black", zorder=3, label="the course's model: step")
            ax.scatter([r["mode"] for r in priced], [r["predicted_compute_ms"] for r in priced], marker="_", s=900,
                       color="grey", zorder=3, label="the course's model: compute")
        simulated = modes[0].get("simulated_network", "")
        repeats = f", median of {len(runs)} runs" if len(runs) > 1 else ""
        day = calibration_day(calibration)
        ax.set_title(f"Step time by mode, {modes[0]['ranks']} ranks{repeats}" +
                     (f"; the model calibrated {day}" if priced and day else "") +
                     (f"\n{simulated.strip()}" if simulated else ""), fontsize=10)
        ax.set(ylabel="ms per step")
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3)
        ax.grid(True, axis="y", alpha=0.3)
        fig.tight_layout()
        fig.savefig(f"{prefix}_modes.png", dpi=120)
        notes = overlap_notes(modes) + overlap_model_notes(modes)
        if priced and day:
            notes.append(f"black marks: the course's cost model (--predict), calibrated on this machine on {day}")
        for line in notes:
            print(f"overlap: {line}")
        write_caption(f"{prefix}_modes.png", notes)
    sweep = events(records, "bucket_sweep")
    if sweep:
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot([r["bucket_mb"] for r in sweep], [r["step_ms"] for r in sweep], marker="o", label="step")
        ax.plot([r["bucket_mb"] for r in sweep], [r["exposed_ms"] for r in sweep], marker="o", label="exposed communication")
        ax.set_xscale("log")
        ax.set(xlabel="bucket cap (MB)", ylabel="ms per step")
        label = sweep[0].get("simulated_network", "").strip()
        ax.set_title("Bucket size: too small pays alpha per bucket, too large starts late" +
                     (f"\n{label}" if label else ""), fontsize=10)
        ax.legend()
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        fig.savefig(f"{prefix}_buckets.png", dpi=120)


def stage_times(paths):
    """07's step per stage over repeated --compare --predict runs: per stage (prefetching apart), in the
    first run's order, the median step, its slowest and fastest run, and the model's prediction."""
    runs = [events(read(path), "zero_prediction") for path in paths]
    if not all(runs):
        raise SystemExit("zero: " + ", ".join(p for p, r in zip(paths, runs) if not r) +
                         " has no zero_prediction records (run 07_zero --compare --predict FILE --metrics M)")
    rows = []
    for first in runs[0]:
        same = [r for records in runs for r in records if (r["stage"], r["prefetch"]) == (first["stage"], first["prefetch"])]
        step = [r["step_ms"] for r in same]
        rows.append(dict(first, step_ms=median(step), step_low=min(step), step_high=max(step), repeats=len(step),
                         spread=(max(step) - min(step)) / median(step) if median(step) else 0.0))
    return rows


def stage_time_notes(rows, oversubscribed):
    """Each stage's predicted/measured step; past OFF_MODEL, the reason the runs' data give."""
    lines = []
    for r in rows:
        ratio = r["predicted_step_ms"] / r["step_ms"] if r["step_ms"] else 0.0
        line = (f"stage {r['stage']}{' prefetching' if r['prefetch'] else ''}: measured {r['step_ms']:.2f} ms a step "
                f"(median of {r['repeats']}), the model {r['predicted_step_ms']:.2f} ms: predicted/measured {ratio:.2f}")
        if abs(ratio - 1) > OFF_MODEL:
            why = ([f"{r['ranks']} ranks on fewer cores: the model gives each rank its share of a core, the run also "
                    "waits for a descheduled rank at every collective"] if oversubscribed else []) + \
                  ([noise_reason(r["spread"], "runs")] if r["spread"] > NOISY_SPREAD else [])
            line += off_model(ratio, why, "--compare's verification runs beside each step: its work is left out of the "
                                          "step's time, not its hold on the caches and the cores (07's NOTES measure a "
                                          "step without it)")
        lines.append(line)
    return lines


def zero_time_chart(paths, out, calibration=None):
    """07's step per stage, the median of the runs with its spread, beside the course's cost model."""
    plt = plt_module()
    rows = stage_times(paths)
    cores = events(read(paths[0]), "cpu_cores")
    oversubscribed = bool(cores) and rows[0]["ranks"] > cores[-1].get("cores", rows[0]["ranks"])
    names = [f"stage {r['stage']}" + (" prefetch" if r["prefetch"] else "") for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    steps = [r["step_ms"] for r in rows]
    ax.bar(names, steps, label=f"measured, median of {rows[0]['repeats']} run(s)")
    if len(paths) > 1:
        ax.errorbar(names, steps, yerr=[[s - r["step_low"] for s, r in zip(steps, rows)],
                                        [r["step_high"] - s for s, r in zip(steps, rows)]],
                    fmt="none", ecolor="black", capsize=4, label="slowest to fastest run")
    ax.scatter(names, [r["predicted_step_ms"] for r in rows], marker="_", s=900, color="black", zorder=3,
               label="the course's model")
    day = calibration_day(calibration)
    ax.set(ylabel="ms per step")
    ax.set_title(f"Step time per stage, {rows[0]['ranks']} ranks" + (" (more ranks than cores)" if oversubscribed else "") +
                 (f"; the model calibrated {day}" if day else ""), fontsize=10)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    notes = stage_time_notes(rows, oversubscribed)
    if day:
        notes.append(f"black marks: the course's cost model (--predict), calibrated on this machine on {day}")
    for line in notes:
        print(f"zero: {line}")
    write_caption(out, notes)


def zero_charts(path, prefix):
    """Chapter 07 --compare: model-state memory per rank by category and stage, the formula marked; and
    the bytes each rank sends per step, beside the theory."""
    plt = plt_module()
    stages = events(read(path), "zero_stage")
    if not stages:
        raise SystemExit(f"zero: {path} has no zero_stage records (run 07_zero --compare --metrics FILE)")
    names = [f"stage {r['stage']}" + (" prefetch" if r.get("prefetch") else "") for r in stages]
    mib = lambda key: [r[key] / 2**20 for r in stages]
    fig, ax = plt.subplots(figsize=(7, 4))
    bottom = [0.0] * len(stages)
    for key, label in (("params_bytes", "parameters"), ("grads_bytes", "gradients"), ("adam_bytes", "Adam state")):
        ax.bar(names, mib(key), bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, mib(key))]
    if any(r.get("host_bytes", 0) for r in stages):  # ZeRO-Offload: on the host, stacked above, hatched
        ax.bar(names, mib("host_bytes"), bottom=bottom, color="white", edgecolor="grey", hatch="//",
               label=f"offloaded to the host ({stages[0]['offload']}), not on the device")
    formula = [(r["formula_params"] + r["formula_grads"] + r["formula_adam"] + r.get("formula_host", 0)) / 2**20
               for r in stages]
    fp32 = stages[0].get("precision", "float32") == "float32"
    ax.scatter(names, formula, marker="_", s=900, color="black", zorder=3,
               label="formula (16, 8+8/N, 4+12/N, 16/N bytes x params)" if fp32 and not stages[0].get("formula_host")
               else "formula (the ZeRO paper's, per stage)")
    ax.set(ylabel="MiB per rank")
    kind = "float32 AdamW" if fp32 else f"{stages[0]['precision']} over float32 masters"
    ax.set_title(f"Model states per rank, {kind}, {stages[0]['ranks']} ranks, {stages[0]['parameters']:.0f} parameters",
                 fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(f"{prefix}_memory.png", dpi=120)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(names, mib("ring_bytes"), label="measured (ring traffic of the collectives issued)")
    ax.scatter(names, mib("ring_theory"), marker="_", s=900, color="black", zorder=3, label="theory: 2 psi, 3 psi at stage 3")
    ax.set(ylabel="MiB sent per rank per step")
    ax.set_title(f"Communication per step, {stages[0]['ranks']} ranks", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(f"{prefix}_communication.png", dpi=120)


def plan_chart(path, out):
    """The planner's ranked configurations (benchmarks/plan --metrics): each one's predicted step time split
    into compute, the communication of each group and the bubble; beside it, its memory per GPU by category.
    A cost model's figures, labelled simulated."""
    plt = plt_module()
    plans = events(read(path), "plan")
    if not plans:
        raise SystemExit(f"plan: {path} has no plan records (run benchmarks/plan --metrics FILE)")
    names = [f"{r['rank']}. {r['config']}" for r in plans][::-1]
    fig, (time_ax, memory_ax) = plt.subplots(1, 2, figsize=(12, 0.45 * len(plans) + 1.6), sharey=True)
    left = [0.0] * len(plans)
    for key, label in (("compute", "compute"), ("tp", "TP"), ("cp", "CP"), ("pp", "PP"), ("dp", "DP"),
                       ("bubble", "bubble"), ("optimizer", "optimizer")):
        values = [r[f"{key}_seconds"] for r in plans][::-1]
        time_ax.barh(names, values, left=left, label=label)
        left = [a + b for a, b in zip(left, values)]
    time_ax.set(xlabel="seconds per iteration (simulated)")
    time_ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.45 / len(plans) - 0.12))
    left = [0.0] * len(plans)
    for key, label in (("parameters", "parameters"), ("gradients", "gradients"), ("optimizer", "optimizer"),
                       ("activations", "activations"), ("buffers", "buffers")):
        values = [r[f"{key}_bytes"] / 2**30 for r in plans][::-1]
        memory_ax.barh(names, values, left=left, label=label)
        left = [a + b for a, b in zip(left, values)]
    memory_ax.set(xlabel="GiB per GPU (simulated)")
    memory_ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.45 / len(plans) - 0.12))
    for ax in (time_ax, memory_ax):
        ax.grid(True, axis="x", alpha=0.3)
    fig.suptitle("The planner's ranked configurations, fastest at the top (a cost model, not a run)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=120, bbox_inches="tight")


def pipeline_charts(path, prefix):
    """Chapter 08 --sweep: the bubble against the micro-batches, each schedule's mean over the stages
    beside (p-1)/(m+p-1) (interleaved: (p-1)/(vm+p-1)); and the peak activations of each stage, GPipe
    against 1F1B."""
    plt = plt_module()
    rows = events(read(path), "pipeline_sweep")
    if not rows:
        raise SystemExit(f"pipeline: {path} has no pipeline_sweep records (run 08_tensor_pipeline --sweep)")
    p = rows[0]["stages"]
    counts = sorted({r["micro_batches"] for r in rows})
    fig, ax = plt.subplots(figsize=(7, 4))
    for schedule, marker in (("gpipe", "o"), ("1f1b", "s")):
        mean = [sum(r["bubble"] for r in rows if r["schedule"] == schedule and r["micro_batches"] == m) / p for m in counts]
        ax.plot(counts, mean, marker=marker, label=f"{schedule}, measured (mean of {p} stages)")
    ax.plot(counts, [(p - 1) / (m + p - 1) for m in counts], "k--", label="theory (p-1)/(m+p-1)")
    interleaved = [r for r in rows if r["schedule"] == "interleaved"]
    if interleaved:  # at the counts that are multiples of p; v chunks per rank
        v = interleaved[0]["virtual_stages"]
        some = sorted({r["micro_batches"] for r in interleaved})
        mean = [sum(r["bubble"] for r in interleaved if r["micro_batches"] == m) / p for m in some]
        ax.plot(some, mean, marker="^", label=f"interleaved 1F1B, v={v}, measured")
        ax.plot(some, [(p - 1) / (v * m + p - 1) for m in some], "k:", label=f"theory (p-1)/(vm+p-1), v={v}")
    zero = [r for r in rows if r["schedule"] == "zero-bubble"]
    if zero:  # backward split into B and W, the W's filling the idle time
        mean = [sum(r["bubble"] for r in zero if r["micro_batches"] == m) / p for m in counts]
        ax.plot(counts, mean, marker="D", label="zero bubble (ZB-H1), measured")
        ax.plot(counts, [1 - 3 * m / max(3 * m + p - 1, 2 * m + 2 * p - 1) for m in counts], "k-.",
                label="theory, F = B = W: (p-1)/(3m+p-1) for m >= p")
    ax.set(xscale="log", xlabel="micro-batches m", ylabel="idle share of the step (bubble)")
    ax.set_xticks(counts)
    ax.set_xticklabels([str(m) for m in counts])
    ax.set_title(f"Pipeline bubble, {p} stages", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(f"{prefix}_bubble.png", dpi=120)
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / (2 * len(counts))
    for k, (schedule, hatch) in enumerate((("gpipe", ""), ("1f1b", "//"))):
        for j, m in enumerate(counts):
            peaks = [next(r["peak_activation_bytes"] for r in rows if r["schedule"] == schedule and
                          r["micro_batches"] == m and r["stage"] == s) / 2**20 for s in range(p)]
            offset = (k * len(counts) + j - len(counts) + 0.5) * width
            ax.bar([s + offset for s in range(p)], peaks, width, hatch=hatch,
                   label=f"{schedule} m={m}", color=plt.cm.viridis(j / max(1, len(counts) - 1)))
    ax.set(xlabel="stage", ylabel="peak activations (MiB)")
    ax.set_xticks(range(p))
    ax.set_title("Activations held per stage: GPipe keeps every micro-batch, 1F1B at most p - s", fontsize=10)
    ax.legend(fontsize=6, ncol=2)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(f"{prefix}_activations.png", dpi=120)


# A stage whose bubble is this far from its theory (a fraction of the theory's) gets a line that says
# why: the theory assumes equal stages and free transfers, and a 10% wobble is within a loaded laptop's.
OFF_THEORY = 0.10


def schedule_rows(paths):
    """The pipeline_stage records of each run (one schedule a file), checked to share p and m: the
    schedules are compared only at equal stages and micro-batches."""
    runs = []
    for path in paths:
        rows = events(read(path), "pipeline_stage")
        if not rows:
            raise SystemExit(f"schedules: {path} has no pipeline_stage records (run 08_tensor_pipeline --pp P --metrics FILE)")
        runs.append(rows)
    shape = {(rows[0]["stages"], rows[0]["micro_batches"]) for rows in runs}
    if len(shape) > 1:
        raise SystemExit("schedules: the runs differ in stages or micro-batches (" +
                         ", ".join(f"{p} stages x {m}" for p, m in sorted(shape)) + "): compare schedules at equal p and m")
    return runs


def schedule_notes(runs):
    """What the chart's reader needs beside the bars: each stage off its theory with the part its measured
    work explains, and a schedule that idles more than one meant to idle less (zero bubble above 1F1B)."""
    notes = []
    for rows in runs:
        name = rows[0]["schedule"] + (f" v={rows[0]['virtual_stages']}" if rows[0]["virtual_stages"] > 1 else "")
        work = ", ".join(f"{r['forward_ms'] + r['backward_ms'] + r['weight_ms']:.2f}" for r in rows)
        for r in rows:
            off = (r["bubble"] - r["theory"]) / r["theory"] if r["theory"] else 0.0
            if abs(off) <= OFF_THEORY:
                continue
            line = (f"{name} stage {r['stage']}: idles {r['bubble']:.3f}, {100 * off:+.0f}% off the theory's {r['theory']:.3f}; "
                    f"the stages' measured work ({work} ms a micro-batch) gives {r['simulated']:.3f}")
            rest = r["bubble"] - r["simulated"]
            if r["theory"] and abs(rest) <= OFF_THEORY * r["theory"]:
                line += ": their unequal work is the difference"
            else:
                line += f", the other {rest:+.3f} is the transfers between the stages and the waits for them (free in the theory)"
            notes.append(line)
    by = {rows[0]["schedule"]: rows for rows in runs}
    if "zero-bubble" in by and "1f1b" in by:
        zero = sum(r["bubble"] for r in by["zero-bubble"]) / len(by["zero-bubble"])
        one = sum(r["bubble"] for r in by["1f1b"]) / len(by["1f1b"])
        if zero >= one:
            zero_work = sum(r["simulated"] for r in by["zero-bubble"]) / len(by["zero-bubble"])
            one_work = sum(r["simulated"] for r in by["1f1b"]) / len(by["1f1b"])
            why = (f"with the stages' measured work the schedules give {zero_work:.3f} against {one_work:.3f}, so the "
                   "extra idle time is the transfers and the waits, which W cannot fill" if zero_work < one_work else
                   f"even with the stages' measured work it gives {zero_work:.3f} against {one_work:.3f}: its split "
                   "backward costs more than the bubble it fills at this size")
            notes.append(f"zero-bubble idles {zero:.3f} (mean of the stages), ABOVE 1F1B's {one:.3f} at equal p and m: {why}")
    return notes


def schedules_chart(out, paths):
    plt = plt_module()
    runs = schedule_rows(paths)
    p, m = runs[0][0]["stages"], runs[0][0]["micro_batches"]
    fig, ax = plt.subplots(figsize=(8, 4))
    labels, x = [], 0
    for k, rows in enumerate(runs):
        for r in rows:
            ax.bar(x - 0.27, r["theory"], 0.27, color="white", edgecolor="black", hatch="//",
                   label="theory (equal stages, free transfers)" if x == 0 else None)
            ax.bar(x, r["simulated"], 0.27, color="#9ecae1",
                   label="the schedule with the stages' measured work" if x == 0 else None)
            ax.bar(x + 0.27, r["bubble"], 0.27, color="#08519c", label="measured" if x == 0 else None)
            if r["simulated"] >= 0.01:  # below, the ratio says nothing
                ax.annotate(f"{r['bubble'] / r['simulated']:.2f}x", (x + 0.27, r["bubble"]), ha="center", va="bottom",
                            fontsize=7)
            v = r["virtual_stages"]
            labels.append(f"{r['schedule']}{f' v={v}' if v > 1 else ''}\nstage {r['stage']}")
            x += 1
        x += 0.5
    ticks = [i + 0.5 * k for k, rows in enumerate(runs) for i in range(k * len(rows), (k + 1) * len(rows))]
    ax.set_xticks(ticks)
    ax.set_xticklabels(labels, fontsize=7)
    ax.set(ylabel="idle share of the step (bubble)")
    top = max(max(r["bubble"], r["simulated"], r["theory"]) for rows in runs for r in rows)
    ax.set_ylim(0, 1.4 * top)  # room for the legend above the tallest bar
    ax.set_title(f"Schedules at equal p = {p}, m = {m}: each stage's bubble (measured / with the measured work above "
                 "each bar)", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    notes = schedule_notes(runs)
    for line in notes:
        print(f"schedules: {line}")
    write_caption(out, notes)


def trace_lanes(doc):
    """A Chrome trace (chapter 05's buckets, chapter 08's stages) read once for the chart and the page:
    its complete spans, its lanes (pid, tid) in order, each lane's name, and whether the spans are a
    pipeline's actions (F3, B3; interleaved F3.1, micro-batch 3 through chunk 1; zero bubble's W3)."""
    spans = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    lanes = sorted({(e["pid"], e["tid"]) for e in spans})
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
             if e.get("ph") == "M" and e["name"] == "thread_name"}
    pipeline = bool(spans) and all(re.fullmatch(r"[FBW]\d+(\.\d+)?", e["name"]) for e in spans)
    return spans, lanes, names, pipeline


def timeline_chart(trace_path, out):
    plt = plt_module()
    with open(trace_path) as f:
        doc = json.load(f)
    spans, lanes, names, pipeline = trace_lanes(doc)
    fig, ax = plt.subplots(figsize=(10, 1 + 0.6 * len(lanes)))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    # A pipeline's actions are coloured by pass; other spans take turns.
    for row, lane in enumerate(lanes):
        for i, e in enumerate(x for x in spans if (x["pid"], x["tid"]) == lane):
            color = colors["FBW".index(e["name"][0])] if pipeline else colors[i % len(colors)]
            ax.broken_barh([(e["ts"] / 1000, max(e["dur"], 1) / 1000)], (row - 0.4, 0.8),
                           facecolors=color, edgecolor="black", linewidth=0.3)
            ax.text(e["ts"] / 1000 + e["dur"] / 2000, row, e["name"].replace("layer ", "L").replace("bucket ", "b"),
                    ha="center", va="center", fontsize=6)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([f"rank {p}: {names.get((p, t), t)}" for p, t in lanes], fontsize=8)
    ax.invert_yaxis()
    label = doc.get("metadata", {}).get("label", "").strip()
    if pipeline:
        ax.set_xlabel("ms since the step began (F forward, B backward of micro-batch i; with W, B is the "
                      "activations' half and W the weights'; .c chunk c; white: the bubble)", fontsize=8)
        ax.set_title("Pipeline stages" + (f": {label}" if label else ""), fontsize=10)
    else:
        ax.set_xlabel("ms since the first gradient of the step")
        ax.set_title("One step: backward compute and bucket all-reduces" + (f"\n{label}" if label else ""), fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


# A point whose repeats spread (max - min) by more than this fraction of their median is marked noisy: the
# machine's other work moved it more than the effect a participant is to read from it (issue: two ranks
# on two cores differ from one by tens of percent; a 10% wobble would hide or fake that).
NOISY_SPREAD = 0.10


class ScalingPoint:
    """One rank count of a scaling sweep: the samples/s of each repeat, and what they share."""

    def __init__(self, ranks):
        self.ranks, self.samples_per_s, self.oversubscribed, self.threads = ranks, [], False, set()
        self.step_ms, self.parameters = [], set()

    @property
    def median(self):
        return median(self.samples_per_s)

    @property
    def spread(self):
        """(max - min) / median of the repeats: 0 for a single run."""
        return (max(self.samples_per_s) - min(self.samples_per_s)) / self.median

    @property
    def noisy(self):
        return self.spread > NOISY_SPREAD


def scaling_points(paths):
    """The runs grouped by rank count (repeats together), sorted by ranks."""
    points = {}
    for path in paths:
        records = read(path)
        s = events(records, "ddp_summary")[-1]
        cores = events(records, "cpu_cores")
        point = points.setdefault(s["ranks"], ScalingPoint(s["ranks"]))
        point.samples_per_s.append(s["samples_per_s"])
        point.oversubscribed |= s["local_size"] > s.get("cores", s["local_size"])
        point.threads.add(cores[-1]["threads"] if cores else None)
        point.step_ms.append(s.get("step_ms"))
        point.parameters.add(s.get("parameters"))
    return [points[r] for r in sorted(points)]


def workload(modes_points):
    """The model's size and one rank's step, the scale a participant reads the speedup against."""
    parameters = set().union(*(p.parameters for points in modes_points.values() for p in points)) - {None}
    one = [ms for points in modes_points.values() for p in points if p.ranks == 1 for ms in p.step_ms if ms]
    said = []
    if len(parameters) == 1:
        said.append(f"{next(iter(parameters)):,} parameters")
    if one:
        said.append(f"one rank's step {sorted(one)[len(one) // 2]:.1f} ms")
    return ", ".join(said)


def scaling(points, mode):
    """Speedup and efficiency of each point's median against the 1-rank median; the summary lines."""
    base = next((p for p in points if p.ranks == 1), None)
    if not base:
        raise SystemExit(f"speedup: the {mode} runs need a 1-rank run as the baseline")
    rows = []
    for p in points:
        speedup = p.median / base.median
        rows.append((p, speedup, speedup / p.ranks))
    lines = [f"{mode:6s} ranks {p.ranks}: {p.median:10.0f} samples/s (median of {len(p.samples_per_s)}, spread "
             f"{100 * p.spread:4.1f}%)  speedup {s:5.2f}  efficiency {e:5.2f}"
             f"{'  (oversubscribed)' if p.oversubscribed else ''}{'  NOISY' if p.noisy else ''}" for p, s, e in rows]
    return rows, lines


# Efficiency above this is speedup beyond ideal, which data parallelism alone cannot give: the chart flags it.
ABOVE_IDEAL = 1.05


def contradictions(rows, mode, same_threads):
    """One line for each point whose speedup exceeds ideal, with the reason the measured data give."""
    lines = []
    for p, speedup, efficiency in rows:
        if efficiency <= ABOVE_IDEAL:
            continue
        why = (f"its repeats spread by {100 * p.spread:.0f}% of their median: the machine's noise" if p.noisy else
               "the points ran with different threads per rank: the speedup measures threads too" if not same_threads else
               "neither noise nor threads explain it: each rank's smaller share may fit a faster cache")
        lines.append(f"{mode} scaling at {p.ranks} ranks is ABOVE IDEAL (efficiency {efficiency:.2f}): {why}")
    return lines


def threads_per_rank(modes_points):
    """The one thread count every run used, or None when they differ (the chart then measures threads too)."""
    threads = set().union(*(p.threads for points in modes_points.values() for p in points))
    return next(iter(threads)) if len(threads) == 1 else None


def efficiency_top(modes_points):
    """The efficiency axis's top: 1.2, or above the fastest repeat of any point (no axis clips a point)."""
    top = 1.2
    for points in modes_points.values():
        base = next((p for p in points if p.ranks == 1), None)
        if base:
            top = max(top, 1.1 * max(max(p.samples_per_s) / base.median / p.ranks for p in points))
    return top


# Predicted and measured speedups further apart than this fraction get a line that says why.
OFF_MODEL = 0.25


def predicted_speedups(mode, paths):
    """The course's cost model's speedup at each rank count, from benchmarks/plan's records (one a file, DP
    ranks): samples/s against one rank's, strong t(1)/t(n) (the same batch), weak n t(1)/t(n)."""
    step = {}
    for path in paths:
        plan = events(read(path), "plan")
        if not plan:
            raise SystemExit(f"speedup: {path} has no plan record (benchmarks/plan --calibration ... --metrics FILE)")
        step[plan[-1]["dp"]] = plan[-1]["step_seconds"]
    if 1 not in step:
        raise SystemExit(f"speedup: the {mode} prediction needs the 1-rank one as its baseline")
    return {n: step[1] / t * (n if mode == "weak" else 1) for n, t in sorted(step.items())}


def model_notes(rows, mode, model):
    """Each point's predicted/measured speedup; where they differ by more than OFF_MODEL, the reason the
    measured data give."""
    lines = []
    for p, speedup, _ in rows:
        if p.ranks not in model or p.ranks == 1:
            continue
        ratio = model[p.ranks] / speedup
        line = f"{mode} at {p.ranks} ranks: measured {speedup:.2f}x, the model {model[p.ranks]:.2f}x (predicted/measured {ratio:.2f})"
        if abs(ratio - 1) > OFF_MODEL:
            why = (["more ranks than cores: the model gives each rank its share of a core, the run also waits "
                    "for a descheduled rank at every all-reduce"] if p.oversubscribed else []) + \
                  ([noise_reason(p.spread)] if p.noisy else [])
            line += off_model(ratio, why, "the ranks' MPI progress and the machine's own work compete with compute for "
                                          "the cores, which the model leaves out (04's NOTES, Speedup charts)")
        lines.append(line)
    return lines


def speedup_chart(out, modes, predicted=None, calibration=None):
    """The chart and its caption; PREDICTED: benchmarks/plan's records per mode, CALIBRATION: its calibration
    file (its date goes on the chart)."""
    day = calibration_day(calibration)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax_speedup, ax_eff) = plt.subplots(1, 2, figsize=(10, 4))
    top, annotated, noisy, total = 1, set(), 0, 0
    modes_points = {mode: scaling_points(paths) for mode, paths in modes.items()}
    threads = threads_per_rank(modes_points)
    flagged = []
    for mode, points in modes_points.items():
        rows, lines = scaling(points, mode)
        print("\n".join(lines))
        flagged += contradictions(rows, mode, threads is not None)
        model = predicted_speedups(mode, predicted[mode]) if predicted and mode in predicted else {}
        flagged += model_notes(rows, mode, model)
        base = next(p for p in points if p.ranks == 1).median
        ranks = [p.ranks for p, _, _ in rows]
        speedup = [s for _, s, _ in rows]
        efficiency = [e for _, _, e in rows]
        # The bars: each point's slowest and fastest repeat, against the same baseline median.
        low = [s - min(p.samples_per_s) / base for p, s, _ in rows]
        high = [max(p.samples_per_s) / base - s for p, s, _ in rows]
        top = max(top, max(ranks))
        line = ax_speedup.errorbar(ranks, speedup, yerr=[low, high], marker="o", capsize=3, label=f"{mode} scaling")[0]
        ax_eff.errorbar(ranks, efficiency, yerr=[[l / r for l, r in zip(low, ranks)], [h / r for h, r in zip(high, ranks)]],
                        marker="o", capsize=3, color=line.get_color(), label=f"{mode} scaling")
        if model:
            at = [n for n in ranks if n in model]
            ax_speedup.plot(at, [model[n] for n in at], linestyle=":", marker="x", color=line.get_color(),
                            label=f"{mode}, the course's model")
            ax_eff.plot(at, [model[n] / n for n in at], linestyle=":", marker="x", color=line.get_color(),
                        label=f"{mode}, the course's model")
        for p, s, e in rows:
            total += 1
            if p.oversubscribed:  # more ranks than cores: hollow marker, and say so once
                ax_speedup.plot([p.ranks], [s], marker="o", markerfacecolor="white", color=line.get_color())
                if p.ranks not in annotated:
                    ax_speedup.annotate("oversubscribed", (p.ranks, s), textcoords="offset points", xytext=(-40, -16), fontsize=8)
                    annotated.add(p.ranks)
            if p.noisy:
                noisy += 1
                ax_eff.annotate("noisy", (p.ranks, e), textcoords="offset points", xytext=(4, 4), fontsize=8, color="red")
            if e > ABOVE_IDEAL:
                ax_eff.annotate("above ideal", (p.ranks, e), textcoords="offset points", xytext=(4, -12), fontsize=8,
                                color="red")
    repeats = sorted({len(p.samples_per_s) for points in modes_points.values() for p in points})
    setting = (f"{threads} thread{'s' if threads != 1 else ''} per rank at every rank count" if threads else
               "THREADS PER RANK DIFFER between the points: the chart measures threads as well as ranks")
    counted = str(repeats[0]) if len(repeats) == 1 else f"{repeats[0]}-{repeats[-1]}"
    size = workload(modes_points)
    fig.suptitle(f"{size + '; ' if size else ''}{setting}; each point the median of {counted} run(s), bars from the "
                 "slowest to the fastest", fontsize=9)
    ax_speedup.plot([1, top], [1, top], linestyle="--", color="grey", label="ideal")
    ax_speedup.set(xlabel="ranks", ylabel="speedup (samples/s vs 1 rank)",
                   title=f"Speedup (dotted: the model, calibrated {day})" if day else "Speedup")
    ax_eff.axhline(1.0, linestyle="--", color="grey", label="ideal")
    ax_eff.set(xlabel="ranks", ylabel="parallel efficiency (speedup / ranks)", title="Efficiency",
               ylim=(0, efficiency_top(modes_points)))
    for ax in (ax_speedup, ax_eff):
        ax.set_xticks(sorted({p.ranks for points in modes_points.values() for p in points}))
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    notes = [setting + (f" ({workload(modes_points)})" if workload(modes_points) else "")]
    if day:
        notes.append(f"dotted: the course's cost model (benchmarks/plan), calibrated on this machine on {day}")
    elif not predicted:
        notes.append("no prediction beside these points: scripts/sweep.sh prices its two workloads as they run, "
                     "without SWEEP_ARGS")
    notes += flagged
    if noisy:
        notes.append(f"{noisy} of {total} point(s) NOISY (their repeats spread by more than {100 * NOISY_SPREAD:.0f}% "
                     "of their median): the machine was too busy for these figures to carry the lesson")
    for line in notes:
        print(f"speedup: {line}")
    write_caption(out, notes)


def write_caption(chart, lines):
    """CHART's caption beside it (CHART without .png, .caption.txt), which the results page shows under the
    chart: through a temporary made anew (O_EXCL) and renamed over, so a link in its place is replaced, not
    followed."""
    path = os.path.splitext(chart)[0] + ".caption.txt"
    temporary = f"{path}.{os.getpid()}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "w") as f:
            f.write("".join(line + "\n" for line in lines))
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def ensure_matplotlib():
    """The charts need matplotlib. scripts/setup.sh installs Debian's python3-matplotlib, which only the
    system's /usr/bin/python3 sees; another python3 first on PATH (pyenv, a virtual environment) may
    lack it. Then the script runs again under the system's."""
    try:
        import matplotlib  # noqa: F401
        return
    except ImportError:
        pass
    system = "/usr/bin/python3"
    if os.access(system, os.X_OK) and os.path.realpath(system) != os.path.realpath(sys.executable):
        os.execv(system, [system] + sys.argv)
    sys.exit("plot.py: matplotlib is missing: install python3-matplotlib (scripts/setup.sh does)")


def repeats_and_prefix(args, command):
    """COMMAND's METRICS... OUT_PREFIX [--calibration FILE]: (the metrics and the prefix, FILE or None);
    (None, None) after saying what is wrong."""
    calibration = None
    if "--calibration" in args:
        at = args.index("--calibration")
        calibration = args[at + 1] if at + 1 < len(args) else None
        if calibration is None or not os.path.isfile(calibration):
            print(f"{command}: --calibration needs the calibration file scripts/calibrate.sh wrote, not '{calibration}'",
                  file=sys.stderr)
            return None, None
        args = args[:at] + args[at + 2:]
    if len(args) < 2:
        print(f"{command}: give the metrics (several: repeats) and OUT_PREFIX", file=sys.stderr)
        return None, None
    return args, calibration


def main(argv):
    if len(argv) < 3 or argv[1] not in ("summary", "loss", "speedup", "overlap", "timeline", "zero", "pipeline", "plan", "schedules"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    if argv[1] != "summary":
        ensure_matplotlib()
    if argv[1] == "summary":
        print(summary(argv[2]))
    elif argv[1] == "loss":
        loss_chart(argv[2], argv[3])
    elif argv[1] == "overlap":
        args, calibration = repeats_and_prefix(argv[2:], "overlap")
        if args is None:
            return 2
        overlap_charts(args[:-1], args[-1], calibration)
    elif argv[1] == "timeline":
        timeline_chart(argv[2], argv[3])
    elif argv[1] == "zero":
        args, calibration = repeats_and_prefix(argv[2:], "zero")
        if args is None:
            return 2
        zero_charts(args[0], args[-1])
        if any(events(read(path), "zero_prediction") for path in args[:-1]):
            zero_time_chart(args[:-1], f"{args[-1]}_time.png", calibration)
    elif argv[1] == "pipeline":
        pipeline_charts(argv[2], argv[3])
    elif argv[1] == "plan":
        plan_chart(argv[2], argv[3])
    elif argv[1] == "schedules":
        if len(argv) < 4:
            print("schedules: give OUT.png and each schedule's metrics", file=sys.stderr)
            return 2
        schedules_chart(argv[2], argv[3:])
    elif argv[1] == "speedup":
        modes, predicted, calibration, current = {}, {}, None, None
        args = iter(argv[3:])
        for arg in args:
            if arg in ("--strong", "--weak"):
                current = modes.setdefault(arg[2:], [])
            elif arg in ("--predicted-strong", "--predicted-weak"):
                current = predicted.setdefault(arg[len("--predicted-"):], [])
            elif arg == "--calibration":
                calibration = next(args, None)
                if calibration is None or not os.path.isfile(calibration):
                    print(f"speedup: --calibration needs the calibration file benchmarks/plan wrote, not '{calibration}'",
                          file=sys.stderr)
                    return 2
                current = None
            elif current is not None:
                current.append(arg)
            else:
                print(f"speedup: '{arg}' comes before --strong or --weak", file=sys.stderr)
                return 2
        if not modes or not all(modes.values()):
            print("speedup: give --strong and/or --weak, each with metrics files", file=sys.stderr)
            return 2
        speedup_chart(argv[2], modes, predicted, calibration)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
