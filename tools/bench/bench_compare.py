#!/usr/bin/env python3
"""Prints a markdown table of remat/PyTorch time ratios from `remat bench ops --json A`
and `tools/bench/bench_torch.py --json B` (measured side by side, same thread count)."""
import json
import sys

a = json.load(open(sys.argv[1]))
b = json.load(open(sys.argv[2]))
print(f"| case | remat ms | PyTorch ms | remat / PyTorch |\n|---|---:|---:|---:|")
for name, ms in a["cases"].items():
    t = b["cases"].get(name)
    if t is None:
        continue
    print(f"| {name} | {ms:.2f} | {t:.2f} | {ms / t:.2f} |")
