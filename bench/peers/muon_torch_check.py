#!/usr/bin/env python3
"""shardopt's Muon against torch.optim.Muon on the same matrices and gradients (issue 34).

Steps (docs/muon.md, "Against torch.optim.Muon"):
  1. make matrices and gradients from a seed (numpy): Llama-like shapes (a square q, a wide
     k, a tall MLP up, a wide MLP down) and a list of equal experts; write them with the
     cases' settings to DIR/inputs.safetensors;
  2. run our Muon on them (test/python/muon_torch_run: DistributedAdam, world of one, every
     matrix Muon) for each case; it writes DIR/ours_<case>.safetensors;
  3. run torch.optim.Muon on the same data (each expert a parameter of its own) and a
     double-precision Muon, and compare each matrix's master after `steps` steps in the
     Frobenius norm:
        ||ours - torch||  <= B_ours + B_torch     (the gate)
        ||ours - double|| <= B_ours               (the gate)
        ||torch - double|| / B_torch              (printed)
     B sums over the steps adjusted_lr * E_U, E_U the bound docs/muon.md derives on the
     Frobenius error of the orthogonalized update for the CUDA path's GEMMs ("The CUDA
     path's bounds"), plus sqrt(numel) x the per-element roundings of the decay and the
     update (4 u (max|p| + adjusted_lr) a step). bf16 GEMMs for MuonGemm::Bf16
     (torch's arithmetic), fp32 GEMMs for MuonGemm::F32, against which torch runs its own
     Newton-Schulz in fp32 (its source with .bfloat16() replaced by .float()).

Cases: nesterov on, ns_steps 5, the quintic coefficients, weight decay 0.1, both
adjust_lr_fn choices, each with bf16 and with fp32 GEMMs; 3 steps with lr 2^-6, 3 2^-8, 2^-7
(exact in fp32, so both sides form the same per-step factors).

Prints one JSON line per case and exits 1 when a bound is broken, 77 (skipped) without
numpy, torch or a GPU. --selftest (no torch, host backend): small shapes, the input file
read back, our host twin (fp32) against the double Muon within the fp32 bound, and the bf16
bounds of both sides against numpy emulations of our and torch's bf16 arithmetic.

Usage: python3 bench/peers/muon_torch_check.py --exe BUILD/test/muon_torch_run [--dir DIR]
       python3 bench/peers/muon_torch_check.py --exe BUILD/test/muon_torch_run --selftest
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ImportError:
    print("numpy is missing: skipped")
    sys.exit(77)

U = 2.0 ** -24   # fp32 unit roundoff
UB = 2.0 ** -8   # bf16 unit roundoff
LRS = [2.0 ** -6, 3.0 * 2.0 ** -8, 2.0 ** -7]
DEVICE_SHAPES = [("attn_q", (1024, 1024)), ("attn_k", (256, 1024)), ("mlp_up", (2816, 1024)),
                 ("mlp_down", (1024, 2816)), ("experts", (4, 512, 1024))]
SMALL_SHAPES = [("attn_q", (32, 32)), ("attn_k", (8, 32)), ("mlp_up", (48, 16)), ("mlp_down", (16, 48)),
                ("experts", (3, 8, 24))]


def cases():
    out = []
    for gemm in ("bf16", "f32"):
        for adjust in ("original", "match_rms_adamw"):
            out.append({"name": f"{gemm}_{adjust}", "gemm": gemm, "adjust_lr": adjust, "nesterov": True,
                        "momentum": 0.95, "weight_decay": 0.1, "ns_steps": 5, "eps": 1e-7,
                        "ns_coefficients": [3.4445, -4.7750, 2.0315]})
    return out


# ------------------------------------------------------------------ inputs and files

def make_inputs(shapes, seed, steps):
    """{name: f32 array}: each parameter's master0 and its gradient per step, from `seed`."""
    rng = np.random.default_rng(seed)
    t = {}
    for name, shape in shapes:
        t[f"{name}.master0"] = (0.02 * rng.standard_normal(shape)).astype(np.float32)
        for s in range(steps):
            t[f"{name}.grad{s}"] = (1e-3 * rng.standard_normal(shape)).astype(np.float32)
    return t


