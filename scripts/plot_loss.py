#!/usr/bin/env python3
"""Draws the loss curves of trainer runs (their --metrics JSON lines) one over the other.

    python3 scripts/plot_loss.py OUT.png LABEL=metrics.jsonl [LABEL=metrics.jsonl ...]

scripts/run_main.sh calls it with the uninterrupted run and the run resumed from its
halfway checkpoint: the resumed curve starts at the checkpoint's step and, resuming
exactly, lies on the first from there on.
"""
import json
import sys


def read(path):
    steps, losses = [], []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                if "loss" not in row:  # a validation row ({"step", "val_loss"})
                    continue
                steps.append(row["step"])
                losses.append(row["loss"])
    return steps, losses


def main(argv):
    if len(argv) < 3 or any("=" not in a for a in argv[2:]):
        sys.exit(__doc__)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    styles = [dict(linewidth=3, alpha=0.5), dict(linewidth=1.2, linestyle="--", marker=".", markersize=3)]
    for k, arg in enumerate(argv[2:]):
        label, path = arg.split("=", 1)
        steps, losses = read(path)
        ax.plot(steps, losses, label=label, **styles[k % len(styles)])
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title("example trainer: loss per step")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(argv[1], dpi=100)
    print(argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
