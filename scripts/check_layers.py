#!/usr/bin/env python3
"""Layering check over the #include graph of src/ and include/shardopt/.

shardopt's layers run one way, top to bottom:

    api (5)        include/shardopt/shardopt.hpp, the umbrella header
    optimizer (4)  src/optimizer/
    quantized (3)  src/quantized/
    buffers (2)    src/buffers/
    comm, kernels, formats (1, siblings)  src/comm/, src/kernels/, src/formats/
    core (0)       src/core/

Files scanned: src/**/*.{hpp,cpp,cu,cuh,h,hh,cc,cxx,inl,ipp} and include/shardopt/**/*.{hpp,h}.
Only quoted includes count (`#include "..."`, any spacing around `#` and `include`);
<...> system includes, includes inside // or /* */ comments and inside string
literals are ignored. (Includes inside #if 0 still count: the check is conservative.)

Resolving `#include "X"` from file F, in the compiler's order:
  1. F's directory / X, if that file exists (a relative include beside the file);
  2. `shardopt/...`            -> include/shardopt/... (must exist, else an error);
  3. `<dir>/...` where <dir> is a layer in LAYERS or an existing src/<dir>/
                               -> src/<dir>/... (its layer is <dir>'s);
  4. `shardopt_config.h`       -> the generated build config: core, ignored;
  5. anything else             -> outside the project (CUDA, NCCL, MPI, ...): ignored.

Layer of a file:
  * src/<dir>/...              -> LAYERS[<dir>], at any depth (src/kernels/<room>/... is
                                  kernels); a directory missing from LAYERS (or a
                                  file directly in src/) is an error ("add it to the
                                  LAYERS table");
  * include/shardopt/<name>    -> PUBLIC_HEADER_LAYER[<name>], the layer of the src/
                                  directory that implements it (pure-type headers that
                                  include nothing above core are core); a header missing
                                  from the table is an error ("add it to
                                  PUBLIC_HEADER_LAYER").

Violations (each makes the script exit 1):
  (a) upward: a file of layer L includes a file of a layer ranked above L
      (this covers any src/ file including the umbrella shardopt.hpp);
  (b) siblings: a file of one layer includes a file of a different layer of the same
      rank (comm, kernels and formats: none includes another);
  (c) cycle: a cycle in the directory graph, whose nodes are the layer names (a
      public header counts as the node of its layer) and whose edges are the includes
      between different nodes. Every cycle holds an edge A -> B going up or sideways;
      for each such edge that B can get back from, the shortest cycle A -> B -> ... -> A
      is one violation (each distinct cycle once), printed as `cycle: A -> B -> A` and
      then the includes making up each hop (the first MAX_SITES_PER_HOP of each).
      So the graph has a cycle iff at least one is reported; the downward hops show
      the includes that close the loop (e.g. buffers reaching into comm).
Edge violations print as  `file:line: <layer> includes <target> (<layer>)`.
The last line is `layering: N violations` (exit 1) or
`layering: ok (F files, E edges)` (exit 0). Errors (unknown directory, header missing
from the table, unresolvable shardopt/ include) are printed as `path: error: ...`,
count as violations and also exit 1.

Options: --root DIR (default: this script's parent's parent, the repository root);
--dot prints the directory graph in Graphviz dot form instead (exit status as usual).
Python 3 standard library only.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections import defaultdict
from pathlib import Path

# Layer name -> rank. A src/ subdirectory must be listed here.
LAYERS = {
    "core": 0,
    "comm": 1,
    "kernels": 1,
    "formats": 1,  # checkpoint file formats: JSON, CRC-32C, atomic files, safetensors
    "buffers": 2,
    "quantized": 3,
    "optimizer": 4,
    "api": 5,  # the public umbrella header only; not a src/ directory
}
SRC_LAYERS = {name for name in LAYERS if name != "api"}

# Public header (path under include/shardopt/) -> the layer that implements it.
# Filled in from the src/ file that defines each header's out-of-line functions.
PUBLIC_HEADER_LAYER = {
    # core: pure types and core services (src/core/*.cpp), include nothing above core
    "backend.hpp": "core",         # src/core/backend.cpp
    "dtype.hpp": "core",           # src/core/dtype.cpp
    "error.hpp": "core",           # src/core/error.cpp
    "host_stream.hpp": "core",     # src/core/host_stream.cpp
    "microbatch.hpp": "core",      # header-only struct
    "numerics.hpp": "core",        # header-only (includes dtype.hpp)
    "param_spec.hpp": "core",      # src/core/param_spec.cpp: the vocabulary type of every layer
    "range.hpp": "core",           # header-only struct
    "watchdog.hpp": "core",        # header-only struct (WatchdogOptions)
    # comm
    "communicator.hpp": "comm",    # src/comm/communicator.cpp, comm_impl.cpp, self_comm.cpp
    "mpi.hpp": "comm",             # src/comm/bootstrap_mpi.cpp (communicator_from_mpi)
    # kernels
    "fused_adam.hpp": "kernels",   # src/kernels/adam/adam.cpp, grad_norm.cpp (shard_chunks, fused_adam_step, ...)
    "muon.hpp": "kernels",         # src/kernels/muon/newton_schulz.cpp (muon_lr_ratio, to_string)
    "mxfp8.hpp": "kernels",        # src/kernels/mxfp8/mxfp8*.cpp (quantize_mxfp8*, mxfp8_partial_*)
    "nvfp4.hpp": "kernels",        # src/kernels/nvfp4/nvfp4*.cpp (quantize_nvfp4*, nvfp4_partial_amax)
    "schedule.hpp": "kernels",     # src/kernels/adam/step_control.cpp (schedule_lr)
    # buffers
    "bucket_store.hpp": "buffers", # src/buffers/bucket_store.cpp
    "layout.hpp": "buffers",       # src/buffers/layout.cpp
    "presets.hpp": "buffers",      # src/buffers/presets.cpp
    # quantized parameters (between buffers and optimizer)
    "mxfp8_param.hpp": "quantized",  # src/quantized/mxfp8_params.cpp (Mxfp8View, GatherState)
    "nvfp4_param.hpp": "quantized",  # src/quantized/nvfp4_params.cpp (Nvfp4View)
    # optimizer
    "adam_options.hpp": "optimizer",  # src/optimizer/shard_engine.cpp (validate)
    "checkpoint.hpp": "optimizer",    # src/optimizer/checkpoint.cpp (SaveHandle)
    "distributed_adam.hpp": "optimizer",  # src/optimizer/distributed_adam.cpp
    "fsdp.hpp": "optimizer",       # src/optimizer/fsdp.cpp
    "sharded_optimizer.hpp": "optimizer",  # src/optimizer/sharded_optimizer.cpp
    "memory_report.hpp": "optimizer",
    "param_format.hpp": "optimizer",  # header-only enum (ParamFormat)  # src/optimizer/views.cpp (MemoryReport::to_string)
    "step_graph.hpp": "optimizer", # src/optimizer/step_graph.cpp
    "views.hpp": "optimizer",      # src/optimizer/views.cpp; includes param_spec.hpp (buffers)
    # the umbrella: top layer, nothing may include it
    "shardopt.hpp": "api",
}

SRC_EXTS = {".hpp", ".cpp", ".cu", ".cuh", ".h", ".hh", ".cc", ".cxx", ".inl", ".ipp"}
PUBLIC_EXTS = {".hpp", ".h"}
CONFIG_HEADER = "shardopt_config.h"
MAX_SITES_PER_HOP = 6  # includes listed per hop of a reported cycle
INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"\n]+)"')
RAW_STRING_RE = re.compile(r'R"([^()\\ \t\n]{0,16})\(')


def strip_comments(text: str) -> str:
    """Blank out comments and the insides of string/char literals, keeping newlines
    (so line numbers stay right) and the quotes of ordinary string literals (so an
    `#include "x"` line still matches)."""
    out = []
    i, n = 0, len(text)
    NORMAL, LINE, BLOCK, STR, CHR = range(5)
    state = NORMAL
    directive = False  # inside a preprocessor line: keep "..." of #include intact
    line_start = True
    while i < n:
        c = text[i]
        nxt = text[i + 1] if i + 1 < n else ""
        if state == NORMAL:
            if c == "\n":
                out.append(c)
                directive = False
                line_start = True
                i += 1
                continue
            if line_start and c in " \t":
                out.append(c)
                i += 1
                continue
            if c == "/" and nxt == "/":
                state = LINE
                out.append("  ")
                i += 2
                continue
            if c == "/" and nxt == "*":
                state = BLOCK
                out.append("  ")
                i += 2
                continue
            if c == "R" and nxt == '"' and not directive and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
                m = RAW_STRING_RE.match(text, i)
                if m:  # raw string literal: skip to )delim"
                    line_start = False
                    end = text.find(")" + m.group(1) + '"', m.end())
                    end = n if end < 0 else end + len(m.group(1)) + 2
                    out.append(re.sub(r"[^\n]", " ", text[i:end]))
                    i = end
                    continue
            if line_start and c == "#":
                directive = True
            line_start = False
            if c == '"':
                if directive:  # "#include "x"": copy the header name verbatim
                    end = text.find('"', i + 1)
                    nl = text.find("\n", i + 1)
                    if end >= 0 and (nl < 0 or end < nl):
                        out.append(text[i:end + 1])
                        i = end + 1
                        continue
                state = STR
                out.append(c)
                i += 1
                continue
            if c == "'" and not (i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")):
                state = CHR
                out.append(" ")
                i += 1
                continue
            out.append(c)
            i += 1
        elif state == LINE:
            if c == "\\" and nxt == "\n":
                out.append(" \n")
                i += 2
            elif c == "\n":
                state = NORMAL
                directive = False
                line_start = True
                out.append(c)
                i += 1
            else:
                out.append(" ")
                i += 1
        elif state == BLOCK:
            if c == "*" and nxt == "/":
                state = NORMAL
                out.append("  ")
                i += 2
            else:
                if c == "\n":
                    line_start = True
                out.append("\n" if c == "\n" else " ")
                i += 1
        else:  # STR or CHR
            quote = '"' if state == STR else "'"
            if c == "\\" and i + 1 < n:
                out.append(" \n" if nxt == "\n" else "  ")
                i += 2
            elif c == quote or c == "\n":  # an unterminated literal ends at the line end
                out.append(c if state == STR or c == "\n" else " ")
                if c == "\n":
                    directive = False
                    line_start = True
                state = NORMAL
                i += 1
            else:
                out.append(" ")
                i += 1
    return "".join(out)


def norm(p: Path) -> Path:
    """Absolute path with `.` and `..` folded, symlinks kept."""
    return Path(os.path.normpath(os.path.abspath(p)))


def read_includes(path: Path):
    """[(line number, quoted include)] of one file."""
    text = path.read_text(encoding="utf-8", errors="replace")
    result = []
    for lineno, line in enumerate(strip_comments(text).split("\n"), 1):
        m = INCLUDE_RE.match(line)
        if m:
            result.append((lineno, m.group(1).strip()))
    return result


class Checker:
    def __init__(self, root: Path):
        self.root = norm(root)  # normalised, not resolved: symlinked trees stay inside root
        self.src = self.root / "src"
        self.pub = self.root / "include" / "shardopt"
        self.errors = []      # (path, message)
        self.violations = []  # (file, line, layer, target, target_layer, kind)
        self.cycles = []      # [node, ...]
        self.edges = []       # (file, line, include text, target rel path, src layer, dst layer)
        self.files = []
        self._reported_dirs = set()

    def rel(self, p: Path) -> str:
        try:
            return norm(p).relative_to(self.root).as_posix()
        except ValueError:
            return p.as_posix()

    def layer_of(self, p: Path):
        """Layer name of a file, or None: outside src/ and include/shardopt/, or an error
        (unknown directory, header missing from the table) recorded once."""
        p = norm(p)
        if p.is_relative_to(self.pub):
            name = p.relative_to(self.pub).as_posix()
            layer = PUBLIC_HEADER_LAYER.get(name)
            if layer is None:
                key = ("pub", name)
                if key not in self._reported_dirs:
                    self._reported_dirs.add(key)
                    self.errors.append((self.rel(p), f"error: public header '{name}' has no layer "
                                        "(add it to PUBLIC_HEADER_LAYER)"))
            return layer
        if p.is_relative_to(self.src):
            parts = p.relative_to(self.src).parts
            if len(parts) < 2:
                key = ("srcfile", parts[0])
                if key not in self._reported_dirs:
                    self._reported_dirs.add(key)
                    self.errors.append((self.rel(p), "error: file directly in src/, not in a layer "
                                        "directory (move it, or add a directory to the LAYERS table)"))
                return None
            d = parts[0]
            if d not in SRC_LAYERS:
                if d not in self._reported_dirs:
                    self._reported_dirs.add(d)
                    self.errors.append((f"src/{d}/", f"error: unknown layer directory '{d}' "
                                        "(add it to the LAYERS table)"))
                return None
            return d
        return None

    def resolve(self, including: Path, inc: str):
        """Path of a project file, 'ignore', or None (unresolvable shardopt/ include)."""
        beside = including.parent / inc
        if beside.is_file():
            return beside
        first = inc.split("/", 1)[0]
        if first == "shardopt" and "/" in inc:
            target = self.root / "include" / inc
            return target if target.is_file() else None
        if "/" in inc and (first in SRC_LAYERS or (self.src / first).is_dir()):
            return self.src / inc
        return "ignore"  # shardopt_config.h (generated, core) or outside the project

    def collect(self):
        if self.src.is_dir():
            for d in sorted(self.src.iterdir()):
                if d.is_dir() and d.name not in SRC_LAYERS:
                    self.layer_of(d / "_")  # reports the unknown directory
            self.files += sorted(p for p in self.src.rglob("*") if p.is_file() and p.suffix in SRC_EXTS)
        if self.pub.is_dir():
            self.files += sorted(p for p in self.pub.rglob("*") if p.is_file() and p.suffix in PUBLIC_EXTS)

    def run(self):
        self.collect()
        for f in self.files:
            layer = self.layer_of(f)
            for lineno, inc in read_includes(f):
                if inc == CONFIG_HEADER:
                    continue
                target = self.resolve(f, inc)
                if target == "ignore":
                    continue
                if target is None:
                    self.errors.append((f"{self.rel(f)}:{lineno}",
                                        f'error: cannot resolve #include "{inc}" (no such public header)'))
                    continue
                tlayer = self.layer_of(target)
                if layer is None or tlayer is None:
                    continue
                self.edges.append((self.rel(f), lineno, inc, self.rel(target), layer, tlayer))
                if LAYERS[tlayer] > LAYERS[layer]:
                    self.violations.append((self.rel(f), lineno, layer, inc, tlayer, "upward"))
                elif tlayer != layer and LAYERS[tlayer] == LAYERS[layer]:
                    self.violations.append((self.rel(f), lineno, layer, inc, tlayer, "sibling"))
        self.find_cycles()

    def dir_graph(self):
        """{(from node, to node): [edge, ...]} over distinct nodes."""
        g = defaultdict(list)
        for e in self.edges:
            if e[4] != e[5]:
                g[(e[4], e[5])].append(e)
        return g

    def find_cycles(self):
        """Every cycle of the directory graph holds at least one edge that goes up or
        sideways (rank of target >= rank of source). For each such edge A -> B from which
        A can be reached again, report the shortest cycle A -> B -> ... -> A, once per
        distinct cycle. So a cyclic graph always yields a report, and the report stays
        bounded by the number of such edges (no enumeration of every elementary cycle)."""
        g = self.dir_graph()
        order = sorted(LAYERS, key=lambda x: (LAYERS[x], x))
        succ = defaultdict(list)
        for a, b in sorted(g, key=lambda ab: (order.index(ab[0]), order.index(ab[1]))):
            succ[a].append(b)
        seen = set()
        for a, b in sorted(g, key=lambda ab: (order.index(ab[0]), order.index(ab[1]))):
            if LAYERS[b] < LAYERS[a]:
                continue
            prev = {b: None}  # breadth-first search b -> a
            queue = [b]
            while queue and a not in prev:
                node = queue.pop(0)
                for nb in succ[node]:
                    if nb not in prev:
                        prev[nb] = node
                        queue.append(nb)
            if a not in prev:
                continue
            back = [a]
            while back[-1] != b:
                back.append(prev[back[-1]])
            cyc = [a] + back[::-1]  # a -> b -> ... -> a
            ring = cyc[:-1]
            k = ring.index(min(ring, key=order.index))
            key = tuple(ring[k:] + ring[:k])
            if key not in seen:
                seen.add(key)
                self.cycles.append(cyc)

    def report(self, out=sys.stdout) -> int:
        for where, msg in self.errors:
            print(f"{where}: {msg}", file=out)
        for f, line, layer, inc, tlayer, kind in self.violations:
            note = " [siblings]" if kind == "sibling" else ""
            print(f"{f}:{line}: {layer} includes {inc} ({tlayer}){note}", file=out)
        g = self.dir_graph()
        for cyc in self.cycles:
            print(f"cycle: {' -> '.join(cyc)}", file=out)
            for a, b in zip(cyc, cyc[1:]):
                for f, line, inc, _t, layer, tlayer in g[(a, b)][:MAX_SITES_PER_HOP]:
                    print(f"  {f}:{line}: {layer} includes {inc} ({tlayer})", file=out)
                if len(g[(a, b)]) > MAX_SITES_PER_HOP:
                    print(f"  ... and {len(g[(a, b)]) - MAX_SITES_PER_HOP} more includes from {a} of {b}", file=out)
        n = len(self.errors) + len(self.violations) + len(self.cycles)
        if n:
            print(f"layering: {n} violations", file=out)
            return 1
        print(f"layering: ok ({len(self.files)} files, {len(self.edges)} edges)", file=out)
        return 0

    def dot(self, out=sys.stdout):
        g = self.dir_graph()
        bad = {(v[2], v[4]) for v in self.violations}
        for cyc in self.cycles:
            bad.update(zip(cyc, cyc[1:]))
        print("digraph shardopt_layers {", file=out)
        print("  rankdir=BT;", file=out)
        nodes = {n for ab in g for n in ab} | SRC_LAYERS
        for name in sorted(nodes, key=lambda x: (LAYERS[x], x)):
            print(f'  "{name}" [label="{name} ({LAYERS[name]})"];', file=out)
        for (a, b), es in sorted(g.items()):
            color = ', color=red, fontcolor=red' if (a, b) in bad else ""
            print(f'  "{a}" -> "{b}" [label="{len(es)}"{color}];', file=out)
        print("}", file=out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Check shardopt's include layering (see the module docstring).")
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent,
                    help="repository root (default: the script's parent's parent)")
    ap.add_argument("--dot", action="store_true", help="print the directory graph in Graphviz dot form")
    args = ap.parse_args(argv)
    if not (args.root / "src").is_dir():
        print(f"{args.root}: error: no src/ directory", file=sys.stderr)
        return 2
    c = Checker(args.root)
    c.run()
    if args.dot:
        c.dot()
        return 1 if (c.errors or c.violations or c.cycles) else 0
    return c.report()


if __name__ == "__main__":
    sys.exit(main())
