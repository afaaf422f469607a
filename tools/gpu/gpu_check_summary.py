#!/usr/bin/env python3
"""The summary of tools/gpu/gpu_check.sh: reads its work folder (stages.tsv, logs/ctest.log,
bench_kernels.json, runs/<model>_<policy>/metrics.jsonl, torch_<model>.json), prints the
tables and writes summary.json beside them.

    python3 tools/gpu/gpu_check_summary.py build/gpu-check [--tf32 1] [--torch-model gpt2_124m]

Step times are the median step_ms of a run's logged steps after the first five (the
allocator's cache and cuBLAS warm up there); the issue's targets are marked "met" or
"MISSED": memory-bound kernels >= 80% of peak bandwidth; bf16 GEMMs at GPT-2's shapes >= 60% of
the dense bf16 peak; for the GPT-2 model PyTorch times, sqrt <= 1.35 x none, selective <= 1.10 x
none, remat (none) <= PyTorch; its bf16 run (runs/<model>_bf16_none) <= PyTorch under
autocast bf16 (torch_<model>_bf16.json).
"""
import argparse
import json
import os
import re
import statistics
import sys

KERNEL_TARGET_PCT = 80.0
BF16_GEMM_TARGET_PCT = 60.0
# FlashAttention-2's forward TFLOP/s on an H100 80GB SXM5, causal, head dim 128, FP16, by
# sequence length (Shah et al. 2024, the FlashAttention-3 paper's forward benchmark): the reference the fused
# attention's bf16 forward is reported against.
FA2_H100_CAUSAL_D128_FWD = {1024: 260, 4096: 319}
RATIO_TARGETS = {"sqrt": 1.35, "selective": 1.10}
WARMUP_STEPS = 5


def read_stages(work):
    """The stages in the plan's order (plan.tsv: name, budget), each with its result from
    stages.tsv; a planned stage without one is "not reached" (the run was stopped first)."""
    done = {}
    path = os.path.join(work, "stages.tsv")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) == 4:
                    done[parts[0]] = {"stage": parts[0], "status": parts[1], "seconds": int(parts[2]), "rc": parts[3]}
    rows = []
    path = os.path.join(work, "plan.tsv")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) == 2:
                    row = done.pop(parts[0], {"stage": parts[0], "status": "not reached", "seconds": 0, "rc": "-"})
                    row["budget"] = int(parts[1])
                    rows.append(row)
    rows.extend(done.values())  # recorded but not planned (an older work folder)
    return rows


def ctest_counts(work):
    """Counts of ctest's result lines: `Test #12: name ....   Passed` / `***Skipped` / `***Failed` ..."""
    path = os.path.join(work, "logs", "ctest.log")
    if not os.path.exists(path):
        return None
    counts = {"passed": 0, "skipped": 0, "failed": 0}
    failed = []
    pat = re.compile(r"Test\s+#\d+: (.*?) \.{2,}\s*\**(Passed|Skipped|Not Run|\w+)")
    with open(path, errors="replace") as f:
        for line in f:
            m = pat.search(line)
            if not m:
                continue
            word = m.group(2)
            if word == "Passed":
                counts["passed"] += 1
            elif word == "Skipped":
                counts["skipped"] += 1
            else:
                counts["failed"] += 1
                failed.append(f"{m.group(1).split(' # ')[0]} ({word})")  # less gtest's "# GetParam() = ..."
    counts["failed_tests"] = failed
    return counts


def run_stats(path):
    steps = []
    with open(path) as f:
        for line in f:
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "step_ms" in r:
                steps.append(r)
    if not steps:
        return None
    later = [r for r in steps if r["step"] > WARMUP_STEPS] or steps
    return {
        "steps": steps[-1]["step"],
        "median_step_ms": statistics.median(r["step_ms"] for r in later),
        "timed_steps": len(later),
        "peak_bytes": max(r.get("peak_bytes", 0) for r in steps),
        "final_loss": steps[-1].get("loss"),
    }


