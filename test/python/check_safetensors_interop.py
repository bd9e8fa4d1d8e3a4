#!/usr/bin/env python3
"""Reads the file that test_safetensors.cpp (InteropFileForPython, write_interop_file)
writes, with Python's safetensors, and checks every tensor and the metadata.

Usage: check_safetensors_interop.py FILE
Exit 0 pass, 1 fail, 77 when numpy or safetensors is not importable.
"""
import json
import struct
import sys

try:
    import numpy as np
    from safetensors import safe_open
except ImportError as e:  # pragma: no cover
    print(f"skip: {e}")
    sys.exit(77)


def crc32c(data: bytes) -> int:
    table = []
    for b in range(256):
        c = b
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    crc = 0xFFFFFFFF
    for b in data:
        crc = (crc >> 8) ^ table[(crc ^ b) & 0xFF]
    return crc ^ 0xFFFFFFFF


def expected():
    f32 = (np.arange(12, dtype=np.float32) * 0.5).reshape(3, 4)
    bf16_bits = ((np.arange(8, dtype=np.float32) - 3).view(np.uint32) >> 16).astype(np.uint16)
    return {
        "f32": f32,
        "bf16": bf16_bits,  # compared as raw bits: numpy has no bfloat16
        "f16": np.arange(6, dtype=np.float16).reshape(2, 3),
        "u8": ((7 * np.arange(256) + 3) % 256).astype(np.uint8).reshape(16, 16),
        "i64": np.array([-1, 1 << 40, 9007199254740993], dtype=np.int64),
        "f64_scalar": np.array(3.25, dtype=np.float64),
        "f32_empty": np.zeros((2, 0), dtype=np.float32),
        "layers.0.mlp.up/master@4096": 4096 + np.arange(5, dtype=np.float32),
        "ünï/名前": np.array([1, 2, 3], dtype=np.uint8),
    }


def main() -> int:
    path = sys.argv[1]
    failures = []
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    if (8 + n) % 8 != 0:
        failures.append(f"data section starts at {8 + n}, not a multiple of 8")
    data = raw[8 + n :]

    meta_want = {
        "format": "shardopt-checkpoint",
        "format_version": "1",
        "rank": "0",
        "world_size": "1",
        "note": 'quote " backslash \\ newline \n é',
        "checksum": f"crc32c:{crc32c(data):08x}",
    }
    want = expected()
    with safe_open(path, "np") as f:
        meta = f.metadata()
        if meta != meta_want:
            failures.append(f"metadata {meta!r} != {meta_want!r}")
        keys = set(f.keys())
        if keys != set(want):
            failures.append(f"tensor names {sorted(keys)} != {sorted(want)}")
        for name, w in want.items():
            if name not in keys:
                continue
            if name == "bf16":
                info = header[name]
                if info["dtype"] != "BF16" or info["shape"] != [8]:
                    failures.append(f"bf16 entry {info}")
                b, e = info["data_offsets"]
                got = np.frombuffer(data[b:e], dtype="<u2")
                try:  # newer safetensors may return bfloat16 through ml_dtypes
                    f.get_tensor(name)
                except Exception:
                    pass
            else:
                got = f.get_tensor(name)
                if got.dtype != w.dtype:
                    failures.append(f"{name}: dtype {got.dtype} != {w.dtype}")
            if got.shape != w.shape or not np.array_equal(got, w):
                failures.append(f"{name}: {got!r} != {w!r}")
    for msg in failures:
        print("FAIL:", msg)
    if not failures:
        print(f"ok: {len(want)} tensors and the metadata (checksum {meta_want['checksum']}) read back")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
