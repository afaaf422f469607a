#!/usr/bin/env python3
"""llm.c token shards end to end (numpy only).

tools/data/make_shards.py and an independent writer (numpy, as llm.c's data_common.py writes
them) produce the same files from the same text; remat reads every window of both as the
tokens the numpy side holds (remat eval --save-logits records the ids it read); remat train
splits a set by file name; damaged files are errors naming the file and field.
"""
import os
import sys

from common import ROOT, TINY_CONFIG, check, parse_args, read_safetensors, run, skip

try:
    import numpy as np
except ImportError as e:
    skip(f"numpy is not importable from {sys.executable} ({e}); tools/bootstrap.sh installs python3-numpy")

SEQ = 32  # tests/configs/gpt2_tiny.json's seq_len


def numpy_shard(path, tokens):
    header = np.zeros(256, dtype="<i4")
    header[0], header[1], header[2] = 20240520, 1, len(tokens)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype="<u2").tobytes())


def main():
    args = parse_args(__doc__)
    w = args.work
    # A text with multi-byte UTF-8, from a fixed generator.
    words = ["remat", "checkpoint", "tensor", "grüße", "naïve", "—", "λ", "shard", "token", "GPT-2", "\n"]
    state, text = 12345, []
    for _ in range(6000):
        state = (1103515245 * state + 12345) % 2**31
        text.append(words[state % len(words)])
    text = " ".join(text)
    src = os.path.join(w, "corpus.txt")
    with open(src, "w", encoding="utf-8") as f:
        f.write(text)

    os.makedirs(os.path.join(w, "a"))
    out = run([sys.executable, os.path.join(ROOT, "tools", "data", "make_shards.py"), src, "--out", os.path.join(w, "a", "s"),
               "--val-tokens", "3001", "--shard-tokens", "20000"])
    print(out, end="")
    tokens = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)
    os.makedirs(os.path.join(w, "b"))
    numpy_shard(os.path.join(w, "b", "s_val_000000.bin"), tokens[:3001])
    rest = tokens[3001:]
    for k in range(0, len(rest), 20000):
        numpy_shard(os.path.join(w, "b", f"s_train_{k // 20000 + 1:06d}.bin"), rest[k:k + 20000])
    names_a, names_b = sorted(os.listdir(os.path.join(w, "a"))), sorted(os.listdir(os.path.join(w, "b")))
    check(names_a == names_b and len(names_a) >= 3, f"the same shard files from both writers: {names_a}")
    for n in names_a:
        with open(os.path.join(w, "a", n), "rb") as fa, open(os.path.join(w, "b", n), "rb") as fb:
            check(fa.read() == fb.read(), f"{n}: make_shards.py and the numpy writer wrote the same bytes")

    # remat reads both sets' files as the numpy tokens: every window, in one batch.
    for n in names_b:
        seg = tokens[:3001] if "_val_" in n else rest[(int(n[-10:-4]) - 1) * 20000:][:20000]
        windows = (len(seg) - 1) // SEQ
        want_in = np.stack([seg[i * SEQ:(i + 1) * SEQ] for i in range(windows)]).astype(np.int32)
        want_tg = np.stack([seg[i * SEQ + 1:(i + 1) * SEQ + 1] for i in range(windows)]).astype(np.int32)
        got = []
        for side in "ab":
            dump = os.path.join(w, f"{side}_{n}.safetensors")
            run([args.remat, "eval", TINY_CONFIG, "--data", os.path.join(w, side, n), "--batch", windows,
                 "--device", "cpu", "--save-logits", dump, "--quiet"])
            got.append(read_safetensors(dump))
        check(all((g["input_ids"] == want_in).all() and (g["targets"].reshape(windows, SEQ) == want_tg).all() for g in got),
              f"{n}: remat read {windows} windows of {SEQ} tokens (+ targets) from both files as written")

    # A set is split by name: the val file evaluates, the train files train.
    out = run([args.remat, "train", TINY_CONFIG, "--data", os.path.join(w, "a"), "--steps", "1", "--device", "cpu"])
    n_train = len(rest)
    check(f"data: train: {n_train} tokens in {len(names_a) - 1} files" in out and "eval: 3001 tokens in 1 file" in out,
          "remat train split the set by name (data line: " + next(l for l in out.splitlines() if l.startswith("data:")) + ")")

    # Damaged files: an error naming the file and the field, exit status 1.
    bad = os.path.join(w, "bad_train.bin")
    good = open(os.path.join(w, "a", names_a[-1]), "rb").read()
    cases = [
        (b"\x01\x00\x00\x00" + good[4:], "header field 0 (magic) is 1, expected 20240520"),
        (good[:4] + b"\x02\x00\x00\x00" + good[8:], "header field 1 (version) is 2, expected 1"),
        (good[:-1], "truncated?"),
        (good[:700], "shorter than the header"),
    ]
    for data, msg in cases:
        with open(bad, "wb") as f:
            f.write(data)
        err = run([args.remat, "eval", TINY_CONFIG, "--data", bad, "--device", "cpu"], expect_rc=1)
        check(f"remat: error: {bad}: not a token shard: " in err and msg in err, f"damaged shard refused: {msg}")
    print("interop shards: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
