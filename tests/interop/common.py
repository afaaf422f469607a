"""Shared by the interop tests: arguments, running the remat tool, skipping, shard files."""
import argparse
import json
import math
import os
import shutil
import struct
import subprocess
import sys

SKIP = 77  # ctest's SKIP_RETURN_CODE for these tests
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TINY_CONFIG = os.path.join(ROOT, "tests", "configs", "gpt2_tiny.json")


def skip(reason):
    print(f"SKIPPED: {reason}")
    sys.exit(SKIP)


def parse_args(description):
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--remat", required=True, help="the remat executable")
    ap.add_argument("--work", required=True, help="a scratch folder (emptied first)")
    args = ap.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    return args


def run(cmd, expect_rc=0):
    """Runs a command; returns its stdout. A different exit status fails the test."""
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if p.returncode != expect_rc:
        sys.exit(f"FAILED: {' '.join(map(str, cmd))}\nexit {p.returncode} (expected {expect_rc})\n"
                 f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p.stdout + p.stderr if expect_rc else p.stdout


def check(cond, message):
    if not cond:
        sys.exit(f"FAILED: {message}")
    print(f"ok: {message}")


def read_safetensors(path):
    """name -> numpy array, for F32 and I32 tensors (a reader of our own, numpy only)."""
    import numpy as np
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        dt = {"F32": "<f4", "I32": "<i4"}[e["dtype"]]
        b, en = e["data_offsets"]
        out[name] = np.frombuffer(data[8 + n + b:8 + n + en], dtype=dt).reshape(e["shape"])
    return out


def tiny_config(work, name="gpt2_tiny.json", dropout=None, **sections):
    """tests/configs/gpt2_tiny.json with dropout set to `dropout` and sections updated."""
    with open(TINY_CONFIG) as f:
        c = json.load(f)

    def walk(layers):
        for l in layers:
            if l["type"] == "repeat":
                walk(l["layers"])
            elif dropout is not None and l["type"] == "dropout":
                l["p"] = dropout
            elif dropout is not None and l["type"] == "attention":
                l["dropout"] = dropout
    walk(c["model"]["layers"])
    for k, v in sections.items():
        c[k].update(v)
    path = os.path.join(work, name)
    with open(path, "w") as f:
        json.dump(c, f, indent=2)
    return path, c


def bitwise(a, b):
    """Names whose tensors differ in any bit (or are missing on one side)."""
    import numpy as np
    bad = sorted(set(a) ^ set(b))
    for k in set(a) & set(b):
        if a[k].shape != b[k].shape or a[k].astype(np.float32).tobytes() != b[k].astype(np.float32).tobytes():
            bad.append(k)
    return bad


def cosine_lr(step, total, lr, warmup, min_ratio):
    """docs/config.md's warm-up + cosine schedule, written out again."""
    if step <= warmup:
        return lr * step / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    floor = lr * min_ratio
    return floor + (lr - floor) * 0.5 * (1 + math.cos(math.pi * t))


def remat_losses(run_dir):
    """The training losses of a remat run, from its metrics.jsonl."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [r["loss"] for r in map(json.loads, f) if "loss" in r]


def train_like_remat(model, shards, seq, batch, steps, vocab, opt, clip, lr_of_step):
    """Trains a transformers model as remat train does with shuffle off: the train shards'
    windows of seq + 1 tokens in file order, `batch` per step, cross-entropy on the next
    tokens, gradients clipped to `clip`, the learning rate lr_of_step(step). Returns the losses."""
    import numpy as np
    import torch
    wins = []
    for n in sorted(os.listdir(shards)):
        if "_train_" in n:
            t = np.fromfile(os.path.join(shards, n), dtype="<u2", offset=1024).astype(np.int64)
            wins += [t[i * seq:(i + 1) * seq + 1] for i in range((len(t) - 1) // seq)]
    model.train()
    losses = []
    for step in range(1, steps + 1):
        b = torch.from_numpy(np.stack(wins[(step - 1) * batch:step * batch]))
        logits = model(b[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), b[:, 1:].reshape(-1))
        losses.append(loss.item())
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        for g in opt.param_groups:
            g["lr"] = lr_of_step(step)
        opt.step()
    return losses


def print_losses(remat, hf):
    diffs = [abs(x - y) for x, y in zip(remat, hf)]
    print("losses remat        " + " ".join(f"{x:.7f}" for x in remat))
    print("losses transformers " + " ".join(f"{x:.7f}" for x in hf))
    print("differences         " + " ".join(f"{x:.1e}" for x in diffs))
    return max(diffs) if diffs else float("inf")
