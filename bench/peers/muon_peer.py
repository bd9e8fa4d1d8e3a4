"""PyTorch peer of bench_muon: the Muon step on the same matrices (Llama-3.2-1B's hidden
matrices: 16 layers of q 2048x2048, k and v 512x2048, o 2048x2048, gate and up 8192x2048,
down 2048x8192; bf16 GEMMs in Newton-Schulz, torch's defaults: momentum 0.95, Nesterov,
5 steps, adjust_lr "original", weight decay 0.1, lr 0.02).

One rank: torch.optim.Muon over the fp32 matrices (foreach=True where this torch takes it),
its step timed with CUDA events.

Two or more ranks (torchrun): a gather-orthogonalize-scatter peer in torch. Every rank
owns an equal contiguous slice of the matrices laid end to end (fp32 master and fp32
gradient, as a ZeRO shard); each matrix has a home rank (largest Newton-Schulz cost first
to the least-loaded rank, as bench_muon's DistributedAdam); per step: one
all_to_all_single sends every slice piece to its matrix's home, the home runs the
momentum, Nesterov and torch.optim.Muon's own Newton-Schulz on the whole matrix, a second
all_to_all_single brings the updates back, each rank applies decay and the adjusted lr to
its slice and all-gathers the bf16 parameters (all_gather_into_tensor).

    python3 bench/peers/muon_peer.py --out /tmp/peer_muon.tsv
    torchrun --nproc_per_node 2 bench/peers/muon_peer.py --out /tmp/peer_muon.tsv

Rank 0 appends "llama1b/n<world><TAB>median_ms<TAB>description" to --out.
"""
import argparse
import inspect
import math
import os

import torch
import torch.distributed as dist

import peer_common

LR, MOMENTUM, WD, NS_STEPS, EPS = 0.02, 0.95, 0.1, 5, 1e-7
COEFFS = (3.4445, -4.7750, 2.0315)


def shapes(layers):
    out = []
    for _ in range(layers):
        out += [(2048, 2048), (512, 2048), (512, 2048), (2048, 2048), (8192, 2048), (8192, 2048), (2048, 8192)]
    return out


def newton_schulz(grad):
    """torch.optim.Muon's own iteration where this torch exposes it, else the same steps."""
    try:
        from torch.optim._muon import _zeropower_via_newtonschulz
        return _zeropower_via_newtonschulz(grad, COEFFS, NS_STEPS, EPS)
    except ImportError:
        a, b, c = COEFFS
        x = grad.bfloat16()
        if grad.size(0) > grad.size(1):
            x = x.T
        x = x / x.norm().clamp(min=EPS)
        for _ in range(NS_STEPS):
            gram = x @ x.T
            x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
        return x.T if grad.size(0) > grad.size(1) else x


def one_rank(args, dev):
    params = [torch.nn.Parameter(torch.randn(r, c, device=dev) * 0.02) for r, c in shapes(args.layers)]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    kwargs = dict(lr=LR, weight_decay=WD, momentum=MOMENTUM, nesterov=True, ns_coefficients=COEFFS, eps=EPS,
                  ns_steps=NS_STEPS)
    foreach = "foreach" in inspect.signature(torch.optim.Muon.__init__).parameters
    if foreach:
        kwargs["foreach"] = True
    opt = torch.optim.Muon(params, **kwargs)
    ms = peer_common.event_median_ms(opt.step, args.iters, warmup=3)
    what = f"torch.optim.Muon (torch {torch.__version__}, foreach={'True' if foreach else 'not offered'}), fp32 params, eager"
    return ms, what


def homes(costs, world):
    order = sorted(range(len(costs)), key=lambda i: -costs[i])  # stable: ties keep the lower index first
    load, home = [0.0] * world, [0] * len(costs)
    for i in order:
        r = min(range(world), key=lambda q: (load[q], q))
        home[i] = r
        load[r] += costs[i]
    return home


