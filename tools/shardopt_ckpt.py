#!/usr/bin/env python3
"""Read, check and export shardopt checkpoints from Python (numpy + safetensors only).

A shardopt checkpoint (docs/checkpoints.md) is a directory of per-rank safetensors files
holding 1-D slices named ``MODEL_TENSOR/KIND@OFFSET`` of flattened model tensors, plus an
``index.json`` written last. This tool is both a command-line program and a module.

Commands::

    shardopt_ckpt.py list DIR
        step, world size, files, and every model tensor with its shape, param dtype,
        format (native / mxfp8 / nvfp4), group and the kinds that are stored (AdamW
        tensors: exp_avg, exp_avg_sq; Muon tensors: muon_momentum).
    shardopt_ckpt.py verify DIR
        index.json present and well-formed (world_size files, each a plain file name
        inside DIR: no separator, "." or "..", NUL, nor absolute path; never followed
        outside DIR); every file present with the size the index gives; each file's data section matches its CRC-32C in the file's metadata and in
        the index; every slice listed in the index is in its file (and no other tensor
        is); each kind's slices cover its model tensor exactly once; dtypes as documented;
        Muon's momentum only on 2-D tensors, never beside Adam's moments.
        Exit 0 when good, 1 with one line per problem.
    shardopt_ckpt.py get DIR TENSOR KIND [--out FILE.npy] [--as-float32]
        assembles one kind of one model tensor at its full shape (MXFP8 scale kinds at
        their scale shapes [rows, ceil(cols/32)] and [ceil(rows/32), cols]) and prints a
        summary, or saves it as .npy.
    shardopt_ckpt.py export-hf DIR OUT [--kind param|master] [--dtype bf16|f32]
                               [--max-shard-bytes N]
        writes the model parameters as Hugging Face style safetensors:
        OUT/model-00001-of-0000N.safetensors (whole tensors at full shape) and
        OUT/model.safetensors.index.json ({"metadata": {"total_size": ...},
        "weight_map": {name: file}}). Default kind ``param``: the native parameter in its
        stored dtype; MXFP8 tensors (which have no ``param`` kind) and native tensors
        saved without one use ``master`` rounded to bf16 (MXFP8) or to the tensor's
        param dtype, round to nearest even, NaN kept. ``--kind master`` exports the fp32
        masters. ``--dtype`` converts every tensor to bf16 or f32. Default shard size
        5,000,000,000 bytes (a tensor larger than that gets a file of its own).

Exit status: 0 success, 1 a bad or incomplete checkpoint (one ``error:`` line, never a
traceback), 2 a usage error (unknown command, tensor or kind).

BF16: numpy has no bfloat16 and safetensors' numpy loader refuses BF16 tensors
(``TypeError: data type 'bfloat16' not understood``), so BF16 slices are read from the raw
bytes through the header's offsets and returned as uint16 bit patterns
(``get --as-float32`` / ``bf16_to_f32`` widen them to float32 exactly). Other dtypes are
read with ``safetensors.safe_open(..., framework="np")``. The export writes safetensors
files itself (8-byte little-endian header length, JSON header, data), so BF16 tensors go
out with dtype "BF16" and load with ``safetensors.torch.load_file``.

CRC-32C (Castagnoli, reflected, init and final xor 0xFFFFFFFF) is computed here: byte
tables (slicing-by-4) run over many lanes of the data at once with numpy, the lanes joined by
the CRC's linearity (the register shifted over n zero bytes is a linear map); about
100 MB/s.

Module use::

    import shardopt_ckpt as sc
    ck = sc.Checkpoint("ckpt/step-1000")
    ck.step, ck.world_size, list(ck.tensors)
    w = ck.get("layers.0.mlp.up", "master")           # float32, full shape
    m = ck.get("layers.0.mlp.up", "exp_avg", as_float32=True)
    problems = sc.verify("ckpt/step-1000")             # [] when good
    sc.export_hf("ckpt/step-1000", "hf-out")
"""

import argparse
import json
import math
import os
import re
import struct
import sys
from functools import lru_cache

try:
    import numpy as np
except ImportError:  # pragma: no cover - reported by main()
    np = None
try:
    import safetensors
    from safetensors import safe_open
except ImportError:  # pragma: no cover - reported by main()
    safetensors = None
    safe_open = None

FORMAT = "shardopt-checkpoint"
FORMAT_VERSION = 1
INDEX_NAME = "index.json"
NO_INDEX = "incomplete checkpoint: no index.json (a save did not finish)"

# kind -> safetensors dtypes allowed in the file (docs/checkpoints.md, "Names").
KIND_DTYPES = {
    "master": ("F32",),
    "exp_avg": ("F32", "BF16"),
    "exp_avg_sq": ("F32", "BF16"),
    "param": ("F32", "BF16", "F16"),
    "mxfp8_row_data": ("U8",),
    "mxfp8_col_data": ("U8",),
    "mxfp8_row_scale": ("U8",),
    "mxfp8_col_scale": ("U8",),
    "nvfp4_data": ("U8",),
    "nvfp4_scale": ("U8",),
    "nvfp4_amax": ("F32",),
    "muon_momentum": ("F32",),
}
# Kinds of a tensor updated by AdamW, and by Muon (index.json's tensors[...]["algorithm"]).
ADAM_KINDS = ("exp_avg", "exp_avg_sq")
MUON_KINDS = ("muon_momentum",)
KINDS = tuple(KIND_DTYPES)
MXFP8_BLOCK = 32
NVFP4_BLOCK = 16

