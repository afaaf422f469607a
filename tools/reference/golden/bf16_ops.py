"""Goldens for remat's ops on bf16 tensors (training.precision bf16), from PyTorch 1.13 on the
CPU, two references per result:

- `<name>`: PyTorch's own bfloat16 kernels (inputs and parameters bf16 tensors, autograd in
  bf16 from a bf16 upstream gradient). Some of them round intermediates to bf16 (the
  tanh GELU, layer and batch norm, the embedding and average-pool gradients that add in
  bf16, attention's scores and probabilities, bf16 parameter gradients).
- `<name>_f32`: the same op in float32 on the very same (bf16) values, its stored results
  rounded to bf16 (activations and their gradients) or kept in float32 (parameter
  gradients, the loss): what remat's "bf16 storage, fp32 math" promises, op by op. Where
  remat reads a stored bf16 product, so does this reference: softmax's backward reads the
  rounded output, attention's P V the rounded probabilities.

Everything is stored as float32 (a bf16 value is exactly a float32). The tolerances against
each, per op, are stated in the Bf16 tests of tests/ops/test_<family>.cpp. PyTorch has no RMSNorm in 1.13
and no fused attention: both are written out here from its ops.
"""
import math

import torch
import torch.nn.functional as F

from golden.transformer import rope_reference

BF = torch.bfloat16


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _rand(gen, *shape, lo=-1.0, hi=1.0):
    """Random values that are exactly representable in bf16 (as float32)."""
    return (torch.rand(*shape, generator=gen) * (hi - lo) + lo).to(BF).float()


def _both(fn, inputs, params, dy, extra=None):
    """Runs fn(**inputs, **params) in bf16 and in float32 on the same values; returns the
    goldens: y, d<input> (bf16 activations, rounded in the f32 reference) and d<param>
    (f32 in the reference)."""
    out = {}
    for mode in ("bf16", "f32"):
        dt = BF if mode == "bf16" else torch.float32
        leaves = {k: v.detach().clone().to(dt).requires_grad_() for k, v in {**inputs, **params}.items()}
        y = fn(**leaves)
        y.backward(dy.to(dt))
        sfx = "" if mode == "bf16" else "_f32"

        def store(t, round_it):
            t = t.detach()
            return (t.to(BF) if round_it and mode == "f32" else t).float()

        out["y" + sfx] = store(y, y.dim() > 0)  # a 0-d result is the loss: f32 in remat
        for k in inputs:
            out[f"d{k}" + sfx] = store(leaves[k].grad, True)
        for k in params:
            out[f"d{k}" + sfx] = store(leaves[k].grad, False)
    out.update({k: v for k, v in {**inputs, **params}.items()})
    out["dy"] = dy
    if extra:
        out.update(extra)
    return out


def _linear():
    g = _gen(300)
    x, w, b = _rand(g, 3, 5, 64), _rand(g, 48, 64, lo=-0.2, hi=0.2), _rand(g, 48)
    return "linear", _both(lambda x, w, b: F.linear(x, w, b), {"x": x}, {"w": w, "b": b}, _rand(g, 3, 5, 48)), {}


def _pointwise():
    g = _gen(301)
    x, x2, dy = _rand(g, 4, 256, lo=-3, hi=3), _rand(g, 4, 256), _rand(g, 4, 256)
    yield "gelu_erf", _both(lambda x: F.gelu(x), {"x": x}, {}, dy), {}
    yield "gelu_tanh", _both(lambda x: F.gelu(x, approximate="tanh"), {"x": x}, {}, dy), {}
    yield "relu", _both(lambda x: F.relu(x), {"x": x}, {}, dy), {}
    yield "add", _both(lambda x, x2: x + x2, {"x": x, "x2": x2}, {}, dy), {}
    yield "silu", _both(lambda x: F.silu(x), {"x": x}, {}, dy), {}
    yield "mul", _both(lambda x, x2: x * x2, {"x": x, "x2": x2}, {}, dy), {}


def _rows():
    g = _gen(302)
    n, c = 24, 75
    x, gamma, beta = _rand(g, n, c, lo=-2, hi=3), _rand(g, c, lo=0.5, hi=1.5), _rand(g, c)
    dy = _rand(g, n, c)
    yield "layernorm", _both(lambda x, gamma, beta: F.layer_norm(x, (c,), gamma, beta, 1e-5), {"x": x},
                             {"gamma": gamma, "beta": beta}, dy), {"eps": 1e-5}
    # Backward reads the stored (bf16) output: the fp32 reference's dx is PyTorch's backward
    # formula in fp32 from the rounded y.
    sm = _both(lambda x: F.softmax(x, -1), {"x": x}, {}, dy)
    sm["dx_f32"] = torch._softmax_backward_data(dy, sm["y_f32"], -1, torch.float32).to(BF).float()
    yield "softmax", sm, {}
    lsm = _both(lambda x: F.log_softmax(x, -1), {"x": x}, {}, dy)
    lsm["dx_f32"] = torch._log_softmax_backward_data(dy, lsm["y_f32"], -1, torch.float32).to(BF).float()
    yield "log_softmax", lsm, {}
    t = torch.randint(0, c, (n,), generator=g)
    t[5] = -100
    yield "cross_entropy", _both(lambda x: F.cross_entropy(x, t, ignore_index=-100), {"x": x}, {},
                                 torch.tensor(1.0), {"targets": t.to(torch.int32)}), {}

    def rms(x, gamma):  # fp32 inside whatever the storage (as remat and llm.c compute it)
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * gamma.float()).to(x.dtype)

    yield "rmsnorm", _both(rms, {"x": x}, {"gamma": gamma}, dy), {"eps": 1e-6}


