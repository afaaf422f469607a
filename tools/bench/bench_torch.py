#!/usr/bin/python3
"""Times the cases of `remat bench ops` in PyTorch (CPU, forward + backward, median of N
after a warm-up), with the same thread count. Run with Debian's Python:

    /usr/bin/python3 tools/bench/bench_torch.py --threads 2 --json torch.json

tools/bench/bench_compare.py turns both JSON files into the table of docs/performance.md.
"""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F


def cases():
    def r(*s):
        return torch.rand(*s) * 2 - 1

    def gemm():
        a, b = r(1024, 1024), r(1024, 1024)
        return lambda: torch.mm(a, b)

    def linear():
        x, w, b = r(4096, 1024).requires_grad_(), r(1024, 1024).requires_grad_(), r(1024).requires_grad_()

        def f():
            y = F.linear(x, w, b)
            y.backward(y.detach())
        return f

    def conv():
        x, w, b = r(64, 64, 32, 32).requires_grad_(), r(64, 64, 3, 3).requires_grad_(), r(64).requires_grad_()

        def f():
            y = F.conv2d(x, w, b, padding=1)
            y.backward(y.detach())
        return f

    def fashion_conv(c, k, hw, need_dx):
        def make():
            x = r(64, c, hw, hw).requires_grad_(need_dx)
            w, b = r(k, c, 5, 5).requires_grad_(), r(k).requires_grad_()

            def f():
                y = F.conv2d(x, w, b, padding=2)
                y.backward(y.detach())
            return f
        return make

    def maxpool():
        x = r(64, 64, 32, 32).requires_grad_()

        def f():
            y = F.max_pool2d(x, 2)
            y.backward(y.detach())
        return f

    def batchnorm():
        x = r(64, 64, 32, 32).requires_grad_()
        g, b = torch.ones(64, requires_grad=True), torch.zeros(64, requires_grad=True)
        rm, rv = torch.zeros(64), torch.ones(64)

        def f():
            y = F.batch_norm(x, rm, rv, g, b, training=True)
            y.backward(y.detach())
        return f

    def layernorm():
        x = r(16, 256, 256).requires_grad_()
        g, b = torch.ones(256, requires_grad=True), torch.zeros(256, requires_grad=True)

        def f():
            y = F.layer_norm(x, (256,), g, b)
            y.backward(y.detach())
        return f

    def attention():
        qkv = r(16, 256, 768).requires_grad_()
        mask = torch.ones(256, 256, dtype=torch.bool).tril()

        def f():
            q, k, v = qkv.split(256, dim=2)
            q, k, v = (t.view(16, 256, 4, 64).transpose(1, 2) for t in (q, k, v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / 8.0)
            att = att.masked_fill(~mask, float("-inf")).softmax(-1)
            y = (att @ v).transpose(1, 2).reshape(16, 256, 256)
            y.backward(y.detach())
        return f

    def sdpa(b, t, h, d, dropout):
        def make():
            qkv = r(b, t, 3 * h * d).requires_grad_()

            def f():
                q, k, v = qkv.split(h * d, dim=2)
                q, k, v = (z.view(b, t, h, d).transpose(1, 2) for z in (q, k, v))
                y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
                y = y.transpose(1, 2).reshape(b, t, h * d)
                y.backward(y.detach())
            return f
        return make

    def explicit(b, t, h, d):
        def make():
            qkv = r(b, t, 3 * h * d).requires_grad_()
            mask = torch.ones(t, t, dtype=torch.bool).tril()

            def f():
                q, k, v = qkv.split(h * d, dim=2)
                q, k, v = (z.view(b, t, h, d).transpose(1, 2) for z in (q, k, v))
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
                att = att.masked_fill(~mask, float("-inf")).softmax(-1)
                y = (att @ v).transpose(1, 2).reshape(b, t, h * d)
                y.backward(y.detach())
            return f
        return make

    def pointwise(fn):
        def make():
            x = r(4096, 1024).requires_grad_()

            def f():
                y = fn(x)
                y.backward(y.detach())
            return f
        return make

    def ce():
        x = r(4096, 1024).requires_grad_()
        t = (torch.arange(4096) * 37) % 1024

        def f():
            F.cross_entropy(x, t).backward()
        return f

    def embedding():
        ids = ((torch.arange(16 * 256) * 7919) % 50257).view(16, 256)
        tab, pos = r(50257, 256).requires_grad_(), r(256, 256).requires_grad_()

        def f():
            y = F.embedding(ids, tab) + pos
            y.backward(y.detach())
        return f

    def adamw():
        p = torch.nn.Parameter(r(10 << 20))
        p.grad = r(10 << 20)
        opt = torch.optim.AdamW([p])
        return opt.step

    return {
        "gemm_1024": gemm, "linear_4096x1024x1024": linear, "conv_64x64x3x3_32x32_b64": conv,
        "conv_1x32x5x5_28x28_b64_nodx": fashion_conv(1, 32, 28, False),
        "conv_32x64x5x5_14x14_b64": fashion_conv(32, 64, 14, True),
        "maxpool_2x2_b64_64x32x32": maxpool, "batchnorm_b64_64x32x32": batchnorm,
        "layernorm_16x256x256": layernorm, "attention_16x256x256_h4": attention,
        # PyTorch's fused attention (scaled_dot_product_attention, torch >= 2.0) for remat's
        # flash_attention cases; the explicit matmul-softmax for its materialised one.
        **({"flash_attention_16x256x256_h4": sdpa(16, 256, 4, 64, 0.0),
            "flash_attention_4x1024x256_h8": sdpa(4, 1024, 8, 32, 0.0),
            "flash_attention_4x1024x256_h8_p0.1": sdpa(4, 1024, 8, 32, 0.1)}
           if hasattr(F, "scaled_dot_product_attention") else {}),
        "attention_4x1024x256_h8": explicit(4, 1024, 8, 32),
        "gelu_4M": pointwise(lambda x: F.gelu(x, approximate="tanh")), "relu_4M": pointwise(F.relu),
        "dropout_4M": pointwise(lambda x: F.dropout(x, 0.1, training=True)),
        "softmax_4096x1024": pointwise(lambda x: F.softmax(x, -1)), "cross_entropy_4096x1024": ce,
        "embedding_16x256_v50257_c256": embedding, "adamw_10M": adamw,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--filter", default="")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    out = {"threads": a.threads, "torch": torch.__version__, "cases": {}}
    print(f"torch {torch.__version__}, {a.threads} thread(s), median of {a.repeat}")
    for name, make in cases().items():
        if a.filter not in name:
            continue
        f = make()
        f()
        ts = []
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            f()
            ts.append((time.perf_counter() - t0) * 1e3)
        ts.sort()
        out["cases"][name] = ts[len(ts) // 2]
        print(f"{name:32s} {ts[len(ts) // 2]:12.3f}", flush=True)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=2)


if __name__ == "__main__":
    main()
