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
import os

import torch
import torch.distributed as dist
from torch import nn

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
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(2048, 8192, bias=False), nn.Linear(8192, 2048, bias=False))
                            for _ in range(16)]).cuda()
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    for unit in model:
        fully_shard(unit, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=True)
        kind = "fused"
    except Exception:  # fused on DTensor unavailable: the next best
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, foreach=True)
        kind = "foreach"
    x = torch.randn(args.tokens, 2048, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(args.tokens, 2048, device="cuda", dtype=torch.bfloat16) * 1e-3

    def iteration():
        out = model(x)
        out.backward(dy)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=False)

    med = peer_common.event_median_ms(iteration, args.iters, warmup=3)
    desc = f"torch FSDP2 fully_shard per unit, bf16 mixed precision, {kind} AdamW, clip 1.0, eager"
    peer_common.finish(rank, args.out, f"16xMLP/T{args.tokens}/n{world}", med, desc,
                       f"peer fsdp n{world}: median {med:.3f} ms ({kind} AdamW)")


if __name__ == "__main__":
    main()
