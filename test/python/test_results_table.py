#!/usr/bin/env python3
"""docs/results.md's measured table is what scripts/plot_results.py generates from the
committed bench/results: a result appended without regenerating the table fails here.
Also checks the generation itself on made-up results: the last line of a (bench,
config, device) is its current row, and rows outside the HEADLINE choice stay out."""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "plot_results.py")


def load_module():
    spec = importlib.util.spec_from_file_location("plot_results", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    failures = []
    # 1. The committed docs/results.md is current.
    r = subprocess.run([sys.executable, SCRIPT, "check"], capture_output=True, text=True)
    if r.returncode != 0:
        failures.append("docs/results.md's table is stale: " + r.stdout + r.stderr)

    # 2. The generation on made-up results.
    mod = load_module()
    with tempfile.TemporaryDirectory() as d:
        rows = [
            {"bench": "adam_step", "config": "fp32/x", "device": "NVIDIA H100 80GB HBM3", "ours_ms": 20.0,
             "peer": "p", "peer_ms": 30.0, "ratio_vs_peer": 1.5, "date": "2026-01-01"},
            {"bench": "adam_step", "config": "fp32/x", "device": "NVIDIA H200", "ours_ms": 12.0, "date": "2026-01-02"},
            {"bench": "adam_step", "config": "fp32/x", "device": "NVIDIA H100 80GB HBM3", "ours_ms": 10.0,
             "peer": "p", "peer_ms": 30.0, "ratio_vs_peer": 3.0, "date": "2026-01-03"},
            {"bench": "comm_buckets", "config": "all_gather/bf16/64MiB/n2/registered", "device": "NVIDIA H100",
             "ours_ms": 1.0, "date": "2026-01-03"},
        ]
        with open(os.path.join(d, "a.jsonl"), "w") as f:
            f.write("\n".join(json.dumps(x) for x in rows) + "\n")
        current = mod.load(d)
        table = mod.table(current)
        body = [line for line in table.splitlines() if line.startswith("| fused")]
        if len(body) != 2:
            failures.append(f"expected one row per device (2), got {len(body)}:\n{table}")
        h100 = [line for line in body if "| H100 |" in line]
        if not h100 or "10.0 ms" not in h100[0] or "3.00" not in h100[0] or "2026-01-03" not in h100[0]:
            failures.append(f"the H100 row is not the last measurement:\n{table}")
        if "64MiB" in table:
            failures.append(f"a config outside HEADLINE is in the table:\n{table}")
        text = "intro\n" + mod.BEGIN + "\nold\n" + mod.END + "\nrest\n"
        new = mod.with_section(text, current)
        if not new.startswith("intro\n" + mod.BEGIN) or not new.endswith(mod.END + "\nrest\n") or "old" in new:
            failures.append("the section is not replaced between the markers:\n" + new)
        if mod.with_section(new, current) != new:
            failures.append("regenerating is not idempotent")

    for f in failures:
        print("FAIL:", f)
    print("ok" if not failures else f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
