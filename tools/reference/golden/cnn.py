"""Goldens for the CNN op family: conv2d, max/avg/global-avg pooling, batchnorm2d.

Every case draws its inputs from its own generator seed; gradients come from autograd with
a random upstream gradient dy.
"""
import torch
import torch.nn.functional as F


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _rand(gen, *shape, lo=-1.0, hi=1.0):
    return torch.rand(*shape, generator=gen) * (hi - lo) + lo


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


# name, x shape, w shape, bias, stride, padding, dilation, groups
_CONVS = [
    ("conv_plain", (2, 3, 8, 8), (4, 3, 3, 3), True, 1, 0, 1, 1),
    ("conv_stride2_pad1_odd", (3, 3, 7, 5), (5, 3, 3, 3), True, 2, 1, 1, 1),
    ("conv_dilation2", (2, 4, 9, 8), (6, 4, 3, 3), False, 1, 2, 2, 1),
    ("conv_groups2", (2, 4, 6, 7), (6, 2, 3, 3), True, 1, 1, 1, 2),
    ("conv_depthwise", (2, 4, 6, 5), (8, 1, 3, 3), False, (1, 2), 1, 1, 4),
    ("conv_asymmetric", (3, 3, 7, 5), (4, 3, 2, 3), True, (2, 1), (0, 1), (1, 2), 1),
    ("conv_1x1", (2, 5, 4, 3), (7, 5, 1, 1), False, 1, 0, 1, 1),
    # Larger images; the C++ tests also run it in chunks of 2 images (2 + 1).
    ("conv_chunked", (3, 1, 40, 40), (2, 1, 3, 3), True, 1, 0, 1, 1),
]


def _conv_cases():
    for seed, (name, xs, ws, bias, stride, pad, dil, groups) in enumerate(_CONVS):
        g = _gen(100 + seed)
        x = _rand(g, *xs).requires_grad_()
        w = _rand(g, *ws, lo=-0.5, hi=0.5).requires_grad_()
        b = _rand(g, ws[0]).requires_grad_() if bias else None
        y = F.conv2d(x, w, b, stride=stride, padding=pad, dilation=dil, groups=groups)
        dy = _rand(g, *y.shape)
        y.backward(dy)
        sh, sw = _pair(stride)
        ph, pw = _pair(pad)
        dh, dw = _pair(dil)
        tensors = {"x": x, "w": w, "y": y, "dy": dy, "dx": x.grad, "dw": w.grad}
        if bias:
            tensors["b"] = b
            tensors["db"] = b.grad
        meta = {"op": "conv2d", "stride_h": sh, "stride_w": sw, "pad_h": ph, "pad_w": pw,
                "dilation_h": dh, "dilation_w": dw, "groups": groups, "bias": int(bias)}
        yield name, tensors, meta


# name, x shape, kernel, stride, padding, integer-valued input (ties)
_POOLS = [
    ("pool_2x2_s2", (2, 3, 8, 6), 2, 2, 0, False),
    ("pool_3x3_s2_p1", (2, 3, 7, 9), 3, 2, 1, False),
    ("pool_3x2_s1x2_p1", (2, 2, 5, 7), (3, 2), (1, 2), 1, False),
    # Values from {-2, ..., 2}: many ties, which the first maximum in scan order wins.
    ("pool_ties_3x3_s1_p1", (1, 3, 6, 5), 3, 1, 1, True),
]


def _pool_cases():
    for seed, (name, xs, k, s, p, ties) in enumerate(_POOLS):
        kh, kw = _pair(k)
        sh, sw = _pair(s)
        ph, pw = _pair(p)
        meta = {"kernel_h": kh, "kernel_w": kw, "stride_h": sh, "stride_w": sw, "pad_h": ph, "pad_w": pw}
        g = _gen(200 + seed)
        if ties:
            x0 = torch.randint(-2, 3, xs, generator=g).float()
        else:
            x0 = _rand(g, *xs)
        x = x0.clone().requires_grad_()
        y, idx = F.max_pool2d(x, (kh, kw), (sh, sw), (ph, pw), return_indices=True)
        dy = _rand(g, *y.shape)
        y.backward(dy)
        yield "max" + name, {"x": x, "y": y, "indices": idx.to(torch.int32), "dy": dy, "dx": x.grad}, \
            dict(meta, op="maxpool2d")
        if ties:
            continue
        x = x0.clone().requires_grad_()
        y = F.avg_pool2d(x, (kh, kw), (sh, sw), (ph, pw), count_include_pad=True)
        dy = _rand(g, *y.shape)
        y.backward(dy)
        yield "avg" + name, {"x": x, "y": y, "dy": dy, "dx": x.grad}, dict(meta, op="avgpool2d")


def _global_avgpool_cases():
    for seed, xs in enumerate([(3, 5, 7, 5), (2, 4, 1, 1)]):
        g = _gen(300 + seed)
        x = _rand(g, *xs).requires_grad_()
        y = F.adaptive_avg_pool2d(x, 1).flatten(1)
        dy = _rand(g, *y.shape)
        y.backward(dy)
        yield f"global_avgpool_{'x'.join(map(str, xs))}", {"x": x, "y": y, "dy": dy, "dx": x.grad}, \
            {"op": "global_avgpool"}


# name, x shape, momentum, eps, input scale, input offset
_BNS = [
    ("bn_train", (4, 3, 5, 6), 0.1, 1e-5, 1.0, 0.0),
    # A large mean relative to the spread, few values per channel, other momentum/eps.
    ("bn_train_offset", (2, 5, 3, 3), 0.2, 1e-3, 2.0, 3.0),
]


def _bn_cases():
    for seed, (name, xs, momentum, eps, scale, offset) in enumerate(_BNS):
        g = _gen(400 + seed)
        c = xs[1]
        x = (_rand(g, *xs) * scale + offset).requires_grad_()
        gamma = _rand(g, c, lo=0.5, hi=1.5).requires_grad_()
        beta = _rand(g, c).requires_grad_()
        rm = _rand(g, c, lo=-0.5, hi=0.5)
        rv = _rand(g, c, lo=0.5, hi=1.5)
        rm_new, rv_new = rm.clone(), rv.clone()
        y, save_mean, save_invstd = torch.ops.aten.native_batch_norm(
            x, gamma, beta, rm_new, rv_new, True, momentum, eps)
        dy = _rand(g, *y.shape)
        y.backward(dy)
        yield name, {"x": x, "gamma": gamma, "beta": beta, "running_mean": rm, "running_var": rv,
                     "y": y, "save_mean": save_mean, "save_invstd": save_invstd,
                     "running_mean_new": rm_new, "running_var_new": rv_new,
                     "dy": dy, "dx": x.grad, "dgamma": gamma.grad, "dbeta": beta.grad}, \
            {"op": "batchnorm2d_train", "momentum": momentum, "eps": eps}
    g = _gen(450)
    xs = (3, 4, 5, 5)
    x = _rand(g, *xs) * 2.0
    gamma = _rand(g, 4, lo=0.5, hi=1.5)
    beta = _rand(g, 4)
    rm = _rand(g, 4, lo=-0.5, hi=0.5)
    rv = _rand(g, 4, lo=0.5, hi=1.5)
    y = F.batch_norm(x, rm, rv, gamma, beta, training=False, eps=1e-5)
    yield "bn_eval", {"x": x, "gamma": gamma, "beta": beta, "running_mean": rm, "running_var": rv, "y": y}, \
        {"op": "batchnorm2d_eval", "eps": 1e-5}


def cases():
    yield from _conv_cases()
    yield from _pool_cases()
    yield from _global_avgpool_cases()
    yield from _bn_cases()