def many_ranks(args, dev, rank, world):
    shp = shapes(args.layers)
    sizes = [r * c for r, c in shp]
    starts = [0]
    for s in sizes:
        starts.append(starts[-1] + s)
    total = starts[-1]
    per = (total + world - 1) // world
    lo, hi = rank * per, min(total, (rank + 1) * per)
    cost = [NS_STEPS * (2.0 * min(r, c) ** 2 * max(r, c) + min(r, c) ** 3) for r, c in shp]
    home = homes(cost, world)
    # pieces[src][dst]: (matrix, first, last) element ranges src's slice holds of matrices homed at dst.
    pieces = [[[] for _ in range(world)] for _ in range(world)]
    for src in range(world):
        a, b = src * per, min(total, (src + 1) * per)
        for m in range(len(shp)):
            f, l = max(a, starts[m]), min(b, starts[m + 1])
            if f < l:
                pieces[src][home[m]].append((m, f, l))
    send_sizes = [sum(l - f for _, f, l in pieces[rank][d]) for d in range(world)]
    recv_sizes = [sum(l - f for _, f, l in pieces[s][rank]) for s in range(world)]
    master = torch.randn(hi - lo, device=dev) * 0.02
    grad = torch.randn(hi - lo, device=dev) * 1e-3
    params = torch.empty(per * world, device=dev, dtype=torch.bfloat16)
    mine = [m for m in range(len(shp)) if home[m] == rank]
    momentum = {m: torch.zeros(shp[m], device=dev) for m in mine}
    send = torch.empty(sum(send_sizes), device=dev)
    recv = torch.empty(sum(recv_sizes), device=dev)
    back = torch.empty(sum(recv_sizes), device=dev)
    upd = torch.empty(sum(send_sizes), device=dev)
    # Where each received piece goes in its whole matrix, by source in order.
    recv_layout, at = [], 0
    for s in range(world):
        for m, f, l in pieces[s][rank]:
            recv_layout.append((m, f - starts[m], l - f, at))
            at += l - f
    send_layout, at = [], 0
    for d in range(world):
        for m, f, l in pieces[rank][d]:
            send_layout.append((m, f - lo, l - f, at))
            at += l - f

    def step():
        for m, off, n, pos in send_layout:
            send[pos:pos + n].copy_(grad[off:off + n])
        dist.all_to_all_single(recv, send, recv_sizes, send_sizes)
        whole = {m: torch.empty(shp[m], device=dev) for m in mine}
        for m, off, n, pos in recv_layout:
            whole[m].view(-1)[off:off + n].copy_(recv[pos:pos + n])
        for m in mine:
            g, buf = whole[m], momentum[m]
            buf.lerp_(g, 1 - MOMENTUM)
            u = g.lerp(buf, MOMENTUM)
            whole[m] = newton_schulz(u).float().contiguous()  # row-major: NS returns a transposed view for tall matrices
        for m, off, n, pos in recv_layout:
            back[pos:pos + n].copy_(whole[m].view(-1)[off:off + n])
        dist.all_to_all_single(upd, back, send_sizes, recv_sizes)
        master.mul_(1 - LR * WD)
        for m, off, n, pos in send_layout:
            r, c = shp[m]
            master[off:off + n].add_(upd[pos:pos + n], alpha=-LR * math.sqrt(max(1.0, r / c)))
        shard = torch.zeros(per, device=dev, dtype=torch.bfloat16)
        shard[:hi - lo].copy_(master)
        dist.all_gather_into_tensor(params, shard)

    ms = peer_common.event_median_ms(step, args.iters, warmup=3)
    what = (f"torch gather-orthogonalize-scatter on {world} ranks (all_to_all_single both ways, "
            f"torch.optim.Muon's Newton-Schulz at the home, bf16 all-gather; torch {torch.__version__}), eager")
    return ms, what


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--layers", type=int, default=16)
    args = ap.parse_args()
    distributed = "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1
    if distributed:
        dist.init_process_group("nccl")
        rank, world = dist.get_rank(), dist.get_world_size()
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    else:
        rank, world = 0, 1
    dev = torch.device("cuda")
    torch.manual_seed(1234 + rank)
    ms, what = one_rank(args, dev) if world == 1 else many_ranks(args, dev, rank, world)
    config = f"llama1b/n{world}"
    peer_common.finish(rank, args.out, config, ms, what, f"muon_peer {config}: {ms:.3f} ms ({what})")


if __name__ == "__main__":
    main()
