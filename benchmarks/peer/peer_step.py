#!/usr/bin/env python3
"""The course's training step against PyTorch's, on the CPU, side by side in one run.

For each case (the MLP at widths 256 and 1024; the chapters' default GPT on addition; the GPT at the
shapes people train: a character model of width 96 at block 64, width 128 at block 128, nanoGPT's
shakespeare-char model of 6 layers x 384 at block 256, width 768 at block 1024, GPT-2 124M's parameters
at block 64, where AdamW weighs most; 1 and 2 threads) the
course's bench_step writes its initial weights and its batch to a safetensors file; this script loads
them into the same model written in PyTorch, runs the same step (forward, loss, backward, optimizer
step, zero_grad) with the same number of threads, and prints

  * the first losses of both: the same weights and data must give the same numbers (to float32 rounding),
    which checks that the two programs really run the same computation;
  * the median step time of both and the ratio ours / PyTorch's, measured in alternating rounds so that
    the machine's drift falls on both alike.

With --profile it also prints, for each case, where the step's time goes on both sides, op group by op
group (GEMMs, attention, layer norm, GELU, cross-entropy, embeddings, adds, optimizer), from
bench_step --profile and torch.profiler.

With --weights FILE it only loads FILE (chapter 07's consolidated checkpoint of the default GPT, or any
chapter's --save of it) into PyTorch's GPT by name, strictly, and prints its loss on bench_step's batch
beside the initial weights' loss.

PyTorch lives in its own virtual environment (scripts/setup_peer.sh); the course never needs it.
  scripts/setup_peer.sh
  .venv-peer/bin/python benchmarks/peer/peer_step.py [--bench build/release/benchmarks/bench_step]
  .venv-peer/bin/python benchmarks/peer/peer_step.py --cases "gpt 6x384" --threads 2 --profile
  .venv-peer/bin/python benchmarks/peer/peer_step.py --device cuda     (on a GPU: the same cases and GPT-2
                                                                       124M's shape, PyTorch eager, MFU of both)
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
# name, bench_step's flags, timed steps per round.
CASES = [
    ("mlp 256", ["--model", "mlp", "--width", "256"], 30),
    ("mlp 1024", ["--model", "mlp", "--width", "1024"], 10),
    ("gpt addition", ["--model", "gpt"], 30),
    ("gpt 3x96 T64 B64", ["--model", "gpt", "--n-layer", "3", "--n-head", "4", "--n-embd", "96", "--block-size", "64",
                          "--batch", "64"], 10),
    ("gpt 4x128 T128 B32", ["--model", "gpt", "--n-layer", "4", "--n-head", "4", "--n-embd", "128", "--block-size",
                            "128", "--batch", "32"], 10),
    ("gpt 6x384 T256 B8", ["--model", "gpt", "--n-layer", "6", "--n-head", "6", "--n-embd", "384", "--block-size",
                           "256", "--batch", "8"], 4),
    ("gpt 4x768 T1024 B1", ["--model", "gpt", "--n-layer", "4", "--n-head", "12", "--n-embd", "768", "--block-size",
                            "1024", "--batch", "1"], 3),
    # GPT-2 124M's parameters (its vocabulary padded to 50304) at a short block: the optimizer's case, where
    # AdamW's pass over 124M parameters is most of the step.
    ("gpt 12x768 V50304 T64 B1", ["--model", "gpt", "--n-layer", "12", "--n-head", "12", "--n-embd", "768",
                                  "--block-size", "64", "--vocab", "50304", "--batch", "1"], 3),
]
# On a GPU also GPT-2 124M's shape as nanoGPT and llm.c train it: 12 x 768, 1024 tokens, 8 sequences, the
# vocabulary padded to 50304 (minutes a step on a CPU, so GPU only).
GPU_CASES = [
    ("gpt2 124M T1024 B8", ["--model", "gpt", "--n-layer", "12", "--n-head", "12", "--n-embd", "768", "--block-size",
                            "1024", "--vocab", "50304", "--batch", "8"], 5),
]
# Dense peak TFLOP/s by GPU and precision (NVIDIA's data sheets, SXM): bf16 and fp16 on tensor cores, fp32
# without TF32 (the course's and this script's default). MFU = the step's model FLOPs / time / peak.
PEAK_TFLOPS = {"H100": {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0},
               "H200": {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0},
               "A100": {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5}}
# The profile's op groups: our op names and PyTorch's (aten) ones that do the same work.
GROUPS = [
    ("GEMMs (linear, head)", {"linear", "matmul"}, {"aten::addmm", "aten::mm", "aten::bmm"}),
    ("attention", {"attention"}, {"aten::_scaled_dot_product_flash_attention_for_cpu",
                                  "aten::_scaled_dot_product_flash_attention_for_cpu_backward"}),
    ("layer norm", {"layer_norm"}, {"aten::native_layer_norm", "aten::native_layer_norm_backward"}),
    ("GELU", {"gelu_tanh", "gelu"}, {"aten::gelu", "aten::gelu_backward"}),
    ("cross-entropy", {"cross_entropy"}, {"aten::_log_softmax", "aten::_log_softmax_backward_data",
                                          "aten::nll_loss_forward", "aten::nll_loss_backward"}),
    ("embeddings", {"embedding"}, {"aten::embedding", "aten::index_select", "aten::embedding_dense_backward"}),
    ("adds, sums", {"add", "sum", "scale", "mean"}, {"aten::add", "aten::sum", "aten::add_"}),
]
# Same weights, same data: only the order of float32 additions differs (OpenBLAS against MKL/oneDNN
# blocking, our double-precision reductions), a few parts in 1e6 per step, over three steps.
LOSS_RTOL = 1e-4
# Under autocast the two round every GEMM's output to 16 bits, but not always the same sums (different
# blocking, and ops PyTorch's CPU table keeps in another type): a loss differs by a few 16-bit roundings
# of its terms, which the losses near ln(vocabulary) put at a few units of u_16 relative. Four units of
# u_16 (2^-8 for bf16, 2^-11 for fp16) over three steps.
LOSS_RTOL_16BIT = {"bf16": 4 * 2.0 ** -8, "fp16": 4 * 2.0 ** -11}


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
        x = self.transformer.wte(ids) + self.transformer.wpe(torch.arange(t, device=ids.device))
        for block in self.transformer.h:
            x = block(x)
        return F.linear(self.transformer.ln_f(x), self.transformer.wte.weight)


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def torch_step(path, device="cpu", precision="fp32"):
    """The model, its optimizer and a step function, from the file bench_step wrote, on `device`; with bf16 or
    fp16 the forward under torch.autocast (fp16 with torch.amp.GradScaler), as bench_step --precision."""
    with safe_open(path, "pt") as f:
        settings = json.loads(f.metadata()["bench"])
    tensors = load_file(path)
    if settings["model"] == "mlp":
        model = mlp_from(settings)
        x, y = tensors.pop("input.x").to(device), tensors.pop("input.y").to(device)
        loss_fn = lambda: F.mse_loss(model(x), y)
    else:
        model = GPT(settings)
        ids, targets = tensors.pop("input.ids").long().to(device), tensors.pop("input.targets").long().to(device)
        loss_fn = lambda: F.cross_entropy(model(ids).view(-1, settings["vocab_size"]), targets, ignore_index=-100)
    model.load_state_dict(tensors, strict=True)
    model.to(device)
    if settings["model"] == "mlp":
        optimizer = torch.optim.SGD(model.parameters(), lr=settings["lr"])
    else:
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": settings["weight_decay"]},
                                       {"params": no_decay, "weight_decay": 0.0}],
                                      lr=settings["lr"], betas=tuple(settings["betas"]), eps=settings["eps"],
                                      foreach=True)  # on the CPU PyTorch defaults to its per-tensor loop
    synchronize = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    scaler = torch.amp.GradScaler(device, enabled=precision == "fp16")

    def step(timings=None):
        with torch.autocast(device, dtype=DTYPES.get(precision, torch.bfloat16), enabled=precision != "fp32"):
            loss = loss_fn()
        scaler.scale(loss).backward()
        synchronize()
        start = time.perf_counter()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        synchronize()
        if timings is not None:
            timings.append((time.perf_counter() - start) * 1e3)
        return loss

    return step


def time_torch(path, threads, warmup, steps, check_steps, device="cpu", precision="fp32"):
    torch.set_num_threads(threads)
    step = torch_step(path, device, precision)
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


def profile_torch(path, threads, steps):
    """PyTorch's step by op group (self CPU time per step, ms), the optimizer timed on its own."""
    from torch.profiler import profile, ProfilerActivity
    torch.set_num_threads(threads)
    step = torch_step(path)
    for _ in range(2):
        step()
    optimizer_ms, totals = [], {}
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step(optimizer_ms)
    step_ms = (time.perf_counter() - start) * 1e3 / steps
    for event in prof.key_averages():
        totals[event.key] = totals.get(event.key, 0.0) + event.self_cpu_time_total / 1e3 / steps
    return step_ms, statistics.mean(optimizer_ms), totals


