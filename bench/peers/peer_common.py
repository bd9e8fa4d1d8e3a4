"""What the PyTorch peers in bench/peers share: CUDA-event timing (event_median_ms,
capture_graph) and the end of a torchrun peer (finish).

A peer imports it as `import peer_common`: Python puts a script's own directory on
sys.path, both for `python3 bench/peers/X.py` and for the worker processes that
`python3 -m torch.distributed.run ... bench/peers/X.py` starts.
"""
import os
import statistics
import sys

import torch


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
