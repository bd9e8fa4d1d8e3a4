"""DeepSpeed ZeRO-Offload peer of bench_dist_adam --offload: the optimizer step with the
whole Adam state in host memory, run by DeepSpeed's CPU Adam, on the same number of
parameters as offload_peer.py (FSDP2 CPUOffloadPolicy).

DeepSpeed (ZeRO stage 2, `offload_optimizer: cpu`, pinned) keeps the fp32 master and both
moments in pinned host memory and runs DeepSpeedCPUAdam (AdamW mode, its AVX kernel,
built from source on first use); the model computes in bf16 on the GPU. The model is the
FSDP2 peer's: units of Linear(2048, 8192) + Linear(8192, 2048), no bias, as many as make
1.5B parameters. Each iteration runs one forward and backward on a few tokens (untimed:
ZeRO-Offload copies the gradients down to the host inside it, which is not counted, in
the peer's favour), then the timed part, engine.step(): the gradient norm and clipping to
1.0, CPU Adam, and the copy of the new bf16 parameters back up to the GPU. Median of host
wall times.

    torchrun --nproc_per_node 1 bench/peers/deepspeed_offload_peer.py --out /tmp/peer_offload.tsv

DeepSpeed is not installed on the GPU machine: its wheel (built from the sdist on a machine
with the network: `pip install wheel && pip wheel --no-deps --no-build-isolation deepspeed`)
and the wheels of hjson, pydantic, pydantic-core,
annotated-types, typing-inspection and typing-extensions travel in .whl/ (git-ignored).
Rank 0 appends "config<TAB>median_ms<TAB>description" to --out, under the config of
bench_dist_adam's fully offloaded fp32 row with "/deepspeed" added; when DeepSpeed cannot
import or build its CPU Adam, it prints why and writes nothing.
"""
import os
import statistics
import sys
import time
import traceback

os.environ.setdefault("DS_ACCELERATOR", "cuda")
os.environ.setdefault("DS_SKIP_CUDA_CHECK", "1")  # the op is CPU code: the CUDA minor version does not matter

import torch

import peer_common


def main():
    args = peer_common.offload_args()
    try:
        import deepspeed
        from deepspeed.accelerator import get_accelerator
    except Exception:
        traceback.print_exc()
        print("peer deepspeed: DeepSpeed does not import: no row", flush=True)
        os._exit(0)
    rank, world = peer_common.init_distributed()
    t0 = time.perf_counter()
    try:
        get_accelerator().create_op_builder("CPUAdamBuilder").load()  # its CPU Adam's JIT build (ninja, g++)
    except Exception:
        traceback.print_exc()
        print("peer deepspeed: its CPU Adam does not build: no row", flush=True)
        os._exit(0)
    build_s = time.perf_counter() - t0
    model = peer_common.offload_model()
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": peer_common.FSDP_CLIP,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW",
                      "params": {"lr": peer_common.FSDP_LR, "weight_decay": peer_common.FSDP_WEIGHT_DECAY}},
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                              "contiguous_gradients": True, "overlap_comm": True},
        "steps_per_print": 1 << 30,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    x, dy = peer_common.fsdp_inputs(args.tokens)

    def backward():
        engine.backward((engine(x) * dy).float().sum())
        torch.cuda.synchronize()

    backward()
    engine.step()  # warm-up: the state is created here
    torch.cuda.synchronize()
    times = []
    for _ in range(args.iters):
        backward()
        t = time.perf_counter()
        engine.step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    med = statistics.median(times)
    n = sum(p.numel() for p in model.parameters()) * world
    desc = (f"DeepSpeed {deepspeed.__version__} ZeRO-2 offload_optimizer cpu (pinned), bf16, {n} params: "
            f"engine.step() (norm, clip, DeepSpeedCPUAdam AdamW, bf16 parameters up), host wall time "
            f"(torch {torch.__version__}, {torch.get_num_threads()} threads; CPU Adam built in {build_s:.0f} s)")
    peer_common.finish(rank, args.out, f"bf16p-bf16g/offload1/1.5B/147/n{world}/deepspeed", med, desc,
                       f"peer deepspeed n{world}: {n} params, step median {med:.1f} ms over {args.iters}")


if __name__ == "__main__":
    sys.exit(main())
