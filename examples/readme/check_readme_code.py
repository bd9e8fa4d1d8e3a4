#!/usr/bin/env python3
"""Every ```cpp block of the README is code that compiles and runs: a marked excerpt of
one of the programs in examples/readme/, verbatim, and every excerpt is in the README.

    python3 examples/readme/check_readme_code.py README.md examples/readme/*.cpp

An excerpt NAME is the lines between `// [readme:NAME]` and `// [readme:end]` in a
program, each marked region dedented by its own common indentation; a program's regions
of one name, in file order, make one excerpt (so the README may leave out the toy
model's lines between them). Exit 1 with a diff when a block and its excerpt differ.
"""
import difflib
import re
import sys
import textwrap

MARK = re.compile(r"^\s*// \[readme:([a-z_0-9]+)\]\s*$")


def excerpts(path):
    """{name: text} of the marked regions of one source file."""
    out, name, region = {}, None, []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            m = MARK.match(line)
            if m and m.group(1) == "end":
                if name is None:
                    sys.exit(f"{path}:{n}: [readme:end] without a start")
                out[name] = out.get(name, "") + textwrap.dedent("".join(region))
                name, region = None, []
            elif m:
                if name is not None:
                    sys.exit(f"{path}:{n}: [readme:{m.group(1)}] inside [readme:{name}]")
                name = m.group(1)
            elif name is not None:
                region.append(line)
    if name is not None:
        sys.exit(f"{path}: [readme:{name}] is not closed")
    return out


def cpp_blocks(text):
    """The bodies of the ```cpp fenced blocks, in order."""
    return [m.group(1) for m in re.finditer(r"^```cpp\n(.*?)^```\s*$", text, re.S | re.M)]


def problems(readme_text, named):
    """What does not match: blocks that are no excerpt, excerpts missing from the README."""
    out = []
    blocks = cpp_blocks(readme_text)
    found = set()
    for i, block in enumerate(blocks, 1):
        hits = [k for k, v in named.items() if v == block]
        if hits:
            found.update(hits)
            continue
        # The closest excerpt, for the diff.
        key = max(named, key=lambda k: difflib.SequenceMatcher(None, named[k], block).ratio())
        diff = "".join(difflib.unified_diff(named[key].splitlines(True), block.splitlines(True),
                                            f"{key[0]} [readme:{key[1]}]", f"README ```cpp block {i}"))
        out.append(f"README ```cpp block {i} is not an excerpt of examples/readme:\n{diff}")
    for key in named:
        if key not in found:
            out.append(f"{key[0]} [readme:{key[1]}] is not in the README as a ```cpp block")
    return out


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    with open(argv[1], encoding="utf-8") as f:
        readme = f.read()
    named = {}
    for path in argv[2:]:
        for name, text in excerpts(path).items():
            named[(path.split("/")[-1], name)] = text
    if not named:
        sys.exit("no [readme:...] excerpts in " + " ".join(argv[2:]))
    failures = problems(readme, named)
    # The check itself: one changed character in a block must be found.
    blocks = cpp_blocks(readme)
    if blocks and not failures:
        mutated = readme.replace(blocks[0], blocks[0].replace("(", "[", 1), 1)
        if not problems(mutated, named):
            failures.append("self-check: a changed README block went unnoticed")
    for p in failures:
        print("FAIL:", p)
    if not failures:
        print(f"ok: {len(blocks)} ```cpp blocks of the README, each an excerpt of examples/readme "
              f"({', '.join(f'{k[0]}:{k[1]}' for k in named)})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
