#!/usr/bin/env python3
"""scale_model.py - a calibrated model of shardopt's optimizer step and memory per rank.

It predicts, per rank, what one optimizer step costs (gradient reduce-scatter, Adam on
the shard, parameter all-gather, the part of the gather that overlaps Adam, the exposed
communication) and the bytes a rank holds, from the model's shape, the world size, GPUs
per node, intra- and inter-node bandwidth and latency, dtypes, the parameter format,
the bucket size and the HSDP shape (shard group x replicas).

Calibration (committed rows of bench/results, chosen by device):
  comm_buckets.jsonl   rows "<op>/bf16/<size>/n<N>/registered/grouped": the bus
                       bandwidth of reduce-scatter and all-gather from the 1024 MiB row
                       (15 grouped buckets: the per-call cost of grouped calls is inside
                       it, so calls add only the ring's per-hop latency, an input).
  adam_step.jsonl      row "bf16grad-bf16param/1.5B/147": Adam's bytes per second
                       (28 bytes an element). A device without a row (H200) takes it
                       from the Adam component (adam_shard_ms) of its dist_adam_step rows.
  dist_adam_step.jsonl rows "bf16p-bf16g/1.5B/147/n<N>", their measured components only:
                       the overlap factor (how much of min(Adam, gather) the gather
                       pipeline hides: (unpipelined_ms - ours_ms) / min(adam, gather)),
                       the 1-rank local reduce pass (reduce_scatter_ms at n1) and the
                       fixed per-step cost (norm, clip, scalars: unpipelined_ms less its
                       reduce, gather and Adam; the 1-rank rows apart). Their totals (ours_ms) are what the model
                       must reproduce (the validation table); no total is fitted.
  mxfp8_quantize.jsonl row "shard-w4/batched": MXFP8 quantize rate (elements per second)
                       and copy_gbps (the device's copy bandwidth).

  python3 tools/scale_model.py              # the validation table and the projections
  python3 tools/scale_model.py --png docs/img/scale_model.png
  python3 tools/scale_model.py --check      # exit 1 if a validation row is off by > 10%

numpy only; matplotlib only for --png.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
ADAM_BYTES = 28          # bytes Adam moves an element: grad, param, master, 2 moments
MXFP8_BYTES = 2.0 + 2.0 / 32  # rowwise + columnwise e4m3 and their e8m0 scales
MXFP8_ONE_PLANE = 1.0 + 1.0 / 32  # one plane (what an FSDP pass gathers)
FSDP_MXFP8_BYTES = 2.125     # FSDP's MXFP8 shard storage an element (measured, see step())
MB = 1 << 20


def load(name):
    with open(os.path.join(RESULTS, name + ".jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def short(device):
    return "H200" if "H200" in device else "H100"


@dataclasses.dataclass
class Device:
    """Measured costs of one GPU kind (seconds, bytes per second)."""
    name: str
    rs_busbw: float      # reduce-scatter bus bandwidth inside a node
    ag_busbw: float      # all-gather bus bandwidth inside a node
    adam_bw: float       # Adam bytes per second
    local_reduce: float  # seconds per gradient byte of the 1-rank reduce (a local pass)
    fixed: float         # seconds of a 1-rank step that are neither reduce nor Adam
    copy_bw: float       # device copy bandwidth (read + write counted)
    quant_rate: float    # MXFP8 shard quantize, elements per second


@dataclasses.dataclass
class Calibration:
    devices: dict
    overlap: float       # fraction of min(Adam, gather) hidden by the gather pipeline
    fixed_multi: float   # seconds of a multi-rank step that are neither comm nor Adam
    rows: list           # the dist_adam_step rows to reproduce


def calibrate() -> Calibration:
    comm = load("comm_buckets")
    adam = load("adam_step")
    quant = load("mxfp8_quantize")
    dist = load("dist_adam_step")
    rows = [r for r in dist if r["config"].startswith("bf16p-bf16g/") and "reduce_scatter_ms" in r]
    ranks = lambda r: int(r["config"].rsplit("n", 1)[1])  # noqa: E731
    adam_rate = {short(r["device"]): ADAM_BYTES * r["params"] / (r["ours_ms"] * 1e-3)
                 for r in adam if r["config"] == "bf16grad-bf16param/1.5B/147"}
    copy = {short(r["device"]): r["copy_gbps"] * 1e9 for r in quant if r["config"] == "shard-w4/batched"}
    qrate = {short(r["device"]): r["elements"] / (r["ours_ms"] * 1e-3) for r in quant if r["config"] == "shard-w4/batched"}
    devices = {}
    for dev in sorted({short(r["device"]) for r in comm}):
        bw = {}
        for op in ("reduce_scatter", "all_gather"):
            big = next(r for r in comm if short(r["device"]) == dev and r["config"].startswith(op + "/bf16/1024MiB/")
                       and r["config"].endswith("/registered/grouped"))
            bw[op] = big["busbw_GBps"] * 1e9
        mine = [r for r in rows if short(r["device"]) == dev]
        adam_bw = adam_rate.get(dev) or float(np.mean([ADAM_BYTES * r["params"] / ranks(r) / (r["adam_shard_ms"] * 1e-3)
                                                       for r in mine]))
        one = next(r for r in mine if ranks(r) == 1)
        local = one["reduce_scatter_ms"] * 1e-3 / (2 * one["params"])
        fixed = (one["unpipelined_ms"] - one["reduce_scatter_ms"] - one["adam_shard_ms"]) * 1e-3
        devices[dev] = Device(dev, bw["reduce_scatter"], bw["all_gather"], adam_bw, local, fixed, copy[dev], qrate[dev])
    # Overlap: the pipelined step saves (unpipelined - ours) of min(Adam, gather).
    fractions = [(r["unpipelined_ms"] - r["ours_ms"]) / min(r["adam_shard_ms"], r["all_gather_ms"])
                 for r in rows if ranks(r) > 1]
    overlap = float(np.clip(np.mean(fractions), 0.0, 1.0))
    fixed_multi = float(np.mean([(r["unpipelined_ms"] - r["reduce_scatter_ms"] - r["all_gather_ms"] - r["adam_shard_ms"])
                                 * 1e-3 for r in rows if ranks(r) > 1]))
    return Calibration(devices, overlap, fixed_multi, rows)


@dataclasses.dataclass
class Cluster:
    """Where the job runs. Inter-node figures are per GPU (one NIC each)."""
    device: Device
    gpus_per_node: int = 8
    intra_bw: float | None = None     # NVLink bus bandwidth; None = the calibrated one
    inter_bw: float = 400e9 / 8       # 400 Gb/s InfiniBand per GPU
    intra_hop: float = 0.0            # latency of one ring step inside a node: inside the
                                      # calibrated bandwidth (grouped buckets of ~67 MiB)
    inter_hop: float = 10e-6          # latency of one ring step across nodes


@dataclasses.dataclass
class Job:
    params: float                # elements
    world: int
    shard: int = 0               # shard group size (0 = world: plain sharding)
    front: str = "dist_adam"     # dist_adam (ZeRO-1/2) or fsdp (ZeRO-3 / HSDP)
    param_format: str = "bf16"   # bf16 or mxfp8
    grad_bytes: int = 2
    bucket: float = 0            # bucket threshold in elements (0 = the library's default)
    unit_params: float = 0       # FSDP: elements of the largest unit (a layer)


def default_bucket(world):
    return max(40e6, 1e6 * world)


def ring(cl: Cluster, ranks: int, nbytes: float, calls: float, busbw_intra: float):
    """Seconds of a ring collective moving nbytes (the full buffer) over `ranks` ranks in
    `calls` calls: (ranks - 1) ring steps of latency per call, and the bytes at the
    slowest link's bus bandwidth."""
    if ranks <= 1:
        return 0.0
    crosses = ranks > cl.gpus_per_node
    bw = min(busbw_intra, cl.inter_bw) if crosses else busbw_intra
    hop = cl.inter_hop if crosses else cl.intra_hop
    return calls * (ranks - 1) * hop + nbytes * (ranks - 1) / ranks / bw


