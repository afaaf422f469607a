#!/usr/bin/python3
"""Peak memory of one PyTorch (1.13, CPU) training step of a config's twin, plain or with
torch.utils.checkpoint around every repeated block, for comparison with `remat memprof`.

    /usr/bin/python3 tools/reference/torch_memory.py models/gpt_char.json [--batch B] [--checkpoint]

PyTorch's CPU allocator keeps no statistics, so the peak is measured from the process's
resident memory: glibc is told to serve every allocation of 64 KiB or more with its own
mmap (MALLOC_MMAP_THRESHOLD_, fixed, so freed tensors go back to the OS at once), the
resident high-water mark is reset through /proc/self/clear_refs just before the step and
read after it. The figure reported is

    peak tensors = (high-water mark during the step - resident before the step)
                   + bytes of the tensors alive before the step (parameters, optimizer
                     state after a warm-up step, the batch)

which is remat's "peak allocated" (parameters, gradients, optimizer state, activations,
temporaries, the batch). Small tensors (< 64 KiB) come from malloc's heap, whose resident
size does not shrink: the figure is accurate to about a megabyte.
"""
import argparse
import json
import os
import sys

if os.environ.get("MALLOC_MMAP_THRESHOLD_") != "65536":
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"
    os.environ["MALLOC_TRIM_THRESHOLD_"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch  # noqa: E402
import torch.utils.checkpoint as tuc  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_reference as tr  # noqa: E402


def rss_and_hwm():
    rss = hwm = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) * 1024
    return rss, hwm


def reset_hwm():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def forward(g, w, x, y, checkpoint):
    """The twin's forward; with `checkpoint`, each repeated-block instance runs under
    torch.utils.checkpoint (non-reentrant, RNG state preserved), as remat's `all`."""
    vals = [None] * len(g.nodes)
    vals[0], vals[1] = x, y
    i = 0
    while i < len(g.nodes):
        n = g.nodes[i]
        if n.type == "input":
            i += 1
            continue
        if checkpoint and n.unit >= 0:
            j = i
            while j < len(g.nodes) and g.nodes[j].unit == n.unit:
                j += 1
            ext = sorted({k for m in range(i, j) for k in g.nodes[m].inputs if k < i})

            def block(*args, i=i, j=j, ext=ext):
                local = dict(zip(ext, args))
                for m in range(i, j):
                    nm = g.nodes[m]
                    ins = [local[k] for k in nm.inputs]
                    local[m] = g._apply(nm, ins, [w[p] for p in nm.params], True)
                return local[j - 1]

            vals[j - 1] = tuc.checkpoint(block, *[vals[k] for k in ext], use_reentrant=False, preserve_rng_state=True)
            i = j
            continue
        vals[i] = g._apply(n, [vals[k] for k in n.inputs], [w[p] for p in n.params], True)
        i += 1
    return vals[g.loss_id]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--checkpoint", action="store_true", help="torch.utils.checkpoint around every repeated block")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--attention", choices=("explicit", "sdpa"), default="explicit",
                    help="sdpa: PyTorch's scaled_dot_product_attention (torch >= 2.0)")
    ap.add_argument("--json", help="also write the figures (bytes) as JSON")
    a = ap.parse_args()
    tr.set_attention(a.attention)
    torch.set_num_threads(a.threads)
    cfg = tr.load_config(a.config)
    batch = a.batch or int(cfg["training"]["batch"])
    cfg["training"]["batch"] = batch
    vars_, data = tr.model_vars(cfg)
    g = tr.Graph(cfg["model"], batch, vars_, a.config)
    w = g.init_params("remat", 0)
    for n, p in g.params.items():
        w[n].requires_grad_(p.trainable)
    trainable = [w[n] for n, p in g.params.items() if p.trainable]
    opt = tr.make_optimizer(cfg, g, w)

    def step(x, y):
        for t in trainable:
            t.grad = None
        loss = forward(g, w, x, y, a.checkpoint)
        loss.backward()
        opt.step()
        return float(loss)

    x, y = data.batch(0, batch)
    step(x, y)  # warm-up: the optimizer creates its state
    x, y = data.batch(1, batch)
    held = sum(t.numel() * t.element_size() for t in w.values())
    held += sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values() if torch.is_tensor(v))
    held += x.numel() * x.element_size() + y.numel() * y.element_size()
    before, _ = rss_and_hwm()
    reset_hwm()
    step(x, y)
    _, hwm = rss_and_hwm()
    peak = hwm - before + held
    print(f"{cfg.get('name') or a.config}: batch {batch}, {'checkpoint every block' if a.checkpoint else 'plain'}: "
          f"peak tensors {peak / 2**20:.2f} MiB (step high-water {((hwm - before) / 2**20):.2f} MiB above "
          f"{held / 2**20:.2f} MiB held)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"config": a.config, "batch": batch, "attention": a.attention, "checkpoint": a.checkpoint,
                       "torch": torch.__version__, "peak_bytes": peak, "held_bytes": held,
                       "step_high_water_bytes": hwm - before}, f)


if __name__ == "__main__":
    main()
