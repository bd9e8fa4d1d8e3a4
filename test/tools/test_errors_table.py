#!/usr/bin/env python3
"""Checks docs/errors.md against the public headers and the test sources.

Every line of include/shardopt/*.hpp (but error.hpp, which defines the codes) that
promises an error (Error(Code), "throws", "refused", "Error on every rank", ...) must be
covered by a row of docs/errors.md: a row quotes the header's comment text (the quote is
searched in the header with comment markers removed and whitespace collapsed, and covers
the lines it spans). Each code named as Error(Code) on a covered line must be among the
codes of a promise row covering that line. Every test a row names must exist: the file,
and in it a TEST/TEST_F/TEST_P(Suite, Name) (or TEST(Suite, Name) inside a macro that
some test source instantiates with Suite), or a "literal" the file contains. A row for a
collective call must name at least one test that runs under mpiexec (test/mpi/ or
test/common/). So a new promise, a changed one or a renamed test fails this check.

Usage: test_errors_table.py [--root DIR]   (exit 0: consistent, 1: findings listed)
       test_errors_table.py --selftest     (the check fails on broken copies)
"""
import argparse
import os
import re
import shutil
import sys
import tempfile

CODES = {"InvalidArgument", "OutOfRange", "LayoutMismatch", "InvalidState", "CaptureRefused", "Unsupported",
         "Cuda", "Nccl", "Mpi", "Timeout", "OutOfMemory", "Internal"}
TRIGGER = re.compile(r"Error\(|\bthrows?\b|\bRethrows\b|\brefuse[sd]?\b|\ban error\b|\bError on every rank\b")
CODE_MENTION = re.compile(r"Error\((\w+)\)")
TEST_CELL = re.compile(r"`([^`]+)`\s*`([^`]+)`")


def comment_text(line):
    """The text of a header line with comment markers removed."""
    s = line.strip()
    for marker in ("///<", "///", "//"):
        if s.startswith(marker):
            return s[len(marker):].strip()
    i = s.find("///<")
    if i >= 0:
        return s[i + 4:].strip()
    return s


class Header:
    def __init__(self, path):
        self.name = os.path.basename(path)
        with open(path, encoding="utf-8") as f:
            self.lines = f.read().split("\n")
        self.text = ""
        self.line_of = []  # line number (1-based) of each character of self.text
        for n, line in enumerate(self.lines, start=1):
            t = " ".join(comment_text(line).split())
            if not t:
                continue
            if self.text:
                self.text += " "
                self.line_of.append(n)
            self.text += t
            self.line_of.extend([n] * len(t))

    def lines_of_quote(self, quote):
        """Line numbers every occurrence of `quote` spans (empty when absent)."""
        q = " ".join(quote.split())
        found = set()
        start = self.text.find(q)
        while start >= 0 and q:
            found.update(self.line_of[start:start + len(q)])
            start = self.text.find(q, start + 1)
        return found

    def promise_lines(self):
        """(line number, codes named on it) of every line that mentions an error."""
        out = []
        for n, line in enumerate(self.lines, start=1):
            t = comment_text(line)
            if line.strip().startswith("#include"):
                continue
            if TRIGGER.search(t):
                out.append((n, set(CODE_MENTION.findall(t)) & CODES))
        return out


def split_row(line):
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    return cells


