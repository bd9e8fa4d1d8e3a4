#!/usr/bin/env python3
"""The PyTorch peer of the example trainer's GPT (--model gpt --task shakespeare).

The same model, numbers and data as the trainer:
  * architecture: token + position embeddings, N blocks of [RMSNorm (eps 1e-5), causal
    multi-head self-attention (qkv [3H, H] rows q|k|v, proj [H, H], no bias)] and [RMSNorm,
    up [F, H], GELU (erf), down [H, F]], final RMSNorm, head [V, H]; no dropout, untied;
  * initial weights: the trainer's, from the checkpoint it writes with --save-init DIR
    (the fp32 master values, read with tools/shardopt_ckpt.py);
  * data: windows of `context` tokens of train.bin at the positions the trainer draws
    (window_start below: the trainer's math::window_start, pinned by the same golden
    values in test/python/test_gpt_peer_data.py and test/unit/test_trainer_gpt.cpp):
    sequence j of microbatch m of step s on rank r; validation batch k from val.bin with
    the evaluation seed;
  * optimizer: torch.optim.AdamW(fused=True) (betas 0.9/0.999, eps 1e-8) on the matrices
    (or, with --optimizer adamw8bit, bitsandbytes' AdamW8bit with the same settings)
    and embeddings with --weight-decay, the norm weights without; gradient clipping at
    --clip (global norm); lr warm-up then cosine to lr * min_lr_ratio (the trainer's
    schedule); bf16 autocast with fp32 parameters; gradients averaged over microbatches
    and ranks (DDP);
  * logging: the trainer's --metrics JSON lines ({"step", "loss", "step_ms"} every step,
    {"step", "val_loss"} every --eval-every steps and at the end).

  python3 -m torch.distributed.run --standalone --nproc_per_node N bench/peers/gpt_peer.py \\
      --data data/shakespeare --init /tmp/gpt_init --steps 300 --metrics peer.jsonl [--compile]
  python3 bench/peers/gpt_peer.py --compare ours.jsonl peer.jsonl [peer_compiled.jsonl] \\
      --config baby/n2 --results bench/results [--plot curves.png]

Only --compare and the data functions work without torch.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

import numpy as np

MASK = (1 << 64) - 1
EVAL_SEED_XOR = 0xE7A15EED


def mix(x):
    """splitmix64's finaliser (the trainer's math::mix) on a Python int."""
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def window_start(seed, rank, step, mb, seq, starts):
    """The trainer's math::window_start: where window `seq` of (step, microbatch) on `rank`
    starts, uniform over `starts` = file tokens - context."""
    h = mix((seed ^ 0x7E47) & MASK)
    for v in (rank, step, mb, seq):
        h = mix(h ^ (v & MASK))
    return h % starts


def batch(data, seed, rank, step, mb, seqs, context):
    """(tokens, targets) int64 arrays [seqs, context] of the trainer's batch."""
    starts = len(data) - context
    idx = np.array([window_start(seed, rank, step, mb, j, starts) for j in range(seqs)], dtype=np.int64)
    offs = idx[:, None] + np.arange(context, dtype=np.int64)[None, :]
    return data[offs].astype(np.int64), data[offs + 1].astype(np.int64)


def eval_batch(data, seed, rank, index, seqs, context):
    return batch(data, (seed ^ EVAL_SEED_XOR) & MASK, rank, index, 0, seqs, context)


