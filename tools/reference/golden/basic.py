"""Goldens for the basic op family: gemm, linear, elementwise (ReLU, GELU, add, SiLU, mul),
softmax, cross-entropy, optimizers, gradient-norm clipping."""
import torch
import torch.nn.functional as F


def _rand(*shape, scale=1.0):
    return (torch.rand(*shape) * 2 - 1) * scale


def _grad_case(fn, inputs, param_names=()):
    """Runs fn(**inputs) -> y, backprops a random dy; returns tensors incl. d<name>."""
    leaves = {k: v.clone().requires_grad_(v.dtype == torch.float32) for k, v in inputs.items()}
    y = fn(**leaves)
    dy = _rand(*y.shape)
    y.backward(dy)
    out = {k: v.detach() for k, v in inputs.items()}
    out["y"] = y.detach()
    out["dy"] = dy
    for k, v in leaves.items():
        if v.grad is not None:
            out["d" + k] = v.grad.detach()
    return out


def cases():
    g = torch.Generator().manual_seed(1)
    torch.manual_seed(1)

    # gemm: c = alpha * op(a) @ op(b) + beta * c0
    for name, (bs, m, k, n, ta, tb, shared_b) in {
        "gemm_small": ((), 3, 4, 5, False, False, False),
        "gemm_trans_a": ((), 7, 3, 2, True, False, False),
        "gemm_trans_b": ((), 5, 6, 9, False, True, False),
        "gemm_batched_tt": ((3,), 4, 5, 6, True, True, False),
        "gemm_batched_shared_b": ((2, 2), 3, 4, 5, False, False, True),
    }.items():
        a = _rand(*bs, *((k, m) if ta else (m, k)))
        b = _rand(*(() if shared_b else bs), *((n, k) if tb else (k, n)))
        c0 = _rand(*bs, m, n)
        alpha, beta = 0.75, 0.5
        opa = a.transpose(-1, -2) if ta else a
        opb = b.transpose(-1, -2) if tb else b
        c = alpha * torch.matmul(opa, opb) + beta * c0
        yield name, {"a": a, "b": b, "c0": c0, "c": c}, {"trans_a": int(ta), "trans_b": int(tb), "alpha": alpha, "beta": beta}

    # linear
    for name, (xs, i, o, bias) in {
        "linear_2d": ((4,), 5, 3, True),
        "linear_3d_nobias": ((2, 3), 7, 4, False),
        "linear_odd": ((17,), 33, 9, True),
    }.items():
        inp = {"x": _rand(*xs, i), "w": _rand(o, i, scale=0.5)}
        if bias:
            inp["b"] = _rand(o)
            t = _grad_case(lambda x, w, b: F.linear(x, w, b), inp)
        else:
            t = _grad_case(lambda x, w: F.linear(x, w), inp)
        yield name, t, {"bias": int(bias)}

    # elementwise
    x = _rand(3, 37, scale=3.0)
    yield "relu", _grad_case(lambda x: F.relu(x), {"x": x}), {}
    yield "gelu_erf", _grad_case(lambda x: F.gelu(x), {"x": x}), {"approx": "none"}
    yield "gelu_tanh", _grad_case(lambda x: F.gelu(x, approximate="tanh"), {"x": x}), {"approx": "tanh"}
    yield "add", _grad_case(lambda a, b: a + b, {"a": _rand(2, 9), "b": _rand(2, 9)}), {}

    # softmax / log-softmax over the last dim
    for name, shape in {"softmax_2d": (4, 10), "softmax_3d_odd": (2, 3, 33)}.items():
        x = _rand(*shape, scale=4.0)
        yield name, _grad_case(lambda x: F.softmax(x, dim=-1), {"x": x}), {"log": 0}
        yield "log_" + name, _grad_case(lambda x: F.log_softmax(x, dim=-1), {"x": x}), {"log": 1}

    # cross-entropy, mean reduction, with ignored rows
    for name, (n, v, ignore) in {"ce_small": (6, 5, -100), "ce_ignore": (9, 13, 3), "ce_wide": (4, 257, -100)}.items():
        logits = _rand(n, v, scale=3.0)
        targets = torch.randint(0, v, (n,), generator=g)
        if ignore >= 0:
            targets[1] = ignore
            targets[4] = ignore
        lg = logits.clone().requires_grad_(True)
        loss = F.cross_entropy(lg, targets, ignore_index=ignore)
        loss.backward()
        yield name, {"logits": logits, "targets": targets.int(), "loss": loss.detach().reshape(1),
                     "dlogits": lg.grad}, {"ignore_index": ignore}

    # optimizers: 10 steps on given gradients
    shape = (5, 7)
    grads = [_rand(*shape) for _ in range(10)]
    for name, make in {
        "sgd_momentum_wd": lambda p: torch.optim.SGD([p], lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01),
        "sgd_nesterov": lambda p: torch.optim.SGD([p], lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.001),
        "sgd_plain": lambda p: torch.optim.SGD([p], lr=0.2),
        "adamw": lambda p: torch.optim.AdamW([p], lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1),
        "adamw_default": lambda p: torch.optim.AdamW([p], lr=1e-3),
    }.items():
        p0 = _rand(*shape)
        p = p0.clone().requires_grad_(True)
        opt = make(p)
        for gr in grads:
            p.grad = gr.clone()
            opt.step()
        t = {"param0": p0, "param": p.detach().clone()}
        for i, gr in enumerate(grads):
            t[f"grad{i}"] = gr
        st = opt.state[p]
        if "momentum_buffer" in st and st["momentum_buffer"] is not None:
            t["momentum_buffer"] = st["momentum_buffer"]
        if "exp_avg" in st:
            t["exp_avg"], t["exp_avg_sq"] = st["exp_avg"], st["exp_avg_sq"]
        d = opt.param_groups[0]
        meta = {k: d[k] for k in ("lr", "weight_decay")}
        for k in ("momentum", "dampening", "nesterov", "eps"):
            if k in d:
                meta[k] = int(d[k]) if isinstance(d[k], bool) else d[k]
        if "betas" in d:
            meta["beta1"], meta["beta2"] = d["betas"]
        yield name, t, meta

    # global norm and clipping
    ts = [_rand(3, 4, scale=2.0), _rand(17, scale=2.0), _rand(2, 2, 5, scale=2.0)]
    ps = [t.clone().requires_grad_(True) for t in ts]
    for p, t in zip(ps, ts):
        p.grad = t.clone()
    norm = torch.nn.utils.clip_grad_norm_(ps, max_norm=1.5)
    out = {f"g{i}": t for i, t in enumerate(ts)}
    out.update({f"clipped{i}": p.grad for i, p in enumerate(ps)})
    out["norm"] = norm.reshape(1).float()
    yield "clip_grad_norm", out, {"max_norm": 1.5, "count": len(ts)}

    # SiLU and the elementwise product (LLaMA's SwiGLU MLP: silu(gate) * up). Last, and from
    # a seed of their own, so that the cases above keep their values.
    torch.manual_seed(2)
    yield "silu", _grad_case(lambda x: F.silu(x), {"x": _rand(3, 37, scale=6.0)}), {}
    yield "mul", _grad_case(lambda a, b: a * b, {"a": _rand(2, 9, scale=2.0), "b": _rand(2, 9, scale=2.0)}), {}

    # Label-smoothed cross-entropy (translation models), with and without ignored rows. Last,
    # from a seed of their own, so that the cases above keep their values.
    torch.manual_seed(3)
    g3 = torch.Generator().manual_seed(3)
    for name, (n, v, ignore, eps) in {"ce_smooth": (9, 13, 3, 0.1), "ce_smooth_wide": (4, 257, -100, 0.25)}.items():
        logits = _rand(n, v, scale=3.0)
        targets = torch.randint(0, v, (n,), generator=g3)
        if ignore >= 0:
            targets[1] = ignore
            targets[4] = ignore
        lg = logits.clone().requires_grad_(True)
        loss = F.cross_entropy(lg, targets, ignore_index=ignore, label_smoothing=eps)
        loss.backward()
        yield name, {"logits": logits, "targets": targets.int(), "loss": loss.detach().reshape(1),
                     "dlogits": lg.grad}, {"ignore_index": ignore, "label_smoothing": eps}