def write_safetensors(path, tensors, metadata):
    header, offset = {}, 0
    for name, a in tensors.items():
        assert a.dtype == np.float32
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for a in tensors.values():
            f.write(np.ascontiguousarray(a).astype("<f4").tobytes())


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    base, out = 8 + n, {}
    for name, e in header.items():
        if e["dtype"] != "F32":
            raise ValueError(f"{path}: tensor {name} is {e['dtype']}, expected F32")
        b, end = e["data_offsets"]
        out[name] = np.frombuffer(data[base + b:base + end], dtype="<f4").reshape(e["shape"]).astype(np.float32)
    return out, meta


def matrices(shapes, tensors):
    """Every 2-D matrix as (label, param name, member index or None, array): experts split."""
    out = []
    for name, shape in shapes:
        a = tensors[name]
        if len(shape) == 2:
            out.append((name, name, None, a))
        else:
            out.extend((f"{name}.{e}", name, e, a[e]) for e in range(shape[0]))
    return out


# ------------------------------------------------------------------ the double oracle and its bound

class Ops:
    """The few array operations the oracle needs, over numpy (host) or torch float64 (GPU)."""

    def __init__(self, torch_device=None):
        self.torch = None
        if torch_device is not None:
            import torch
            self.torch, self.dev = torch, torch_device

    def array(self, a):
        a = np.ascontiguousarray(a, dtype=np.float64)
        return self.torch.from_numpy(a).to(self.dev) if self.torch else a

    def numpy(self, a):
        return a.detach().cpu().numpy() if self.torch else a


def fro(a):
    return float((a * a).sum()) ** 0.5


def ns_step(X, co, dA=None, dB=None):
    a, b, c = co
    A = X @ X.T
    if dA is not None:
        A = A + dA
    B = b * A + c * (A @ A)
    if dB is not None:
        B = B + dB
    return a * X + B @ X


def ns_bound_terms(ops, X0, co, S, rng):
    """The orthogonalized update of X0 (n x k, n <= k) in double, and the sites of its error
    bound (docs/muon.md "The CUDA path's bounds"): the growth g of a perturbation entering
    there through the rest of the double iteration (three pseudo-random directions of
    relative size 1e-7, the largest growth, times 2) and the site's error
    e = ub * e_b + e_f + us * e_s (e_b: the stored matrix's norm, rounded at ub; e_f: the
    fp32 accumulation and epilogue; e_s: what the separate operations of torch without
    addmm round at us, B = (b A) + ((c A) A) and X' = (a X) + (B X), each a stored result).
    Returns (X_S, ||X_0||, g_X0, [(g, e_b, e_f, e_s), ...])."""
    n, k = X0.shape
    Xs = [X0]
    for _ in range(S):
        Xs.append(ns_step(Xs[-1], co))

    def growth(st, site, ref):
        if site == 0 and st == S:
            return 1.0
        best = 0.0
        for _ in range(3):
            R = ops.array(rng.random(X0.shape if site == 0 else (n, n)) - 0.5)
            eps = 1e-7 * ref / fro(R)
            X = Xs[st]
            if site == 0:
                X, frm = X + eps * R, st
            else:
                X, frm = ns_step(X, co, eps * R if site == 1 else None, eps * R if site == 2 else None), st + 1
            for _ in range(frm, S):
                X = ns_step(X, co)
            best = max(best, fro(X - Xs[S]) / (eps * fro(R)))
        return 2.0 * best

    a, b, c = co
    rk, rn = math.sqrt(k), math.sqrt(n)
    sites = []
    for st in range(S):
        X, nxt = Xs[st], Xs[st + 1]
        aX_ = abs(X)
        A = X @ X.T
        AA = A @ A
        B = b * A + c * AA
        e_a = (fro(A), 4.0 * rk * U * fro(aX_ @ aX_.T), 0.0)
        e_b = (fro(B), 4.0 * rn * U * abs(c) * fro(abs(A) @ abs(A)) + U * (fro(b * A) + fro(c * AA) + fro(B)),
               fro(c * A) * fro(A) + fro(c * AA) + fro(b * A))
        e_x = (fro(nxt), 4.0 * rn * U * fro(abs(B) @ aX_) + U * (fro(a * X) + fro(nxt)), fro(a * X) + fro(B @ X))
        sites.append((growth(st, 1, fro(A)),) + e_a)
        sites.append((growth(st, 2, fro(B)),) + e_b)
        sites.append((growth(st + 1, 0, fro(nxt)),) + e_x)
    return Xs[S], fro(X0), growth(0, 0, fro(X0)), sites


