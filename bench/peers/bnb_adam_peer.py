#!/usr/bin/env python3
"""Timing peer of bench_adam's 8-bit moment rows: bitsandbytes' AdamW8bit (block-wise
8-bit moments, Dettmers et al.) on the Llama-3.2-1B parameter set of adam_peer.py, bf16
parameters and gradients (bitsandbytes keeps no fp32 master for them). Eager steps, as
bitsandbytes runs them; whether a step captures in a CUDA graph is tried and recorded.
Adds its keys to the flat JSON object for `bench_adam --peer-json` (creating it):

  bnb_q8_ms:       median step time of bnb.optim.AdamW8bit (events around each step).
  bnb_version:     the bitsandbytes version.
  bnb_capturable:  1 if a step captured and replayed in a CUDA graph, else 0
                   (bnb_capture_error: why not).

Usage: python3 bench/peers/bnb_adam_peer.py --out /tmp/peer.json [--iters 20]
"""
import argparse
import json
import os

import torch

import peer_common
from adam_peer import llama_shapes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args()
    import bitsandbytes as bnb

    shapes = llama_shapes()
    params = [torch.nn.Parameter(torch.empty(s, device="cuda", dtype=torch.bfloat16).normal_(0, 0.02))
              for s, _ in shapes]
    for p in params:
        p.grad = torch.empty_like(p).normal_(0, 1e-3)
    decays = [d for _, d in shapes]
    groups = [{"params": [p for p, d in zip(params, decays) if d], "weight_decay": 0.1},
              {"params": [p for p, d in zip(params, decays) if not d], "weight_decay": 0.0}]
    opt = bnb.optim.AdamW8bit(groups, lr=1e-4, betas=(0.9, 0.999), eps=1e-8)
    out = {}
    if os.path.exists(a.out):
        with open(a.out) as f:
            out = json.load(f)
    out["bnb_q8_ms"] = peer_common.event_median_ms(opt.step, a.iters, warmup=3)
    out["bnb_version"] = bnb.__version__
    try:
        g = peer_common.capture_graph(opt.step)
        g.replay()
        torch.cuda.synchronize()
        out["bnb_capturable"] = 1
    except Exception as e:  # recorded, not fatal: the peer's eager time stands
        out["bnb_capturable"] = 0
        out["bnb_capture_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
    with open(a.out, "w") as f:
        json.dump(out, f)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
