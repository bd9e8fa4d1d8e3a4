"""PyTorch FSDP2 peer of bench_fsdp: the same synthetic model and iteration.

16 units, each nn.Sequential(Linear(2048, 8192), Linear(8192, 2048)) without bias,
fully_shard per unit and at the root, MixedPrecisionPolicy(param bf16, reduce bf16) over
fp32 sharded parameters, torch.optim.AdamW(fused=True) with weight decay 0.1,
clip_grad_norm_(1.0); forward on T x 2048 bf16 input, backward from a fixed bf16 output
gradient, step, zero_grad. Eager (FSDP2 is not graph-captured), median of CUDA-event
timed iterations after warm-up.

    torchrun --nproc_per_node 4 bench/peers/fsdp_peer.py --out /tmp/peer_fsdp.tsv

Rank 0 appends "config<TAB>median_ms<TAB>description" to --out.
"""
import argparse

import torch

import peer_common

try:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
except ImportError:  # older layout
    from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=4096)
    args = ap.parse_args()
    rank, world = peer_common.init_distributed()
    model = peer_common.fsdp_model()
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    for unit in model:
        fully_shard(unit, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    opt, kind = peer_common.adamw(model.parameters())
    x, dy = peer_common.fsdp_inputs(args.tokens)
    med = peer_common.event_median_ms(peer_common.fsdp_iteration(model, opt, x, dy), args.iters, warmup=3)
    desc = f"torch FSDP2 fully_shard per unit, bf16 mixed precision, {kind} AdamW, clip 1.0, eager"
    peer_common.finish(rank, args.out, peer_common.fsdp_config(args.tokens, world), med, desc,
                       f"peer fsdp n{world}: median {med:.3f} ms ({kind} AdamW)")


if __name__ == "__main__":
    main()
