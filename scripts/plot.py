#!/usr/bin/env python3
"""Reads the chapters' JSON-lines metrics: one-line summaries and charts (PNG).

  plot.py summary METRICS              the key figure of a run, in one line
  plot.py loss METRICS OUT.png         loss per epoch (or per step)
  plot.py speedup OUT.png --strong M1 M2 M4 [--weak W1 W2 W4]
                                       speedup against ideal and parallel efficiency, from runs of
                                       chapter 04 at several rank counts (strong: fixed global batch;
                                       weak: fixed per-rank batch)
"""
import json
import sys


def read(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def events(records, name):
    return [r for r in records if r.get("event") == name]


def summary(path):
    records = read(path)
    final = (events(records, "final") or [None])[-1]
    acc = (events(records, "accumulation") or [None])[-1]
    ddp = (events(records, "ddp_summary") or [None])[-1]
    if ddp:
        text = (f"{ddp['ranks']} ranks, {ddp['samples_per_s']:.0f} samples/s, step {ddp['step_ms']:.2f} ms "
                f"(communication {ddp['comm_ms']:.2f})")
        if ddp["verified"]:
            text += (f", lock-step {ddp['gradient_bound_ratio']:.2f} of the fp32 bound, final drift "
                     f"{ddp['drift_ratio']:.2f}x noise floor")
        return text
    bench = events(records, "bench")
    if bench:
        largest = max(r["bytes"] for r in bench)
        rows = {r["algorithm"]: r for r in bench if r["op"] == "all_reduce" and r["bytes"] == largest}
        lib = next((r for a, r in rows.items() if a not in ("ring", "tree", "naive")), None)
        wrong = sum(r["wrong"] for r in bench)
        text = f"{len(bench)} rows, #wrong {wrong}"
        if "ring" in rows and lib and lib["busbw_gbps"] > 0:
            text += (f"; all_reduce {largest / 2**20:.0f} MiB busbw ring {rows['ring']['busbw_gbps']:.2f} GB/s"
                     f" vs {lib['algorithm']} {lib['busbw_gbps']:.2f} GB/s")
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
    ax.set_ylabel("loss (MSE)")
    ax.set_title(path.split("/")[-2] if "/" in path else path)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def scaling_points(paths):
    """(ranks, samples/s, oversubscribed) per run, sorted by ranks."""
    points = []
    for path in paths:
        s = events(read(path), "ddp_summary")[-1]
        points.append((s["ranks"], s["samples_per_s"], s["local_size"] > s.get("cores", s["local_size"])))
    return sorted(points)


def speedup_chart(out, modes):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax_speedup, ax_eff) = plt.subplots(1, 2, figsize=(10, 4))
    top, annotated = 1, set()
    for mode, paths in modes.items():
        points = scaling_points(paths)
        base = next((sps for ranks, sps, _ in points if ranks == 1), None)
        if not base:
            raise SystemExit(f"speedup: the {mode} runs need a 1-rank run as the baseline")
        ranks = [p[0] for p in points]
        speedup = [p[1] / base for p in points]
        efficiency = [s / r for s, r in zip(speedup, ranks)]
        top = max(top, max(ranks))
        line = ax_speedup.plot(ranks, speedup, marker="o", label=f"{mode} scaling")[0]
        ax_eff.plot(ranks, efficiency, marker="o", color=line.get_color(), label=f"{mode} scaling")
        for (r, _, over), s, e in zip(points, speedup, efficiency):
            if over:  # more ranks than cores: hollow marker, and say so once
                ax_speedup.plot([r], [s], marker="o", markerfacecolor="white", color=line.get_color())
                if r not in annotated:
                    ax_speedup.annotate("oversubscribed", (r, s), textcoords="offset points", xytext=(-40, -16), fontsize=8)
                    annotated.add(r)
            print(f"{mode:6s} ranks {r}: {points[ranks.index(r)][1]:10.0f} samples/s  speedup {s:5.2f}  "
                  f"efficiency {e:5.2f}{'  (oversubscribed)' if over else ''}")
    ax_speedup.plot([1, top], [1, top], linestyle="--", color="grey", label="ideal")
    ax_speedup.set(xlabel="ranks", ylabel="speedup (samples/s vs 1 rank)", title="Speedup")
    ax_eff.axhline(1.0, linestyle="--", color="grey", label="ideal")
    ax_eff.set(xlabel="ranks", ylabel="parallel efficiency (speedup / ranks)", title="Efficiency", ylim=(0, 1.2))
    for ax in (ax_speedup, ax_eff):
        ax.set_xticks(sorted({r for paths in modes.values() for r, _, _ in scaling_points(paths)}))
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main(argv):
    if len(argv) < 3 or argv[1] not in ("summary", "loss", "speedup"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    if argv[1] == "summary":
        print(summary(argv[2]))
    elif argv[1] == "loss":
        loss_chart(argv[2], argv[3])
    elif argv[1] == "speedup":
        modes, current = {}, None
        for arg in argv[3:]:
            if arg in ("--strong", "--weak"):
                current = arg[2:]
                modes[current] = []
            elif current:
                modes[current].append(arg)
            else:
                print(f"speedup: '{arg}' comes before --strong or --weak", file=sys.stderr)
                return 2
        if not modes or not all(modes.values()):
            print("speedup: give --strong and/or --weak, each with metrics files", file=sys.stderr)
            return 2
        speedup_chart(argv[2], modes)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