def update_bound(x0_norm, g_x0, sites, ub, x0_rel, us=0.0):
    """E_U = g_X0 x0_rel ||X_0|| + sum over sites g (ub e_b + e_f + us e_s)."""
    return g_x0 * x0_rel * x0_norm + sum(g * (ub * eb + ef + us * es) for g, eb, ef, es in sites)


class OracleMatrix:
    """torch.optim.Muon's step on one matrix in double, with the running per-element bounds
    on |ours - double| and |torch - double|."""

    def __init__(self, p0):
        self.p = p0.astype(np.float64)
        self.m = np.zeros_like(self.p)
        self.bound_ours = 0.0   # sum of adjusted_lr E_U (Frobenius)
        self.bound_torch = 0.0
        self.rounding = 0.0     # sum of the per-element roundings of decay and update
        self.t = 0

    def frobenius_bounds(self):
        r = math.sqrt(self.p.size) * self.rounding
        return self.bound_ours + r, self.bound_torch + r


def oracle_step(ops, o, g, case, lr, ours_ub, torch_ub, rng, torch_split=False):
    mom, S = case["momentum"], case["ns_steps"]
    g = g.astype(np.float64)
    o.m = mom * o.m + (1.0 - mom) * g
    u = (1.0 - mom) * g + mom * o.m if case["nesterov"] else o.m
    x = u / max(float(np.sqrt((u * u).sum())), case["eps"])
    rows, cols = x.shape
    tall = rows > cols
    X, x0n, g0, sites = ns_bound_terms(ops, ops.array(x.T if tall else x), case["ns_coefficients"], S, rng)
    U_ = ops.numpy(X)
    if tall:
        U_ = U_.T
    t = o.t
    # The stored X_0: ours rounds the fp32 normalized update once (u_b); the momentum,
    # Nesterov and normalization add (6 + 3t) u (docs/muon.md). torch rounds the update to
    # the GEMM dtype, takes its norm in that dtype and divides in it: 3 roundings at its unit,
    # the norm's fp32 reduction (4 sqrt(N) u) and the division's u.
    ours_x0 = ours_ub + (6.0 + 3.0 * t) * U
    torch_x0 = 3.0 * torch_ub + (6.0 + 3.0 * t) * U + 4.0 * math.sqrt(x.size) * U + 2.0 * U
    e_ours = update_bound(x0n, g0, sites, ours_ub, ours_x0)
    # torch without addmm (its default where it has use_addmm) rounds each separate
    # operation's result to the GEMM dtype (bf16, or fp32 in the fp32 cases).
    torch_us = (torch_ub if torch_ub > 0 else U) if torch_split else 0.0
    e_torch = update_bound(x0n, g0, sites, torch_ub, torch_x0, torch_us)
    ratio = math.sqrt(max(1.0, rows / cols)) if case["adjust_lr"] == "original" else 0.2 * math.sqrt(max(rows, cols))
    adjusted = lr * ratio
    o.p = o.p * (1.0 - lr * case["weight_decay"]) - adjusted * U_
    o.rounding += 4.0 * U * (float(np.abs(o.p).max()) + adjusted)  # the decay's and the update's roundings
    o.bound_ours += adjusted * e_ours
    o.bound_torch += adjusted * e_torch
    o.t += 1
    return adjusted * fro(U_)


def round_bf16(a):
    """fp32 -> bf16 (to nearest even), kept as fp32."""
    b = np.asarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)


