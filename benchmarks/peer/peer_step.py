#!/usr/bin/env python3
"""The course's training step against PyTorch's, on the CPU, side by side in one run.

For each case (the MLP at widths 256 and 1024, the chapters' default GPT; 1 and 2 threads) the course's
bench_step writes its initial weights and its batch to a safetensors file; this script loads them into
the same model written in PyTorch, runs the same step (forward, loss, backward, optimizer step,
zero_grad) with the same number of threads, and prints

  * the first losses of both: the same weights and data must give the same numbers (to float32 rounding),
    which checks that the two programs really run the same computation;
  * the median step time of both and the ratio ours / PyTorch's, measured in alternating rounds so that
    the machine's drift falls on both alike.

With --weights FILE it only loads FILE (chapter 07's consolidated checkpoint of the default GPT, or any
chapter's --save of it) into PyTorch's GPT by name, strictly, and prints its loss on bench_step's batch
beside the initial weights' loss.

PyTorch lives in its own virtual environment (scripts/setup_peer.sh); the course never needs it.
  scripts/setup_peer.sh
  .venv-peer/bin/python benchmarks/peer/peer_step.py [--bench build/release/benchmarks/bench_step]
  .venv-peer/bin/python benchmarks/peer/peer_step.py --weights model.safetensors
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from safetensors import safe_open
    from safetensors.torch import load_file
except ImportError as error:
    sys.exit(f"peer_step: {error.name} is missing; run scripts/setup_peer.sh and use .venv-peer/bin/python")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CASES = [("mlp", 256), ("mlp", 1024), ("gpt", None)]
# Same weights, same data: only the order of float32 additions differs (OpenBLAS against MKL/oneDNN
# blocking, our double-precision reductions), a few parts in 1e6 per step, over three steps.
LOSS_RTOL = 1e-4


def mlp_from(settings):
    layers = []
    sizes = [settings["features"]] + [settings["width"]] * settings["hidden_layers"] + [1]
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i + 2 < len(sizes):
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class SelfAttention(nn.Module):
    def __init__(self, c, n_head):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(c, 3 * c)
        self.c_proj = nn.Linear(c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))


class MLPBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = nn.Linear(c, 4 * c)
        self.c_proj = nn.Linear(4 * c, c)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, c, n_head):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(c), SelfAttention(c, n_head)
        self.ln_2, self.mlp = nn.LayerNorm(c), MLPBlock(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """nanoGPT's model, with the course's parameter names; the head is the token table (tied)."""

    def __init__(self, s):
        super().__init__()
        c = s["n_embd"]
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(s["vocab_size"], c), wpe=nn.Embedding(s["block_size"], c),
            h=nn.ModuleList(Block(c, s["n_head"]) for _ in range(s["n_layer"])), ln_f=nn.LayerNorm(c)))

    def forward(self, ids):
        t = ids.shape[1]
        x = self.transformer.wte(ids) + self.transformer.wpe(torch.arange(t))
        for block in self.transformer.h:
            x = block(x)
        return F.linear(self.transformer.ln_f(x), self.transformer.wte.weight)


def torch_step(path):
    """The model, its optimizer and a step function, from the file bench_step wrote."""
    with safe_open(path, "pt") as f:
        settings = json.loads(f.metadata()["bench"])
    tensors = load_file(path)
    if settings["model"] == "mlp":
        model = mlp_from(settings)
        x, y = tensors.pop("input.x"), tensors.pop("input.y")
        loss_fn = lambda: F.mse_loss(model(x), y)
        optimizer = torch.optim.SGD(model.parameters(), lr=settings["lr"])
    else:
        model = GPT(settings)
        ids, targets = tensors.pop("input.ids").long(), tensors.pop("input.targets").long()
        loss_fn = lambda: F.cross_entropy(model(ids).view(-1, settings["vocab_size"]), targets, ignore_index=-100)
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": settings["weight_decay"]},
                                       {"params": no_decay, "weight_decay": 0.0}],
                                      lr=settings["lr"], betas=tuple(settings["betas"]), eps=settings["eps"])
    model.load_state_dict(tensors, strict=True)

    def step():
        loss = loss_fn()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    return step


def time_torch(path, threads, warmup, steps, check_steps):
    torch.set_num_threads(threads)
    step = torch_step(path)
    losses, times = [], []
    for i in range(warmup + steps):
        start = time.perf_counter()
        loss = step()
        elapsed = (time.perf_counter() - start) * 1e3
        if i < check_steps:
            losses.append(loss.item())
        if i >= warmup:
            times.append(elapsed)
    return statistics.median(times), losses


def run_ours(bench, model, width, threads, warmup, steps, save_init=None):
    command = [bench, "--model", model, "--threads", str(threads), "--warmup", str(warmup), "--steps", str(steps),
               "--json", "--device", "cpu"]
    if width:
        command += ["--width", str(width)]
    if save_init:
        command += ["--save-init", save_init]
    env = dict(os.environ)
    env.pop("OPENBLAS_NUM_THREADS", None)
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def load_weights(bench, path):
    """PyTorch's GPT from FILE, strictly by name; its loss on bench_step's GPT batch against the initial one."""
    with tempfile.TemporaryDirectory() as folder:
        init = os.path.join(folder, "gpt.safetensors")
        run_ours(bench, "gpt", None, 1, 0, 1, save_init=init)
        with safe_open(init, "pt") as f:
            settings = json.loads(f.metadata()["bench"])
        tensors = load_file(init)
    ids, targets = tensors.pop("input.ids").long(), tensors.pop("input.targets").long()
    model = GPT(settings)
    model.load_state_dict(tensors, strict=True)
    with torch.no_grad():
        loss = lambda: F.cross_entropy(model(ids).view(-1, settings["vocab_size"]), targets, ignore_index=-100).item()
        initial = loss()
        weights = load_file(path)
        try:
            model.load_state_dict(weights, strict=True)
        except RuntimeError as error:
            sys.exit(f"peer_step: --weights {path}: not the chapters' default GPT: {' '.join(str(error).split())[:300]}")
        print(f"loaded {len(weights)} tensors from {path} into PyTorch's GPT (strict, by name); loss on "
              f"bench_step's batch {loss():.6f}, initial weights {initial:.6f}")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bench", default=os.path.join(ROOT, "build/release/benchmarks/bench_step"))
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per case")
    parser.add_argument("--steps", type=int, default=0, help="timed steps per round (0: by case)")
    parser.add_argument("--metrics", help="append one JSON line per case here")
    parser.add_argument("--weights", help="only load this file into PyTorch's GPT and print its loss")
    args = parser.parse_args()
    if not os.access(args.bench, os.X_OK):
        sys.exit(f"peer_step: --bench {args.bench} is not an executable; build the course first (scripts/setup.sh)")
    if args.weights:
        if not os.path.isfile(args.weights):
            sys.exit(f"peer_step: --weights {args.weights}: no such file")
        return load_weights(args.bench, args.weights)
    threads = [int(t) for t in args.threads.split(",")]

    print(f"PyTorch {torch.__version__} against the course, CPU, {os.cpu_count()} cores; "
          f"medians over {args.rounds} alternating rounds")
    print(f"{'case':<16}{'threads':>8}{'ours ms':>10}{'PyTorch ms':>12}{'ours/PyTorch':>14}"
          f"{'step/GEMMs':>12}  first losses, ours | PyTorch")
    all_agree = True
    with tempfile.TemporaryDirectory() as folder:
        for model, width in CASES:
            name = f"{model} {width}" if width else f"{model} default"
            steps = args.steps or (10 if width == 1024 else 30)
            for t in threads:
                init = os.path.join(folder, f"{model}_{width}.safetensors")
                first = run_ours(args.bench, model, width, t, 0, 3, save_init=init)
                _, torch_losses = time_torch(init, t, 0, 3, 3)
                agree = all(math.isclose(a, b, rel_tol=LOSS_RTOL) for a, b in zip(first["losses"], torch_losses))
                all_agree &= agree
                ours, theirs, gemm = [], [], []
                for _ in range(args.rounds):
                    time.sleep(0.2)  # let the other side's OpenMP threads stop spinning first
                    result = run_ours(args.bench, model, width, t, 3, steps)
                    ours.append(result["step_ms"])
                    gemm.append(result.get("step_over_gemm", float("nan")))
                    time.sleep(0.2)
                    theirs.append(time_torch(init, t, 3, steps, 0)[0])
                ratio = statistics.median(o / p for o, p in zip(ours, theirs))
                gemm_text = "-" if math.isnan(gemm[0]) else f"{statistics.median(gemm):.2f}"
                losses = " ".join(f"{x:.6f}" for x in first["losses"]) + " | " + \
                    " ".join(f"{x:.6f}" for x in torch_losses)
                print(f"{name:<16}{t:>8}{statistics.median(ours):>10.3f}{statistics.median(theirs):>12.3f}"
                      f"{ratio:>14.2f}{gemm_text:>12}  {losses}  {'agree' if agree else 'DIFFER'}",
                      flush=True)
                if args.metrics:
                    with open(args.metrics, "a") as f:
                        f.write(json.dumps({"benchmark": "peer_step", "case": name, "threads": t,
                                            "ours_ms": statistics.median(ours),
                                            "pytorch_ms": statistics.median(theirs), "ratio": ratio,
                                            "step_over_gemm": None if math.isnan(gemm[0]) else statistics.median(gemm), "losses_agree": agree,
                                            "torch": torch.__version__}) + "\n")
    print("first losses agree" if all_agree else "first losses DIFFER: the two programs do not compute the same step")
    return 0 if all_agree else 1


if __name__ == "__main__":
    sys.exit(main())
