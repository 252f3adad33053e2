#!/usr/bin/env python3
"""A whole character-model training run in PyTorch beside the course's, on the same text, timed end to end.

The run a new user tries after chapter 04: a GPT of 3 layers, 4 heads, width 96 and block 64 on the
characters of a text file, global batch 64, AdamW (betas 0.9, 0.95, weight decay 0.1 on the matrices)
with a linear warm-up over a tenth of the run (at most 100 steps) and cosine decay to a tenth of the
learning rate, the gradient clipped to norm 1: nanoGPT's recipe, which is also the course's
`--optimizer adamw` (common/optim/recipe.h). This script runs

  * the course: `04_ddp --model gpt --data FILE --optimizer adamw ...` (one rank, every core), and
  * the same training in PyTorch, written here the way nanoGPT's train.py does it (the model of
    peer_step.py, random windows of the first 90% of the text, the same schedule and clipping),

one after the other for each seed, and prints the wall time of each whole run (start-up, data,
training, the final validation loss), the mean step time, and the validation loss of both on the same 64
windows of the held-out tenth. A 4.1 MB text and 1,500 steps take a few minutes per run on two cores.

  .venv-peer/bin/python benchmarks/peer/peer_train.py --data FILE [--steps 1500] [--seeds 1,2]
"""
import argparse
import math
import os
import re
import statistics
import subprocess
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError as error:
    sys.exit(f"peer_train: {error.name} is missing; run scripts/setup_peer.sh and use .venv-peer/bin/python")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_step import GPT  # noqa: E402  the same PyTorch model as the step benchmark

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def lr_at(step, lr, steps):
    """The course's (and nanoGPT's) schedule: linear warm-up from lr/warmup, then cosine to lr/10."""
    warmup = min(100, steps // 10)
    if step < warmup:
        return lr * (1.0 / warmup + (1.0 - 1.0 / warmup) * step / warmup)
    progress = (step - warmup) / (steps - warmup)
    return lr / 10 + (lr - lr / 10) * 0.5 * (1.0 + math.cos(math.pi * progress))


def train_torch(args, seed):
    start = time.perf_counter()
    torch.manual_seed(seed)
    torch.set_num_threads(args.threads)
    text = open(args.data, "rb").read()
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    data = torch.tensor([index[c] for c in text], dtype=torch.long)
    split = int(len(data) * (1.0 - args.val_fraction))
    train, val = data[:split], data[split:]
    settings = {"n_layer": args.n_layer, "n_head": args.n_head, "n_embd": args.n_embd,
                "block_size": args.block_size, "vocab_size": len(vocab)}
    model = GPT(settings)
    for name, p in model.named_parameters():  # GPT-2's initialisation, as nanoGPT's _init_weights
        if name.endswith("bias"):
            torch.nn.init.zeros_(p)
        elif "ln" in name:
            torch.nn.init.ones_(p)
        else:
            std = 0.02 / math.sqrt(2 * args.n_layer) if name.endswith("c_proj.weight") else 0.02
            torch.nn.init.normal_(p, 0.0, std)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    t = args.block_size
    step_times = []
    for step in range(args.steps):
        began = time.perf_counter()
        at = torch.randint(len(train) - t, (args.batch,))
        x = torch.stack([train[i:i + t] for i in at])
        y = torch.stack([train[i + 1:i + 1 + t] for i in at])
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, args.lr, args.steps)
        loss = F.cross_entropy(model(x).view(-1, len(vocab)), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step > 0:
            step_times.append((time.perf_counter() - began) * 1e3)
    # The validation loss on the windows the course evaluates: 64 spread across the held-out text.
    count = len(val) - t
    windows = [i * count // min(64, count) for i in range(min(64, count))]
    with torch.no_grad():
        x = torch.stack([val[i:i + t] for i in windows])
        y = torch.stack([val[i + 1:i + 1 + t] for i in windows])
        val_loss = F.cross_entropy(model(x).view(-1, len(vocab)), y.view(-1)).item()
    where = f"{torch.get_num_threads()} threads on {len(os.sched_getaffinity(0))} of {os.cpu_count()} cores"
    return time.perf_counter() - start, statistics.mean(step_times), val_loss, where


def train_ours(args, seed):
    command = [args.binary, "--device", "cpu", "--model", "gpt", "--data", args.data, "--optimizer", "adamw",
               "--lr", str(args.lr), "--steps", str(args.steps), "--global-batch", str(args.batch),
               "--n-layer", str(args.n_layer), "--n-head", str(args.n_head), "--n-embd", str(args.n_embd),
               "--block-size", str(args.block_size), "--val-fraction", str(args.val_fraction), "--seed", str(seed),
               "--log-every", str(args.steps)]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    start = time.perf_counter()
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout
    wall = time.perf_counter() - start
    val_loss = float(re.search(r"validation loss: ([0-9.]+)", out).group(1))
    step_ms = re.search(r"per step ([0-9.]+) ms", out)
    cores = re.search(r"^cpu: (.*)$", out, re.MULTILINE)
    return wall, float(step_ms.group(1)) if step_ms else float("nan"), val_loss, cores.group(1) if cores else "?"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True, help="a text file (a few MB of characters)")
    parser.add_argument("--binary", default=os.path.join(ROOT, "build/release/04_ddp/04_ddp"))
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--seeds", default="1,2")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--n-layer", type=int, default=3)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--n-embd", type=int, default=96)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--val-fraction", type=float, default=0.1)
    args = parser.parse_args()
    if not os.path.isfile(args.data):
        sys.exit(f"peer_train: --data {args.data}: no such file")
    if not os.access(args.binary, os.X_OK):
        sys.exit(f"peer_train: --binary {args.binary} is not an executable; build the course first (scripts/setup.sh)")
    print(f"PyTorch {torch.__version__} against the course, {args.threads} threads, {args.steps} steps of "
          f"{args.batch} x {args.block_size} characters of {args.data}")
    print(f"{'seed':<6}{'run':<10}{'wall s':>9}{'step ms':>10}{'val loss':>10}  threads and cores")
    for seed in (int(s) for s in args.seeds.split(",")):
        for name, run in (("course", train_ours), ("PyTorch", train_torch)):
            wall, step_ms, val_loss, where = run(args, seed)
            print(f"{seed:<6}{name:<10}{wall:>9.1f}{step_ms:>10.1f}{val_loss:>10.4f}  {where}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
