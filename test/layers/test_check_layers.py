#!/usr/bin/env python3
"""Self-test of scripts/check_layers.py: builds tiny synthetic source trees in a temp
directory and runs the checker on each with --root. Plain Python; exit 0 when every
case passes, 1 otherwise.   python3 test/layers/test_check_layers.py"""

import subprocess
import sys
import tempfile
from pathlib import Path

CHECKER = Path(__file__).resolve().parent.parent.parent / "scripts" / "check_layers.py"

# A clean tree: every layer, public headers, and includes the checker must ignore.
CLEAN = {
    "include/shardopt/error.hpp": "#pragma once\n",
    "include/shardopt/dtype.hpp": '#pragma once\n#include "shardopt/error.hpp"\n',
    "include/shardopt/communicator.hpp": '#pragma once\n#include "shardopt/dtype.hpp"\n',
    "include/shardopt/fused_adam.hpp": '#pragma once\n#include "shardopt/dtype.hpp"\n',
    "include/shardopt/layout.hpp": '#pragma once\n#include <vector>\n',
    "include/shardopt/distributed_adam.hpp":
        '#pragma once\n#include "shardopt/layout.hpp"\n#include "shardopt/communicator.hpp"\n',
    "include/shardopt/shardopt.hpp":
        '#pragma once\n#include "shardopt/distributed_adam.hpp"\n#include "shardopt/error.hpp"\n',
    "src/core/check.hpp": '#pragma once\n#include "shardopt/error.hpp"\n#include "shardopt_config.h"\n',
    "src/core/error.cpp": '#include "shardopt/error.hpp"\n'
                          '// #include "optimizer/state.hpp"   (a comment: ignored)\n'
                          '/* #include "shardopt/shardopt.hpp"\n   #include "comm/impl.hpp" */\n'
                          'const char* s = "#include \\"kernels/math.cuh\\"";\n',
    "src/comm/impl.hpp": '#pragma once\n#  include "core/check.hpp"\n#include "shardopt/communicator.hpp"\n',
    "src/comm/impl.cpp": '#include "impl.hpp"\n#include <mpi.h>\n#include "nccl.h"\n',
    "src/kernels/math.cuh": '#pragma once\n#include "shardopt/fused_adam.hpp"\n',
    "src/kernels/adam/adam.cu": '\t#\tinclude "kernels/math.cuh"\n#include "core/check.hpp"\n',
    "src/buffers/layout.cpp": '#include "shardopt/layout.hpp"\n#include "comm/impl.hpp"\n',
    "src/optimizer/state.hpp": '#pragma once\n#include "kernels/math.cuh"\n#include "shardopt/layout.hpp"\n',
    "src/optimizer/adam.cpp": '#include "shardopt/distributed_adam.hpp"\n#include "state.hpp"\n'
                              '#include "buffers/../core/check.hpp"\n',
}
# Quoted includes above that resolve to project files (edges):
#   dtype 1, communicator 1, fused_adam 1, distributed_adam 2, shardopt 2, check 1,
#   error.cpp 1, impl.hpp 2, impl.cpp 1, math.cuh 1, adam.cu 2, layout.cpp 2,
#   state.hpp 2, adam.cpp 3
CLEAN_FILES, CLEAN_EDGES = 16, 22


def run_checker(files, *extra, via_symlink=False):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "tree"
        for rel, text in files.items():
            p = root / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
        if via_symlink:  # check a tree reached through a symlinked root
            (Path(tmp) / "link").symlink_to(root, target_is_directory=True)
            root = Path(tmp) / "link"
        proc = subprocess.run([sys.executable, str(CHECKER), "--root", str(root), *extra],
                              capture_output=True, text=True)
        return proc.returncode, proc.stdout.splitlines(), proc.stderr


failures = []


def case(name, files, rc, lines=(), last=None, via_symlink=False):
    got_rc, out, err = run_checker(files, via_symlink=via_symlink)
    problems = []
    if got_rc != rc:
        problems.append(f"exit {got_rc}, want {rc}")
    for want in lines:
        if want not in out:
            problems.append(f"missing line: {want!r}")
    if last is not None and (not out or out[-1] != last):
        problems.append(f"last line {out[-1] if out else None!r}, want {last!r}")
    if problems:
        failures.append(name)
        print(f"FAIL {name}: " + "; ".join(problems))
        print("  output:\n    " + "\n    ".join(out) + (f"\n  stderr: {err}" if err else ""))
    else:
        print(f"ok   {name}")


def tree(**changes):
    t = dict(CLEAN)
    t.update(changes)
    return t


case("clean tree passes", CLEAN, 0, last=f"layering: ok ({CLEAN_FILES} files, {CLEAN_EDGES} edges)")

case("core includes an optimizer header",
     tree(**{"src/core/bad.cpp": '#include "core/check.hpp"\n\n#include "optimizer/state.hpp"\n'}), 1,
     ["src/core/bad.cpp:3: core includes optimizer/state.hpp (optimizer)",
      "cycle: core -> optimizer -> core",
      "  src/optimizer/adam.cpp:3: optimizer includes buffers/../core/check.hpp (core)"],
     "layering: 2 violations")

case("core includes an optimizer header, root through a symlink",
     tree(**{"src/core/bad.cpp": '#include "optimizer/state.hpp"\n'}), 1,
     ["src/core/bad.cpp:1: core includes optimizer/state.hpp (optimizer)"], via_symlink=True)

case("core includes a public optimizer header",
     tree(**{"src/core/bad.hpp": '#pragma once\n#include "shardopt/distributed_adam.hpp"\n'}), 1,
     ["src/core/bad.hpp:2: core includes shardopt/distributed_adam.hpp (optimizer)"])

