#!/usr/bin/env python3
"""Data parallel on cpu: the reduction's buckets overlapped with the backward sweep against
the reduction after it, side by side (docs/distributed.md, "Overlap, measured").

    tools/bench/bench_overlap.py [--remat build/default/remat] [--config models/gpt_char.json]
                           [--ranks 2] [--rounds 5] [--steps 30] [--skip 5] [--bucket-kib 512]

Each round runs `mpirun -np RANKS remat train CONFIG --overlap off` then `--overlap on`
(then the other order in the next round, so that a drift of the machine's load falls on
both), after one warm-up run, one thread per rank, every step logged. Per run: the median step time and the
medians of rank 0's communication per step (time in flight, time waited for) over the
steps after the first SKIP. Printed: each round's figures and on/off ratio, then the
medians over the rounds. On a shared machine compare ratios, not times.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def run(a, work, overlap, k):
    out = os.path.join(work, f"run{k}_{overlap}")
    cmd = [a.mpirun, "-np", str(a.ranks), "--bind-to", "core", a.remat, "train", a.derived, "--device", "cpu",
           "--steps", str(a.steps), "--overlap", overlap, "--bucket-kib", str(a.bucket_kib), "--out", out, "--quiet"]
    env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    step_ms, comm_ms, wait_ms = {}, {}, {}
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            s = r.get("step", 0)
            if s <= a.skip:
                continue
            if "step_ms" in r:
                step_ms[s] = r["step_ms"]
            if "comm_ms" in r:
                comm_ms[s], wait_ms[s] = r["comm_ms"], r["comm_wait_ms"]
    med = statistics.median
    return {"step_ms": med(step_ms.values()), "comm_ms": med(comm_ms.values()), "wait_ms": med(wait_ms.values())}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--remat", default="build/default/remat")
    p.add_argument("--mpirun", default="mpirun")
    p.add_argument("--config", default="models/gpt_char.json")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--skip", type=int, default=5, help="steps left out of the medians (warm-up)")
    p.add_argument("--bucket-kib", type=int, default=512)
    a = p.parse_args()
    work = tempfile.mkdtemp(prefix="remat_overlap_")
    cfg = json.load(open(a.config))
    t = cfg.setdefault("training", {})
    t.update({"log_every": 1, "eval_batches": 1, "sample_length": 0, "eval_every": 0, "checkpoint_every": 0})
    a.derived = os.path.join(work, "config.json")
    json.dump(cfg, open(a.derived, "w"))
    print(f"{a.config}: {a.ranks} ranks x 1 thread, {a.steps} steps (medians after step {a.skip}), "
          f"buckets of {a.bucket_kib} KiB, {a.rounds} rounds; load average {os.getloadavg()[0]:.1f}")
    print(f"{'round':>5} | {'off ms/step':>11} {'on ms/step':>10} {'on/off':>6} | "
          f"{'off comm/wait ms':>16} | {'on comm/wait ms':>15} {'hidden':>6}")
    run(a, work, "off", -1)  # warm-up, not counted (the first run of a series was often the fastest here)
    ratios, hidden, off_share, on_share = [], [], [], []
    for k in range(a.rounds):
        order = ["off", "on"] if k % 2 == 0 else ["on", "off"]
        r = {o: run(a, work, o, k) for o in order}
        off, on = r["off"], r["on"]
        ratio = on["step_ms"] / off["step_ms"]
        hid = max(0.0, on["comm_ms"] - on["wait_ms"]) / on["comm_ms"] if on["comm_ms"] > 0 else 0.0
        ratios.append(ratio)
        hidden.append(hid)
        off_share.append(off["wait_ms"] / off["step_ms"])
        on_share.append(on["wait_ms"] / on["step_ms"])
        print(f"{k + 1:>5} | {off['step_ms']:>11.1f} {on['step_ms']:>10.1f} {ratio:>6.3f} | "
              f"{off['comm_ms']:>7.1f} / {off['wait_ms']:>6.1f} | {on['comm_ms']:>6.1f} / {on['wait_ms']:>6.1f} "
              f"{100 * hid:>5.0f}%", flush=True)
    med = statistics.median
    print(f"medians over {a.rounds} rounds: step time on/off {med(ratios):.3f} (range {min(ratios):.3f}-"
          f"{max(ratios):.3f}); communication hidden with overlap {100 * med(hidden):.0f}%; waited-for "
          f"communication per step {100 * med(off_share):.1f}% of the step without overlap, "
          f"{100 * med(on_share):.1f}% with it; load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    sys.exit(main())
