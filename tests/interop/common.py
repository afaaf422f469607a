"""Shared by the interop tests: arguments, running the remat tool, skipping, shard files."""
import argparse
import json
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
