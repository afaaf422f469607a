#!/usr/bin/python3
"""Step time and peak memory of a GPT (d 256, 8 heads, 6 blocks, synthetic tokens) on the
CPU at several sequence lengths, with and without attention dropout: remat with its fused
attention and with the materialised one, against PyTorch's twin of the same model with
scaled_dot_product_attention (SDPA) and with the explicit matmul-softmax. For
docs/performance.md; a benchmark, never run in CI.

    tools/bench/bench_attention.py --remat build/default/remat --python VENV/bin/python \\
        [--points 256:16,1024:4,4096:1] [--dropout 0,0.1] [--steps 6] [--threads 2] [--json out.json]

VENV is a virtual environment with a current PyTorch from PyPI (`python3 -m venv VENV &&
VENV/bin/pip install torch numpy`; SDPA needs torch >= 2.0). Each point runs, one after the
other: `remat memprof --device cpu` (the measured peak of one step), `remat train` (the
median step time after the first), tools/reference/torch_reference.py time and tools/reference/torch_memory.py
for each PyTorch attention. Peaks are tensors allocated at the step's peak (parameters,
gradients, optimizer state, activations, the batch); "above the model" subtracts the
parameters, gradients and AdamW moments (16 bytes per parameter).
"""
import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

BASE = {
    "name": "bench_attention",
    "model": {
        "input": {"type": "tokens", "seq_len": 256},
        "layers": [
            {"type": "embedding", "name": "embed", "vocab": "$vocab", "dim": 256, "positions": 256, "init_std": 0.02},
            {"type": "dropout", "name": "embed_drop", "p": 0.0},
            {"type": "repeat", "name": "h", "count": 6, "layers": [
                {"type": "layernorm", "name": "ln1"},
                {"type": "linear", "name": "qkv", "out_features": 768, "init_std": 0.02},
                {"type": "attention", "name": "attn", "heads": 8, "dropout": 0.0},
                {"type": "linear", "name": "proj", "out_features": 256, "init_std": 0.02},
                {"type": "dropout", "name": "drop1", "p": 0.0},
                {"type": "add", "name": "res1", "inputs": ["in", "drop1"]},
                {"type": "layernorm", "name": "ln2"},
                {"type": "linear", "name": "fc", "out_features": 1024, "init_std": 0.02},
                {"type": "gelu", "name": "act", "approximate": "tanh"},
                {"type": "linear", "name": "fc2", "out_features": 256, "init_std": 0.02},
                {"type": "dropout", "name": "drop2", "p": 0.0},
                {"type": "add", "name": "res2", "inputs": ["res1", "drop2"]},
            ]},
            {"type": "layernorm", "name": "ln_f"},
            {"type": "linear", "name": "head", "out_features": "$vocab", "bias": False, "tie_weight": "embed"},
        ],
    },
    "data": {"dataset": "synthetic_text", "vocab": 64, "synthetic_size": 200000, "shuffle": False},
    "optimizer": {"type": "adamw", "lr": 0.0003, "weight_decay": 0.1},
    "schedule": {"type": "constant"},
    "training": {"batch": 16, "steps": 6, "policy": "none", "log_every": 1, "eval_every": 0},
}


def config(seq, batch, dropout, impl, steps):
    c = copy.deepcopy(BASE)
    c["model"]["input"]["seq_len"] = seq
    layers = c["model"]["layers"]
    layers[0]["positions"] = seq
    layers[1]["p"] = dropout
    for spec in layers[2]["layers"]:
        if spec["type"] == "dropout":
            spec["p"] = dropout
        if spec["type"] == "attention":
            spec["dropout"] = dropout
            spec["impl"] = impl
    c["training"].update(batch=batch, steps=steps)
    c["data"]["synthetic_size"] = max(200000, 2 * batch * (seq + 1) * (steps + 2))
    return c


def run(cmd, env=None):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return r.stdout


def remat_point(a, path, tmp, tag):
    out = os.path.join(tmp, f"{tag}.memprof.json")
    run([a.remat, "memprof", path, "--device", "cpu", "--policy", "none", "--json", out])
    prof = json.load(open(out))["policies"][0]
    run_dir = os.path.join(tmp, f"{tag}.run")
    run([a.remat, "train", path, "--device", "cpu", "--out", run_dir, "--quiet"])
    ms = [r["step_ms"] for r in map(json.loads, open(os.path.join(run_dir, "metrics.jsonl")))
          if "step_ms" in r and r.get("step", 0) > 1]
    return {"peak_bytes": prof["measured_peak_bytes"], "step_ms": statistics.median(ms)}


def torch_point(a, path, tmp, tag, attention):
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    tj, mj = os.path.join(tmp, f"{tag}.{attention}.time.json"), os.path.join(tmp, f"{tag}.{attention}.mem.json")
    run([a.python, os.path.join(HERE, "..", "reference", "torch_reference.py"), "time", path, "--steps", str(a.steps),
         "--threads", str(a.threads), "--attention", attention, "--json", tj], env)
    run([a.python, os.path.join(HERE, "..", "reference", "torch_memory.py"), path, "--threads", str(a.threads), "--attention", attention,
         "--json", mj], env)
    return {"peak_bytes": json.load(open(mj))["peak_bytes"], "step_ms": json.load(open(tj))["median_ms"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--remat", required=True, help="the remat binary")
    ap.add_argument("--python", required=True, help="a Python with torch >= 2.0")
    ap.add_argument("--points", default="256:16,1024:4,4096:1", help="T:batch,...")
    ap.add_argument("--dropout", default="0,0.1")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for point in a.points.split(","):
            seq, batch = (int(x) for x in point.split(":"))
            for p in (float(x) for x in a.dropout.split(",")):
                row = {"seq_len": seq, "batch": batch, "dropout": p}
                for impl in ("fused", "materialized"):
                    path = os.path.join(tmp, f"t{seq}_b{batch}_p{p}_{impl}.json")
                    with open(path, "w") as f:
                        json.dump(config(seq, batch, p, impl, a.steps), f)
                    row["remat_" + impl] = remat_point(a, path, tmp, os.path.basename(path))
                    if impl == "fused":
                        for attention in ("sdpa", "explicit"):
                            row["torch_" + attention] = torch_point(a, path, tmp, os.path.basename(path), attention)
                # The model grows with T (its position embedding): count it at each point.
                out = run([a.remat, "memprof", path, "--policy", "none"])
                params = int(out.split(" parameters")[0].split()[-1])
                row["parameters"] = params
                rows.append(row)
                model = 16 * params  # parameters, gradients, two AdamW moments
                cells = "  ".join(f"{k} {v['step_ms']:8.1f} ms {v['peak_bytes'] / 2**20:8.1f} MiB "
                                  f"({(v['peak_bytes'] - model) / 2**20:7.1f} above the model)"
                                  for k, v in row.items() if isinstance(v, dict))
                print(f"T {seq:5d} batch {batch:3d} dropout {p:.1f}: {cells}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"threads": a.threads, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