# safetensors dtype -> (numpy dtype string, bytes per element). BF16 is held as uint16 bits.
DTYPES = {
    "F64": ("<f8", 8), "F32": ("<f4", 4), "F16": ("<f2", 2), "BF16": ("<u2", 2),
    "I64": ("<i8", 8), "I32": ("<i4", 4), "I16": ("<i2", 2), "I8": ("i1", 1),
    "U64": ("<u8", 8), "U32": ("<u4", 4), "U16": ("<u2", 2), "U8": ("u1", 1),
    "BOOL": ("?", 1),
}
SHORT_DTYPE = {"f32": "F32", "bf16": "BF16", "f16": "F16"}
# The file dtype of the moments per options.moment_dtype: 8-bit block moments (q8_block)
# are saved decoded, as F32 (docs/checkpoints.md).
MOMENT_FILE_DTYPE = dict(SHORT_DTYPE, q8_block="F32")
HF_DEFAULT_SHARD_BYTES = 5_000_000_000


class CheckpointError(Exception):
    """A bad or incomplete checkpoint (exit status 1)."""


class UsageError(Exception):
    """A request the checkpoint cannot answer: unknown tensor or kind (exit status 2)."""


# --------------------------------------------------------------------------------------
# CRC-32C
# --------------------------------------------------------------------------------------

_POLY = 0x82F63B78  # Castagnoli, reflected


def _make_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (_POLY if c & 1 else 0)
        table.append(c)
    return table


_TABLE = _make_table()
_TABLES_NP = None  # numpy slicing-by-4 tables, made on first use


def _gf2_apply(mat, x):
    r = 0
    i = 0
    while x:
        if x & 1:
            r ^= mat[i]
        x >>= 1
        i += 1
    return r


@lru_cache(maxsize=64)
def _zeros_op(n):
    """Byte tables of the linear map 'register -> register after n zero bytes'."""
    one = [((1 << i) >> 8) ^ _TABLE[(1 << i) & 0xFF] for i in range(32)]
    result = [1 << i for i in range(32)]
    base = one
    while n:
        if n & 1:
            result = [_gf2_apply(base, col) for col in result]
        n >>= 1
        if n:
            base = [_gf2_apply(base, col) for col in base]
    return tuple(tuple(_gf2_apply(result, b << (8 * k)) for b in range(256)) for k in range(4))


def _shift(tables, x):
    t0, t1, t2, t3 = tables
    return t0[x & 0xFF] ^ t1[(x >> 8) & 0xFF] ^ t2[(x >> 16) & 0xFF] ^ t3[x >> 24]


