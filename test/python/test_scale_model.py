#!/usr/bin/env python3
"""Tests of tools/scale_model.py (issue 33). A plain script: exit 0 pass, 1 fail, 77 skip
(numpy missing).

* Validation: the model reproduces every measured bf16 optimizer step of
  bench/results/dist_adam_step.jsonl (1, 2 and 4 ranks, H100 and H200) within 10%.
* Memory: the model's bytes per rank equal the benchmarks' own memory reports
  (dist_adam_step mem_total_bytes, fsdp_iteration memory_per_rank_bytes) within 1%,
  and the hand formula (2 + g) P + 12 P / d exactly.
* Costs written by hand from the calibration: Adam of a shard is 28 P / d / bandwidth,
  a ring reduce-scatter inside a node is (d - 1) / d of the bytes at the bus bandwidth,
  and across nodes the per-GPU InfiniBand bandwidth and the per-hop latency bound it.
"""
import json
import math
import os
import sys

try:
    import numpy  # noqa: F401
except ImportError as e:
    print(f"SKIP: {e}")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import scale_model as sm  # noqa: E402

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def first_of_each_key(pairs):  # some rows repeat a key ("params": a count and a dtype, in either order)
    out = {}
    for k, v in pairs:
        if k not in out or (not isinstance(out[k], (int, float)) and isinstance(v, (int, float))):
            out[k] = v  # the first value, or the first number where a text came first
    return out


def rows(name):
    with open(os.path.join(ROOT, "bench", "results", name + ".jsonl")) as f:
        return [json.loads(line, object_pairs_hook=first_of_each_key) for line in f if line.strip()]


cal = sm.calibrate()
table = sm.validation(cal)
check(len(table) >= 5, "at least the 1- and 2-rank rows of both devices are validated (%d rows)" % len(table))
check({n for _, _, n, _, _ in table} >= {1, 2}, "1- and 2-rank rows present")
for cfg, dev, n, meas, pred in table:
    err = abs(pred - meas) / meas
    check(err <= 0.10, "%s on %s: model %.2f ms vs measured %.2f ms (%.1f%%)" % (cfg, dev, pred, meas, 100 * err))

# Memory against the benchmarks' reports and the hand formula.
for r in rows("dist_adam_step"):
    if not r["config"].startswith("bf16p-bf16g/"):
        continue
    n = int(r["config"].rsplit("n", 1)[1])
    P = r["params"]
    p = sm.step(sm.Cluster(cal.devices[sm.short(r["device"])]), cal, sm.Job(P, n))
    check(abs(p["mem"] - r["mem_total_bytes"]) / r["mem_total_bytes"] < 0.01,
          "dist_adam memory %s %s: %.4g vs reported %.4g" % (r["config"], sm.short(r["device"]), p["mem"],
                                                             r["mem_total_bytes"]))
    check(p["mem"] == 4 * P + 12 * P / n, "dist_adam memory is (2 + 2) P + 12 P / d at d = %d" % n)
for r in rows("fsdp_iteration"):
    if "memory_per_rank_bytes" not in r:
        continue
    n = int(r["config"].split("/")[2][1:])
    units = int(r["config"].split("x")[0])
    P = r["param_count"] if "param_count" in r else r["params"]  # "params" in rows before 2026-11-27
    fmt = "mxfp8" if r["config"].endswith("/mxfp8") else "bf16"
    p = sm.step(sm.Cluster(cal.devices[sm.short(r["device"])]), cal,
                sm.Job(P, n, front="fsdp", param_format=fmt, unit_params=P / units))
    check(abs(p["mem"] - r["memory_per_rank_bytes"]) / r["memory_per_rank_bytes"] < 0.01,
          "fsdp memory %s: %.4g vs reported %.4g" % (r["config"], p["mem"], r["memory_per_rank_bytes"]))

# Costs by hand.
dev = cal.devices["H100"]
P = 8e9
for d in (8, 64):
    p = sm.step(sm.Cluster(dev), cal, sm.Job(P, d, shard=min(d, 8)))
    s = min(d, 8)
    check(math.isclose(p["adam"], 28 * P / s / dev.adam_bw, rel_tol=1e-12), "Adam of the shard at d = %d" % d)
intra = sm.ring(sm.Cluster(dev), 8, 1e9, 10, dev.rs_busbw)
check(math.isclose(intra, 1e9 * 7 / 8 / dev.rs_busbw, rel_tol=1e-12), "reduce-scatter inside a node: bytes at bus bandwidth")
cl = sm.Cluster(dev)
cross = sm.ring(cl, 64, 1e9, 10, dev.rs_busbw)
check(math.isclose(cross, 10 * 63 * cl.inter_hop + 1e9 * 63 / 64 / cl.inter_bw, rel_tol=1e-12),
      "reduce-scatter across nodes: IB bandwidth per GPU and per-hop latency")
check(sm.model_params(sm.MODELS["70B"])[0] == 70_553_706_496, "the 70B shape has 70,553,706,496 elements (as the C++ layout test)")

print("%d failures" % len(failures))
sys.exit(1 if failures else 0)