case("comm includes kernels (siblings)",
     tree(**{"src/comm/impl.cpp": '#include "impl.hpp"\n#include "kernels/math.cuh"\n'}), 1,
     ["src/comm/impl.cpp:2: comm includes kernels/math.cuh (kernels) [siblings]"])

case("public kernels header includes a comm header (siblings)",
     tree(**{"include/shardopt/fused_adam.hpp": '#pragma once\n#include "shardopt/communicator.hpp"\n'}), 1,
     ["include/shardopt/fused_adam.hpp:2: kernels includes shardopt/communicator.hpp (comm) [siblings]"])

case("buffers <-> optimizer cycle",
     tree(**{"src/buffers/back.cpp": '#include "optimizer/state.hpp"\n'}), 1,
     ["src/buffers/back.cpp:1: buffers includes optimizer/state.hpp (optimizer)",
      "cycle: buffers -> optimizer -> buffers",
      "  src/buffers/back.cpp:1: buffers includes optimizer/state.hpp (optimizer)",
      "  src/optimizer/state.hpp:3: optimizer includes shardopt/layout.hpp (buffers)"],
     "layering: 2 violations")

FORMATS = {"src/formats/json.hpp": '#pragma once\n#include "core/check.hpp"\n',
           "src/optimizer/save.cpp": '#include "formats/json.hpp"\n#include "state.hpp"\n'}

case("formats: a room above core, used by the optimizer", tree(**FORMATS), 0,
     last=f"layering: ok ({CLEAN_FILES + 2} files, {CLEAN_EDGES + 3} edges)")

case("core includes formats",
     tree(**FORMATS, **{"src/core/bad.cpp": '#include "formats/json.hpp"\n'}), 1,
     ["src/core/bad.cpp:1: core includes formats/json.hpp (formats)"])

case("formats includes comm (siblings)",
     tree(**FORMATS, **{"src/formats/file.cpp": '#include "comm/impl.hpp"\n'}), 1,
     ["src/formats/file.cpp:1: formats includes comm/impl.hpp (comm) [siblings]"])

case("kernels includes formats (siblings)",
     tree(**FORMATS, **{"src/kernels/io.cpp": '#include "formats/json.hpp"\n'}), 1,
     ["src/kernels/io.cpp:1: kernels includes formats/json.hpp (formats) [siblings]"])

ROOMS = {"src/kernels/adam/adam_math.cuh": '#pragma once\n#include "kernels/common/convert.cuh"\n',
         "src/kernels/common/convert.cuh": '#pragma once\n#include "core/check.hpp"\n',
         "src/optimizer/step.cpp": '#include "kernels/adam/adam_math.cuh"\n'}

case("kernel rooms: subfolders of kernels are the kernels layer", tree(**ROOMS), 0,
     last=f"layering: ok ({CLEAN_FILES + 3} files, {CLEAN_EDGES + 3} edges)")

case("a room's file includes comm (siblings)",
     tree(**ROOMS, **{"src/kernels/adam/adam.cpp": '#include "comm/impl.hpp"\n'}), 1,
     ["src/kernels/adam/adam.cpp:1: kernels includes comm/impl.hpp (comm) [siblings]"])

case("comm includes a room's header (siblings)",
     tree(**ROOMS, **{"src/comm/impl.cpp": '#include "impl.hpp"\n#include "kernels/adam/adam_math.cuh"\n'}), 1,
     ["src/comm/impl.cpp:2: comm includes kernels/adam/adam_math.cuh (kernels) [siblings]"])

case("src file includes the umbrella header",
     tree(**{"src/optimizer/adam.cpp": '#include "shardopt/shardopt.hpp"\n'}), 1,
     ["src/optimizer/adam.cpp:1: optimizer includes shardopt/shardopt.hpp (api)"])

case("unknown src/ directory",
     tree(**{"src/fancy/thing.cpp": '#include "core/check.hpp"\n'}), 1,
     ["src/fancy/: error: unknown layer directory 'fancy' (add it to the LAYERS table)"])

case("public header missing from the table",
     tree(**{"include/shardopt/brand_new.hpp": "#pragma once\n"}), 1,
     ["include/shardopt/brand_new.hpp: error: public header 'brand_new.hpp' has no layer "
      "(add it to PUBLIC_HEADER_LAYER)"])

case("unresolvable public include",
     tree(**{"src/core/error.cpp": '#include "shardopt/missing.hpp"\n'}), 1,
     ['src/core/error.cpp:1: error: cannot resolve #include "shardopt/missing.hpp" (no such public header)'])

# --dot prints a graph; and the real tree runs to a verdict (it may have violations).
rc, out, err = run_checker(CLEAN, "--dot")
if rc != 0 or not out or out[0] != "digraph shardopt_layers {" or '  "buffers" -> "comm" [label="1"];' not in out:
    failures.append("--dot")
    print("FAIL --dot:\n    " + "\n    ".join(out) + err)
else:
    print("ok   --dot")
proc = subprocess.run([sys.executable, str(CHECKER)], capture_output=True, text=True)
if proc.returncode not in (0, 1) or not proc.stdout.splitlines()[-1:][0].startswith("layering: "):
    failures.append("repository tree")
    print(f"FAIL repository tree: exit {proc.returncode}\n{proc.stdout}{proc.stderr}")
else:
    print(f"ok   repository tree runs ({proc.stdout.splitlines()[-1]})")

print(f"{'FAILED: ' + ', '.join(failures) if failures else 'all passed'}")
sys.exit(1 if failures else 0)
