"""Golden values for the transformer op family: layernorm, rmsnorm, rope, embedding, attention, permute_0213.

Inputs are float32; the reference is computed by PyTorch in float64 from those exact
values and stored as float32, so the files hold the true result (to float32 rounding),
not another float32 implementation's rounding. Gradients come from autograd with a
random upstream gradient (dy, or dout for attention).
"""
import math

import torch
import torch.nn.functional as F


def _rand(gen, *shape, lo=-1.0, hi=1.0):
    return (torch.rand(*shape, generator=gen, dtype=torch.float32) * (hi - lo) + lo)


def _f32(d):
    return {k: (v.detach().to(torch.float32) if v.dtype.is_floating_point else v) for k, v in d.items()}


def _layernorm(name, seed, shape, eps, offset=0.0):
    g = torch.Generator().manual_seed(seed)
    c = shape[-1]
    x = _rand(g, *shape) * 2.0 + offset
    gamma = _rand(g, c, lo=0.5, hi=1.5)
    beta = _rand(g, c)
    dy = _rand(g, *shape)
    xd, gd, bd = (t.double().requires_grad_() for t in (x, gamma, beta))
    y = F.layer_norm(xd, (c,), gd, bd, eps)
    y.backward(dy.double())
    xr = xd.detach().reshape(-1, c)
    mean = xr.mean(dim=1)
    rstd = 1.0 / torch.sqrt(xr.var(dim=1, unbiased=False) + eps)
    return name, _f32({"x": x, "gamma": gamma, "beta": beta, "y": y, "mean": mean, "rstd": rstd, "dy": dy,
                       "dx": xd.grad, "dgamma": gd.grad, "dbeta": bd.grad}), {"op": "layernorm", "eps": eps}


def _rmsnorm(name, seed, shape, eps, offset=0.0):
    # PyTorch 1.13 has no nn.RMSNorm (2.4 added it): the formula, differentiated by autograd.
    g = torch.Generator().manual_seed(seed)
    c = shape[-1]
    x = _rand(g, *shape) * 2.0 + offset
    gamma = _rand(g, c, lo=0.5, hi=1.5)
    dy = _rand(g, *shape)
    xd, gd = (t.double().requires_grad_() for t in (x, gamma))
    rstd = torch.rsqrt(xd.pow(2).mean(dim=-1, keepdim=True) + eps)
    y = xd * rstd * gd
    y.backward(dy.double())
    return name, _f32({"x": x, "gamma": gamma, "y": y, "rstd": rstd.detach().reshape(-1), "dy": dy,
                       "dx": xd.grad, "dgamma": gd.grad}), {"op": "rmsnorm", "eps": eps}


