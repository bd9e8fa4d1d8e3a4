"""Megatron-FSDP peer of bench_fsdp: the same synthetic model, settings and timing as the
FSDP2 peer (bench/peers/fsdp_peer.py, shared through peer_common), under NVIDIA's
Megatron-FSDP (pip megatron-fsdp, 0.6.x) instead of torch's fully_shard.

16 MlpUnit units (Linear(2048, 8192), Linear(8192, 2048), no bias), each an FSDP unit
(fsdp_unit_modules=[MlpUnit]), ZeRO-3 ("optim_grads_params"), bf16 compute weights over
fp32 main weights (MixedPrecisionPolicy main_params_dtype fp32), gradients reduced in
bf16 (grad_comm_dtype) into fp32 main gradients (main_grads_dtype), as FSDP2's
MixedPrecisionPolicy(param bf16, reduce bf16) over fp32 sharded parameters does;
torch.optim.AdamW(fused when torch takes it, weight decay 0.1) wrapped by
megatron_fsdp.fully_shard, the gradient norm clipped to 1.0 over the ranks' gradient
shards (clip_local_shards: one all-reduce, as torch's clip_grad_norm_ does for FSDP2);
forward on T x 2048 bf16 input, backward from a fixed bf16 output gradient, step,
zero_grad. Eager, median of CUDA-event timed iterations after warm-up.

    torchrun --nproc_per_node 2 bench/peers/megatron_fsdp_peer.py --out /tmp/peer_megatron.tsv
    python3 bench/peers/megatron_fsdp_peer.py --mxfp8-support

Rank 0 appends "config<TAB>median_ms<TAB>description" to --out; the description names
the megatron_fsdp version. MXFP8 parameters in Megatron-FSDP are TransformerEngine
MXFP8Tensor weights of TE modules (it has no quantization of its own), and TE's MXFP8
recipe needs an MXFP8 GEMM (Blackwell); --mxfp8-support prints what this machine has
and this peer times bf16 only. Any mismatch with the API this was written against
(0.6.1) raises: nothing falls back silently except fused -> foreach AdamW, which the
description names.
"""
import argparse
import inspect
import sys

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

import peer_common

try:
    import megatron_fsdp
except ImportError as e:  # the device suite checks the import first and logs it
    sys.exit(f"megatron_fsdp_peer: cannot import megatron_fsdp ({e}); install the megatron-fsdp wheel")

# The names this peer passes, checked against the installed package before any use.
NEEDED = {
    megatron_fsdp.fully_shard: {"module", "optimizer", "fsdp_unit_modules", "zero_dp_strategy",
                                "mixed_precision_policy", "device"},
    megatron_fsdp.MixedPrecisionPolicy: {"main_params_dtype", "main_grads_dtype", "grad_comm_dtype"},
}


def check_api():
    """Raises RuntimeError naming every argument the installed megatron_fsdp lacks."""
    missing = []
    for fn, names in NEEDED.items():
        have = set(inspect.signature(fn).parameters)
        missing += [f"{fn.__name__}({n}=)" for n in sorted(names - have)]
    if missing:
        raise RuntimeError(f"megatron_fsdp {megatron_fsdp.__version__} lacks {', '.join(missing)}: "
                           "this peer was written against 0.6.1; update bench/peers/megatron_fsdp_peer.py")


def mxfp8_support():
    """One line: whether Megatron-FSDP can hold MXFP8 parameters on this machine."""
    head = f"megatron_fsdp {megatron_fsdp.__version__}: MXFP8 parameters need TransformerEngine (MXFP8Tensor)"
    try:
        import transformer_engine.pytorch as te
    except ImportError:
        return f"{head}; transformer_engine: absent (bf16 only)"
    version = getattr(sys.modules.get("transformer_engine"), "__version__", "?")
    check = getattr(te, "is_mxfp8_available", None)
    if check is None:
        return f"{head}; transformer_engine {version}: no is_mxfp8_available (bf16 only)"
    try:
        ok, reason = check(return_reason=True)
    except TypeError:
        ok, reason = check(), ""
    return (f"{head}; transformer_engine {version}: MXFP8 {'available' if ok else 'unavailable'}"
            f"{': ' + reason if reason else ''} (this peer times bf16 only)")


def clip_local_shards(params, max_norm):
    """clip_grad_norm_ over the ranks' gradient shards: one all-reduce of the summed
    squares. Megatron-FSDP shards each bucket flat, so a parameter can have no elements
    (and a None gradient) on a rank; torch's clip over DTensors would then issue
    different collectives on different ranks."""
    grads = [p.grad for p in params if p.grad is not None]
    local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
    local = [g for g in local if g.numel() > 0]
    if local:
        sq = torch.stack([n.float() for n in torch._foreach_norm(local)]).square().sum()
    else:
        sq = torch.zeros((), device="cuda")
    dist.all_reduce(sq)
    coef = torch.clamp(max_norm / (sq.sqrt() + 1e-6), max=1.0)
    if local:
        torch._foreach_mul_(local, coef)
    return sq.sqrt()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--mxfp8-support", action="store_true", help="print MXFP8 support and exit")
    args = ap.parse_args()
    check_api()
    if args.mxfp8_support:
        print(mxfp8_support())
        return
    if not args.out:
        ap.error("--out is required")
    rank, world = peer_common.init_distributed()
    model = peer_common.fsdp_model().to(torch.bfloat16)  # the compute weights; fp32 main weights below
    mp = megatron_fsdp.MixedPrecisionPolicy(main_params_dtype=torch.float32, main_grads_dtype=torch.float32,
                                            grad_comm_dtype=torch.bfloat16)

    def wrap(fused):
        opt, kind = peer_common.adamw(model.parameters(), fused=fused)
        mfsdp, opt = megatron_fsdp.fully_shard(module=model, optimizer=opt, fsdp_unit_modules=[peer_common.MlpUnit],
                                               zero_dp_strategy="optim_grads_params", mixed_precision_policy=mp,
                                               device=torch.device("cuda", torch.cuda.current_device()))
        return mfsdp, opt, kind

    try:
        mfsdp, opt, kind = wrap(True)  # fully_shard's first (zero-gradient) step runs the fused kernel
    except RuntimeError as e:
        if "fused" not in str(e).lower():
            raise
        print(f"megatron_fsdp_peer: fused AdamW refused ({e}); foreach", file=sys.stderr)
        model = peer_common.fsdp_model().to(torch.bfloat16)
        mfsdp, opt, kind = wrap(False)
    x, dy = peer_common.fsdp_inputs(args.tokens)
    iteration = peer_common.fsdp_iteration(mfsdp, opt, x, dy, zero_grad=opt.zero_grad, clip=clip_local_shards)
    med = peer_common.event_median_ms(iteration, args.iters, warmup=3)
    desc = (f"Megatron-FSDP {megatron_fsdp.__version__} fully_shard, unit per MLP, optim_grads_params, bf16 compute "
            f"over fp32 main params, bf16 grad comm into fp32 main grads, {kind} AdamW, clip 1.0 (shards), eager")
    peer_common.finish(rank, args.out, peer_common.fsdp_config(args.tokens, world), med, desc,
                       f"peer megatron-fsdp {megatron_fsdp.__version__} n{world}: median {med:.3f} ms ({kind} AdamW)")


if __name__ == "__main__":
    main()
