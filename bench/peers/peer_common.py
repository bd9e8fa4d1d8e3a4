"""What the PyTorch peers in bench/peers share: CUDA-event timing (event_median_ms,
capture_graph), the end of a torchrun peer (finish), and bench_fsdp's synthetic model
and iteration, which the FSDP2 and the Megatron-FSDP peers both run (FSDP_UNITS ...,
MlpUnit, init_distributed, fsdp_model, fsdp_inputs, adamw, fsdp_iteration, fsdp_config), and
the offload peers' arguments and model (offload_args, offload_model).

A peer imports it as `import peer_common`: Python puts a script's own directory on
sys.path, both for `python3 bench/peers/X.py` and for the worker processes that
`python3 -m torch.distributed.run ... bench/peers/X.py` starts.
"""
import argparse
import os
import statistics
import sys

import torch
import torch.distributed as dist
from torch import nn


def event_median_ms(fn, iters, warmup=0):
    """Calls fn `warmup` times, synchronizes, then times `iters` calls, each between two
    CUDA events on the current stream; returns the median in milliseconds."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def capture_graph(fn, warmup=3):
    """Runs fn `warmup` times on a side stream (as torch.cuda.graph wants), then captures
    one call in a CUDA graph and returns it (time it with event_median_ms(g.replay, ...))."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def finish(rank, out, config, ms, description, summary):
    """Rank 0 appends "config<TAB>ms<TAB>description" to `out` (the file a bench's --peer
    reads) and prints `summary`; then every rank exits at once: tearing NCCL down after
    graph capture can hang for minutes, and the result is already written."""
    if rank == 0:
        with open(out, "a") as f:
            f.write(f"{config}\t{ms:.4f}\t{description}\n")
        print(summary)
    sys.stdout.flush()
    os._exit(0)


# bench_fsdp's synthetic model: 16 units of up Linear(2048, 8192) and down
# Linear(8192, 2048), no bias; T x 2048 bf16 input, a fixed bf16 output gradient.
FSDP_UNITS, FSDP_HIDDEN, FSDP_MLP = 16, 2048, 8192
FSDP_LR, FSDP_WEIGHT_DECAY, FSDP_CLIP = 1e-4, 0.1, 1.0


class MlpUnit(nn.Sequential):
    """One unit of the model (its own class so that a wrapper can name the units)."""

    def __init__(self):
        super().__init__(nn.Linear(FSDP_HIDDEN, FSDP_MLP, bias=False), nn.Linear(FSDP_MLP, FSDP_HIDDEN, bias=False))


def init_distributed():
    """NCCL process group of a torchrun worker, its GPU selected; returns (rank, world)."""
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    return rank, world


def fsdp_model():
    """The model in fp32 on the current GPU, seeded (the same values in every peer)."""
    torch.manual_seed(0)
    return nn.Sequential(*[MlpUnit() for _ in range(FSDP_UNITS)]).cuda()


def fsdp_inputs(tokens):
    """(x, dy): the T x 2048 bf16 input and output gradient of every iteration."""
    x = torch.randn(tokens, FSDP_HIDDEN, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(tokens, FSDP_HIDDEN, device="cuda", dtype=torch.bfloat16) * 1e-3
    return x, dy


def adamw(params, fused=True):
    """torch.optim.AdamW(lr 1e-4, weight decay 0.1) over `params`: fused when asked and
    torch takes it for these parameters, else foreach. Returns (optimizer, kind)."""
    params = list(params)  # a generator would be spent by a refused first try
    if fused:
        try:
            return torch.optim.AdamW(params, lr=FSDP_LR, weight_decay=FSDP_WEIGHT_DECAY, fused=True), "fused"
        except Exception:  # fused on these (DTensor) parameters unavailable: the next best
            pass
    return torch.optim.AdamW(params, lr=FSDP_LR, weight_decay=FSDP_WEIGHT_DECAY, foreach=True), "foreach"


def fsdp_iteration(model, opt, x, dy, zero_grad=None, clip=None):
    """One training iteration as a function: forward, backward from dy, clip the
    gradient norm to 1.0 (by default torch.nn.utils.clip_grad_norm_ over
    model.parameters(); else clip(parameters, max_norm)), step, zero_grad (by default
    opt.zero_grad(set_to_none=False))."""
    clip = clip or torch.nn.utils.clip_grad_norm_

    def run():
        out = model(x)
        out.backward(dy)
        clip(model.parameters(), FSDP_CLIP)
        opt.step()
        if zero_grad is None:
            opt.zero_grad(set_to_none=False)
        else:
            zero_grad()
    return run


def fsdp_config(tokens, world):
    """The config key bench_fsdp writes for its bf16 row."""
    return f"16xMLP/T{tokens}/n{world}"


# The offload peers' model (offload_peer.py, deepspeed_offload_peer.py): MlpUnits, as many
# as make the parameter count of bench_dist_adam's Llama-3.2-1B-shaped set.
OFFLOAD_PARAMS = 1_498_482_688


def offload_args():
    """The offload peers' command line: --out FILE, --iters N (3), --tokens T (16)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=16)
    return ap.parse_args()


def offload_model():
    """The offload peers' model in fp32 on the CPU, seeded: ceil(OFFLOAD_PARAMS / unit) units."""
    unit = 2 * FSDP_HIDDEN * FSDP_MLP
    torch.manual_seed(0)
    return nn.Sequential(*[MlpUnit() for _ in range((OFFLOAD_PARAMS + unit - 1) // unit)])