def print_profiles(ours, torch_profile):
    """Side by side: each op group's ms per step, ours and PyTorch's, and the rest of the step."""
    torch_step_ms, torch_optimizer_ms, torch_ops = torch_profile
    our_ops = {op["op"]: op["forward_ms"] + op["backward_ms"] for op in ours["ops"]}
    rows, our_rest, torch_rest = [], ours["step_ms"], torch_step_ms
    for name, our_names, torch_names in GROUPS:
        a = sum(v for k, v in our_ops.items() if k in our_names)
        b = sum(v for k, v in torch_ops.items() if k in torch_names)
        rows.append((name, a, b))
        our_rest -= a
        torch_rest -= b
    a = our_ops.get("adamw step", our_ops.get("sgd step", 0.0))
    rows.append(("optimizer step", a, torch_optimizer_ms))
    # The rest of the step: the step's time less its op groups', each profiled apart. Where profiling
    # made the groups' sum exceed the timed step, there is no rest to show (printed "-", not a negative).
    rows.append(("everything else", our_rest - a, torch_rest - torch_optimizer_ms))
    print(f"    {'op group':<22}{'ours ms':>10}{'PyTorch ms':>12}{'ours/PyTorch':>14}   (profiled steps, per step)")
    for name, a, b in rows:
        ratio = f"{a / b:.2f}" if a >= 0 and b > 0.005 else "-"
        cells = "".join(f"{v:>{w}.2f}" if v >= 0 else f"{'-':>{w}}" for v, w in ((a, 10), (b, 12)))
        print(f"    {name:<22}{cells}{ratio:>14}")
    if min(rows[-1][1:]) < 0:
        print("    (-: the op groups, each profiled, add up to more than the timed step)")