def ns_emulated(u, co, S, eps, torch_like):
    """The bf16 Newton-Schulz of u (fp32, n x k), emulated in numpy: GEMMs accumulate in
    fp32 and round their result to bf16. Ours (torch_like False): u / ||u|| (double norm)
    rounded once, each B and X formed by one GEMM with an fp32 epilogue (cuBLAS beta).
    torch's: u cast to bf16, its norm and the division in bf16, and B = (b A) + ((c A) A),
    X' = (a X) + (B X) by separate operations, each result rounded."""
    a, b, c = (np.float32(v) for v in co)
    if torch_like:
        X = round_bf16(u)
        X = round_bf16(X / round_bf16(max(np.float32(np.sqrt((X * X).sum(dtype=np.float32))), np.float32(eps))))
    else:
        X = round_bf16(u.astype(np.float64) / max(float(np.sqrt((u.astype(np.float64) ** 2).sum())), eps))
    for _ in range(S):
        A = round_bf16(X @ X.T)
        if torch_like:
            B = round_bf16(round_bf16(b * A) + round_bf16(round_bf16(c * A) @ A))
            X = round_bf16(round_bf16(a * X) + round_bf16(B @ X))
        else:
            B = round_bf16(c * (A @ A) + b * A)
            X = round_bf16(B @ X + a * X)
    return X


def check_bf16_bound_model(seed):
    """Host check of the bf16 bounds themselves: on pseudo-random matrices the emulations
    of our arithmetic and of torch's stay within the bound each side uses."""
    rng, ok = np.random.default_rng(seed), True
    co, S = cases()[0]["ns_coefficients"], cases()[0]["ns_steps"]
    for n, k in ((16, 24), (8, 40), (24, 48)):
        u = rng.standard_normal((n, k)).astype(np.float32)
        x = u.astype(np.float64) / fro(u.astype(np.float64))
        XS, x0n, g0, sites = ns_bound_terms(Ops(), x, co, S, rng)
        e_ours = update_bound(x0n, g0, sites, UB, UB + 6.0 * U)
        e_torch = update_bound(x0n, g0, sites, UB, 3.0 * UB + 8.0 * U + 4.0 * math.sqrt(u.size) * U, UB)
        r_ours = fro(ns_emulated(u, co, S, 1e-7, False) - XS) / e_ours
        r_torch = fro(ns_emulated(u, co, S, 1e-7, True) - XS) / e_torch
        print(json.dumps({"check": "bf16_bound_model", "shape": [n, k], "err_over_bound_ours": r_ours,
                          "err_over_bound_torch": r_torch, "bound_ours_over_update": e_ours / fro(XS)}))
        ok = ok and r_ours <= 1.0 and r_torch <= 1.0
    return ok


# ------------------------------------------------------------------ torch.optim.Muon

def run_torch(torch, dev, shapes, inputs, case, steps):
    """torch.optim.Muon on the inputs: {matrix label: its master after `steps` steps}."""
    import inspect
    import torch.optim._muon as tm
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    mats = matrices(shapes, {n: inputs[f"{n}.master0"] for n, _ in shapes})
    params = [torch.nn.Parameter(torch.from_numpy(a.copy()).to(dev)) for _, _, _, a in mats]
    original = tm._zeropower_via_newtonschulz
    calls = [0]
    if case["gemm"] == "f32":
        src = inspect.getsource(original)
        if ".bfloat16()" not in src:
            raise RuntimeError("torch's _zeropower_via_newtonschulz no longer casts with .bfloat16(): "
                               "update the fp32 patch of muon_torch_check.py")
        scope = dict(tm.__dict__)
        exec(src.replace(".bfloat16()", ".float()"), scope)
        fp32_ns = scope["_zeropower_via_newtonschulz"]
    else:
        fp32_ns = original

    def counted(*a, **kw):
        calls[0] += 1
        return fp32_ns(*a, **kw)

    # Without use_addmm (torch >= 2.10: default False) B and the next X are formed by
    # separate operations, each rounded; torch 2.9 always used addmm (one rounding, an fp32
    # epilogue, as our cuBLAS calls).
    split = "use_addmm" in inspect.signature(torch.optim.Muon).parameters or "addmm" not in inspect.getsource(original)
    tm._zeropower_via_newtonschulz = counted
    try:
        opt = torch.optim.Muon(params, lr=LRS[0], weight_decay=case["weight_decay"], momentum=case["momentum"],
                               nesterov=case["nesterov"], ns_coefficients=tuple(case["ns_coefficients"]),
                               eps=case["eps"], ns_steps=case["ns_steps"], adjust_lr_fn=case["adjust_lr"])
        for s in range(steps):
            grads = matrices(shapes, {n: inputs[f"{n}.grad{s}"] for n, _ in shapes})
            for p, (_, _, _, g) in zip(params, grads):
                p.grad = torch.from_numpy(g.copy()).to(dev)
            opt.param_groups[0]["lr"] = LRS[s]
            opt.step()
        torch.cuda.synchronize() if dev.type == "cuda" else None
    finally:
        tm._zeropower_via_newtonschulz = original
    if calls[0] != steps * len(params):
        raise RuntimeError(f"torch.optim.Muon called its Newton-Schulz {calls[0]} times, expected "
                           f"{steps * len(params)}: the patched function was not the one it used")
    return {label: p.detach().float().cpu().numpy() for (label, _, _, _), p in zip(mats, params)}, split