def schedule_lr(peak, min_lr, warmup, total, step):
    """shardopt's LrSchedule::warmup_cosine at `step` (1-based)."""
    if warmup > 0 and step <= warmup:
        return peak * step / warmup
    if step >= total:
        return min_lr
    progress = (step - warmup) / (total - warmup)
    return min_lr + (peak - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


# ------------------------------------------------------------------ compare (no torch)

def read_metrics(path):
    loss, val, ms = {}, {}, []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if "val_loss" in r:
                val[r["step"]] = r["val_loss"]
            elif "loss" in r:
                loss[r["step"]] = r["loss"]
                if "step_ms" in r:
                    ms.append(r["step_ms"])
    return loss, val, ms


def median_ms(ms, skip=10):
    xs = sorted(ms[skip:] if len(ms) > skip else ms)
    return xs[len(xs) // 2] if xs else float("nan")


def device_name():
    """The first GPU's name from nvidia-smi, or "host" without one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20).stdout.strip().splitlines()
        return out[0].strip() if out else "host"
    except (OSError, subprocess.SubprocessError):
        return "host"


def compare(a):
    ours_loss, ours_val, ours_ms = read_metrics(a.compare[0])
    peer_loss, peer_val, peer_ms = read_metrics(a.compare[1])
    row = {"bench": "gpt", "config": a.config,
           "ours_ms": median_ms(ours_ms), "peer_ms": median_ms(peer_ms),
           "ours_val_loss": ours_val[max(ours_val)] if ours_val else None,
           "peer_val_loss": peer_val[max(peer_val)] if peer_val else None,
           "ours_loss": ours_loss[max(ours_loss)] if ours_loss else None,
           "peer_loss": peer_loss[max(peer_loss)] if peer_loss else None,
           "steps": max(ours_loss) if ours_loss else 0}
    if len(a.compare) > 2 and os.path.exists(a.compare[2]):
        _, cval, cms = read_metrics(a.compare[2])
        row["peer_compiled_ms"] = median_ms(cms)
        row["peer_compiled_val_loss"] = cval[max(cval)] if cval else None
    if row["ours_val_loss"] is not None and row["peer_val_loss"] is not None:
        row["val_loss_diff"] = row["ours_val_loss"] - row["peer_val_loss"]
        row["val_within_0.02"] = abs(row["val_loss_diff"]) <= 0.02
    # The common keys of bench/results rows (bench/common/results.hpp), for plot_results.py.
    row["device"] = a.device or device_name()
    row["peer"] = "torch.optim.AdamW(fused=True) under DDP, eager (peer_compiled_ms: torch.compile)"
    row["limit_ms"] = None
    row["ratio_vs_peer"] = row["peer_ms"] / row["ours_ms"] if row["ours_ms"] and row["peer_ms"] else None
    row["fraction_of_limit"] = None
    row["command"] = a.command or "bench/peers/gpt_peer.py --compare " + " ".join(a.compare)
    row["date"] = time.strftime("%Y-%m-%d", time.gmtime())
    print(json.dumps(row))
    if a.results:
        os.makedirs(a.results, exist_ok=True)
        with open(os.path.join(a.results, "gpt.jsonl"), "a") as f:
            f.write(json.dumps(row) + "\n")
    if a.plot:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("no matplotlib: no plot")
            return
        fig, ax = plt.subplots(figsize=(7, 4))
        for (loss, val, name) in ((ours_loss, ours_val, "shardopt"), (peer_loss, peer_val, "PyTorch AdamW (DDP)")):
            s = sorted(loss)
            ax.plot(s, [loss[k] for k in s], lw=0.8, label=f"{name} train")
            v = sorted(val)
            ax.plot(v, [val[k] for k in v], "o-", label=f"{name} val")
        ax.set_xlabel("step")
        ax.set_ylabel("cross entropy (nats/char)")
        ax.set_title(f"char-level GPT on Shakespeare ({a.config})")
        ax.legend()
        fig.tight_layout()
        fig.savefig(a.plot, dpi=120)
        print("plot:", a.plot)


# ------------------------------------------------------------------ training (torch)

def train(a):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
    import shardopt_ckpt

    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("nccl")
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    torch.backends.cuda.matmul.allow_tf32 = True

    manifest = json.load(open(os.path.join(a.data, "manifest.json")))
    train_data = np.fromfile(os.path.join(a.data, "train.bin"), dtype=np.uint8)
    val_data = np.fromfile(os.path.join(a.data, "val.bin"), dtype=np.uint8)
    ck = shardopt_ckpt.Checkpoint(a.init)
    V, H, N, heads, F_, S = (manifest["vocab_size"], a.hidden, a.layers, a.heads, a.mlp, a.context)
    seqs = a.tokens // S
    D = H // heads

    def rms_norm(x, w):
        if hasattr(F, "rms_norm"):  # torch >= 2.4
            return F.rms_norm(x, (H,), w, 1e-5)
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * w

    def master(name):
        return torch.from_numpy(np.ascontiguousarray(ck.get(name, "master")).astype(np.float32))

    class Block(torch.nn.Module):
        def __init__(self, l):
            super().__init__()
            p = f"layers.{l}."
            self.norm1 = torch.nn.Parameter(master(p + "norm1"))
            self.qkv = torch.nn.Parameter(master(p + "attn.qkv"))
            self.proj = torch.nn.Parameter(master(p + "attn.proj"))
            self.norm2 = torch.nn.Parameter(master(p + "norm2"))
            self.up = torch.nn.Parameter(master(p + "mlp.up"))
            self.down = torch.nn.Parameter(master(p + "mlp.down"))

        def forward(self, x):
            B = x.shape[0]
            h = rms_norm(x, self.norm1)
            q, k, v = F.linear(h, self.qkv).split(H, dim=-1)
            q, k, v = (t.view(B, S, heads, D).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + F.linear(y.transpose(1, 2).reshape(B, S, H), self.proj)
            h = rms_norm(x, self.norm2)
            return x + F.linear(F.gelu(F.linear(h, self.up)), self.down)

    class Gpt(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Parameter(master("embed"))
            self.pos_embed = torch.nn.Parameter(master("pos_embed"))
            self.blocks = torch.nn.ModuleList(Block(l) for l in range(N))
            self.final_norm = torch.nn.Parameter(master("final_norm"))
            self.head = torch.nn.Parameter(master("head"))

        def forward(self, idx, targets):
            x = F.embedding(idx, self.embed) + self.pos_embed
            for b in self.blocks:
                x = b(x)
            logits = F.linear(rms_norm(x, self.final_norm), self.head)
            return F.cross_entropy(logits.float().view(-1, V), targets.view(-1))

    model = Gpt().to(dev)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": a.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if a.optimizer == "adamw8bit":  # block-wise 8-bit moments (bitsandbytes), fp32 parameters
        import bitsandbytes as bnb
        opt = bnb.optim.AdamW8bit(groups, lr=a.lr, betas=(0.9, 0.999), eps=1e-8)
    else:
        opt = torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.999), eps=1e-8, fused=True)
    net = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local]) if distributed else model
    fwd = torch.compile(net) if a.compile else net
    warmup = a.warmup_steps if a.warmup_steps >= 0 else a.steps // 10

    def to_dev(x):
        return torch.from_numpy(x).to(dev, non_blocking=True)

    def evaluate():
        model.eval()
        total = 0.0
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            for k in range(a.eval_batches):
                x, y = eval_batch(val_data, a.seed, rank, k, seqs, S)
                total += float(model(to_dev(x), to_dev(y)))
        model.train()
        t = torch.tensor([total / a.eval_batches], device=dev, dtype=torch.float64)
        if distributed:
            dist.all_reduce(t)
        return float(t) / world

    out = open(a.metrics, "w") if rank == 0 else None
    step = 0  # optimizer steps applied (the trainer's device step counter)
    for it in range(1, a.steps + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        losses = []
        for m in range(a.microbatches):
            x, y = batch(train_data, a.seed, rank, step, m, seqs, S)
            sync = (not distributed) or m == a.microbatches - 1
            ctx = net.no_sync() if distributed and not sync else _null()
            with ctx:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = fwd(to_dev(x), to_dev(y))
                (loss / a.microbatches).backward()
            losses.append(loss.detach())
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        lr = schedule_lr(a.lr, a.lr * a.min_lr_ratio, warmup, a.steps, step + 1)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        mean = torch.stack(losses).float().mean()
        if distributed:
            dist.all_reduce(mean)
            mean /= world
        value = float(mean)  # synchronizes, as the trainer's --metrics does
        ms = (time.perf_counter() - t0) * 1000.0
        if out:
            out.write(json.dumps({"step": it, "loss": value, "lr": lr, "step_ms": ms}) + "\n")
        if (a.eval_every > 0 and it % a.eval_every == 0) or it == a.steps:
            val = evaluate()
            if out:
                out.write(json.dumps({"step": it, "val_loss": val}) + "\n")
                out.flush()
                print(f"step {it}: loss {value:.4f} val {val:.4f} ({ms:.2f} ms/step)")
    if out:
        out.close()
    sys.stdout.flush()
    os._exit(0)  # NCCL teardown can hang; the metrics are written


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compare", nargs="+", metavar="JSONL", help="ours.jsonl peer.jsonl [peer_compiled.jsonl]")
    ap.add_argument("--device", help="with --compare: the device the runs used (default: nvidia-smi's first GPU)")
    ap.add_argument("--command", help="with --compare: the command that produced the runs (for the results row)")
    ap.add_argument("--config", default="baby")
    ap.add_argument("--results", default="")
    ap.add_argument("--plot", default="")
    ap.add_argument("--data", default="data/shakespeare")
    ap.add_argument("--init", help="the trainer's --save-init checkpoint directory")
    ap.add_argument("--metrics", default="gpt_peer.jsonl")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--optimizer", choices=["adamw", "adamw8bit"], default="adamw",
                    help="adamw: torch.optim.AdamW(fused=True); adamw8bit: bitsandbytes.optim.AdamW8bit "
                         "(8-bit block moments: the peer of the trainer's --moments q8)")
    # The trainer's defaults for --model gpt --size baby.
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--mlp", type=int, default=1536)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=64 * 256, help="tokens per microbatch per rank")
    ap.add_argument("--microbatches", type=int, default=2)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--warmup-steps", type=int, default=-1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--eval-every", type=int, default=0)
    ap.add_argument("--eval-batches", type=int, default=4)
    a = ap.parse_args()
    if a.compare:
        compare(a)
    else:
        if not a.init:
            sys.exit("--init DIR: the trainer's --save-init checkpoint (the same initial weights)")
        train(a)


if __name__ == "__main__":
    main()
