#!/usr/bin/env python3
"""Self-test of scripts/check_seam.py: builds tiny source trees in a temp directory and
runs the checker on each with --root. Plain Python; exit 0 when every case passes, 1
otherwise.   python3 test/layers/test_check_seam.py"""

import subprocess
import sys
import tempfile
from pathlib import Path

CHECKER = Path(__file__).resolve().parent.parent.parent / "scripts" / "check_seam.py"
SWITCH = "#if SHARDOPT_HAVE_CUDA\nint x;\n#endif\n"

# Inside the seam, in build files the check does not read, and in other file kinds: allowed.
CLEAN = {
    "src/core/check.hpp": SWITCH,
    "src/kernels/adam/adam.cpp": SWITCH,
    "src/kernels/meson.build": "if have_cuda\nendif\n",
    "src/meson.build": "if have_cuda\nendif\n",
    "test/meson.build": "if have_cuda\nendif\n",
    "test/common/notes.md": "SHARDOPT_HAVE_CUDA\n",
    "src/optimizer/step.cpp": "int step();\n",
}
# Each case: one more file that must be reported, by path and line.
CASES = {
    "src/optimizer/kernel_preload.cpp": ("int a;\n" + SWITCH, 2),
    "include/shardopt/backend.hpp": (SWITCH, 1),
    "examples/trainer/cuda_ops.cu": (SWITCH, 1),
    "test/common/device_util.hpp": ("// x\n\n" + SWITCH, 3),
    "test/gpu/test_adam.cpp": (SWITCH, 1),
    "bench/bench_trace.cpp": ("int t;\n" + SWITCH, 2),
    "src/optimizer/meson.build": ("x = 1\nif have_cuda\nendif\n", 2),
}


def run(files: dict) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        for rel, text in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
        return subprocess.run([sys.executable, str(CHECKER), "--root", str(root)],
                              capture_output=True, text=True, check=False)


def main() -> int:
    failures = []
    clean = run(CLEAN)
    if clean.returncode != 0 or "seam: ok" not in clean.stdout:
        failures.append(f"clean tree refused: {clean.stdout}{clean.stderr}")
    for rel, (text, line) in CASES.items():
        r = run({**CLEAN, rel: text})
        if r.returncode != 1 or f"{rel}:{line}:" not in r.stdout or "seam: 1 violations" not in r.stdout:
            failures.append(f"{rel}: expected one violation at line {line}, got rc {r.returncode}: {r.stdout}")
    for f in failures:
        print("FAIL", f)
    print(f"check_seam self-test: {1 + len(CASES) - len(failures)} of {1 + len(CASES)} cases pass")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