def mark(ok):
    return "met" if ok else "MISSED"


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("work")
    ap.add_argument("--tf32", default="1")
    ap.add_argument("--torch-model", default="gpt2_124m")
    a = ap.parse_args(argv)
    out = {"tf32": a.tf32 == "1", "stages": read_stages(a.work)}

    print("== stages (status, seconds used / budget)")
    for s in out["stages"]:
        print(f"  {s['stage']:<34} {s['status']:<11} {s['seconds']:>4} s / {s.get('budget', '-'):>3}")

    ct = ctest_counts(a.work)
    out["ctest_gpu"] = ct
    print("\n== ctest -L gpu")
    if ct is None:
        print("  not run")
    else:
        print(f"  passed {ct['passed']}, skipped {ct['skipped']}, failed {ct['failed']}")
        for t in ct["failed_tests"][:20]:
            print(f"  FAILED {t}")

    print("\n== remat bench kernels")
    bench_path = os.path.join(a.work, "bench_kernels.json")
    if os.path.exists(bench_path):
        with open(bench_path) as f:
            bench = json.load(f)
        out["bench"] = bench
        print(f"  {bench.get('device_name')}: peak {bench.get('peak_gbps', 0):.0f} GB/s ({bench.get('peak_source')}); "
              f"L2 flush {'on' if bench.get('l2_flush') else 'off'}; timing {bench.get('timing')}")
        print(f"  {'kernel':<20} {'shape':<18} {'GB/s':>8} {'% peak':>7}  target >= {KERNEL_TARGET_PCT:.0f}%")
        for k in bench.get("kernels", []):
            if k.get("status") != "ok":
                print(f"  {k['name']:<20} {k['shape']:<18} {k.get('status'):>8}")
                continue
            pct = k.get("pct_peak")
            pct_s = f"{pct:6.1f}%" if pct is not None else "      -"
            target = mark(pct >= KERNEL_TARGET_PCT) if pct is not None else ""
            print(f"  {k['name']:<20} {k['shape']:<18} {k['gbps']:8.1f} {pct_s}  {target}")
        if bench.get("peak_bf16_tflops"):
            print(f"  bf16 GEMMs: % of the dense bf16 peak, {bench['peak_bf16_tflops']:.0f} TFLOP/s "
                  f"({bench.get('peak_bf16_source')}); target >= {BF16_GEMM_TARGET_PCT:.0f}% at GPT-2's shapes")
        for g in bench.get("gemm", []):
            shape = f"{g['m']}x{g.get('n', g['m'])}x{g.get('k', g['m'])}"
            if g.get("status") != "ok":
                print(f"  {g['name']:<20} {shape:<18} {g.get('status'):>8}")
                continue
            pct = g.get("pct_bf16_peak")
            pct_s = f"{pct:6.1f}%" if pct is not None else ""
            target = mark(pct >= BF16_GEMM_TARGET_PCT) if pct is not None and g["name"].startswith("gpt2_") else ""
            print(f"  {g['name']:<20} {shape:<18} {g['tflops']:8.2f} TFLOP/s {pct_s}  {target}")
        attention = bench.get("attention", [])
        if attention:
            print("  fused attention (causal; forward and forward + backward TFLOP/s); FlashAttention-2's forward at "
                  "head dim 128, causal, on an H100 SXM5: " +
                  ", ".join(f"{v} at T {k}" for k, v in sorted(FA2_H100_CAUSAL_D128_FWD.items())) + " TFLOP/s "
                  "(FlashAttention-3 paper, FP16)")
        for c in attention:
            shape = f"{c['b']}x{c['t']}x{c['h']}x{c['d']}"
            if c.get("status") != "ok":
                print(f"  {c['name']:<20} {shape:<18} {c.get('status'):>8}")
                continue
            ref = FA2_H100_CAUSAL_D128_FWD.get(c["t"]) if c["d"] == 128 and c["dtype"] == "bf16" else None
            of_fa2 = f"  {100.0 * c['forward_tflops'] / ref:5.1f}% of FA2's forward" if ref else ""
            print(f"  {c['name']:<20} {shape:<18} fwd {c['forward_tflops']:8.2f}  fwd+bwd "
                  f"{c['forward_backward_tflops']:8.2f} TFLOP/s{of_fa2}")
    else:
        print("  no bench_kernels.json")

    print(f"\n== training steps ({'TF32' if out['tf32'] else 'fp32'} GEMMs; median step after step {WARMUP_STEPS})")
    runs = {}
    runs_dir = os.path.join(a.work, "runs")
    for d in sorted(os.listdir(runs_dir)) if os.path.isdir(runs_dir) else []:
        mp = os.path.join(runs_dir, d, "metrics.jsonl")
        if os.path.exists(mp):
            st = run_stats(mp)
            if st:
                model, _, policy = d.rpartition("_")
                runs.setdefault(model, {})[policy] = st
    # PyTorch's step per remat model key: the fp32 (or TF32) step, and the autocast bf16 step
    # beside remat's bf16 run of the same model.
    torch_by_model = {}
    for key, suffix in ((a.torch_model, ""), (a.torch_model + "_bf16", "_bf16")):
        tp = os.path.join(a.work, f"torch_{a.torch_model}{suffix}.json")
        if os.path.exists(tp):
            with open(tp) as f:
                torch_by_model[key] = json.load(f).get("median_ms")
    torch_ms = torch_by_model.get(a.torch_model)
    out["runs"] = runs
    out["torch"] = {"model": a.torch_model, "median_step_ms": torch_ms,
                    "bf16_median_step_ms": torch_by_model.get(a.torch_model + "_bf16")}
    print(f"  {'model':<18} {'policy':<10} {'step ms':>9} {'x none':>7} {'peak MiB':>9} {'loss':>8} {'x PyTorch':>10}")
    for model, by_policy in runs.items():
        base = by_policy.get("none", {}).get("median_step_ms")
        for policy, st in by_policy.items():
            ms = st["median_step_ms"]
            ratio = ms / base if base else None
            st["ratio_to_none"] = ratio
            t_ms = torch_by_model.get(model)
            vs_torch = ms / t_ms if t_ms else None
            st["ratio_to_torch"] = vs_torch
            notes = []
            if model == a.torch_model and ratio is not None and policy in RATIO_TARGETS:
                notes.append(f"x none <= {RATIO_TARGETS[policy]}: {mark(ratio <= RATIO_TARGETS[policy])}")
            if vs_torch is not None and policy == "none":
                notes.append(f"<= PyTorch: {mark(vs_torch <= 1.0)}")
            ratio_s = f"{ratio:7.3f}" if ratio is not None else "      -"
            torch_s = f"{vs_torch:10.3f}" if vs_torch is not None else "         -"
            loss = st["final_loss"]
            print(f"  {model:<18} {policy:<10} {ms:9.2f} {ratio_s} {st['peak_bytes'] / 2**20:9.1f} "
                  f"{loss if loss is not None else float('nan'):8.4f} {torch_s}  {'; '.join(notes)}")
    if not runs:
        print("  no runs")
    if torch_ms:
        print(f"  PyTorch eager {a.torch_model}: {torch_ms:.2f} ms/step (median)")
    if torch_by_model.get(a.torch_model + "_bf16"):
        print(f"  PyTorch eager {a.torch_model} bf16 (autocast): "
              f"{torch_by_model[a.torch_model + '_bf16']:.2f} ms/step (median)")

    with open(os.path.join(a.work, "summary.json"), "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    bad = [s["stage"] for s in out["stages"] if s["status"] != "ok"]
    print(f"\n== {len(out['stages']) - len(bad)} stage(s) ok" + (f"; not ok: {', '.join(bad)}" if bad else ""))


if __name__ == "__main__":
    main(sys.argv[1:])