def parse_table(md_path):
    """Promise rows and no-promise rows of docs/errors.md."""
    promises, others = [], []
    section = None
    with open(md_path, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if line.startswith("## "):
                section = "none" if "promise no error" in line.lower() else "rows"
                continue
            if not line.startswith("|") or re.match(r"^\|\s*[-:]", line) or line.startswith("| Header"):
                continue
            cells = split_row(line)
            quotes = re.findall(r"\"([^\"]+)\"", cells[1]) if len(cells) > 1 else []
            header = cells[0].strip("` ")
            if section == "none":
                others.append({"line": n, "header": header, "quotes": quotes})
            elif len(cells) == 7:
                codes = set(re.findall(r"\w+", cells[4])) & CODES
                promises.append({"line": n, "header": header, "quotes": quotes, "codes": codes,
                                 "scope": cells[5].lower(), "tests": TEST_CELL.findall(cells[6]),
                                 "raw_tests": cells[6]})
            else:
                promises.append({"line": n, "header": header, "bad": "expected 7 cells, got %d" % len(cells)})
    return promises, others


def instantiated_suites(root):
    suites = set()
    for d, _, files in os.walk(os.path.join(root, "test")):
        for fn in files:
            if fn.endswith((".cpp", ".hpp", ".cu")):
                with open(os.path.join(d, fn), encoding="utf-8", errors="replace") as f:
                    suites.update(re.findall(r"^\s*SHARDOPT_\w+_CASES\(\s*(\w+)\s*,", f.read(), re.M))
    return suites


def check_test(root, path, name, suites):
    full = os.path.join(root, path)
    if not os.path.isfile(full):
        return "test file %s does not exist" % path
    with open(full, encoding="utf-8", errors="replace") as f:
        src = f.read()
    if name.startswith('"') and name.endswith('"'):
        return None if name[1:-1] in src else "%s does not contain %s" % (path, name)
    m = re.fullmatch(r"(\w+)\.(\w+)", name)
    if not m:
        return "test name %r is neither Suite.Name nor a \"literal\"" % name
    suite, test = m.groups()
    for found in re.findall(r"TEST(?:_F|_P)?\(\s*(\w+)\s*,\s*" + test + r"\s*\)", src):
        if found == suite or (found == "Suite" and suite in suites):
            return None
    return "%s has no test %s" % (path, name)


def check(root):
    problems = []
    md = os.path.join(root, "docs", "errors.md")
    inc = os.path.join(root, "include", "shardopt")
    promises, others = parse_table(md)
    headers = {fn: Header(os.path.join(inc, fn)) for fn in sorted(os.listdir(inc))
               if fn.endswith(".hpp") and fn != "error.hpp"}
    suites = instantiated_suites(root)
    covered = {}  # (header, line) -> list of (is_promise, codes)
    for row in promises + others:
        is_promise = "codes" in row or "bad" in row
        if "bad" in row:
            problems.append("docs/errors.md:%d: %s" % (row["line"], row["bad"]))
            continue
        h = headers.get(row["header"])
        if h is None:
            problems.append("docs/errors.md:%d: no public header %r" % (row["line"], row["header"]))
            continue
        if not row["quotes"]:
            problems.append("docs/errors.md:%d: the row quotes nothing of %s" % (row["line"], row["header"]))
        for q in row["quotes"]:
            lines = h.lines_of_quote(q)
            if not lines:
                problems.append("docs/errors.md:%d: %s does not say \"%s\"" % (row["line"], row["header"], q))
            for n in lines:
                covered.setdefault((row["header"], n), []).append((is_promise, row.get("codes", set())))
        if not is_promise:
            continue
        if not row["codes"]:
            problems.append("docs/errors.md:%d: the row names no error code" % row["line"])
        if row["scope"] not in ("local", "collective"):
            problems.append("docs/errors.md:%d: scope must be local or collective, not %r" % (row["line"], row["scope"]))
        if not row["tests"]:
            problems.append("docs/errors.md:%d: the row names no test" % row["line"])
        for path, name in row["tests"]:
            err = check_test(root, path, name, suites)
            if err:
                problems.append("docs/errors.md:%d: %s" % (row["line"], err))
        if row["scope"] == "collective" and not any(p.startswith(("test/mpi/", "test/common/")) for p, _ in row["tests"]):
            problems.append("docs/errors.md:%d: a collective call needs a test run under mpiexec (test/mpi/ or "
                            "test/common/)" % row["line"])
    for name, h in headers.items():
        for n, codes in h.promise_lines():
            rows = covered.get((name, n))
            where = "include/shardopt/%s:%d" % (name, n)
            if not rows:
                problems.append("%s promises an error that docs/errors.md does not list: %s" % (where, h.lines[n - 1].strip()))
                continue
            if not any(p for p, _ in rows):
                continue  # listed as a mention that promises no error
            listed = set().union(*(c for p, c in rows if p))
            for c in sorted(codes - listed):
                problems.append("%s names Error(%s) but no row covering the line has that code" % (where, c))
    return problems


def selftest(root):
    """The check passes on the tree and fails on each broken copy."""
    ok = True
    if check(root):
        print("selftest: the tree itself fails the check")
        return False
    def broken(edit):
        tmp = tempfile.mkdtemp(prefix="errors-table-")
        try:
            for sub in ("docs", "include", "test"):
                shutil.copytree(os.path.join(root, sub), os.path.join(tmp, sub))
            edit(tmp)
            return check(tmp)
        finally:
            shutil.rmtree(tmp)
    def new_promise(tmp):
        with open(os.path.join(tmp, "include", "shardopt", "dtype.hpp"), "a", encoding="utf-8") as f:
            f.write("/// Throws Error(Timeout) when the moon is full.\n")
    def drop_row(tmp):
        p = os.path.join(tmp, "docs", "errors.md")
        with open(p, encoding="utf-8") as f:
            lines = f.readlines()
        lines = [l for l in lines if "parse_dtype" not in l]
        with open(p, "w", encoding="utf-8") as f:
            f.writelines(lines)
    def rename_test(tmp):
        p = os.path.join(tmp, "test", "unit", "test_documented_errors.cpp")
        with open(p, encoding="utf-8") as f:
            s = f.read()
        with open(p, "w", encoding="utf-8") as f:
            f.write(s.replace("ParseDtypeRefusesUnknownNames", "Renamed"))
    def wrong_code(tmp):
        p = os.path.join(tmp, "docs", "errors.md")
        with open(p, encoding="utf-8") as f:
            s = f.read()
        with open(p, "w", encoding="utf-8") as f:
            f.write(s.replace("| Unsupported | local | `test/unit/test_errors.cpp` `BackendEnv.",
                              "| InvalidState | local | `test/unit/test_errors.cpp` `BackendEnv."))
    for label, edit, expect in (("a new promise", new_promise, "Error(Timeout)"),
                                ("a row with another code", wrong_code, "names Error(Unsupported)"),
                                ("a dropped row", drop_row, "include/shardopt/dtype.hpp:"),
                                ("a renamed test", rename_test, "ParseDtypeRefusesUnknownNames")):
        found = broken(edit)
        if not any(expect in p for p in found):
            print("selftest: %s was not caught (findings: %s)" % (label, found))
            ok = False
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    ap.add_argument("--selftest", action="store_true")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    if args.selftest:
        ok = selftest(root)
        print("selftest: " + ("PASS" if ok else "FAIL"))
        return 0 if ok else 1
    problems = check(root)
    for p in problems:
        print(p)
    print("errors table: %s" % ("OK" if not problems else "%d finding(s)" % len(problems)))
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