# ------------------------------------------------------------------ the check

def check_case(ops, shapes, inputs, ours_file, case, steps, ub_ours, ub_torch, torch_result, seed,
               torch_split=False):
    ours, meta = read_safetensors(ours_file)
    rng = np.random.default_rng(seed + 1)
    worst = {"ours_vs_double": 0.0, "ours_vs_torch": 0.0, "torch_vs_double": 0.0}
    max_err = {"ours_vs_double": 0.0, "ours_vs_torch": 0.0}
    tightness = 0.0
    for (label, _, _, p0), (_, _, _, a) in zip(matrices(shapes, {n: inputs[f"{n}.master0"] for n, _ in shapes}),
                                               matrices(shapes, ours)):
        if a.shape != p0.shape or not np.isfinite(a).all():
            raise RuntimeError(f"{ours_file}: {label} has shape {a.shape} or non-finite values")
        o = OracleMatrix(p0)
        moved = 0.0
        for s in range(steps):
            g = [x for lb, _, _, x in matrices(shapes, {n: inputs[f"{n}.grad{s}"] for n, _ in shapes}) if lb == label][0]
            moved += oracle_step(ops, o, g, case, LRS[s], ub_ours, ub_torch, rng, torch_split)
        b_ours, b_torch = o.frobenius_bounds()
        ours64 = a.astype(np.float64)
        max_err["ours_vs_double"] = max(max_err["ours_vs_double"], float(np.abs(ours64 - o.p).max()))
        worst["ours_vs_double"] = max(worst["ours_vs_double"], fro(ours64 - o.p) / b_ours)
        tightness = max(tightness, b_ours / moved)
        if torch_result is not None:
            t = torch_result[label].astype(np.float64)
            max_err["ours_vs_torch"] = max(max_err["ours_vs_torch"], float(np.abs(ours64 - t).max()))
            worst["ours_vs_torch"] = max(worst["ours_vs_torch"], fro(ours64 - t) / (b_ours + b_torch))
            worst["torch_vs_double"] = max(worst["torch_vs_double"], fro(t - o.p) / b_torch)
    ok = worst["ours_vs_double"] <= 1.0 and (torch_result is None or worst["ours_vs_torch"] <= 1.0)
    # err_over_bound_*: the largest ||difference||_F / its bound over the matrices (<= 1
    # passes); bound_over_update: the largest B_ours / sum adjusted_lr ||U||_F (how much of
    # the update the bound leaves open); max_abs_err_*: the largest element difference.
    return {"check": "muon_torch", "case": case["name"], "backend": meta.get("backend", "?"), "steps": steps,
            "max_abs_err_ours_vs_double": max_err["ours_vs_double"], "err_over_bound_ours_vs_double": worst["ours_vs_double"],
            "max_abs_err_ours_vs_torch": max_err["ours_vs_torch"] if torch_result is not None else None,
            "err_over_bound_ours_vs_torch": worst["ours_vs_torch"] if torch_result is not None else None,
            "err_over_bound_torch_vs_double": worst["torch_vs_double"] if torch_result is not None else None,
            "bound_over_update": tightness, "ok": ok}


def prepare(d, shapes, seed, steps):
    inputs = make_inputs(shapes, seed, steps)
    meta = {"params": [{"name": n, "shape": list(s)} for n, s in shapes], "lrs": LRS[:steps], "cases": cases(),
            "seed": seed}
    write_safetensors(os.path.join(d, "inputs.safetensors"), inputs, {"muon_check": json.dumps(meta)})
    return inputs


