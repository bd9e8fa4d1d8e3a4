#!/usr/bin/env python3
"""Element-wise check of shardopt's fused Adam against torch.optim.AdamW / Adam
(fused=False, foreach=False, fp32) on identical inputs, 100 steps.

The inputs and our results are written by `bench_adam --torch-check-dir DIR` (raw
little-endian .f32/.bf16 files and meta.json). For each variant this script runs the
PyTorch optimizer on the same initial params, the same raw grads per step (unscaled as
GradScaler does, grad * inv_loss_scale, then multiplied by the clip coefficient, each in
fp32), the same per-step lr (per group lr * lr_scale) and the same hyper-parameters,
then compares params, exp_avg and exp_avg_sq element by element.

Tolerance (the bound test/unit/test_adam.cpp proves against a double oracle; PyTorch is
another fp32 evaluation of the same formulas): after `steps` steps
  |p - p_torch|   <= steps * (2 * 2^-23 * |p| + 1e-5 * lr_max)
  |m - m_torch|   <= 1e-5 * |m| + 1e-6 * G     (G: largest |effective grad|)
  |v - v_torch|   <= 1e-5 * |v| + 1e-30
and the bf16 param output equals bf16(our master) exactly and bf16(torch master) within
one bf16 ulp. Prints max abs/rel errors, the share of bitwise-equal elements, PASS/FAIL;
exits 1 on FAIL.

Usage: python3 bench/peers/adam_torch_check.py --dir DIR [--device cuda|cpu]
"""
import argparse
import json
import os
import sys

import torch


def load(path, dtype):
    with open(path, "rb") as f:
        data = bytearray(f.read())
    return torch.frombuffer(data, dtype=dtype).clone()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    d, dev = args.dir, torch.device(args.device)
    meta = json.load(open(os.path.join(d, "meta.json")))
    n, steps = meta["n"], meta["steps"]
    master0 = load(os.path.join(d, "master0.f32"), torch.float32)
    grads = load(os.path.join(d, "grads.f32"), torch.float32).view(steps, n)
    lrs = load(os.path.join(d, "lr.f32"), torch.float32).tolist()
    clips = load(os.path.join(d, "clip.f32"), torch.float32).tolist()
    inv = float(meta["inv_loss_scale"])
    lr_max = max(lrs) * max(g["lr_scale"] for g in meta["groups"])
    g_max = float((grads.abs().max() * inv).item())
    all_ok = True
    print(f"torch {torch.__version__} on {dev}; {n} elements in {len(meta['params'])} tensors, {steps} steps, "
          f"our run on {meta['backend']}")

    for var in meta["variants"]:
        name = var["name"]
        spans = [(p["offset"], p["numel"], p["group"]) for p in meta["params"]]
        params = [torch.nn.Parameter(master0[o:o + k].clone().to(dev)) for o, k, _ in spans]
        groups = []
        for gi, g in enumerate(meta["groups"]):
            groups.append({"params": [p for p, (_, _, pg) in zip(params, spans) if pg == gi],
                           "weight_decay": g["weight_decay"], "lr_scale": g["lr_scale"]})
        groups = [g for g in groups if g["params"]]
        kw = dict(lr=1e-3, betas=(meta["beta1"], meta["beta2"]), eps=meta["eps"], foreach=False, fused=False)
        opt = (torch.optim.AdamW if var["decoupled"] else torch.optim.Adam)(groups, **kw)
        for s in range(steps):
            for g in opt.param_groups:
                g["lr"] = lrs[s] * g["lr_scale"]
            for p, (o, k, _) in zip(params, spans):
                raw = grads[s, o:o + k].to(dev)
                p.grad = (raw * inv) * clips[s]  # fp32 multiplies, as unscale then clip
            opt.step()

        ours = {key: load(os.path.join(d, f"{name}.{key}.f32"), torch.float32)
                for key in ("master", "exp_avg", "exp_avg_sq")}
        ok = True
        rows = []
        for key in ("master", "exp_avg", "exp_avg_sq"):
            ref = torch.cat([(p.detach() if key == "master" else opt.state[p][key]).float().cpu().reshape(-1)
                             for p in params]).double()
            got = torch.cat([ours[key][o:o + k] for o, k, _ in spans]).double()
            err = (got - ref).abs()
            if key == "master":
                tol = steps * (2.0 * 2.0 ** -23 * torch.maximum(got.abs(), ref.abs()) + 1e-5 * lr_max)
            elif key == "exp_avg":
                tol = 1e-5 * ref.abs() + 1e-6 * g_max
            else:
                tol = 1e-5 * ref.abs() + 1e-30
            worst = float((err / tol).max())
            rel = float((err / ref.abs().clamp_min(1e-30)).max())
            same = float((got == ref).double().mean())
            rows.append(f"  {key:11s} max abs {float(err.max()):.3e}  max rel {rel:.3e}  bitwise equal {same:.4f}  "
                        f"worst err/tol {worst:.3f}")
            ok = ok and worst <= 1.0 and bool(torch.isfinite(got).all() or key == "exp_avg_sq")
        if var["param_out"]:
            out = load(os.path.join(d, f"{name}.params.bf16"), torch.bfloat16)
            got_p = torch.cat([out[o:o + k] for o, k, _ in spans])
            our_m = torch.cat([ours["master"][o:o + k] for o, k, _ in spans]).to(torch.bfloat16)
            ref_m = torch.cat([p.detach().float().cpu().reshape(-1) for p in params]).to(torch.bfloat16)
            exact = bool((got_p.view(torch.int16) == our_m.view(torch.int16)).all())
            ulps = (got_p.view(torch.int16).int() - ref_m.view(torch.int16).int()).abs().max().item()
            rows.append(f"  params.bf16 == bf16(our master): {exact}; max bf16 ulps vs bf16(torch master): {ulps}")
            ok = ok and exact and ulps <= 1
        print(f"{name}: {'PASS' if ok else 'FAIL'}")
        print("\n".join(rows))
        all_ok = all_ok and ok
    print("PASS" if all_ok else "FAIL")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
