#!/usr/bin/env python3
"""The Host/CUDA seam check: only src/core and src/kernels switch on the build's CUDA.

Fails (exit 1) on
  * a file under src/, include/, examples/, test/ or bench/ outside src/core/ and
    src/kernels/ that names SHARDOPT_HAVE_CUDA (the preprocessor switch of
    shardopt_config.h; the tests' CUDA calls go through test/common/cuda_ops.hpp and
    grad_stream.hpp, the benchmarks' through bench/common/cuda_bench.hpp and their
    *_cuda.cpp device halves);
  * a meson.build under src/ outside src/kernels/ (src/meson.build, which gathers the
    lists, aside) that adds CUDA sources or tests have_cuda (the same switch in the build).
A layer above the seam that needs a CUDA-only thing calls a function the seam defines in
both builds. Prints each violation as `path:line: ...`, then `seam: N violations` or
`seam: ok (F files)`. Options: --root DIR (default: the repository root). Python 3 only.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

SEAM = ("src/core/", "src/kernels/")
SOURCES = {".hpp", ".cpp", ".cu", ".cuh", ".h", ".hh", ".cc", ".cxx", ".inl", ".ipp"}
MESON_SWITCHES = ("have_cuda", "shardopt_cuda_sources")


def violations(root: Path) -> tuple[list[str], int]:
    found: list[str] = []
    files = 0
    for top in ("src", "include", "examples", "test", "bench"):
        for path in sorted((root / top).rglob("*")):
            rel = path.relative_to(root).as_posix()
            if not path.is_file() or rel.startswith(SEAM):
                continue
            is_meson = path.name == "meson.build" and top == "src" and rel != "src/meson.build"
            if path.suffix not in SOURCES and not is_meson:
                continue
            files += 1
            words = MESON_SWITCHES if is_meson else ("SHARDOPT_HAVE_CUDA",)
            for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                for w in words:
                    if w in line:
                        found.append(f"{rel}:{n}: {w} outside src/core and src/kernels (use a function of the seam)")
    return found, files


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    args = parser.parse_args()
    found, files = violations(args.root)
    for v in found:
        print(v)
    print(f"seam: {len(found)} violations" if found else f"seam: ok ({files} files)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
