#!/usr/bin/env python3
"""bench/peers/gpt_peer.py's data positions and schedule (no torch needed): the golden
window starts below are also asserted of the trainer's math::window_start in
test/unit/test_trainer_gpt.cpp (GptData.WindowStartsMatchThePeersGoldenValues), so the
peer reads the trainer's batches; the batch assembly and the lr schedule against their
definitions."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "peers"))
import gpt_peer  # noqa: E402

GOLDEN = [  # (seed, rank, step, microbatch, sequence, starts) -> start
    ((1234, 0, 0, 0, 0, 1000), 928),
    ((1234, 1, 5, 1, 3, 4568876), 488030),
    ((0xE7A15EED ^ 1234, 0, 2, 0, 7, 487893), 354179),
    ((7, 3, 123456, 2, 63, 97), 31),
]


def main():
    bad = 0
    for args, want in GOLDEN:
        got = gpt_peer.window_start(*args)
        if got != want:
            print(f"FAIL window_start{args} = {got}, want {want}")
            bad += 1
    data = (np.arange(500) % 37).astype(np.uint8)
    x, y = gpt_peer.batch(data, 9, 1, 4, 1, 3, 20)
    for j in range(3):
        s = gpt_peer.window_start(9, 1, 4, 1, j, 480)
        if not (np.array_equal(x[j], data[s:s + 20]) and np.array_equal(y[j], data[s + 1:s + 21])):
            print(f"FAIL batch window {j}")
            bad += 1
    ex, _ = gpt_peer.eval_batch(data, 9, 1, 2, 3, 20)
    s = gpt_peer.window_start(9 ^ 0xE7A15EED, 1, 2, 0, 0, 480)
    if not np.array_equal(ex[0], data[s:s + 20]):
        print("FAIL eval batch: the evaluation seed")
        bad += 1
    # warm-up then cosine (shardopt's LrSchedule::warmup_cosine).
    cases = [((1e-3, 1e-4, 100, 5000, 50), 5e-4), ((1e-3, 1e-4, 100, 5000, 100), 1e-3),
             ((1e-3, 1e-4, 100, 5000, 2550), 1e-4 + 9e-4 * 0.5), ((1e-3, 1e-4, 100, 5000, 5000), 1e-4)]
    for args, want in cases:
        if abs(gpt_peer.schedule_lr(*args) - want) > 1e-12:
            print(f"FAIL schedule_lr{args} = {gpt_peer.schedule_lr(*args)}, want {want}")
            bad += 1
    if bad:
        sys.exit(f"{bad} failure(s)")
    print("ok")


if __name__ == "__main__":
    main()