def step(cl: Cluster, cal: Calibration, job: Job) -> dict:
    """Predicted seconds and bytes per rank of one optimizer step (and, for FSDP, the
    parameter gathers of one forward + backward)."""
    d = cl.device
    s = job.shard or job.world
    replicas = job.world // s
    P = job.params
    bucket = job.bucket or default_bucket(job.world)
    if job.front == "fsdp" and job.unit_params:
        bucket = min(bucket, job.unit_params)  # a bucket never spans two units
    calls = math.ceil(P / bucket)
    rs_bw = cl.intra_bw or d.rs_busbw
    ag_bw = cl.intra_bw or d.ag_busbw
    gbytes = P * job.grad_bytes
    if s == 1:
        rs = gbytes * d.local_reduce   # one rank: the reduce is a local pass
    else:
        rs = ring(cl, s, gbytes, calls, rs_bw)
    # HSDP: the shard's gradient all-reduced across replicas (one rank per node apart).
    ar = 0.0
    if replicas > 1:
        far = Cluster(cl.device, 1, cl.intra_bw, cl.inter_bw, cl.intra_hop, cl.inter_hop)
        ar = 2 * ring(far, replicas, gbytes / s, calls, rs_bw)
    adam = ADAM_BYTES * P / s / d.adam_bw
    quant = 0.0
    if job.front == "dist_adam":
        gather_bytes = P * (MXFP8_BYTES if job.param_format == "mxfp8" else 2.0)
        passes = 1
    else:  # FSDP gathers every unit twice (forward and backward), one MXFP8 plane a pass
        gather_bytes = P * (MXFP8_ONE_PLANE if job.param_format == "mxfp8" else 2.0)
        passes = 2
    ag = passes * ring(cl, s, gather_bytes, calls, ag_bw)
    if job.param_format == "mxfp8":
        # quantize the shard, the e8m0 Max all-reduce of the scales (1/16 byte an element,
        # over the shard group), and the landing copy of the gathered planes.
        quant = P / s / d.quant_rate
        quant += 2 * ring(cl, s, P / 16, calls, rs_bw)
        if job.front == "dist_adam":
            quant += 2 * P * MXFP8_BYTES / d.copy_bw
    # The gather pipeline of distributed Adam overlaps its gathers with Adam; FSDP's gathers
    # run in the next forward and backward (hidden only behind compute, not modelled here).
    hidden = cal.overlap * min(adam, ag) if job.front == "dist_adam" else 0.0
    total = (d.fixed if job.world == 1 else cal.fixed_multi) + rs + ar + adam + quant + ag - hidden
    exposed = rs + ar + ag - hidden
    # Memory per rank (bytes).
    shard_state = 12 * P / s               # fp32 master + two fp32 moments
    if job.front == "dist_adam":
        params_b = P * (MXFP8_BYTES if job.param_format == "mxfp8" else 2.0)
        mem = params_b + gbytes + shard_state
    else:
        if job.param_format == "mxfp8":
            # no bf16 shard: the MXFP8 planes of the shard (with the scales' tile padding,
            # fsdp_iteration's mxfp8 row: 2.125 bytes an element) and a pool of one plane.
            mem = job.grad_bytes * P / s + shard_state + FSDP_MXFP8_BYTES * P / s + 3 * job.unit_params
        else:
            pool = 6 * job.unit_params      # two gather slots + one gradient slot, bf16
            mem = (2.0 + job.grad_bytes) * P / s + shard_state + pool
    return dict(total=total, rs=rs + ar, ag=ag, adam=adam, quant=quant, hidden=hidden, exposed=exposed,
                mem=mem, bucket=bucket, shard=s, replicas=replicas)


