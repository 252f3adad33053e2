#!/usr/bin/env python3
"""Reads the chapters' JSON-lines metrics: one-line summaries and charts (PNG).

  plot.py summary METRICS              the key figure of a run, in one line
  plot.py loss METRICS OUT.png         loss per epoch (or per step)
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
        return (f"max weight diff {acc['max_weight_diff']:.2e}, peak activations "
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


def main(argv):
    if len(argv) < 3 or argv[1] not in ("summary", "loss"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    if argv[1] == "summary":
        print(summary(argv[2]))
    elif argv[1] == "loss":
        loss_chart(argv[2], argv[3])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