def step_flops(path):
    """A GPT step's model FLOPs, as nanoGPT's estimate_mfu counts them: 6 N per token for the weights' forward
    and backward (N without the position table) and 12 L C T per token for attention's scores and mixing,
    times the batch's tokens. None for the MLP."""
    with safe_open(path, "pt") as f:
        settings = json.loads(f.metadata()["bench"])
        if settings["model"] != "gpt":
            return None
        ids = f.get_tensor("input.ids")
        params = sum(f.get_tensor(k).numel() for k in f.keys()
                     if not k.startswith("input.") and k != "transformer.wpe.weight")
    tokens, t = ids.numel(), ids.shape[-1]
    return (6 * params + 12 * settings["n_layer"] * settings["n_embd"] * t) * tokens


def peak_tflops(device, precision):
    if device != "cuda":
        return None
    name = torch.cuda.get_device_name()
    return next((peaks[precision] for gpu, peaks in PEAK_TFLOPS.items() if gpu in name), None)


def mfu(flops, ms, peak):
    return None if flops is None or peak is None else flops / (ms * 1e-3) / (peak * 1e12)


def run_ours(bench, flags, threads, warmup, steps, save_init=None, profile=False, device="cpu"):
    command = [bench] + flags + ["--threads", str(threads), "--warmup", str(warmup), "--steps", str(steps),
                                 "--json", "--device", device]
    if profile:
        command += ["--profile"]
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
        run_ours(bench, ["--model", "gpt"], 1, 0, 1, save_init=init)
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
    parser.add_argument("--cases", help="comma-separated prefixes of the case names to run (default: all)")
    parser.add_argument("--profile", action="store_true", help="print both steps op group by op group (CPU)")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"],
                        help="bf16 or fp16: both steps under autocast (ours: --precision; PyTorch: torch.autocast)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                        help="cuda: both steps on the GPU, PyTorch eager in float32 without TF32 (as ours)")
    args = parser.parse_args()
    if not os.access(args.bench, os.X_OK):
        sys.exit(f"peer_step: --bench {args.bench} is not an executable; build the course first (scripts/setup.sh)")
    if args.weights:
        if not os.path.isfile(args.weights):
            sys.exit(f"peer_step: --weights {args.weights}: no such file")
        return load_weights(args.bench, args.weights)
    threads = [int(t) for t in args.threads.split(",")]
    if args.device == "cuda":
        if not torch.cuda.is_available():
            sys.exit("peer_step: --device cuda: PyTorch sees no usable GPU")
        torch.backends.cuda.matmul.allow_tf32 = False  # plain float32, as the course's cuBLAS calls
        threads = threads[:1]  # the threads do not matter on the GPU
        if args.profile:
            sys.exit("peer_step: --profile compares CPU steps; run it without --device cuda")

    where = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU, {os.cpu_count()} cores"
    print(f"PyTorch {torch.__version__} against the course, {where}, {args.precision}; "
          f"medians over {args.rounds} alternating rounds")
    peak = peak_tflops(args.device, args.precision)
    if args.device == "cuda":
        print(f"MFU against {peak:g} TFLOP/s ({args.precision}, dense)" if peak else
              "MFU: no peak known for this GPU (PEAK_TFLOPS)")
    print(f"{'case':<20}{'threads':>8}{'ours ms':>10}{'PyTorch ms':>12}{'ours/PyTorch':>14}"
          f"{'step/GEMMs':>12}{'MFU ours':>10}{'PyTorch':>9}  first losses, ours | PyTorch")
    all_agree = True
    known = CASES + (GPU_CASES if args.device == "cuda" else [])
    cases = [c for c in known if not args.cases or any(c[0].startswith(p.strip()) for p in args.cases.split(","))]
    if not cases:
        sys.exit(f"peer_step: --cases {args.cases}: no case starts so; the cases: {', '.join(c[0] for c in known)}")
    with tempfile.TemporaryDirectory() as folder:
        for name, flags, case_steps in cases:
            flags = flags + ["--precision", args.precision]
            steps = args.steps or case_steps
            for t in threads:
                init = os.path.join(folder, "init.safetensors")
                first = run_ours(args.bench, flags, t, 0, 3, save_init=init, device=args.device)
                _, torch_losses = time_torch(init, t, 0, 3, 3, args.device, args.precision)
                tolerance = LOSS_RTOL if args.precision == "fp32" else LOSS_RTOL_16BIT[args.precision]
                agree = all(math.isclose(a, b, rel_tol=tolerance) for a, b in zip(first["losses"], torch_losses))
                all_agree &= agree
                ours, theirs, gemm = [], [], []
                for _ in range(args.rounds):
                    time.sleep(0.2)  # let the other side's OpenMP threads stop spinning first
                    result = run_ours(args.bench, flags, t, 2, steps, device=args.device)
                    ours.append(result["step_ms"])
                    gemm.append(result.get("step_over_gemm", float("nan")))
                    time.sleep(0.2)
                    theirs.append(time_torch(init, t, 2, steps, 0, args.device, args.precision)[0])
                ratio = statistics.median(o / p for o, p in zip(ours, theirs))
                gemm_text = "-" if math.isnan(gemm[0]) else f"{statistics.median(gemm):.2f}"
                flops = step_flops(init)
                mfu_ours, mfu_torch = (mfu(flops, statistics.median(x), peak) for x in (ours, theirs))
                mfu_text = "".join(f"{'-' if m is None else f'{m:.3f}':>{w}}" for m, w in ((mfu_ours, 10), (mfu_torch, 9)))
                losses = " ".join(f"{x:.6f}" for x in first["losses"]) + " | " + \
                    " ".join(f"{x:.6f}" for x in torch_losses)
                print(f"{name:<20}{t:>8}{statistics.median(ours):>10.3f}{statistics.median(theirs):>12.3f}"
                      f"{ratio:>14.2f}{gemm_text:>12}{mfu_text}  {losses}  {'agree' if agree else 'DIFFER'}",
                      flush=True)
                if args.profile:
                    print_profiles(run_ours(args.bench, flags, t, 2, steps, profile=True),
                                   profile_torch(init, t, steps))
                if args.metrics:
                    with open(args.metrics, "a") as f:
                        f.write(json.dumps({"benchmark": "peer_step", "case": name, "threads": t, "device": args.device,
                                            "precision": args.precision,
                                            "ours_ms": statistics.median(ours),
                                            "pytorch_ms": statistics.median(theirs), "ratio": ratio,
                                            "step_over_gemm": None if math.isnan(gemm[0]) else statistics.median(gemm), "losses_agree": agree,
                                            "step_flops": flops, "mfu_ours": mfu_ours, "mfu_pytorch": mfu_torch,
                                            "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None,
                                            "date": time.strftime("%Y-%m-%d"),
                                            "torch": torch.__version__}) + "\n")
    print("first losses agree" if all_agree else "first losses DIFFER: the two programs do not compute the same step")
    return 0 if all_agree else 1


if __name__ == "__main__":
    sys.exit(main())