def validation(cal: Calibration):
    """Each measured bf16 dist_adam_step row against the model on its device and world."""
    out = []
    for r in cal.rows:
        n = int(r["config"].rsplit("n", 1)[1])
        dev = cal.devices[short(r["device"])]
        cl = Cluster(dev, gpus_per_node=8)
        p = step(cl, cal, Job(params=r["params"], world=n))
        out.append((r["config"], short(r["device"]), n, r["ours_ms"], p["total"] * 1e3))
    return out


# Llama-like shapes: hidden, layers, MLP width, k/v width, vocabulary.
MODELS = {
    "8B": (4096, 32, 14336, 1024, 128256),
    "70B": (8192, 80, 28672, 1024, 128256),
}


def model_params(shape):
    h, layers, mlp, kv, vocab = shape
    layer = 2 * h + 2 * h * h + 2 * kv * h + 3 * mlp * h
    return 2 * vocab * h + h + layers * layer, layer


WORLDS = [8 * 2 ** k for k in range(12)]  # 8 ... 16384
BUCKETS = [b * 1e6 for b in (10, 25, 50, 100, 200, 400, 800, 1600)]


GPU_MEMORY = 80 * 2 ** 30  # H100: a shape that needs more does not fit


def best(cl, cal, P, unit, world, front, fmt):
    """The fastest (bucket, shard group) for a job among those that fit in GPU_MEMORY:
    shard groups of a whole node or of whole nodes. None when none fits."""
    shards = [s for s in [2 ** k for k in range(15)] if s <= world and world % s == 0 and s >= min(8, world)]
    results = []
    for s in shards:
        for b in reversed(BUCKETS):  # on a tie, the larger bucket (fewer calls)
            p = step(cl, cal, Job(P, world, s, front, fmt, 2, b, unit))
            if p["mem"] <= GPU_MEMORY:
                results.append((p["total"], s, b, p))
    return min(results, key=lambda x: x[0]) if results else None


