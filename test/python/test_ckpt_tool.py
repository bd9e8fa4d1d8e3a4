#!/usr/bin/env python3
"""Tests of tools/shardopt_ckpt.py against checkpoints written here, per docs/checkpoints.md.

A plain script: exit 0 pass, 1 fail, 77 skip (numpy or safetensors missing). It has its
own small checkpoint writer (its own CRC-32C, bf16 and safetensors code, none taken from
the tool) and builds checkpoints of 1, 2 and 3 ranks with uneven shards: a bf16 native
tensor, a grouped pair moe.experts.0 / moe.experts.1, an f16 tensor, bf16 moments and an
MXFP8 tensor with data and scale kinds; and a model with Muon tensors (muon_momentum). It checks `list`, `verify` (good, then missing
index, missing file, truncated file, flipped data byte, a gap, an overlap, a wrong dtype,
and the hostile copies of issue 30: rewritten headers, slices, file names, world size),
`get` (equal to the arrays it sliced) and `export-hf` (loads back equal, index correct).

With SHARDOPT_CKPT_DIR (a checkpoint the C++ tests wrote) it also runs verify and list on
it, and with SHARDOPT_CKPT_EXPECT (a directory of TENSOR__KIND.npy files) compares `get`
against each of those arrays; SHARDOPT_CKPT_ENV_ONLY=1 runs only that part.
"""

import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import safetensors  # noqa: F401
    from safetensors import safe_open
except ImportError as e:
    print(f"SKIP: {e}")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = os.path.normpath(os.path.join(HERE, "..", "..", "tools", "shardopt_ckpt.py"))
sys.path.insert(0, os.path.dirname(TOOL))
import shardopt_ckpt as tool  # noqa: E402

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}")
    return cond