def _update(reg, data):
    """The raw (not inverted) CRC register after feeding bytes-like `data`."""
    global _TABLES_NP
    n = len(data)
    if n == 0:
        return reg
    if n < 8192 or np is None:
        t = _TABLE
        for b in bytes(data):
            reg = t[(reg ^ b) & 0xFF] ^ (reg >> 8)
        return reg
    if _TABLES_NP is None:  # slicing-by-4 tables
        t0 = np.array(_TABLE, dtype=np.uint32)
        ts = [t0]
        for _ in range(3):
            ts.append((ts[-1] >> 8) ^ t0[ts[-1] & 0xFF])
        _TABLES_NP = ts
    t0, t1, t2, t3 = _TABLES_NP
    buf = np.frombuffer(data, dtype=np.uint8)
    # Many lanes of `words` 32-bit words each, all run at once; zeros in front of the
    # first lane change nothing while the register is 0.
    words = max(64, math.isqrt(n // 4))
    lanes = -(-n // (4 * words))
    pad = lanes * 4 * words - n
    if pad:
        buf = np.concatenate([np.zeros(pad, dtype=np.uint8), buf])
    cols = np.ascontiguousarray(buf.view("<u4").reshape(lanes, words).T)
    crc = np.zeros(lanes, dtype=np.uint32)
    idx = np.empty(lanes, dtype=np.uint32)
    for j in range(words):
        np.bitwise_xor(crc, cols[j], out=crc)
        np.bitwise_and(crc, 0xFF, out=idx)
        acc = t3[idx]
        np.right_shift(crc, 8, out=idx)
        np.bitwise_and(idx, 0xFF, out=idx)
        acc ^= t2[idx]
        np.right_shift(crc, 16, out=idx)
        np.bitwise_and(idx, 0xFF, out=idx)
        acc ^= t1[idx]
        np.right_shift(crc, 24, out=idx)
        acc ^= t0[idx]
        crc = acc
    step = _zeros_op(4 * words)
    acc = 0
    for c in crc.tolist():  # join the lanes: shift over one lane, add the next
        acc = _shift(step, acc) ^ c
    return _shift(_zeros_op(n), reg) ^ acc


def crc32c(data, crc=0):
    """CRC-32C of bytes-like `data`, continuing from a previous result `crc`."""
    return _update(crc ^ 0xFFFFFFFF, data) ^ 0xFFFFFFFF


def crc32c_file(path, start=0, block=1 << 25):
    """CRC-32C of a file's bytes from `start` to its end."""
    crc = 0
    with open(path, "rb") as f:
        f.seek(start)
        while True:
            chunk = f.read(block)
            if not chunk:
                return crc
            crc = crc32c(chunk, crc)


# --------------------------------------------------------------------------------------
# bf16
# --------------------------------------------------------------------------------------

def bf16_to_f32(bits):
    """bf16 bit patterns (uint16) -> float32, exactly."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x):
    """float32 -> bf16 bit patterns (uint16), round to nearest even, NaN kept NaN."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded = np.where(nan, (bits >> 16) | 0x40, rounded)
    return rounded.astype(np.uint16)


# --------------------------------------------------------------------------------------
# safetensors files
# --------------------------------------------------------------------------------------

class SafetensorsHeader:
    """A parsed safetensors header: tensors {name: (dtype, shape, begin, end)}, metadata."""

    def __init__(self, path):
        self.path = path
        self.name = os.path.basename(path)
        try:
            self.file_size = os.path.getsize(path)
            with open(path, "rb") as f:
                head = f.read(8)
                if len(head) < 8:
                    raise CheckpointError(f"{self.name}: {len(head)} bytes, too short for a safetensors file")
                (hlen,) = struct.unpack("<Q", head)
                if hlen > self.file_size - 8:
                    raise CheckpointError(
                        f"{self.name}: truncated: header of {hlen} bytes but the file has {self.file_size}")
                raw = f.read(hlen)
        except OSError as e:
            raise CheckpointError(f"{self.name}: cannot read: {e.strerror or e}")
        try:
            header = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise CheckpointError(f"{self.name}: header is not valid JSON ({e})")
        except RecursionError:
            raise CheckpointError(f"{self.name}: header is JSON nested too deep to be a safetensors header")
        if not isinstance(header, dict):
            raise CheckpointError(f"{self.name}: header is not a JSON object")
        meta = header.pop("__metadata__", None) or {}
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            raise CheckpointError(f"{self.name}: __metadata__ is not a string-to-string map")
        self.metadata = meta
        self.data_start = 8 + hlen
        self.tensors = {}
        end_max = 0
        for tname, t in header.items():
            ok = (isinstance(t, dict) and isinstance(t.get("dtype"), str)
                  and _int_list(t.get("shape")) and _int_list(t.get("data_offsets"))
                  and len(t["data_offsets"]) == 2 and 0 <= t["data_offsets"][0] <= t["data_offsets"][1])
            if not ok:
                raise CheckpointError(f"{self.name}: bad header entry for {tname!r}")
            begin, end = t["data_offsets"]
            self.tensors[tname] = (t["dtype"], list(t["shape"]), begin, end)
            end_max = max(end_max, end)
        self.data_bytes = end_max


def _int_list(v):
    return isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


class _ShardFile:
    """One checkpoint file opened for reading slices."""

    def __init__(self, path):
        self.path = path
        self.header = SafetensorsHeader(path)
        self._st = None

    def read(self, name):
        h = self.header
        if name not in h.tensors:
            raise CheckpointError(f"{h.name}: no tensor {name!r} (index.json lists it)")
        dtype, shape, begin, end = h.tensors[name]
        if dtype not in DTYPES:
            raise CheckpointError(f"{h.name}: {name}: unsupported dtype {dtype}")
        npdt, size = DTYPES[dtype]
        count = (end - begin) // size
        if h.data_start + end > h.file_size:
            raise CheckpointError(f"{h.name}: truncated: {name} ends past the end of the file")
        if dtype == "BF16" or safe_open is None:
            # numpy has no bfloat16: read the raw little-endian bits through the offsets.
            arr = np.fromfile(self.path, dtype=npdt, count=count, offset=h.data_start + begin)
            if arr.size != count:
                raise CheckpointError(f"{h.name}: truncated: {name}")
            return arr
        try:
            if self._st is None:
                self._st = safe_open(self.path, framework="np")
            return np.ascontiguousarray(self._st.get_tensor(name)).reshape(-1)
        except Exception as e:  # safetensors raises its own error types
            raise CheckpointError(f"{h.name}: safetensors cannot read {name}: {e}")


def write_safetensors(path, entries, metadata=None):
    """Writes a safetensors file from entries [(name, dtype, shape, producer)], where
    producer() returns the tensor's little-endian bytes (called in order, one at a time).
    Dtype is a safetensors dtype string ("BF16", "F32", ...). Writes PATH.tmp-PID, fsyncs,
    renames."""
    header = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    offset = 0
    sizes = []
    for name, dtype, shape, _ in entries:
        nbytes = DTYPES[dtype][1] * _prod(shape)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        sizes.append(nbytes)
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % 8)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for (name, _, _, producer), nbytes in zip(entries, sizes):
            data = producer()
            if len(data) != nbytes:
                raise RuntimeError(f"{name}: {len(data)} bytes, expected {nbytes}")
            f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------
# index.json
# --------------------------------------------------------------------------------------

def _prod(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def kind_shape(shape, kind):
    """The full shape of `kind` of a model tensor of `shape`."""
    if kind in ("mxfp8_row_scale", "mxfp8_col_scale"):
        rows = _prod(shape[:-1])
        cols = shape[-1] if shape else 1
        if kind == "mxfp8_row_scale":
            return [rows, -(-cols // MXFP8_BLOCK)]
        return [-(-rows // MXFP8_BLOCK), cols]
    if kind == "nvfp4_data":  # two E2M1 codes per byte, element 2i in the low nibble
        return [-(-_prod(shape) // 2)]
    if kind == "nvfp4_scale":  # one E4M3 byte per 16 x 16 block
        rows = _prod(shape[:-1])
        cols = shape[-1] if shape else 1
        return [-(-rows // NVFP4_BLOCK), -(-cols // NVFP4_BLOCK)]
    if kind == "nvfp4_amax":
        return [1]
    return list(shape)


def not_plain_name(name):
    """Why `name` (a file name from index.json) is not a plain file name inside the
    checkpoint directory, or None: no separator, no "." or "..", not empty, no NUL, not
    absolute."""
    if name == "":
        return "is empty"
    if name in (".", ".."):
        return "names a directory"
    if "\0" in name:
        return "holds a NUL character"
    if name.startswith("/") or os.path.isabs(name):
        return "is an absolute path"
    if "/" in name or "\\" in name:
        return "holds a path separator"
    return None


def _parse_index(obj):
    """-> (files, tensors, slices, problems). files: list of dict or None (bad entry);
    tensors: {name: dict}; slices: {(tensor, kind): [(file, offset, length)]}."""
    problems = []
    files, tensors, slices = [], {}, {}
    if not isinstance(obj, dict):
        return files, tensors, slices, ["index.json: not a JSON object"]
    if obj.get("format") != FORMAT:
        problems.append(f"index.json: format is {obj.get('format')!r}, expected {FORMAT!r}")
    if obj.get("format_version") != FORMAT_VERSION:
        problems.append(f"index.json: format_version is {obj.get('format_version')!r}, "
                        f"this tool reads {FORMAT_VERSION}")
    ws = obj.get("world_size")
    if not _is_int(ws) or ws < 1:
        problems.append(f"index.json: world_size is {ws!r}, expected a positive integer")
    state = obj.get("state", {})
    if not isinstance(state, dict):
        problems.append("index.json: state is not an object")
    # files
    fl = obj.get("files")
    if not isinstance(fl, list):
        problems.append("index.json: files is missing or not a list")
        fl = []
    if _is_int(ws) and ws >= 1 and len(fl) != ws:
        problems.append(f"index.json: world_size is {ws} but files lists {len(fl)} files (one per saving rank)")
    seen_ranks = set()
    for i, fe in enumerate(fl):
        ok = (isinstance(fe, dict) and isinstance(fe.get("file"), str)
              and _is_int(fe.get("rank")) and _is_int(fe.get("bytes"))
              and isinstance(fe.get("checksum"), str))
        if not ok:
            problems.append(f"index.json: files[{i}] is not {{file, rank, bytes, checksum}}: {fe!r}")
            files.append(None)
            continue
        why = not_plain_name(fe["file"])
        if why:
            problems.append(f"index.json: files[{i}] is named {fe['file']!r}, which {why}; a checkpoint names "
                            f"only plain files inside its directory")
            files.append(None)
            continue
        if not re.fullmatch(r"crc32c:[0-9a-f]{8}", fe["checksum"]):
            problems.append(f"index.json: files[{i}] checksum {fe['checksum']!r} is not crc32c:XXXXXXXX")
        if fe["rank"] in seen_ranks:
            problems.append(f"index.json: files[{i}]: rank {fe['rank']} appears twice")
        if _is_int(ws) and not 0 <= fe["rank"] < ws:
            problems.append(f"index.json: files[{i}]: rank {fe['rank']} outside world size {ws}")
        seen_ranks.add(fe["rank"])
        files.append(fe)
    # tensors
    tl = obj.get("tensors")
    if not isinstance(tl, dict):
        problems.append("index.json: tensors is missing or not an object")
        tl = {}
    for name, t in tl.items():
        if not (isinstance(t, dict) and _int_list(t.get("shape"))):
            problems.append(f"index.json: tensors[{name!r}] has no valid shape")
            continue
        if t.get("algorithm", "adamw") not in ("adamw", "muon"):
            problems.append(f"index.json: tensors[{name!r}] algorithm {t.get('algorithm')!r} is not adamw or muon")
            continue
        if t.get("format", "native") not in ("native", "mxfp8", "nvfp4"):
            problems.append(f"index.json: tensors[{name!r}] format {t.get('format')!r} is not native, mxfp8 "
                            f"or nvfp4")
            continue
        tensors[name] = t
    # slices
    sl = obj.get("slices")
    if not isinstance(sl, dict):
        problems.append("index.json: slices is missing or not an object")
        sl = {}
    for key, entries in sl.items():
        tname, sep, kind = key.rpartition("/")
        if not sep:
            problems.append(f"index.json: slices key {key!r} is not TENSOR/KIND")
            continue
        if tname not in tensors:
            problems.append(f"index.json: slices {key!r}: no tensor {tname!r} in tensors")
            continue
        if kind not in KIND_DTYPES:
            problems.append(f"index.json: slices {key!r}: unknown kind {kind!r}")
            continue
        if not isinstance(entries, list):
            problems.append(f"index.json: slices {key!r} is not a list")
            continue
        good = []
        for j, e in enumerate(entries):
            if not (isinstance(e, dict) and all(_is_int(e.get(k)) and e[k] >= 0
                                                for k in ("file", "offset", "length"))):
                problems.append(f"index.json: slices {key!r}[{j}] is not {{file, offset, length}}: {e!r}")
                continue
            if e["file"] >= len(files):
                problems.append(f"index.json: slices {key!r}[{j}]: file {e['file']} but only "
                                f"{len(files)} files")
                continue
            good.append((e["file"], e["offset"], e["length"]))
        slices[(tname, kind)] = good
    return files, tensors, slices, problems


def _load_index(path):
    ipath = os.path.join(path, INDEX_NAME)
    if not os.path.isdir(path):
        raise CheckpointError(f"{path}: not a directory")
    if not os.path.exists(ipath):
        raise CheckpointError(NO_INDEX)
    try:
        with open(ipath, "rb") as f:
            return json.loads(f.read().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"index.json: not valid JSON ({e})")
    except RecursionError:
        raise CheckpointError("index.json: JSON nested too deep to be a checkpoint index")
    except OSError as e:
        raise CheckpointError(f"index.json: cannot read: {e.strerror or e}")


def _coverage(entries, numel):
    """Problems (strings) with how sorted (offset, length) pieces cover [0, numel)."""
    out = []
    pos = 0
    for off, length in sorted(entries):
        if length == 0:
            continue
        if off > pos:
            out.append(f"elements [{pos}, {off}) are in no slice (gap)")
        elif off < pos:
            out.append(f"elements [{off}, {min(pos, off + length)}) are in more than one slice (overlap)")
        pos = max(pos, off + length)
    if pos < numel:
        out.append(f"elements [{pos}, {numel}) are in no slice (gap)")
    elif pos > numel:
        out.append(f"slices reach element {pos} but the tensor has {numel}")
    return out


class Checkpoint:
    """A checkpoint directory with a well-formed index. Raises CheckpointError otherwise."""

    def __init__(self, path):
        self.path = path
        self.index = _load_index(path)
        self.files, self.tensors, self.slices, problems = _parse_index(self.index)
        if problems:
            raise CheckpointError(problems[0] + (f" (and {len(problems) - 1} more problems; run verify)"
                                                 if len(problems) > 1 else ""))
        self._open = {}

    @property
    def world_size(self):
        return self.index["world_size"]

    @property
    def step(self):
        return self.index.get("state", {}).get("step")

    def kinds(self, tensor):
        """The kinds stored of `tensor`, in the document's order."""
        return [k for k in KINDS if (tensor, k) in self.slices]

    def shape(self, tensor, kind=None):
        return kind_shape(self.tensors[tensor]["shape"], kind)

    def _file(self, i):
        if i not in self._open:
            fe = self.files[i]
            p = os.path.join(self.path, fe["file"])
            if not os.path.exists(p):
                raise CheckpointError(f"{fe['file']}: missing (index.json lists it)")
            self._open[i] = _ShardFile(p)
        return self._open[i]

    def dtype(self, tensor, kind):
        """The safetensors dtype of a stored kind ("F32", "BF16", ...)."""
        self._check(tensor, kind)
        entries = self.slices[(tensor, kind)]
        if not entries:
            raise CheckpointError(f"{tensor}/{kind}: no slices")
        f, off, _ = entries[0]
        name = f"{tensor}/{kind}@{off}"
        sf = self._file(f)
        if name not in sf.header.tensors:
            raise CheckpointError(f"{sf.header.name}: no tensor {name!r} (index.json lists it)")
        return sf.header.tensors[name][0]

    def _check(self, tensor, kind):
        if tensor not in self.tensors:
            raise UsageError(f"no tensor {tensor!r} in the checkpoint (see `list`)")
        if kind not in KIND_DTYPES:
            raise UsageError(f"unknown kind {kind!r} (kinds: {', '.join(KINDS)})")
        if (tensor, kind) not in self.slices:
            have = ", ".join(self.kinds(tensor)) or "none"
            raise UsageError(f"{tensor} has no kind {kind!r} (stored: {have})")

    def get(self, tensor, kind, as_float32=False):
        """Assembles `kind` of `tensor` at its full shape. BF16 comes back as uint16 bit
        patterns unless as_float32 (exact widening)."""
        self._check(tensor, kind)
        shape = self.shape(tensor, kind)
        numel = _prod(shape)
        entries = self.slices[(tensor, kind)]
        bad = _coverage([(o, n) for _, o, n in entries], numel)
        if bad:
            raise CheckpointError(f"{tensor}/{kind}: {bad[0]}")
        dtype = self.dtype(tensor, kind)
        if dtype not in DTYPES:
            raise CheckpointError(f"{tensor}/{kind}: unsupported dtype {dtype}")
        out = np.empty(numel, dtype=np.dtype(DTYPES[dtype][0]).newbyteorder("="))
        for f, off, length in entries:
            if length == 0:
                continue
            sf = self._file(f)
            name = f"{tensor}/{kind}@{off}"
            piece = sf.read(name)
            got = sf.header.tensors[name][0]
            if got != dtype:
                raise CheckpointError(f"{sf.header.name}: {name} is {got}, other slices are {dtype}")
            if piece.size != length:
                raise CheckpointError(f"{sf.header.name}: {name} has {piece.size} elements, "
                                      f"index.json says {length}")
            out[off:off + length] = piece
        out = out.reshape(shape)
        if as_float32 and dtype == "BF16":
            out = bf16_to_f32(out)
        return out

    def close(self):
        self._open.clear()


# --------------------------------------------------------------------------------------
# verify
# --------------------------------------------------------------------------------------

def verify(path):
    """All problems with the checkpoint at `path`, one string each; [] when it is good."""
    try:
        obj = _load_index(path)
    except CheckpointError as e:
        return [str(e)]
    files, tensors, slices, problems = _parse_index(obj)
    ws = obj.get("world_size") if isinstance(obj, dict) else None
    options = obj.get("options") if isinstance(obj, dict) else None
    moment_dtype = options.get("moment_dtype") if isinstance(options, dict) else None

    # where each slice must be: (file, name) -> (tensor, kind, length)
    expected = {}
    for (tname, kind), entries in slices.items():
        for f, off, length in entries:
            name = f"{tname}/{kind}@{off}"
            if (f, name) in expected:
                problems.append(f"index.json: slice {name} listed twice for file {f}")
            expected[(f, name)] = (tname, kind, length)
    kind_dtype = {}  # (tensor, kind) -> dtype seen

    for i, fe in enumerate(files):
        if fe is None:
            continue
        fname = fe["file"]
        p = os.path.join(path, fname)
        if not os.path.isfile(p):
            problems.append(f"{fname}: missing (index.json lists it)")
            continue
        size = os.path.getsize(p)
        if size != fe["bytes"]:
            problems.append(f"{fname}: {size} bytes, index.json says {fe['bytes']}")
        try:
            h = SafetensorsHeader(p)
        except CheckpointError as e:
            problems.append(str(e))
            continue
        if h.data_start + h.data_bytes > size:
            problems.append(f"{fname}: truncated: the header says the data ends at byte "
                            f"{h.data_start + h.data_bytes}, the file has {size}")
        elif h.data_start + h.data_bytes < size:
            problems.append(f"{fname}: {size - h.data_start - h.data_bytes} bytes after the data section")
        else:
            try:
                with safe_open(p, framework="np") as st:
                    st.keys()
            except Exception as e:
                problems.append(f"{fname}: safetensors refuses the file: {e}")
        m = h.metadata
        if m.get("format") != FORMAT:
            problems.append(f"{fname}: metadata format is {m.get('format')!r}, expected {FORMAT!r}")
        if m.get("format_version") != str(FORMAT_VERSION):
            problems.append(f"{fname}: metadata format_version is {m.get('format_version')!r}")
        if m.get("rank") != str(fe["rank"]):
            problems.append(f"{fname}: metadata rank is {m.get('rank')!r}, index.json says {fe['rank']}")
        if _is_int(ws) and m.get("world_size") != str(ws):
            problems.append(f"{fname}: metadata world_size is {m.get('world_size')!r}, index.json says {ws}")
        actual = "crc32c:%08x" % crc32c_file(p, h.data_start)
        if "checksum" not in m:
            problems.append(f"{fname}: no checksum in its metadata")
        elif m["checksum"] != actual:
            problems.append(f"{fname}: checksum mismatch: data section is {actual}, "
                            f"file metadata says {m['checksum']}")
        if fe["checksum"] != actual:
            problems.append(f"{fname}: checksum mismatch: data section is {actual}, "
                            f"index.json says {fe['checksum']}")
        # the file's tensors against the index
        for name, (dtype, shape, begin, end) in h.tensors.items():
            want = expected.get((i, name))
            if want is None:
                problems.append(f"{fname}: tensor {name} is not listed in index.json")
                continue
            tname, kind, length = want
            if shape != [length]:
                problems.append(f"{fname}: {name} has shape {shape}, index.json says [{length}]")
            if dtype not in KIND_DTYPES[kind]:
                problems.append(f"{fname}: {name} is {dtype}; {kind} must be {' or '.join(KIND_DTYPES[kind])}")
            elif end - begin != DTYPES[dtype][1] * _prod(shape):
                problems.append(f"{fname}: {name}: data_offsets span {end - begin} bytes, "
                                f"shape {shape} of {dtype} needs {DTYPES[dtype][1] * _prod(shape)}")
            prev = kind_dtype.setdefault((tname, kind), dtype)
            if prev != dtype:
                problems.append(f"{fname}: {name} is {dtype}, other slices of {tname}/{kind} are {prev}")
        for (f, name) in expected:
            if f == i and name not in h.tensors:
                problems.append(f"{fname}: slice {name} listed in index.json is not in the file")

    # coverage and dtypes per model tensor
    for (tname, kind), entries in slices.items():
        numel = _prod(kind_shape(tensors[tname]["shape"], kind))
        for msg in _coverage([(o, n) for _, o, n in entries], numel):
            problems.append(f"{tname}/{kind}: {msg}")
        dt = kind_dtype.get((tname, kind))
        if kind == "param" and dt and tensors[tname].get("param_dtype") in SHORT_DTYPE \
                and SHORT_DTYPE[tensors[tname]["param_dtype"]] != dt:
            problems.append(f"{tname}/param is {dt}, index.json says param_dtype "
                            f"{tensors[tname]['param_dtype']}")
        if kind in ("exp_avg", "exp_avg_sq") and dt and moment_dtype in MOMENT_FILE_DTYPE \
                and MOMENT_FILE_DTYPE[moment_dtype] != dt:
            problems.append(f"{tname}/{kind} is {dt}, options.moment_dtype is {moment_dtype}")
        fmt = tensors[tname].get("format", "native")
        if fmt != "mxfp8" and kind.startswith("mxfp8_"):
            problems.append(f"{tname}/{kind}: an MXFP8 kind on a {fmt} tensor")
        if fmt != "nvfp4" and kind.startswith("nvfp4_"):
            problems.append(f"{tname}/{kind}: an NVFP4 kind on a {fmt} tensor")
        algo = tensors[tname].get("algorithm")
        if kind in MUON_KINDS and len(tensors[tname]["shape"]) != 2:
            problems.append(f"{tname}/{kind}: Muon's momentum on a tensor of shape {tensors[tname]['shape']} "
                            f"(Muon updates 2-D matrices only)")
        if kind in MUON_KINDS and algo not in (None, "muon"):
            problems.append(f"{tname}/{kind}: Muon's momentum on a tensor whose algorithm is {algo!r}")
        if kind in ADAM_KINDS and algo == "muon":
            problems.append(f"{tname}/{kind}: Adam's moment on a tensor whose algorithm is 'muon'")
    for tname in tensors:
        if any((tname, k) in slices for k in ADAM_KINDS) and any((tname, k) in slices for k in MUON_KINDS):
            problems.append(f"{tname}: holds both Adam's moments and Muon's momentum (one algorithm per tensor)")
    for tname in tensors:
        if not any((tname, k) in slices for k in KINDS):
            problems.append(f"{tname}: listed in tensors but has no slices")
    return problems


# --------------------------------------------------------------------------------------
# export
# --------------------------------------------------------------------------------------

def _convert(arr, src, dst):
    """Flat little-endian bytes of `arr` (stored as safetensors dtype src) as dtype dst."""
    if src == dst:
        return np.ascontiguousarray(arr).astype(DTYPES[dst][0], copy=False).tobytes()
    if src == "BF16":
        f32 = bf16_to_f32(arr)
    else:
        f32 = np.asarray(arr, dtype=np.float32)
    if dst == "BF16":
        return f32_to_bf16(f32).astype("<u2", copy=False).tobytes()
    return f32.astype(DTYPES[dst][0]).tobytes()


def export_plan(ck, kind="param", dtype=None):
    """[(tensor, source kind, source dtype, output dtype, shape)] for export_hf."""
    plan = []
    for tname, t in ck.tensors.items():
        fmt = t.get("format", "native")
        if kind == "param" and (tname, "param") in ck.slices:
            src_kind = "param"
        elif (tname, "master") in ck.slices:
            src_kind = "master"
        else:
            raise CheckpointError(f"{tname}: no {kind} kind to export (stored: "
                                  f"{', '.join(ck.kinds(tname)) or 'none'})")
        src = ck.dtype(tname, src_kind)
        if dtype:
            out = SHORT_DTYPE[dtype]
        elif src_kind == "param" or kind == "master":
            out = src
        elif fmt in ("mxfp8", "nvfp4"):
            out = "BF16"
        else:
            out = SHORT_DTYPE.get(t.get("param_dtype"), "BF16")
        plan.append((tname, src_kind, src, out, list(t["shape"])))
    return plan


def export_hf(path, out, kind="param", dtype=None, max_shard_bytes=HF_DEFAULT_SHARD_BYTES):
    """Writes OUT/model-XXXXX-of-YYYYY.safetensors and OUT/model.safetensors.index.json.
    Returns the index written."""
    if kind not in ("param", "master"):
        raise UsageError(f"--kind must be param or master, not {kind!r}")
    if dtype not in (None, "bf16", "f32"):
        raise UsageError(f"--dtype must be bf16 or f32, not {dtype!r}")
    if max_shard_bytes < 1:
        raise UsageError("--max-shard-bytes must be positive")
    ck = Checkpoint(path)
    plan = export_plan(ck, kind, dtype)
    groups, cur, cur_bytes = [], [], 0
    for item in plan:
        nbytes = DTYPES[item[3]][1] * _prod(item[4])
        if cur and cur_bytes + nbytes > max_shard_bytes:
            groups.append(cur)
            cur, cur_bytes = [], 0
        cur.append(item)
        cur_bytes += nbytes
    if cur:
        groups.append(cur)
    os.makedirs(out, exist_ok=True)
    weight_map, total = {}, 0
    n = len(groups)
    for gi, group in enumerate(groups):
        fname = f"model-{gi + 1:05d}-of-{n:05d}.safetensors"
        entries = []
        for tname, src_kind, src, dst, shape in group:
            def producer(tname=tname, src_kind=src_kind, src=src, dst=dst):
                return _convert(ck.get(tname, src_kind), src, dst)
            entries.append((tname, dst, shape, producer))
            weight_map[tname] = fname
            total += DTYPES[dst][1] * _prod(shape)
        write_safetensors(os.path.join(out, fname), entries, {"format": "pt"})
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    ipath = os.path.join(out, "model.safetensors.index.json")
    with open(ipath + f".tmp-{os.getpid()}", "w") as f:
        json.dump(index, f, indent=2)
        f.write("\n")
    os.replace(ipath + f".tmp-{os.getpid()}", ipath)
    return index


# --------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------

def _cmd_list(a):
    ck = Checkpoint(a.dir)
    st = ck.index.get("state", {})
    print(f"checkpoint {a.dir}")
    print(f"  step {ck.step}  world size {ck.world_size}  format_version {ck.index['format_version']}"
          + "".join(f"  {k} {st[k]}" for k in ("lr", "loss_scale") if k in st))
    print(f"files ({len(ck.files)}):")
    for fe in ck.files:
        print(f"  {fe['file']}  rank {fe['rank']}  {fe['bytes']} bytes  {fe['checksum']}")
    print(f"tensors ({len(ck.tensors)}):")
    width = max((len(t) for t in ck.tensors), default=0)
    for tname, t in ck.tensors.items():
        group = f"  group {t['group']}" if "group" in t else ""
        group += f"  {t['algorithm']}" if t.get("algorithm") == "muon" else ""
        print(f"  {tname:<{width}}  shape {list(t['shape'])}  {t.get('param_dtype', '?')}  "
              f"{t.get('format', 'native')}{group}  kinds: {' '.join(ck.kinds(tname)) or '-'}")
    user = ck.index.get("user")
    if isinstance(user, dict) and user:
        print("user: " + ", ".join(f"{k}={v}" for k, v in user.items()))
    return 0


def _cmd_verify(a):
    problems = verify(a.dir)
    for p in problems:
        print(p)
    if not problems:
        print(f"{a.dir}: ok")
    return 1 if problems else 0


def _cmd_get(a):
    ck = Checkpoint(a.dir)
    arr = ck.get(a.tensor, a.kind, as_float32=a.as_float32)
    dtype = ck.dtype(a.tensor, a.kind)
    if a.out:
        np.save(a.out, arr)
        print(f"{a.tensor}/{a.kind}: {dtype} {list(arr.shape)} -> {a.out}"
              + (" (uint16 bf16 bit patterns; --as-float32 widens)" if dtype == "BF16" and not a.as_float32
                 else ""))
        return 0
    vals = bf16_to_f32(arr) if dtype == "BF16" and not a.as_float32 else arr
    desc = f"{dtype}" + (" as uint16 bit patterns" if dtype == "BF16" and not a.as_float32 else "") \
        + (" as float32" if dtype == "BF16" and a.as_float32 else "")
    print(f"{a.tensor}/{a.kind}: shape {list(arr.shape)}  {desc}  ({arr.size} elements)")
    if vals.size:
        v = vals.astype(np.float64)
        finite = np.isfinite(v)
        nonfinite = int(v.size - finite.sum())
        if finite.any():
            f = v[finite]
            print(f"  min {f.min():.6g}  max {f.max():.6g}  mean {f.mean():.6g}  "
                  f"rms {math.sqrt(float(np.mean(f * f))):.6g}"
                  + (f"  non-finite {nonfinite}" if nonfinite else ""))
        flat = arr.reshape(-1)
        print(f"  first: {flat[:8].tolist()}")
    return 0


def _cmd_export(a):
    idx = export_hf(a.dir, a.out, kind=a.kind, dtype=a.dtype, max_shard_bytes=a.max_shard_bytes)
    files = sorted(set(idx["weight_map"].values()))
    print(f"wrote {len(idx['weight_map'])} tensors, {idx['metadata']['total_size']} bytes, "
          f"in {len(files)} files to {a.out}")
    return 0


def _parser():
    p = argparse.ArgumentParser(prog="shardopt_ckpt.py",
                                description="Read, check and export shardopt checkpoints.")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    sub.required = True
    s = sub.add_parser("list", help="step, world size, files and tensors")
    s.add_argument("dir")
    s.set_defaults(func=_cmd_list)
    s = sub.add_parser("verify", help="check files, sizes, checksums and slice coverage")
    s.add_argument("dir")
    s.set_defaults(func=_cmd_verify)
    s = sub.add_parser("get", help="assemble one kind of one tensor")
    s.add_argument("dir")
    s.add_argument("tensor")
    s.add_argument("kind")
    s.add_argument("--out", metavar="FILE.npy")
    s.add_argument("--as-float32", action="store_true", help="widen bf16 bit patterns to float32")
    s.set_defaults(func=_cmd_get)
    s = sub.add_parser("export-hf", help="write Hugging Face style safetensors shards + index")
    s.add_argument("dir")
    s.add_argument("out")
    s.add_argument("--kind", choices=("param", "master"), default="param")
    s.add_argument("--dtype", choices=("bf16", "f32"))
    s.add_argument("--max-shard-bytes", type=int, default=HF_DEFAULT_SHARD_BYTES, metavar="N")
    s.set_defaults(func=_cmd_export)
    return p


def main(argv=None):
    args = _parser().parse_args(argv)  # exits 2 on a usage error
    if np is None or safetensors is None:
        print("error: shardopt_ckpt.py needs numpy and safetensors "
              "(python3 -m pip install numpy safetensors)", file=sys.stderr)
        return 2
    try:
        return args.func(args)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except (ValueError, KeyError, TypeError, IndexError, struct.error, RecursionError) as e:
        # a malformed checkpoint this tool did not foresee: still one line, no traceback
        print(f"error: cannot read the checkpoint: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