def crossover(cl, cal, P, unit, front):
    """The smallest shard group (1 ... 8 GPUs of a node, then whole nodes) at which MXFP8
    parameters make the step faster than bf16 ones, or None."""
    for s in [2 ** k for k in range(15)]:
        bf = step(cl, cal, Job(P, s, s, front, "bf16", 2, 0, unit))["total"]
        mx = step(cl, cal, Job(P, s, s, front, "mxfp8", 2, 0, unit))["total"]
        if mx < bf:
            return s
    return None


def projections(cal, device="H100"):
    cl = Cluster(cal.devices[device])
    rows = []
    for name, shape in MODELS.items():
        P, unit = model_params(shape)
        for w in WORLDS:
            bf = best(cl, cal, P, unit, w, "fsdp", "bf16")
            mx = best(cl, cal, P, unit, w, "fsdp", "mxfp8")
            rows.append(dict(model=name, world=w, bf16=bf, mxfp8=mx))
    return rows


def print_validation(cal, table):
    print("Calibration: overlap factor %.3f, fixed cost of a multi-rank step %.2f ms" %
          (cal.overlap, cal.fixed_multi * 1e3))
    for d in cal.devices.values():
        print("  %s: reduce-scatter %.0f GB/s, all-gather %.0f GB/s (bus), Adam %.0f GB/s, 1-rank reduce %.0f GB/s, "
              "fixed %.2f ms, copy %.0f GB/s, MXFP8 quantize %.0f Gelem/s" %
              (d.name, d.rs_busbw / 1e9, d.ag_busbw / 1e9, d.adam_bw / 1e9, 1 / d.local_reduce / 1e9,
               d.fixed * 1e3, d.copy_bw / 1e9, d.quant_rate / 1e9))
    print()
    print("| bench row (dist_adam_step) | device | ranks | measured ms | model ms | error |")
    print("|---|---|---|---|---|---|")
    for cfg, dev, n, meas, pred in table:
        print("| %s | %s | %d | %.2f | %.2f | %+.1f%% |" % (cfg, dev, n, meas, pred, 100 * (pred - meas) / meas))