def run_ours(exe, d, backend):
    r = subprocess.run([exe, d, backend])
    if r.returncode == 77:
        print("muon_torch_run: no GPU: skipped")
        sys.exit(77)
    if r.returncode != 0:
        raise RuntimeError(f"{exe} {d} {backend} failed with exit code {r.returncode}")


def selftest(exe, d, seed, steps):
    """Host, no torch: the generation is deterministic, the file reads back exactly, and our
    host twin (fp32) meets the fp32 bound against the double Muon."""
    inputs = prepare(d, SMALL_SHAPES, seed, steps)
    again = make_inputs(SMALL_SHAPES, seed, steps)
    other = make_inputs(SMALL_SHAPES, seed + 1, steps)
    back, meta = read_safetensors(os.path.join(d, "inputs.safetensors"))
    assert list(back) == list(inputs), "tensor names or order changed in the round trip"
    for k, a in inputs.items():
        assert a.tobytes() == again[k].tobytes(), f"{k}: the same seed gave other values"
        assert a.tobytes() != other[k].tobytes(), f"{k}: another seed gave the same values"
        assert back[k].tobytes() == a.tobytes(), f"{k}: differs after the file round trip"
    assert json.loads(meta["muon_check"])["cases"] == cases()
    run_ours(exe, d, "host")
    ok = check_bf16_bound_model(seed)
    for case in cases():
        row = check_case(Ops(), SMALL_SHAPES, inputs, os.path.join(d, f"ours_{case['name']}.safetensors"), case,
                         steps, 0.0, 0.0, None, seed)
        print(json.dumps(row))
        ok = ok and row["ok"] and row["backend"] == "host"
    # The check can fail: the original-lr result judged as match_rms_adamw's breaks the bound.
    wrong = dict(cases()[0], adjust_lr="match_rms_adamw")
    row = check_case(Ops(), SMALL_SHAPES, inputs, os.path.join(d, f"ours_{cases()[0]['name']}.safetensors"), wrong,
                     steps, 0.0, 0.0, None, seed)
    print("another lr adjustment must fail:", json.dumps(row))
    return ok and not row["ok"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exe", required=True, help="the muon_torch_run program of a build")
    ap.add_argument("--dir", help="work directory (default: a temporary one, removed afterwards)")
    ap.add_argument("--seed", type=int, default=34)
    ap.add_argument("--steps", type=int, default=3, choices=[1, 2, 3])
    ap.add_argument("--selftest", action="store_true", help="host backend, small shapes, no torch")
    args = ap.parse_args()
    d = args.dir or tempfile.mkdtemp(prefix="muon_torch_check.")
    os.makedirs(d, exist_ok=True)
    try:
        if args.selftest:
            return 0 if selftest(args.exe, d, args.seed, args.steps) else 1
        try:
            import torch
        except ImportError:
            print("torch is missing: skipped")
            return 77
        if not torch.cuda.is_available():
            print("no CUDA device for torch: skipped")
            return 77
        if not hasattr(torch.optim, "Muon"):
            print(f"torch {torch.__version__} has no torch.optim.Muon: skipped")
            return 77
        dev = torch.device("cuda")
        inputs = prepare(d, DEVICE_SHAPES, args.seed, args.steps)
        run_ours(args.exe, d, "cuda")
        print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}; shapes {DEVICE_SHAPES}; "
              f"{args.steps} steps, lr {LRS[:args.steps]}")
        ok = True
        for case in cases():
            ub = UB if case["gemm"] == "bf16" else 0.0
            ref, split = run_torch(torch, dev, DEVICE_SHAPES, inputs, case, args.steps)
            row = check_case(Ops(dev), DEVICE_SHAPES, inputs, os.path.join(d, f"ours_{case['name']}.safetensors"),
                             case, args.steps, ub, ub, ref, args.seed, split)
            row["torch"] = torch.__version__
            row["torch_separate_ops"] = split
            print(json.dumps(row), flush=True)
            ok = ok and row["ok"] and row["backend"] == "cuda"
        print("PASS" if ok else "FAIL")
        return 0 if ok else 1
    finally:
        if not args.dir:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
