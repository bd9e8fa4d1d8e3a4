"""PyTorch peer of bench_dist_adam: the same distributed step done with PyTorch.

Per rank: reduce_scatter_tensor of the bf16 grad buffer (average), the global grad
norm (local sum of squares + all_reduce) and clipping, torch.optim.AdamW(fused=True,
capturable=True) on one flat fp32 master shard with the bf16 grads cast into its fp32
.grad, the master cast back into the bf16 param shard, all_gather_into_tensor -- all
captured in one CUDA graph and replayed. Same element count as the Llama-3.2-1B-shaped
set (1,498,482,688 params, padded to a multiple of lcm(world, 128)).

    torchrun --nproc_per_node 4 bench/peers/dist_adam_peer.py --out /tmp/peer_dist.tsv

Rank 0 appends "config<TAB>median_ms<TAB>description" to --out.
"""
import argparse
import math
import os

import torch
import torch.distributed as dist

import peer_common

PARAMS = 1_498_482_688


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--iters", type=int, default=30)
    args = ap.parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dev = torch.device("cuda")
    pad = world * 128 // math.gcd(world, 128)
    n = (PARAMS + pad - 1) // pad * pad
    shard = n // world

    g = torch.Generator(device=dev).manual_seed(1234 + rank)
    grads = (torch.rand(n, device=dev, generator=g) * 2e-3 - 1e-3).to(torch.bfloat16)
    params = (torch.rand(n, device=dev, generator=g) * 0.1 - 0.05).to(torch.bfloat16)
    shard_grad = torch.empty(shard, device=dev, dtype=torch.bfloat16)
    param_shard = params[rank * shard:(rank + 1) * shard]
    master = torch.nn.Parameter(param_shard.float())
    master.grad = torch.zeros_like(master)
    opt = torch.optim.AdamW([master], lr=1e-4, weight_decay=0.1, fused=True, capturable=True)
    max_norm = torch.tensor(1.0, device=dev)
    sumsq = torch.zeros(1, device=dev)
    staging = torch.empty(shard, device=dev, dtype=torch.bfloat16)

    def step():
        dist.reduce_scatter_tensor(shard_grad, grads, op=dist.ReduceOp.AVG)
        master.grad.copy_(shard_grad)
        torch.sum(master.grad * master.grad, dim=0, keepdim=True, out=sumsq)
        dist.all_reduce(sumsq)
        coef = torch.clamp(max_norm / (sumsq.sqrt() + 1e-6), max=1.0)
        master.grad.mul_(coef)
        opt.step()
        staging.copy_(master)
        dist.all_gather_into_tensor(params, staging)

    graph = peer_common.capture_graph(step)
    med = peer_common.event_median_ms(graph.replay, args.iters, warmup=3)
    desc = ("torch reduce_scatter_tensor + norm/clip + fused capturable AdamW on fp32 master shard "
            "(bf16 grads cast) + cast back + all_gather_into_tensor, one CUDA graph")
    peer_common.finish(rank, args.out, f"bf16p-bf16g/1.5B/147/n{world}", med, desc,
                       f"peer dist_adam n{world}: median {med:.3f} ms over {args.iters}")


if __name__ == "__main__":
    main()