def run(*args):
    p = subprocess.run([sys.executable, TOOL] + [str(a) for a in args],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    return p.returncode, p.stdout, p.stderr


def no_traceback(res, what):
    check("Traceback" not in res[1] + res[2], f"{what}: printed a traceback:\n{res[2]}")


# ------------------------------------------------------------------ independent helpers

def crc32c_ref(data):
    """Bitwise CRC-32C (reflected Castagnoli polynomial 0x82F63B78)."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def bf16_round_ref(x):
    """float32 -> bf16 bits, nearest, ties to even: picks the nearer of the two bf16
    neighbours by float64 distance (finite inputs well inside range only)."""
    bits = x.astype(np.float32).view(np.uint32)
    lo = bits & np.uint32(0xFFFF0000)
    hi = lo + np.uint32(0x10000)
    xv = x.astype(np.float64)
    dlo = np.abs(xv - lo.view(np.float32).astype(np.float64))
    dhi = np.abs(hi.view(np.float32).astype(np.float64) - xv)
    lo16 = (lo >> 16).astype(np.uint16)
    hi16 = (hi >> 16).astype(np.uint16)
    pick_hi = (dhi < dlo) | ((dhi == dlo) & (hi16 % 2 == 0))
    return np.where(pick_hi, hi16, lo16).astype(np.uint16)


def st_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return 8 + n, json.loads(f.read(n))


def st_raw(path, name):
    start, h = st_header(path)
    a, b = h[name]["data_offsets"]
    with open(path, "rb") as f:
        f.seek(start + a)
        return h[name]["dtype"], h[name]["shape"], f.read(b - a)


# ------------------------------------------------------------------ the model

def prod(s):
    n = 1
    for d in s:
        n *= d
    return n


def bf16_bits(rng, n):
    """Random bf16 bit patterns (truncated normal floats)."""
    return (rng.standard_normal(n).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def make_model(seed=1):
    """{tensor: {"meta": index entry, "kinds": {kind: (dtype, full array)}}}"""
    rng = np.random.default_rng(seed)
    model = {}

    def native(name, shape, param_dtype, group=None):
        n = prod(shape)
        master = rng.standard_normal(n).astype(np.float32).reshape(shape)
        if param_dtype == "bf16":
            param = ("BF16", bf16_round_ref(master.reshape(-1)).reshape(shape))
        elif param_dtype == "f16":
            param = ("F16", master.astype(np.float16))
        else:
            param = ("F32", master.copy())
        meta = {"shape": list(shape), "param_dtype": param_dtype, "format": "native"}
        if group:
            meta["group"] = group
        model[name] = {"meta": meta, "kinds": {
            "master": ("F32", master),
            "exp_avg": ("BF16", bf16_bits(rng, n).reshape(shape)),
            "exp_avg_sq": ("BF16", bf16_bits(rng, n).reshape(shape)),
            "param": param}}

    native("embed", [10, 6], "bf16")
    native("moe.experts.0", [4, 5], "f32", group="decay")
    native("moe.experts.1", [4, 5], "f32", group="decay")
    native("norm", [7], "f16")
    # MXFP8: rows = 2*35 = 70, cols = 40 -> row scales [70, 2], col scales [3, 40]
    shape = [2, 35, 40]
    n = prod(shape)
    master = rng.standard_normal(n).astype(np.float32)
    specials = {0: 0x3F808000, 1: 0x3F818000, 2: 0x7FC00001, 3: 0x80000000, 4: 0xBF80FFFF}
    for i, b in specials.items():
        master[i] = np.array([b], dtype=np.uint32).view(np.float32)[0]
    u8 = lambda s: rng.integers(0, 256, prod(s), dtype=np.uint8).reshape(s)  # noqa: E731
    model["proj"] = {"meta": {"shape": shape, "param_dtype": "bf16", "format": "mxfp8", "group": "decay"},
                     "kinds": {"master": ("F32", master.reshape(shape)),
                               "exp_avg": ("BF16", bf16_bits(rng, n).reshape(shape)),
                               "exp_avg_sq": ("BF16", bf16_bits(rng, n).reshape(shape)),
                               "mxfp8_row_data": ("U8", u8(shape)),
                               "mxfp8_col_data": ("U8", u8(shape)),
                               "mxfp8_row_scale": ("U8", u8([70, 2])),
                               "mxfp8_col_scale": ("U8", u8([3, 40]))}}
    return model


def make_nvfp4_model(seed=2):
    """Two NVFP4 members of [5, 9] (45 elements: odd, so rank cuts inside them split
    bytes), with the kinds the C++ side saves for them."""
    rng = np.random.default_rng(seed)
    model = {}
    for m in range(2):
        shape = [5, 9]
        n = prod(shape)
        model[f"moe.up.{m}"] = {
            "meta": {"shape": shape, "param_dtype": "bf16", "format": "nvfp4", "group": "decay"},
            "kinds": {"master": ("F32", rng.standard_normal(n).astype(np.float32).reshape(shape)),
                      "exp_avg": ("BF16", bf16_bits(rng, n).reshape(shape)),
                      "exp_avg_sq": ("BF16", bf16_bits(rng, n).reshape(shape)),
                      "nvfp4_data": ("U8", rng.integers(0, 256, (n + 1) // 2, dtype=np.uint8)),
                      "nvfp4_scale": ("U8", rng.integers(0, 256, 1, dtype=np.uint8).reshape([1, 1])),
                      "nvfp4_amax": ("F32", np.abs(rng.standard_normal(1)).astype(np.float32))}}
    return model


def make_muon_model(seed=3):
    """An AdamW tensor beside Muon matrices (a plain one and two expert members): Muon
    tensors hold master, param and muon_momentum (no Adam moments), as the C++ side saves."""
    rng = np.random.default_rng(seed)
    model = {}
    for name, shape, algo in (("embed", [10, 6], "adamw"), ("attn.wq", [6, 8], "muon"),
                              ("moe.experts.0", [4, 5], "muon"), ("moe.experts.1", [4, 5], "muon")):
        n = prod(shape)
        master = rng.standard_normal(n).astype(np.float32).reshape(shape)
        kinds = {"master": ("F32", master), "param": ("BF16", bf16_round_ref(master.reshape(-1)).reshape(shape))}
        if algo == "muon":
            kinds["muon_momentum"] = ("F32", rng.standard_normal(n).astype(np.float32).reshape(shape))
        else:
            kinds["exp_avg"] = ("BF16", bf16_bits(rng, n).reshape(shape))
            kinds["exp_avg_sq"] = ("BF16", bf16_bits(rng, n).reshape(shape))
        model[name] = {"meta": {"shape": shape, "param_dtype": "bf16", "format": "native", "algorithm": algo},
                       "kinds": kinds}
    return model


# 3 ranks: rank 0 owns embed[0:25], rank 1 embed[25:60], moe.experts.0, moe.experts.1[0:15],
# rank 2 the rest (total 60 + 20 + 20 + 7 + 2800 elements).
CUTS3 = [25, 95]
NP = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", "U8": "u1"}


# ------------------------------------------------------------------ the writer

def plan_slices(model, world, cuts):
    """[(rank, tensor, kind, offset, length)]: shard kinds by uneven rank ranges over the
    concatenated model (rank r owns elements [cuts[r-1], cuts[r]), cuts given without 0
    and the total), scales split evenly per member as the document says."""
    total = sum(prod(t["meta"]["shape"]) for t in model.values())
    cuts = [0] + list(cuts) + [total]
    assert len(cuts) == world + 1
    out = []
    base = 0
    for home, (name, t) in enumerate(model.items()):
        n = prod(t["meta"]["shape"])
        for kind, (_, arr) in t["kinds"].items():
            if kind == "muon_momentum":  # whole, written by the matrix's home rank
                out.append((home % world, name, kind, 0, n))
                continue
            if kind == "nvfp4_data":  # whole bytes: byte k by the rank owning element 2k
                for r in range(world):
                    a, b = max(cuts[r], base) - base, min(cuts[r + 1], base + n) - base
                    ka, kb = (a + 1) // 2, (b + 1) // 2
                    if b > a and kb > ka:
                        out.append((r, name, kind, ka, kb - ka))
                continue
            if kind.endswith("_scale") or kind == "nvfp4_amax":
                m = arr.size
                for r in range(world):
                    a, b = r * m // world, (r + 1) * m // world
                    if b > a:
                        out.append((r, name, kind, a, b - a))
                continue
            for r in range(world):
                a, b = max(cuts[r], base), min(cuts[r + 1], base + n)
                if b > a:
                    out.append((r, name, kind, a - base, b - a))
        base += n
    return out


def write_checkpoint(path, model, world, cuts, mutate=None, dtype_override=None):
    os.makedirs(path)
    slices = plan_slices(model, world, cuts)
    if mutate:
        slices = mutate(slices)
    files, index_slices = [], {}
    for r in range(world):
        header, blobs, off = {}, [], 0
        for (rank, name, kind, o, n) in slices:
            if rank != r:
                continue
            dtype, arr = model[name]["kinds"][kind]
            piece = arr.reshape(-1)[o:o + n]
            if piece.size < n:  # a slice made too long on purpose: pad it
                piece = np.concatenate([piece, np.zeros(n - piece.size, dtype=piece.dtype)])
            data = np.ascontiguousarray(piece).astype(NP[dtype]).tobytes()
            if dtype_override and (name, kind) in dtype_override:  # deliberately wrong dtype tag
                dtype = dtype_override[(name, kind)]
            sname = f"{name}/{kind}@{o}"
            header[sname] = {"dtype": dtype, "shape": [n], "data_offsets": [off, off + len(data)]}
            blobs.append(data)
            off += len(data)
            index_slices.setdefault(f"{name}/{kind}", []).append({"file": r, "offset": o, "length": n})
        data = b"".join(blobs)
        crc = "crc32c:%08x" % crc32c_ref(data)
        header["__metadata__"] = {"format": "shardopt-checkpoint", "format_version": "1",
                                  "rank": str(r), "world_size": str(world), "checksum": crc}
        hj = json.dumps(header).encode()
        hj += b" " * ((8 - len(hj) % 8) % 8)
        fname = f"shard-{r:05d}-of-{world:05d}.safetensors"
        with open(os.path.join(path, fname), "wb") as f:
            f.write(struct.pack("<Q", len(hj)) + hj + data)
        files.append({"file": fname, "rank": r, "bytes": 8 + len(hj) + len(data), "checksum": crc})
    index = {"format": "shardopt-checkpoint", "format_version": 1, "world_size": world,
             "files": files,
             "tensors": {name: t["meta"] for name, t in model.items()},
             "slices": index_slices,
             "state": {"step": 1000, "loss_scale": 1.0, "lr": 3e-4},
             "options": {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "decoupled_weight_decay": True,
                         "clip_max_norm": 1.0, "moment_dtype": "bf16",
                         "default_group": {"weight_decay": 0.0, "lr_scale": 1.0},
                         "groups": {"decay": {"weight_decay": 0.1, "lr_scale": 1.0}}},
             "user": {"data_position": "123456"}}
    with open(os.path.join(path, "index.json"), "w") as f:
        json.dump(index, f, indent=1)
    return slices


# ------------------------------------------------------------------ checks

def test_crc():
    check(tool.crc32c(b"123456789") == 0xE3069283, "crc32c('123456789') == 0xE3069283")
    check(crc32c_ref(b"123456789") == 0xE3069283, "reference crc32c('123456789')")
    rng = np.random.default_rng(7)
    for n in (0, 1, 3, 8191, 8192, 8193, 20001, 70000):
        d = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        check(tool.crc32c(d) == crc32c_ref(d), f"crc32c of {n} random bytes")
        check(tool.crc32c(d[n // 3:], tool.crc32c(d[:n // 3])) == crc32c_ref(d), f"crc32c continued, {n}")


def test_bf16():
    x = np.array([1.0, -2.5, 3.14159, 1e-30, 65504.0, 0.0, -0.0], dtype=np.float32)
    check(np.array_equal(tool.f32_to_bf16(x), bf16_round_ref(x)), "f32_to_bf16 on finite values")
    ties = np.array([0x3F808000, 0x3F818000, 0xBF808000, 0x3F80FFFF], dtype=np.uint32).view(np.float32)
    check(tool.f32_to_bf16(ties).tolist() == [0x3F80, 0x3F82, 0xBF80, 0x3F81], "f32_to_bf16 ties to even")
    nan = np.array([0x7FC00000, 0x7F800001, 0xFF800001], dtype=np.uint32).view(np.float32)
    out = tool.f32_to_bf16(nan)
    check(all((b & 0x7F80) == 0x7F80 and (b & 0x7F) for b in out.tolist()), "f32_to_bf16 keeps NaN")
    bits = np.arange(0, 65536, 7, dtype=np.uint16)
    w = tool.bf16_to_f32(bits)
    check(np.array_equal(w.view(np.uint32) >> 16, bits.astype(np.uint32)) and
          not (w.view(np.uint32) & 0xFFFF).any(), "bf16_to_f32 exact")


def test_list_verify_get(ck, model, world):
    res = run("list", ck)
    check(res[0] == 0, f"list W={world} exit {res[0]}: {res[2]}")
    out = res[1]
    check("step 1000" in out and f"world size {world}" in out, f"list W={world} shows step and world size")
    for name, t in model.items():
        line = [ln for ln in out.splitlines() if ln.strip().startswith(name + " ")]
        check(len(line) == 1, f"list W={world} shows {name}")
        if line:
            check(str(t["meta"]["shape"]) in line[0] and t["meta"]["format"] in line[0],
                  f"list shows shape/format of {name}: {line[0]}")
            check(line[0].split("kinds:")[1].split() == [k for k in tool.KINDS if k in t["kinds"]],
                  f"list shows the kinds of {name}: {line[0]}")
    for r in range(world):
        check(f"shard-{r:05d}-of-{world:05d}.safetensors" in out, f"list W={world} shows file {r}")

    res = run("verify", ck)
    check(res[0] == 0, f"verify good W={world}: exit {res[0]}:\n{res[1]}{res[2]}")
    check(tool.verify(ck) == [], f"tool.verify good W={world}")

    c = tool.Checkpoint(ck)
    check(c.step == 1000 and c.world_size == world, "Checkpoint step / world_size")
    for name, t in model.items():
        for kind, (dtype, arr) in t["kinds"].items():
            got = c.get(name, kind)
            check(got.shape == arr.shape, f"get {name}/{kind} W={world}: shape {got.shape} != {arr.shape}")
            check(got.dtype == np.dtype(NP[dtype]) and np.array_equal(got.view(np.uint8), np.ascontiguousarray(
                arr).view(np.uint8)), f"get {name}/{kind} W={world}: values")
            if dtype == "BF16":
                wide = c.get(name, kind, as_float32=True)
                check(wide.dtype == np.float32 and np.array_equal(
                    wide.view(np.uint32), arr.astype(np.uint32) << 16), f"get {name}/{kind} as float32")


def test_cli_get(ck, model, tmp):
    out = os.path.join(tmp, "x.npy")
    for name, kind, extra in (("embed", "exp_avg", []), ("embed", "exp_avg", ["--as-float32"]),
                              ("proj", "mxfp8_col_scale", []), ("moe.experts.1", "master", []),
                              ("norm", "param", [])):
        res = run("get", ck, name, kind, "--out", out, *extra)
        check(res[0] == 0, f"get {name} {kind} {extra}: exit {res[0]} {res[2]}")
        dtype, arr = model[name]["kinds"][kind]
        got = np.load(out)
        if extra:
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        check(got.shape == arr.shape and np.array_equal(got.view(np.uint8), arr.view(np.uint8)),
              f"get {name} {kind} {extra} --out values")
    res = run("get", ck, "proj", "mxfp8_row_scale")
    check(res[0] == 0 and "[70, 2]" in res[1], f"get summary of row scales: {res}")
    res = run("get", ck, "embed", "exp_avg")
    check(res[0] == 0 and "BF16" in res[1], f"get summary of bf16: {res}")
    for args in (("get", ck, "nope", "master"), ("get", ck, "proj", "param"), ("get", ck, "embed", "bogus")):
        res = run(*args)
        check(res[0] == 2 and "error:" in res[2], f"{args[2:]}: usage error exit 2, got {res[0]} {res[2]}")
        no_traceback(res, str(args[2:]))
    res = run()
    check(res[0] == 2, "no command: exit 2")
    res = run("frobnicate", ck)
    check(res[0] == 2, "unknown command: exit 2")


def expect_bad(ck, what, needles, only=False):
    res = run("verify", ck)
    no_traceback(res, f"verify {what}")
    check(res[0] == 1, f"verify {what}: exit {res[0]}, expected 1:\n{res[1]}{res[2]}")
    lines = [ln for ln in res[1].splitlines() if ln.strip()]
    for n in needles:
        check(any(n in ln for ln in lines), f"verify {what}: no line with {n!r}:\n{res[1]}")
    if only:
        check(all(any(n in ln for n in needles) for ln in lines),
              f"verify {what}: unexpected problems:\n{res[1]}")
    return lines


def test_corruptions(good, model, tmp):
    def copy(tag):
        d = os.path.join(tmp, tag)
        shutil.copytree(good, d)
        return d

    d = copy("noindex")
    os.remove(os.path.join(d, "index.json"))
    msg = "incomplete checkpoint: no index.json (a save did not finish)"
    expect_bad(d, "missing index", [msg], only=True)
    for cmd in (["list", d], ["get", d, "embed", "master"], ["export-hf", d, os.path.join(tmp, "hfx")]):
        res = run(*cmd)
        check(res[0] == 1 and msg in res[2], f"{cmd[0]} without index: exit {res[0]} {res[2]}")
        no_traceback(res, f"{cmd[0]} without index")

    d = copy("badjson")
    with open(os.path.join(d, "index.json"), "w") as f:
        f.write("{not json")
    expect_bad(d, "broken index", ["index.json"])
    res = run("list", d)
    check(res[0] == 1, f"list with a broken index: exit {res[0]}")
    no_traceback(res, "list with a broken index")

    d = copy("nofile")
    os.remove(os.path.join(d, "shard-00001-of-00003.safetensors"))
    expect_bad(d, "missing file", ["shard-00001-of-00003.safetensors: missing"], only=True)
    res = run("get", d, "embed", "master")
    check(res[0] == 1 and "missing" in res[2], f"get with a missing file: {res}")
    no_traceback(res, "get with a missing file")

    d = copy("trunc")
    p = os.path.join(d, "shard-00002-of-00003.safetensors")
    size = os.path.getsize(p)
    with open(p, "r+b") as f:
        f.truncate(size - 10)
    expect_bad(d, "truncated file", ["truncated", "index.json says %d" % size])
    res = run("export-hf", d, os.path.join(tmp, "hft"))
    check(res[0] == 1, f"export-hf of a truncated checkpoint: exit {res[0]} {res[2]}")
    no_traceback(res, "export-hf of a truncated checkpoint")

    d = copy("flip")
    p = os.path.join(d, "shard-00000-of-00003.safetensors")
    with open(p, "r+b") as f:
        f.seek(-5, 2)
        b = f.read(1)
        f.seek(-5, 2)
        f.write(bytes([b[0] ^ 0x10]))
    lines = expect_bad(d, "flipped byte", ["checksum mismatch"], only=True)
    check(len(lines) == 2 and any("file metadata" in ln for ln in lines) and any("index.json" in ln for ln in lines),
          f"flipped byte: one line for metadata, one for the index: {lines}")

    # a gap: the middle rank's slice of moe.experts.1/master is not written anywhere
    def drop(slices):
        victim = [s for s in slices if s[1] == "moe.experts.1" and s[2] == "master" and s[0] == 1][0]
        drop.victim = victim
        return [s for s in slices if s != victim]
    d = os.path.join(tmp, "gap")
    write_checkpoint(d, model, 3, CUTS3, mutate=drop)
    _, _, _, o, n = drop.victim
    expect_bad(d, "gap", [f"moe.experts.1/master: elements [{o}, {o + n}) are in no slice (gap)"], only=True)
    res = run("get", d, "moe.experts.1", "master")
    check(res[0] == 1 and "gap" in res[2], f"get over a gap: {res}")
    no_traceback(res, "get over a gap")

    # an overlap: rank 2's slice of moe.experts.1/exp_avg starts 2 elements early
    def overlap(slices):
        out = []
        for s in slices:
            if s[1] == "moe.experts.1" and s[2] == "exp_avg" and s[0] == 2:
                overlap.start = s[3]
                s = (s[0], s[1], s[2], s[3] - 2, s[4] + 2)
            out.append(s)
        return out
    d = os.path.join(tmp, "overlap")
    write_checkpoint(d, model, 3, CUTS3, mutate=overlap)
    o = overlap.start
    expect_bad(d, "overlap", [f"moe.experts.1/exp_avg: elements [{o - 2}, {o}) are in more than one slice (overlap)"],
               only=True)

    # a slice running past the end of its tensor
    def long(slices):
        return [(s[0], s[1], s[2], s[3], s[4] + 3) if (s[1], s[2]) == ("norm", "exp_avg_sq") and
                s[3] + s[4] == 7 else s for s in slices]
    d = os.path.join(tmp, "long")
    write_checkpoint(d, model, 3, CUTS3, mutate=long)
    expect_bad(d, "too long", ["norm/exp_avg_sq: slices reach element 10 but the tensor has 7"], only=True)

    # master stored as BF16 (tagged so, data of the right size)
    d = os.path.join(tmp, "dtype")
    m2 = {k: {"meta": v["meta"], "kinds": dict(v["kinds"])} for k, v in model.items()}
    m2["norm"]["kinds"]["master"] = ("BF16", bf16_round_ref(model["norm"]["kinds"]["master"][1]))
    write_checkpoint(d, m2, 3, CUTS3)
    expect_bad(d, "bf16 master", ["master must be F32"], only=True)


def test_muon(tmp):
    """Muon checkpoints: list / verify / get of muon_momentum at 1-3 ranks (the generic
    checks), and verify flags a BF16 momentum, Adam moments beside the momentum, and a
    momentum on a tensor that is not 2-D."""
    model = make_muon_model()
    for world, cuts in ((1, []), (2, [70]), (3, [30, 100])):
        ck = os.path.join(tmp, f"muon-w{world}")
        write_checkpoint(ck, model, world, cuts)
        test_list_verify_get(ck, model, world)
    c = tool.Checkpoint(os.path.join(tmp, "muon-w3"))
    got = c.get("attn.wq", "muon_momentum")
    check(got.dtype == np.float32 and got.shape == (6, 8) and
          np.array_equal(got, model["attn.wq"]["kinds"]["muon_momentum"][1]), "get attn.wq muon_momentum")
    res = run("list", os.path.join(tmp, "muon-w3"))
    wq = [ln for ln in res[1].splitlines() if ln.strip().startswith("attn.wq ")]
    check(len(wq) == 1 and "muon" in wq[0].split("kinds:")[0], f"list shows attn.wq as a Muon tensor: {wq}")

    d = os.path.join(tmp, "muon-bf16")
    write_checkpoint(d, model, 3, [30, 100], dtype_override={("attn.wq", "muon_momentum"): "F16"})
    expect_bad(d, "f16 momentum", ["muon_momentum must be F32"])
    both = {k: {"meta": dict(v["meta"]), "kinds": dict(v["kinds"])} for k, v in model.items()}
    both["attn.wq"]["kinds"]["exp_avg"] = model["embed"]["kinds"]["exp_avg"][0], bf16_bits(np.random.default_rng(4), 48).reshape(6, 8)
    d = os.path.join(tmp, "muon-both")
    write_checkpoint(d, both, 3, [30, 100])
    expect_bad(d, "adam beside muon", ["attn.wq: holds both Adam's moments and Muon's momentum",
                                       "attn.wq/exp_avg: Adam's moment on a tensor whose algorithm is 'muon'"],
               only=True)
    flat = {k: {"meta": dict(v["meta"]), "kinds": dict(v["kinds"])} for k, v in model.items()}
    flat["attn.wq"]["meta"]["shape"] = [48]
    flat["attn.wq"]["kinds"] = {k: (dt, a.reshape(48)) for k, (dt, a) in flat["attn.wq"]["kinds"].items()}
    d = os.path.join(tmp, "muon-1d")
    write_checkpoint(d, flat, 3, [30, 100])
    expect_bad(d, "1-D momentum", ["attn.wq/muon_momentum: Muon's momentum on a tensor of shape [48]"], only=True)


def put_header(path, hlen, text):
    """Rewrites a safetensors file as 8-byte length `hlen`, header bytes `text` and its old
    data section."""
    start, _ = st_header(path)
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", hlen) + text + data)


def edit_last_tensor(path, edit):
    """Changes the header entry whose data ends last: edit(entry) changes it in place."""
    _, h = st_header(path)
    last = max((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][1])
    edit(h[last])
    text = json.dumps(h).encode()
    put_header(path, len(text), text)


def edit_index(d, edit):
    p = os.path.join(d, "index.json")
    with open(p) as f:
        index = json.load(f)
    edit(index)
    with open(p, "w") as f:
        json.dump(index, f, indent=1)


def last_master_slice(index):
    return next(v for k, v in index["slices"].items() if k.endswith("/master"))[-1]


def test_hostile(good, tmp):
    """Copies of a good checkpoint with a header or the index rewritten (issue 30): verify
    and list refuse each with the problem on one line, never a traceback, and never open a
    file outside the directory."""
    last = "shard-00002-of-00003.safetensors"

    def past_end(e):
        n = e["shape"][0]
        b, x = e["data_offsets"]
        e["shape"] = [n + (1 << 20)]
        e["data_offsets"] = [b, x + (1 << 20) * ((x - b) // n)]

    def name(value):
        return lambda d: edit_index(d, lambda i: i["files"][2].update(file=value))

    def moved(d):
        os.rename(os.path.join(d, last), os.path.join(d, "..", "moved-" + last))
        edit_index(d, lambda i: i["files"][2].update(file="../moved-" + last))

    nested = b'{"x":' + b"[" * 200000 + b"]" * 200000 + b"}"
    plain = "a checkpoint names only plain files inside its directory"
    cases = [
        ("header-2p60", lambda d: put_header(os.path.join(d, last), 1 << 60, b""),
         "truncated: header of 1152921504606846976 bytes"),
        ("offsets-past-end", lambda d: edit_last_tensor(os.path.join(d, last), past_end),
         "truncated: the header says the data ends at byte"),
        ("offsets-reversed", lambda d: edit_last_tensor(
            os.path.join(d, last), lambda e: e.update(data_offsets=e["data_offsets"][::-1])), "bad header entry"),
        ("shape-2p62", lambda d: edit_last_tensor(os.path.join(d, last), lambda e: e.update(shape=[1 << 62])),
         "has shape [4611686018427387904]"),
        ("shape-negative", lambda d: edit_last_tensor(os.path.join(d, last), lambda e: e.update(shape=[-3])),
         "bad header entry"),
        ("nested", lambda d: put_header(os.path.join(d, last), len(nested), nested), "nested too deep"),
        ("slice-offset-2p62", lambda d: edit_index(d, lambda i: last_master_slice(i).update(offset=1 << 62)),
         "(gap)"),
        ("slice-length-2p40", lambda d: edit_index(d, lambda i: last_master_slice(i).update(length=1 << 40)),
         "index.json says [1099511627776]"),
        ("name-passwd", name("../../../../etc/passwd"), plain),
        ("name-moved", moved, plain),
        ("world-100000", lambda d: edit_index(d, lambda i: i.update(world_size=100000)),
         "world_size is 100000 but files lists 3 files"),
        # the other names that are not plain file names
        ("name-absolute", name("/etc/passwd"), "is an absolute path"),
        ("name-backslash", name("..\\x.safetensors"), "holds a path separator"),
        ("name-dot", name("."), "names a directory"),
        ("name-dotdot", name(".."), "names a directory"),
        ("name-empty", name(""), "is empty"),
        ("name-nul", name("shard\u0000.safetensors"), "holds a NUL character"),
    ]
    for tag, damage, needle in cases:
        d = os.path.join(tmp, "hostile", tag)
        shutil.copytree(good, d)
        damage(d)
        expect_bad(d, tag, [needle])
        res = run("list", d)
        no_traceback(res, f"list {tag}")
        if tag.startswith(("name-", "world-")):  # refused from the index alone
            check(res[0] == 1 and needle in res[2], f"list {tag}: exit {res[0]} {res[2]}")


def test_export(ck, model, tmp):
    out = os.path.join(tmp, "hf")
    res = run("export-hf", ck, out)
    check(res[0] == 0, f"export-hf: exit {res[0]} {res[2]}")
    with open(os.path.join(out, "model.safetensors.index.json")) as f:
        idx = json.load(f)
    names = list(model)
    check(sorted(idx["weight_map"]) == sorted(names), f"export weight_map names: {idx['weight_map']}")
    check(set(idx["weight_map"].values()) == {"model-00001-of-00001.safetensors"}, "export: one file by default")
    expected = {}
    for name, t in model.items():
        if "param" in t["kinds"]:
            expected[name] = t["kinds"]["param"]
        else:
            expected[name] = ("BF16", bf16_round_ref(t["kinds"]["master"][1].reshape(-1)).reshape(
                t["meta"]["shape"]))
    total = sum(a.size * {"F32": 4, "F16": 2, "BF16": 2}[dt] for dt, a in expected.values())
    check(idx["metadata"]["total_size"] == total, f"export total_size {idx['metadata']['total_size']} != {total}")
    load_check(out, idx, expected, "export default", special_nan=("proj", 2))

    out2 = os.path.join(tmp, "hf2")
    res = run("export-hf", ck, out2, "--kind", "master", "--dtype", "f32", "--max-shard-bytes", "300")
    check(res[0] == 0, f"export-hf --kind master: exit {res[0]} {res[2]}")
    with open(os.path.join(out2, "model.safetensors.index.json")) as f:
        idx2 = json.load(f)
    files = sorted(set(idx2["weight_map"].values()))
    nf = len(files)
    check(nf > 2 and files == [f"model-{i + 1:05d}-of-{nf:05d}.safetensors" for i in range(nf)],
          f"export sharded names: {files}")
    check(sorted(os.listdir(out2)) == sorted(files + ["model.safetensors.index.json"]), "export: no stray files")
    for fn in files:
        sizes = [prod(model[n]["meta"]["shape"]) * 4 for n, v in idx2["weight_map"].items() if v == fn]
        check(sum(sizes) <= 300 or len(sizes) == 1, f"export shard {fn} over the limit: {sizes}")
    exp2 = {n: ("F32", t["kinds"]["master"][1]) for n, t in model.items()}
    check(idx2["metadata"]["total_size"] == sum(a.size * 4 for _, a in exp2.values()), "export f32 total_size")
    load_check(out2, idx2, exp2, "export master f32", special_nan=("proj", 2))

    out3 = os.path.join(tmp, "hf3")
    res = run("export-hf", ck, out3, "--dtype", "bf16")
    check(res[0] == 0, f"export-hf --dtype bf16: exit {res[0]} {res[2]}")
    with open(os.path.join(out3, "model.safetensors.index.json")) as f:
        idx3 = json.load(f)
    exp3 = {}
    for n, (dt, a) in expected.items():
        if dt == "F32":
            a = bf16_round_ref(a.reshape(-1)).reshape(a.shape)
        elif dt == "F16":
            a = bf16_round_ref(a.astype(np.float32).reshape(-1)).reshape(a.shape)
        exp3[n] = ("BF16", a)
    load_check(out3, idx3, exp3, "export bf16", special_nan=("proj", 2))

    res = run("export-hf", ck, os.path.join(tmp, "hf4"), "--dtype", "f8")
    check(res[0] == 2, f"export-hf --dtype f8: exit {res[0]}")


def load_check(out, idx, expected, what, special_nan=None):
    for name, (dtype, arr) in expected.items():
        path = os.path.join(out, idx["weight_map"][name])
        got_dtype, shape, raw = st_raw(path, name)
        check(got_dtype == dtype and shape == list(arr.shape), f"{what}: {name} is {got_dtype} {shape}")
        want = np.ascontiguousarray(arr).astype(NP[dtype])
        ok = raw == want.tobytes()
        if not ok and special_nan and name == special_nan[0]:
            # NaN payloads may differ; compare all but the NaN element, then check NaN-ness
            i = special_nan[1]
            g = np.frombuffer(raw, dtype=NP[dtype]).copy()
            w = want.reshape(-1).copy()
            nan_ok = (np.isnan(tool.bf16_to_f32(g[i:i + 1]))[0] if dtype == "BF16" else np.isnan(g[i]))
            g[i] = w[i] = 0
            ok = nan_ok and np.array_equal(g.view(np.uint8), w.view(np.uint8))
        check(ok, f"{what}: {name} bytes")
    files = sorted(set(idx["weight_map"].values()))
    for fn in files:
        path = os.path.join(out, fn)
        start, h = st_header(path)
        check(start % 8 == 0, f"{what}: {fn} header length is a multiple of 8")
        with safe_open(path, framework="np") as f:  # the official parser accepts the file
            keys = sorted(f.keys())
            check(keys == sorted(n for n, v in idx["weight_map"].items() if v == fn), f"{what}: {fn} keys")
            check(f.metadata() == {"format": "pt"}, f"{what}: {fn} metadata {f.metadata()}")
            for k in keys:
                if expected[k][0] != "BF16":
                    a = f.get_tensor(k)
                    w = expected[k][1]
                    check(a.shape == w.shape and np.array_equal(a, w, equal_nan=True),
                          f"{what}: safe_open {k}")
        if hasattr(safetensors, "deserialize"):
            with open(path, "rb") as fh:
                items = dict(safetensors.deserialize(fh.read()))
            for k, v in items.items():
                check(v["dtype"] == expected[k][0] and list(v["shape"]) == list(expected[k][1].shape),
                      f"{what}: deserialize {k}")
        try:
            import torch
            from safetensors.torch import load_file
        except ImportError:
            continue
        tens = load_file(path)
        for k, t in tens.items():
            dt, w = expected[k]
            if dt == "BF16":
                check(t.dtype == torch.bfloat16, f"{what}: torch dtype of {k}")
                g = t.view(torch.int16).numpy().view(np.uint16)
            else:
                g = t.numpy()
            check(np.array_equal(g, w, equal_nan=True) or k == (special_nan or [None])[0],
                  f"{what}: torch {k}")


def test_same_tensors(d, other):
    """Checkpoint `d` holds the tensors of `other`, every kind, with equal bytes (e.g. an
    Fsdp and a DistributedAdam checkpoint of the same MXFP8 state); both verify."""
    for x in (d, other):
        res = run("verify", x)
        check(res[0] == 0, f"verify {x}: exit {res[0]}\n{res[1]}{res[2]}")
    a, b = tool.Checkpoint(d), tool.Checkpoint(other)
    check(sorted(a.tensors) == sorted(b.tensors), f"{d} and {other} hold other tensors")
    compared = 0
    for tensor in sorted(b.tensors):
        check(a.kinds(tensor) == b.kinds(tensor), f"{tensor}: kinds {a.kinds(tensor)} vs {b.kinds(tensor)}")
        for kind in b.kinds(tensor):
            x, y = a.get(tensor, kind), b.get(tensor, kind)
            check(x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x.view(np.uint8), y.view(np.uint8)),
                  f"{tensor} {kind}: {d} differs from {other}")
            compared += 1
    check(any(k.startswith("mxfp8_") for t in b.tensors for k in b.kinds(t)), f"{other} holds no MXFP8 tensors")
    print(f"{compared} tensors of {d} equal those of {other}")


def test_q8_moments(model, tmp):
    """8-bit block moments (options.moment_dtype "q8_block") are saved decoded, as F32:
    verify takes F32 moments under that option and flags BF16 ones."""
    import copy
    m32 = copy.deepcopy(model)
    for t in m32.values():
        for kind in ("exp_avg", "exp_avg_sq"):
            if kind in t["kinds"]:
                bits = t["kinds"][kind][1].astype(np.uint32) << 16
                t["kinds"][kind] = ("F32", bits.view(np.float32))

    def q8_option(path):
        ip = os.path.join(path, "index.json")
        with open(ip) as f:
            index = json.load(f)
        index["options"]["moment_dtype"] = "q8_block"
        with open(ip, "w") as f:
            json.dump(index, f, indent=1)

    ok = os.path.join(tmp, "q8-f32")
    write_checkpoint(ok, m32, 2, [1500])
    q8_option(ok)
    res = run("verify", ok)
    check(res[0] == 0, f"verify of F32 moments under q8_block: exit {res[0]}:\n{res[1]}{res[2]}")
    bad = os.path.join(tmp, "q8-bf16")
    write_checkpoint(bad, model, 2, [1500])
    q8_option(bad)
    expect_bad(bad, "bf16 moments under q8_block", ["embed/exp_avg is BF16, options.moment_dtype is q8_block"])


def test_env():
    d = os.environ.get("SHARDOPT_CKPT_DIR")
    if not d:
        print("SHARDOPT_CKPT_DIR not set: no C++ checkpoint to read")
        return
    res = run("verify", d)
    check(res[0] == 0, f"verify {d}: exit {res[0]}\n{res[1]}{res[2]}")
    res = run("list", d)
    check(res[0] == 0, f"list {d}: exit {res[0]} {res[2]}")
    print(res[1])
    e = os.environ.get("SHARDOPT_CKPT_EXPECT")
    if not e:
        return
    c = tool.Checkpoint(d)
    names = sorted(fn for fn in os.listdir(e) if fn.endswith(".npy"))
    check(names, f"SHARDOPT_CKPT_EXPECT={e} holds no .npy files")
    for fn in names:
        tensor, sep, kind = fn[:-4].rpartition("__")
        if not check(sep, f"{fn}: not TENSOR__KIND.npy"):
            continue
        want = np.load(os.path.join(e, fn))
        try:
            got = c.get(tensor, kind)
        except (tool.CheckpointError, tool.UsageError) as err:
            check(False, f"get {tensor} {kind}: {err}")
            continue
        if c.dtype(tensor, kind) == "BF16" and want.dtype != np.uint16:
            got = tool.bf16_to_f32(got)
            want = want.astype(np.float32)
        check(want.size == got.size and (want.shape == got.shape or want.ndim == 1),
              f"{fn}: shape {got.shape}, expected {want.shape}")
        check(want.size == got.size and want.dtype == got.dtype and
              np.array_equal(want.reshape(-1).view(np.uint8), got.reshape(-1).view(np.uint8)),
              f"{fn}: values differ ({got.dtype} vs {want.dtype})")
        print(f"{fn}: ok")
    # The Hugging Face export of the C++ checkpoint: every parameter whole, bytes equal to
    # the `param` values the C++ side dumped.
    out = tempfile.mkdtemp(prefix="shardopt-hf-")
    try:
        res = run("export-hf", d, out)
        check(res[0] == 0, f"export-hf {d}: exit {res[0]} {res[2]}")
        with open(os.path.join(out, "model.safetensors.index.json")) as f:
            idx = json.load(f)
        for fn in names:
            tensor, _, kind = fn[:-4].rpartition("__")
            if kind != "param":
                continue
            want = np.load(os.path.join(e, fn))
            got_dtype, shape, raw = st_raw(os.path.join(out, idx["weight_map"][tensor]), tensor)
            check(raw == want.tobytes(), f"export-hf of the C++ checkpoint: {tensor} ({got_dtype}) differs")
        print("export-hf of the C++ checkpoint: ok")
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main():
    same = os.environ.get("SHARDOPT_CKPT_SAME_AS")
    model = make_model()
    tmp = tempfile.mkdtemp(prefix="shardopt-ckpt-test-")
    try:
        if same:  # only the comparison of two C++ checkpoints (the rest ran already)
            test_same_tensors(os.environ["SHARDOPT_CKPT_DIR"], same)
            return finish()
        if os.environ.get("SHARDOPT_CKPT_ENV_ONLY"):  # only the C++ checkpoint (the rest ran already)
            test_env()
            return finish()
        test_crc()
        test_bf16()
        for world, cuts in ((1, []), (2, [1500]), (3, CUTS3)):
            ck = os.path.join(tmp, f"ckpt-w{world}")
            write_checkpoint(ck, model, world, cuts)
            test_list_verify_get(ck, model, world)
        good = os.path.join(tmp, "ckpt-w3")
        test_cli_get(good, model, tmp)
        test_corruptions(good, model, tmp)
        test_hostile(good, tmp)
        test_export(os.path.join(tmp, "ckpt-w2"), model, tmp)
        test_q8_moments(model, tmp)
        test_env()
        test_muon(tmp)
        nv = make_nvfp4_model()
        for world, cuts in ((1, []), (2, [21]), (3, [9, 52])):  # odd cuts: shared bytes
            ck = os.path.join(tmp, f"nvfp4-w{world}")
            write_checkpoint(ck, nv, world, cuts)
            test_list_verify_get(ck, nv, world)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return finish()


def finish():
    if failures:
        print(f"{len(failures)} checks failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