def _rope():
    # Hugging Face's Llama in bf16: cos and sin computed in fp32, cast to bf16, the products in
    # bf16 (PyTorch's kernels); and in fp32 on the same values, rounded once.
    g = _gen(305)
    b, t, heads, rotated, d = 2, 9, 4, 3, 16
    x, dy = _rand(g, b, t, heads * d, lo=-2, hi=2), _rand(g, b, t, heads * d)

    def rope(x):
        return rope_bf16(x) if x.dtype == BF else rope_reference(x, heads, rotated, 10000.0)

    def rope_bf16(x):
        d_ = x.shape[-1] // heads
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d_, 2, dtype=torch.float32) / d_))
        emb = torch.outer(torch.arange(t, dtype=torch.float32), inv_freq).repeat(1, 2)
        cos, sin = emb.cos().to(BF), emb.sin().to(BF)
        xh = x.view(b, t, heads, d_)
        r = xh[:, :, :rotated]
        x1, x2 = r[..., : d_ // 2], r[..., d_ // 2:]
        turned = r * cos[None, :, None, :] + torch.cat((-x2, x1), dim=-1) * sin[None, :, None, :]
        return torch.cat((turned, xh[:, :, rotated:]), dim=2).reshape(b, t, heads * d_)

    return "rope", _both(rope, {"x": x}, {}, dy), {"heads": heads, "rotated": rotated, "theta": 10000.0}


def _embedding():
    g = _gen(303)
    b, t, v, c = 3, 10, 23, 48
    ids = torch.randint(0, v, (b, t), generator=g)
    fn = lambda table, pos: F.embedding(ids, table) + pos  # noqa: E731
    return "embedding", _both(fn, {}, {"table": _rand(g, v, c), "pos": _rand(g, t, c)}, _rand(g, b, t, c),
                              {"ids": ids.to(torch.int32)}), {}


def _attention():
    g = _gen(304)
    b, t, c, h = 2, 20, 32, 4

    def attn(qkv):
        q, k, v = (z.view(b, t, h, c // h).transpose(1, 2) for z in qkv.split(c, dim=2))
        s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // h))
        s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        p = F.softmax(s, -1)
        if p.dtype == torch.float32:  # the probabilities are stored in bf16: P V reads them rounded
            p = p + (p.to(BF).float() - p).detach()
        return (p @ v).transpose(1, 2).reshape(b, t, c)

    return "attention", _both(attn, {"qkv": _rand(g, b, t, 3 * c)}, {}, _rand(g, b, t, c)), {"heads": h}


def _conv():
    g = _gen(305)
    x, w, bias = _rand(g, 3, 4, 11, 9), _rand(g, 6, 2, 3, 3, lo=-0.5, hi=0.5), _rand(g, 6)
    fn = lambda x, w, b: F.conv2d(x, w, b, stride=1, padding=1, groups=2)  # noqa: E731
    return "conv2d", _both(fn, {"x": x}, {"w": w, "b": bias}, _rand(g, 3, 6, 11, 9)), {"padding": 1, "groups": 2}


def _batchnorm():
    g = _gen(306)
    x, gamma, beta = _rand(g, 4, 5, 6, 7, lo=-1, hi=2), _rand(g, 5, lo=0.5, hi=1.5), _rand(g, 5)

    def bn(x, gamma, beta):  # PyTorch 1.13's bf16 batch norm wants bf16 running statistics
        rm, rv = torch.zeros(5, dtype=x.dtype), torch.ones(5, dtype=x.dtype)
        return F.batch_norm(x, rm, rv, gamma, beta, training=True, momentum=0.1, eps=1e-5)

    return "batchnorm", _both(bn, {"x": x}, {"gamma": gamma, "beta": beta}, _rand(g, 4, 5, 6, 7)), {"eps": 1e-5}


def _pool():
    g = _gen(307)
    x = _rand(g, 2, 3, 10, 12, lo=-2, hi=2)
    yield "maxpool", _both(lambda x: F.max_pool2d(x, 2, 2), {"x": x}, {}, _rand(g, 2, 3, 5, 6)), {}
    yield "avgpool", _both(lambda x: F.avg_pool2d(x, 3, 2, 1), {"x": x}, {}, _rand(g, 2, 3, 5, 6)), {}
    yield "global_avgpool", _both(lambda x: F.adaptive_avg_pool2d(x, 1).flatten(1), {"x": x}, {},
                                  _rand(g, 2, 3)), {}


def cases():
    yield _linear()
    yield from _pointwise()
    yield from _rows()
    yield _rope()
    yield _embedding()
    yield _attention()
    yield _conv()
    yield _batchnorm()
    yield from _pool()