def rope_reference(x, heads, rotated, theta):
    """Hugging Face Llama's rotary embedding (rotate_half form) on packed heads [B, T, heads * d],
    written out in x's dtype (float64 here): the first `rotated` heads turn, the rest pass."""
    b, t, c = x.shape
    d = c // heads
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    freqs = torch.outer(torch.arange(t, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    xh = x.view(b, t, heads, d)
    r = xh[:, :, :rotated]
    x1, x2 = r[..., : d // 2], r[..., d // 2:]
    turned = r * cos[None, :, None, :] + torch.cat((-x2, x1), dim=-1) * sin[None, :, None, :]
    return torch.cat((turned, xh[:, :, rotated:]), dim=2).reshape(b, t, c)


def _rope(name, seed, b, t, heads, rotated, d, theta):
    g = torch.Generator().manual_seed(seed)
    x = _rand(g, b, t, heads * d) * 2.0
    dy = _rand(g, b, t, heads * d)
    xd = x.double().requires_grad_()
    y = rope_reference(xd, heads, rotated, theta)
    y.backward(dy.double())
    return name, _f32({"x": x, "y": y, "dy": dy, "dx": xd.grad}), {"op": "rope", "heads": heads,
                                                                      "rotated": rotated, "theta": theta}


def _embedding(name, seed, b, t, v, c, tmax):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, v, (b, t), generator=g, dtype=torch.int64)
    ids[0, 0] = v - 1  # the last row is used
    table = _rand(g, v, c)
    dy = _rand(g, b, t, c)
    td = table.double().requires_grad_()
    y = F.embedding(ids, td)
    tensors = {"ids": ids.to(torch.int32), "table": table}
    meta = {"op": "embedding", "pos": int(tmax > 0)}
    if tmax > 0:
        pos = _rand(g, tmax, c)
        pd = pos.double().requires_grad_()
        y = y + pd[:t].unsqueeze(0)
        y.backward(dy.double())
        tensors.update({"pos_table": pos, "dpos_table": pd.grad})
    else:
        y.backward(dy.double())
    tensors.update({"y": y, "dy": dy, "dtable": td.grad})
    return name, _f32(tensors), meta


def _attention(name, seed, b, t, c, n_head, causal):
    g = torch.Generator().manual_seed(seed)
    qkv = _rand(g, b, t, 3 * c) * 1.5
    dout = _rand(g, b, t, c)
    hs = c // n_head
    xd = qkv.double().requires_grad_()
    q, k, v = xd.split(c, dim=2)
    q, k, v = (z.view(b, t, n_head, hs).transpose(1, 2) for z in (q, k, v))  # [B, H, T, hs]
    s = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
    if causal:
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        s = s.masked_fill(mask, float("-inf"))
    probs = torch.softmax(s, dim=-1)
    out = (probs @ v).transpose(1, 2).reshape(b, t, c)
    out.backward(dout.double())
    return name, _f32({"qkv": qkv, "out": out, "probs": probs, "dout": dout, "dqkv": xd.grad}), {
        "op": "attention", "n_head": n_head, "causal": int(causal), "dropout": 0.0}


def _permute(name, seed, shape):
    g = torch.Generator().manual_seed(seed)
    x = _rand(g, *shape)
    return name, {"x": x, "y": x.permute(0, 2, 1, 3).contiguous()}, {"op": "permute_0213"}


def cases():
    yield _layernorm("layernorm_2d_c37", 1, (6, 37), 1e-5)
    yield _layernorm("layernorm_3d_c16", 2, (2, 5, 16), 1e-5)
    yield _layernorm("layernorm_3d_offset_eps", 3, (3, 4, 9), 1e-3, offset=4.0)
    yield _rmsnorm("rmsnorm_2d_c37", 12, (6, 37), 1e-6)
    yield _rmsnorm("rmsnorm_3d_c16", 13, (2, 5, 16), 1e-6)
    yield _rmsnorm("rmsnorm_3d_offset_eps", 14, (3, 4, 9), 1e-3, offset=4.0)
    # q, k, v of one head each (v copied); grouped queries (4 q heads, 1 k, 1 v) at Llama 3's
    # theta; positions up to 63 with every head turning.
    yield _rope("rope_qkv_d8", 15, 2, 5, 3, 2, 8, 10000.0)
    yield _rope("rope_gqa_d6_theta5e5", 16, 1, 7, 6, 5, 6, 500000.0)
    yield _rope("rope_t64_all_heads", 17, 1, 64, 2, 2, 16, 10000.0)
    yield _embedding("embedding_pos", 4, 3, 7, 5, 6, 9)
    yield _embedding("embedding_nopos", 5, 2, 5, 4, 19, 0)
    yield _attention("attention_causal_b2_t5_c12_h3", 6, 2, 5, 12, 3, True)
    yield _attention("attention_full_b2_t5_c12_h3", 7, 2, 5, 12, 3, False)
    yield _attention("attention_causal_b1_t17_c16_h2", 8, 1, 17, 16, 2, True)
    yield _attention("attention_full_b1_t17_c16_h2", 9, 1, 17, 16, 2, False)
    yield _permute("permute_2x3x4x5", 10, (2, 3, 4, 5))
    yield _permute("permute_1x5x2x3", 11, (1, 5, 2, 3))
