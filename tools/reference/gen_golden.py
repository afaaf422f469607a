#!/usr/bin/python3
"""Writes PyTorch golden values for remat's op tests into tests/golden/<family>/<case>.safetensors.

Run with Debian's Python (it has python3-torch):  /usr/bin/python3 tools/reference/gen_golden.py [family ...]

Families are the modules of tools/reference/golden/ (basic, cnn, transformer, ...). Naming inside a
file: inputs by their argument names (x, w, b, ids, qkv, ...), outputs (y, loss, ...), the
upstream gradient dy (or dout), and gradients d<name> of inputs and parameters. Op
parameters go in the metadata. Values are generated from a fixed seed per case, so the
files are reproducible; they are small and committed.
"""
import importlib
import os
import pkgutil
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import golden  # noqa: E402
from golden import st  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "golden")


def main(argv):
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    families = [m.name for m in pkgutil.iter_modules(golden.__path__) if m.name != "st"]
    wanted = argv or families
    for fam in wanted:
        if fam not in families:
            sys.exit(f"gen_golden: no family {fam!r} (have {', '.join(sorted(families))})")
        mod = importlib.import_module(f"golden.{fam}")
        n = 0
        torch.manual_seed(0)
        for name, tensors, meta in mod.cases():
            st.save(os.path.join(OUT, fam, f"{name}.safetensors"), tensors, meta)
            n += 1
        print(f"gen_golden: {fam}: {n} case(s)")


if __name__ == "__main__":
    main(sys.argv[1:])
