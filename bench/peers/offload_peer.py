"""PyTorch FSDP2 peer of bench_dist_adam --offload: the optimizer step with the whole
state in host memory (CPUOffloadPolicy), on the same number of parameters.

FSDP2 (fully_shard per unit and at the root) with CPUOffloadPolicy keeps the sharded fp32
parameters, their gradients and the optimizer state in pinned host memory; bf16 compute
(MixedPrecisionPolicy). Its optimizer step is host-driven: the gradient norm and clipping
(clip_grad_norm_) and torch.optim.AdamW (fused on the CPU where torch has it, else
foreach) run on the CPU. The model: units of Linear(2048, 8192) + Linear(8192, 2048), no
bias, as many as make 1.5B parameters (the Llama-3.2-1B-shaped set of bench_dist_adam has
1,498,482,688). One forward and backward on a few tokens fill the gradients; then the
timed part is the step alone, clip + opt.step(), median of host wall times (the
parameters' next upload happens in the next forward and is not counted: in the peer's
favour).

    torchrun --nproc_per_node 1 bench/peers/offload_peer.py --out /tmp/peer_offload.tsv

Rank 0 appends "config<TAB>median_ms<TAB>description" to --out, under the config of
bench_dist_adam's fully offloaded fp32 row.
"""
import statistics
import time

import torch

import peer_common

try:
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
except ImportError:  # older layout
    from torch.distributed._composable.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard


def main():
    args = peer_common.offload_args()
    rank, world = peer_common.init_distributed()
    model = peer_common.offload_model()  # fp32, on the CPU
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    offload = CPUOffloadPolicy()
    for unit in model:
        fully_shard(unit, mp_policy=mp, offload_policy=offload)
    fully_shard(model, mp_policy=mp, offload_policy=offload)
    opt, kind = peer_common.adamw(model.parameters())
    x, dy = peer_common.fsdp_inputs(args.tokens)
    model(x).backward(dy)
    torch.cuda.synchronize()

    def step():
        torch.nn.utils.clip_grad_norm_(model.parameters(), peer_common.FSDP_CLIP)
        opt.step()

    step()  # warm-up: the optimizer state is created here
    times = []
    for _ in range(args.iters):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    med = statistics.median(times)
    n = sum(p.numel() for p in model.parameters()) * world
    desc = (f"FSDP2 CPUOffloadPolicy, {n} params: clip_grad_norm_ + torch.optim.AdamW ({kind}) on the CPU, "
            f"host wall time of the step (torch {torch.__version__}, {torch.get_num_threads()} threads)")
    peer_common.finish(rank, args.out, f"bf16p-bf16g/offload1/1.5B/147/n{world}", med, desc,
                       f"peer offload n{world}: {n} params, step median {med:.1f} ms over {args.iters} ({kind})")


if __name__ == "__main__":
    main()
