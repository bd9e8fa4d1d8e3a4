#!/usr/bin/env python3
"""Timing peer of bench_adam: PyTorch's fused AdamW on the Llama-3.2-1B parameter set
(147 tensors, 1,498,482,688 elements; the shapes of shardopt::presets::kLlama32_1B),
replayed from a CUDA graph. Writes a flat JSON object for `bench_adam --peer-json`.

  fp32_ms: torch.optim.AdamW(fused=True, capturable=True) on fp32 params/grads/moments.
  bf16_ms: the best PyTorch equivalent of bf16 grads + fp32 master + bf16 params: the
           bf16 grads cast into fp32 .grad tensors, the same fused AdamW on the fp32
           master, the master cast back into bf16 params, all in one graph.
  copy_gbps: device-to-device copy (bytes read + written) measured by torch.

Usage: python3 bench/peers/adam_peer.py --out /tmp/peer.json [--iters 50]
"""
import argparse
import json

import torch

import peer_common

HIDDEN, LAYERS, MLP, KV, VOCAB = 2048, 16, 8192, 512, 128256


def llama_shapes():
    """(shape, decays) in registration order, as presets::transformer."""
    out = [((VOCAB, HIDDEN), True)]
    for _ in range(LAYERS):
        out += [((HIDDEN,), False), ((HIDDEN, HIDDEN), True), ((KV, HIDDEN), True), ((KV, HIDDEN), True),
                ((HIDDEN, HIDDEN), True), ((HIDDEN,), False), ((MLP, HIDDEN), True), ((MLP, HIDDEN), True),
                ((HIDDEN, MLP), True)]
    out += [((HIDDEN,), False), ((VOCAB, HIDDEN), True)]
    return out


def graph_median_ms(fn, iters):
    """Warm up on a side stream, capture fn once, replay it; median of per-replay events."""
    graph = peer_common.capture_graph(fn)
    ms = peer_common.event_median_ms(graph.replay, iters, warmup=5)
    del graph
    return ms


def make_optimizer(params, decays):
    groups = [{"params": [p for p, d in zip(params, decays) if d], "weight_decay": 0.1},
              {"params": [p for p, d in zip(params, decays) if not d], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, fused=True, capturable=True)


def bench_fp32(shapes, iters):
    params = [torch.nn.Parameter(torch.empty(s, device="cuda").normal_(0, 0.02)) for s, _ in shapes]
    for p in params:
        p.grad = torch.empty_like(p).normal_(0, 1e-3)
    opt = make_optimizer(params, [d for _, d in shapes])
    ms = graph_median_ms(opt.step, iters)
    del opt, params
    torch.cuda.empty_cache()
    return ms


def bench_bf16(shapes, iters):
    master = [torch.nn.Parameter(torch.empty(s, device="cuda").normal_(0, 0.02)) for s, _ in shapes]
    for p in master:
        p.grad = torch.zeros_like(p)
    fp32_grads = [p.grad for p in master]
    bf16_grads = [torch.empty(s, device="cuda", dtype=torch.bfloat16).normal_(0, 1e-3) for s, _ in shapes]
    bf16_params = [torch.empty(s, device="cuda", dtype=torch.bfloat16) for s, _ in shapes]
    opt = make_optimizer(master, [d for _, d in shapes])

    def step():
        torch._foreach_copy_(fp32_grads, bf16_grads)
        opt.step()
        torch._foreach_copy_(bf16_params, [p.detach() for p in master])

    ms = graph_median_ms(step, iters)
    del opt, master, fp32_grads, bf16_grads, bf16_params
    torch.cuda.empty_cache()
    return ms


def copy_gbps(iters):
    nbytes = 2 << 30
    a = torch.ones(nbytes // 4, device="cuda")
    b = torch.empty_like(a)
    ms = peer_common.event_median_ms(lambda: b.copy_(a), iters, warmup=5)
    del a, b
    torch.cuda.empty_cache()
    return 2 * nbytes / (ms * 1e-3) / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON file for bench_adam --peer-json")
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()
    iters = max(args.iters, 20)
    shapes = llama_shapes()
    numel = sum(torch.Size(s).numel() for s, _ in shapes)
    assert len(shapes) == 147 and numel == 1498482688, (len(shapes), numel)
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "tensors": len(shapes),
        "params": numel,
        "iters": iters,
        "copy_gbps": copy_gbps(iters),
        "fp32_ms": bench_fp32(shapes, iters),
        "bf16_ms": bench_bf16(shapes, iters),
    }
    with open(args.out, "w") as f:
        json.dump(result, f)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