def print_projections(cal, rows, device="H100"):
    print()
    print("Projection: FSDP/HSDP on %s (%d GiB), NVLink nodes of 8, 400 Gb/s InfiniBand per GPU; the fastest"
          " shard group and bucket that fit" % (device, GPU_MEMORY // 2 ** 30))
    print("| model | GPUs | step ms (bf16) | exposed comm ms | memory GiB/rank | shard x replicas | bucket (M elements) | "
          "step ms (MXFP8) | MXFP8 pays |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["bf16"] is None:
            print("| %s | %d | does not fit | | | | | | |" % (r["model"], r["world"]))
            continue
        t, s, b, p = r["bf16"]
        tm = r["mxfp8"][0] if r["mxfp8"] else float("inf")
        print("| %s | %d | %.1f | %.1f | %.1f | %d x %d | %d | %.1f | %s |" %
              (r["model"], r["world"], t * 1e3, p["exposed"] * 1e3, p["mem"] / 2 ** 30, s, r["world"] // s, p["bucket"] / 1e6,
               tm * 1e3, "yes" if tm < t else "no"))
    cl = Cluster(cal.devices[device])
    for name, shape in MODELS.items():
        P, unit = model_params(shape)
        for front, why in (("fsdp", "one plane gathered a pass"), ("dist_adam", "both planes gathered")):
            s = crossover(cl, cal, P, unit, front)
            print("MXFP8 crossover, %s, %s (%s): %s" % (name, front, why,
                  ("from a shard group of %d GPUs" % s) if s else "never (up to 16384 GPUs)"))


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, color in (("8B", "tab:blue"), ("70B", "tab:red")):
        sel = [r for r in rows if r["model"] == name and r["bf16"] and r["mxfp8"]]
        w = [r["world"] for r in sel]
        a.plot(w, [r["bf16"][0] * 1e3 for r in sel], "-o", color=color, label=name + " bf16 params")
        a.plot(w, [r["mxfp8"][0] * 1e3 for r in sel], "--s", color=color, label=name + " MXFP8 params")
        a.plot(w, [r["bf16"][3]["exposed"] * 1e3 for r in sel], ":", color=color, label=name + " exposed comm (bf16)")
        b.plot(w, [r["bf16"][3]["mem"] / 2 ** 30 for r in sel], "-o", color=color, label=name)
    for ax in (a, b):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GPUs (nodes of 8, 400 Gb/s IB per GPU)")
        ax.grid(True, which="both", alpha=0.3)
    a.set_yscale("log")
    a.set_ylabel("optimizer step + gathers per rank (ms)")
    a.set_title("Predicted step time (best shard group, bucket)")
    a.legend(fontsize=7)
    b.set_yscale("log")
    b.set_ylabel("GiB per rank")
    b.set_title("Predicted memory per rank (FSDP/HSDP)")
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--png", help="write the projection curves to this PNG (needs matplotlib)")
    ap.add_argument("--check", action="store_true", help="exit 1 if a validation row is off by more than 10%%")
    ap.add_argument("--device", default="H100", help="device of the projections (H100 or H200)")
    args = ap.parse_args(argv)
    cal = calibrate()
    table = validation(cal)
    print_validation(cal, table)
    rows = projections(cal, args.device)
    print_projections(cal, rows, args.device)
    if args.png:
        plot(rows, args.png)
        print("wrote", args.png)
    worst = max(abs(p - m) / m for _, _, _, m, p in table)
    if args.check and worst > 0.10:
        print("validation: worst error %.1f%% > 10%%" % (100 * worst))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
