#!/usr/bin/python3
"""The PyTorch twin of a remat model config: the same layers with the same semantics and
the same parameter full names (docs/config.md), built from the same JSON.

Run with Debian's Python (python3-torch):

    /usr/bin/python3 tools/reference/torch_reference.py golden tests/configs/gpt_char_tiny.json
    /usr/bin/python3 tools/reference/torch_reference.py curve --run RUN_DIR [--steps N] [--precision bf16]
    /usr/bin/python3 tools/reference/torch_reference.py eval --run RUN_DIR
    /usr/bin/python3 tools/reference/torch_reference.py time CONFIG [--steps N] [--threads 2] [--remat-run DIR]
                                                [--device cuda [--tf32]] [--precision bf16]
    /usr/bin/python3 tools/reference/torch_reference.py derive CONFIG OUT.json training.log_every=1 dropout=0

golden  One training-mode forward and backward of a tiny config on a fixed batch, with
        random weights drawn by torch from a fixed seed, computed in float64 from the
        float32 weights and inputs (so the file holds the exact result to float32
        rounding). Writes tests/golden/twin/<config stem>.safetensors: `param/<name>`
        (every parameter and buffer before the step), `input`, `targets`, `loss`,
        `grad/<name>` (every trainable parameter), `after/<name>` (buffers after the step:
        batchnorm running statistics); metadata: config path, batch, vars, seed.
        tests/test_twin.cpp loads it into remat.
curve   Trains the twin from a remat run's initial weights (RUN/init.safetensors) with the
        run's resolved config (RUN/config.json): same data order (data.shuffle must be
        false), optimizer, schedule and clipping, in float32; writes the losses and
        compares them with RUN/metrics.jsonl step by step (the run needs log_every 1 for
        a per-step comparison; steps missing from metrics.jsonl are skipped).
eval    The evaluation loss and accuracy of a run's final weights (RUN/checkpoint/
        model.safetensors) on its evaluation set, batched as remat's end-of-run evaluation,
        compared with the last eval record of RUN/metrics.jsonl.
time    Median time of one twin training step (batch, forward, backward, clipping,
        optimizer) over N steps after one warm-up, at a given thread count or on a GPU
        (--device cuda, fp32 unless --tf32); with --remat-run, also the median step_ms of
        remat runs (their first step skipped).
derive  Writes a copy of a config with overrides: dotted.key=JSON_VALUE, and dropout=0
        (every dropout layer's p and every attention's dropout).

Layer semantics follow src/graph/layers/*.cpp; names follow src/graph/graph.cpp (layers
default to <type><index>, a repeat instance prefixes "<name><k>.", `in` is the instance's
input, and after a repeat its name refers to its last output).
"""
import argparse
import copy
import gzip
import json
import math
import os
import statistics
import struct
import sys
import time

# As the remat command: idle OpenMP threads sleep instead of spinning (on small or shared
# machines spinning threads fight over the cores); set OMP_WAIT_POLICY to override.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

from golden import st  # noqa: E402


class ConfigError(Exception):
    pass


# ---- config (src/graph/config.cpp) ------------------------------------------------------------

SECTION_DEFAULTS = {
    "data": {"dataset": "fashion_mnist", "path": "", "synthetic_size": 2048, "vocab": 32,
             "image_shape": [1, 28, 28], "classes": 10, "eval_fraction": 0.1, "shuffle": True,
             "length_buckets": [], "augment": {"hflip": 0.0}},
    "optimizer": {"type": "adamw", "lr": 0.001, "weight_decay": 0.0, "momentum": 0.9, "dampening": 0.0,
                  "nesterov": False, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "grad_clip": 0.0},
    "schedule": {"type": "constant", "warmup_steps": 0, "min_lr_ratio": 0.0, "step_size": 1000, "gamma": 0.1},
    "training": {"batch": 32, "steps": 0, "epochs": 0, "seed": 0, "policy": "none", "log_every": 10,
                 "eval_every": 0, "eval_batches": 0, "checkpoint_every": 0, "sample_every": 0,
                 "sample_length": 200, "micro_batch": 0, "shard_optimizer": False, "precision": "fp32"},
}


def shorthand_model(model, source):
    """The twin reads models in the shorthand form (model.input, model.loss). A model written
    with named inputs (model.inputs) whose inputs are the built-in data sets' "input" and
    "targets" and whose last layer is a cross_entropy on the layer before it and "targets" is
    the same model: rewritten here. Any other explicit model has no twin."""
    if "inputs" not in model:
        return model
    inputs = {i.get("name"): i for i in model["inputs"]}
    layers = list(model["layers"])
    loss = layers[-1] if layers else {}
    prev = layers[-2].get("name", f"{layers[-2]['type']}{len(layers) - 2}") if len(layers) > 1 else None
    if (set(inputs) != {"input", "targets"} or loss.get("type") != "cross_entropy"
            or loss.get("inputs") != [prev, "targets"] or inputs["input"].get("type") not in ("image", "tokens")):
        raise ConfigError(f"{source}: /model/inputs: the twin handles models whose inputs are input and targets and "
                          "whose last layer is a cross_entropy on the layer before it and targets")
    out = {k: v for k, v in model.items() if k not in ("inputs", "layers")}
    out["input"] = {k: v for k, v in inputs["input"].items() if k != "name"}
    out["layers"] = layers[:-1]
    out["loss"] = {k: v for k, v in loss.items() if k not in ("name", "inputs")}
    return out


def load_config(path):
    with open(path) as f:
        raw = json.load(f)
    cfg = {"name": raw.get("name", ""), "model": shorthand_model(raw["model"], path), "source": path}
    for sec, defaults in SECTION_DEFAULTS.items():
        given = raw.get(sec, {})
        unknown = set(given) - set(defaults)
        if unknown:
            raise ConfigError(f"{path}: /{sec}: unknown key(s) {sorted(unknown)}")
        cfg[sec] = {**defaults, **given}
    if cfg["data"]["length_buckets"]:
        raise ConfigError(f"{path}: /data/length_buckets: the twin pads every batch to the model's lengths")
    aug = cfg["data"]["augment"]
    if not isinstance(aug, dict) or set(aug) - {"hflip"}:
        raise ConfigError(f"{path}: /data/augment: expected an object with the key hflip, got {aug!r}")
    cfg["data"]["augment"] = {"hflip": 0.0, **aug}
    unknown = set(raw) - {"name", "description", "model", *SECTION_DEFAULTS}
    if unknown:
        raise ConfigError(f"{path}: unknown top-level key(s) {sorted(unknown)}")
    return cfg


def scheduled_lr(opt, sch, step, total):
    """The learning rate of step `step` (counted from 1) of `total`, as remat's scheduled_lr."""
    lr = opt["lr"]
    w = sch["warmup_steps"]
    if w > 0 and step <= w:
        return lr * step / w
    if sch["type"] == "cosine":
        span = max(1, total - w)
        t = min(1.0, (step - w) / span)
        floor = lr * sch["min_lr_ratio"]
        return floor + (lr - floor) * 0.5 * (1.0 + math.cos(math.pi * t))
    if sch["type"] == "step":
        return lr * sch["gamma"] ** ((step - 1) // sch["step_size"])
    return lr


# ---- the layer graph (src/graph/graph.cpp, src/graph/layers/) ------------------------------

LAYER_KEYS = {
    "linear": {"out_features": None, "bias": True, "init_std": 0.0, "tie_weight": ""},
    "conv2d": {"out_channels": None, "kernel": None, "stride": 1, "padding": 0, "dilation": 1, "groups": 1,
               "bias": True},
    "batchnorm2d": {"momentum": 0.1, "eps": 1e-5},
    "layernorm": {"eps": 1e-5},
    "relu": {},
    "gelu": {"approximate": "none"},
    "dropout": {"p": 0.5},
    "add": {},
    "flatten": {},
    "maxpool2d": {"kernel": 2, "stride": None, "padding": 0},
    "avgpool2d": {"kernel": 2, "stride": None, "padding": 0},
    "global_avgpool": {},
    "embedding": {"vocab": None, "dim": None, "positions": 0, "init_std": 1.0},
    # impl (fused or materialized) changes how remat computes, not what: the twin ignores it.
    # kv_heads 0: as many as heads (remat's default).
    "attention": {"heads": 1, "kv_heads": 0, "dropout": 0.0, "causal": True, "impl": "fused"},
    "rmsnorm": {"eps": 1e-6},
    "silu": {},
    "mul": {},
    "rope": {"heads": 1, "kv_heads": 0, "theta": 10000.0, "scaling": {}},
    "patch_tokens": {},
    "position_embedding": {"positions": None, "init_std": 0.02},
    "mean_tokens": {},
    "concat": {},
    "upsample": {"scale_factor": 2},
}
INT_KEYS = {"out_features", "out_channels", "groups", "vocab", "dim", "positions", "heads", "kv_heads", "scale_factor"}
PAIR_KEYS = {"kernel", "stride", "padding", "dilation"}


class Param:
    """A parameter or buffer: full name, shape, remat's init (kind, scale), flags."""

    def __init__(self, name, shape, init, scale=0.0, trainable=True, decay=True, layer_type=""):
        self.name, self.shape, self.init, self.scale = name, tuple(shape), init, scale
        self.trainable, self.decay, self.layer_type = trainable, decay, layer_type


class Node:
    def __init__(self, name, type_, cfg, inputs, unit):
        self.name, self.type, self.cfg, self.inputs, self.unit = name, type_, cfg, inputs, unit
        self.params = []  # full names, in remat's param_specs order (ties resolved)
        self.shape = None


def _pair(v, what):
    if isinstance(v, list):
        if len(v) != 2:
            raise ConfigError(f"{what}: expected a list of two integers")
        return int(v[0]), int(v[1])
    return int(v), int(v)


# How the twin computes attention: "explicit" (matmul, softmax, dropout, matmul: the [T, T]
# probabilities, as remat's materialised path and PyTorch 1.13) or "sdpa"
# (torch.nn.functional.scaled_dot_product_attention, PyTorch >= 2.0: its fused kernels where
# it has them). Set by --attention; only for timing and memory (the values agree to rounding).
ATTENTION = "explicit"


class Graph:
    """Nodes in topological order (input, targets, the layers, loss) and parameter specs."""

    def __init__(self, model, batch, vars_=None, source="config"):
        self.source = source
        self.vars = dict(vars_ or {})
        self.vars.update({k: int(v) for k, v in model.get("vars", {}).items()})
        self.nodes = []
        self.params = {}  # full name -> Param, in creation order
        inp = model["input"]
        if inp.get("type", "image") == "image":
            c, h, w = inp["shape"]
            self.input_shape, self.input_dtype = (batch, c, h, w), torch.float32
            self.targets_shape = (batch,)
        else:
            t = self._int(inp["seq_len"], "/model/input/seq_len")
            self.vars["seq_len"] = t
            self.input_shape, self.input_dtype = (batch, t), torch.int32
            self.targets_shape = (batch, t)
        self.tokens = self.input_dtype == torch.int32
        self.batch = batch
        self._add(Node("input", "input", {}, [], -1), None)
        self.nodes[0].shape = self.input_shape
        self._add(Node("targets", "input", {}, [], -1), None)
        self.nodes[1].shape = self.targets_shape
        self.num_units = 0
        self.logits_id = self._build_list(model["layers"], {"input": 0}, 0, "", -1, "/model/layers")
        loss = {"type": "cross_entropy", "ignore_index": -100, **model.get("loss", {})}
        self.ignore_index = int(loss["ignore_index"])
        self.loss_id = self._add(Node("loss", "cross_entropy", loss, [self.logits_id, 1], -1), None)

    def _int(self, v, where):
        if isinstance(v, str) and v.startswith("$"):
            if v[1:] not in self.vars:
                raise ConfigError(f"{self.source}: {where}: unknown variable {v!r}")
            return self.vars[v[1:]]
        if isinstance(v, float) and v.is_integer():
            return int(v)
        if not isinstance(v, int) or isinstance(v, bool):
            raise ConfigError(f"{self.source}: {where}: expected an integer, got {v!r}")
        return v

    def _build_list(self, layers, scope, prev, prefix, unit, where):
        scope = dict(scope)
        for i, spec in enumerate(layers):
            at = f"{where}/{i}"
            t = spec["type"]
            if t == "repeat":
                name = spec.get("name", "block")
                for k in range(self._int(spec["count"], at + "/count")):
                    inner = dict(scope)
                    inner["in"] = prev
                    u = self.num_units
                    self.num_units += 1
                    prev = self._build_list(spec["layers"], inner, prev, f"{prefix}{name}{k}.", u, at + "/layers")
                scope[name] = prev
                continue
            if t not in LAYER_KEYS:
                raise ConfigError(f"{self.source}: {at}/type: unknown layer type {t!r}")
            allowed = LAYER_KEYS[t]
            unknown = set(spec) - set(allowed) - {"type", "name", "inputs"}
            if unknown:
                raise ConfigError(f"{self.source}: {at}: unknown key(s) {sorted(unknown)} for {t}")
            cfg = {}
            for k, d in allowed.items():
                if k in spec:
                    v = spec[k]
                    cfg[k] = self._int(v, f"{at}/{k}") if k in INT_KEYS else v
                elif d is None and not (k == "stride" and t in ("maxpool2d", "avgpool2d")):
                    raise ConfigError(f"{self.source}: {at}/{k}: missing (required)")
                else:
                    cfg[k] = d
            local = spec.get("name", f"{t}{i}")
            inputs = [scope[r] if r in scope else self._missing(at, r) for r in spec.get("inputs", [])] or [prev]
            prev = self._add(Node(prefix + local, t, cfg, inputs, unit), at)
            scope[local] = prev
        return prev

    def _missing(self, at, ref):
        raise ConfigError(f"{self.source}: {at}/inputs: no tensor named {ref!r} before this layer")

    def _add(self, node, at):
        if any(n.name == node.name for n in self.nodes):
            raise ConfigError(f"{self.source}: {at}/name: duplicate layer name {node.name!r}")
        if node.type not in ("input",):
            node.shape = self._infer(node, [self.nodes[i].shape for i in node.inputs], at)
        self.nodes.append(node)
        return len(self.nodes) - 1

    def _param(self, node, local, shape, init, scale=0.0, trainable=True, decay=True, tie=""):
        if tie:
            if tie not in self.params:
                raise ConfigError(f"{self.source}: {node.name}: no parameter {tie!r} defined before this layer")
            if self.params[tie].shape != tuple(shape):
                raise ConfigError(f"{self.source}: {node.name}: {tie!r} has shape {self.params[tie].shape}, "
                                  f"this layer needs {tuple(shape)}")
            node.params.append(tie)
            return
        full = f"{node.name}.{local}"
        self.params[full] = Param(full, shape, init, scale, trainable, decay, node.type)
        node.params.append(full)

    def _infer(self, n, shapes, at):
        c = n.cfg
        t = n.type
        x = shapes[0]
        if t == "linear":
            fin = x[-1]
            bound = 1.0 / math.sqrt(max(fin, 1))
            std = float(c["init_std"])
            tie = c["tie_weight"] + ".weight" if c["tie_weight"] else ""
            if std > 0:
                self._param(n, "weight", (c["out_features"], fin), "normal", std, tie=tie)
            else:
                self._param(n, "weight", (c["out_features"], fin), "uniform", bound, tie=tie)
            if c["bias"]:
                if std > 0:
                    self._param(n, "bias", (c["out_features"],), "zeros", decay=False)
                else:
                    self._param(n, "bias", (c["out_features"],), "uniform", bound, decay=False)
            return tuple(x[:-1]) + (c["out_features"],)
        if t == "conv2d":
            kh, kw = _pair(c["kernel"], at)
            sh, sw = _pair(c["stride"], at)
            ph, pw = _pair(c["padding"], at)
            dh, dw = _pair(c["dilation"], at)
            g = int(c["groups"])
            n_, cin, h, w = x
            k = c["out_channels"]
            if cin % g or k % g:
                raise ConfigError(f"{self.source}: {at}: channels not divisible by groups")
            fan_in = cin // g * kh * kw
            bound = 1.0 / math.sqrt(max(fan_in, 1))
            self._param(n, "weight", (k, cin // g, kh, kw), "uniform", bound)
            if c["bias"]:
                self._param(n, "bias", (k,), "uniform", bound, decay=False)
            c.update(kh=kh, kw=kw, sh=sh, sw=sw, ph=ph, pw=pw, dh=dh, dw=dw, g=g)
            p = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
            q = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
            return (n_, k, p, q)
        if t in ("batchnorm2d", "layernorm"):
            ch = x[1] if t == "batchnorm2d" else x[-1]
            self._param(n, "weight", (ch,), "ones", decay=False)
            self._param(n, "bias", (ch,), "zeros", decay=False)
            if t == "batchnorm2d":
                self._param(n, "running_mean", (ch,), "zeros", trainable=False, decay=False)
                self._param(n, "running_var", (ch,), "ones", trainable=False, decay=False)
            return x
        if t == "rmsnorm":
            self._param(n, "weight", (x[-1],), "ones", decay=False)
            return x
        if t == "rope":
            c["kv_heads"] = c["kv_heads"] or c["heads"]
            if len(x) != 3 or x[2] % (c["heads"] + 2 * c["kv_heads"]):
                raise ConfigError(f"{self.source}: {at}: rope input {x} must be [B, T, (heads + 2 kv_heads) d]")
            return x
        if t in ("relu", "gelu", "dropout", "silu"):
            if t == "gelu" and c["approximate"] not in ("none", "tanh"):
                raise ConfigError(f"{self.source}: {at}/approximate: expected none or tanh")
            return x
        if t in ("add", "mul"):
            if len(shapes) != 2 or shapes[0] != shapes[1]:
                raise ConfigError(f"{self.source}: {at}: {t} needs two inputs of one shape, got {shapes}")
            return x
        if t == "flatten":
            return (x[0], int(np.prod(x[1:])) if x[0] else 0)
        if t in ("maxpool2d", "avgpool2d"):
            kh, kw = _pair(c["kernel"], at)
            sh, sw = _pair(c["stride"], at) if c["stride"] is not None else (kh, kw)
            ph, pw = _pair(c["padding"], at)
            c.update(kh=kh, kw=kw, sh=sh, sw=sw, ph=ph, pw=pw)
            return (x[0], x[1], (x[2] + 2 * ph - kh) // sh + 1, (x[3] + 2 * pw - kw) // sw + 1)
        if t == "global_avgpool":
            return (x[0], x[1])
        if t == "embedding":
            std = float(c["init_std"])
            self._param(n, "weight", (c["vocab"], c["dim"]), "normal", std)
            if c["positions"] > 0:
                if x[1] > c["positions"]:
                    raise ConfigError(f"{self.source}: {at}: sequence length {x[1]} exceeds positions")
                self._param(n, "pos_weight", (c["positions"], c["dim"]), "normal", std)
            return (x[0], x[1], c["dim"])
        if t == "attention":
            c["kv_heads"] = c["kv_heads"] or c["heads"]
            all_heads = c["heads"] + 2 * c["kv_heads"]
            if len(x) != 3 or x[2] % all_heads:
                raise ConfigError(f"{self.source}: {at}: attention input {x} must be [B, T, (heads + 2 kv_heads) d]")
            return (x[0], x[1], x[2] // all_heads * c["heads"])
        if t == "patch_tokens":
            if len(x) != 4:
                raise ConfigError(f"{self.source}: {at}: patch_tokens input {x} must be [N, C, H, W]")
            return (x[0], x[2] * x[3], x[1])
        if t == "position_embedding":
            if len(x) != 3 or x[1] > c["positions"]:
                raise ConfigError(f"{self.source}: {at}: position_embedding input {x} must be [N, T <= positions, D]")
            self._param(n, "weight", (c["positions"], x[2]), "normal", float(c["init_std"]), decay=False)
            return x
        if t == "mean_tokens":
            if len(x) != 3:
                raise ConfigError(f"{self.source}: {at}: mean_tokens input {x} must be [N, T, D]")
            return (x[0], x[2])
        if t == "concat":
            if len(shapes) < 2 or len(x) < 2 or any(len(s) != len(x) or s[:1] + s[2:] != x[:1] + x[2:]
                                                    for s in shapes):
                raise ConfigError(f"{self.source}: {at}: concat inputs {shapes} differ beyond dimension 1")
            return (x[0], sum(s[1] for s in shapes)) + tuple(x[2:])
        if t == "upsample":
            if len(x) != 4 or c["scale_factor"] != 2:
                raise ConfigError(f"{self.source}: {at}: upsample needs [N, C, H, W] and scale_factor 2")
            return (x[0], x[1], 2 * x[2], 2 * x[3])
        if t == "cross_entropy":
            return (1,)
        raise ConfigError(f"{self.source}: {at}: no shape rule for {t}")

    # ---- parameters --------------------------------------------------------------------------

    def init_params(self, how, seed, dtype=torch.float32):
        """New parameter and buffer tensors by full name. how='remat': remat's init
        distributions (not its Philox values); how='golden': every value random (norm weights
        around 1, biases and running statistics non-zero), so that a test sees each of them."""
        gen = torch.Generator().manual_seed(seed)

        def u(shape, lo, hi):
            return torch.rand(shape, generator=gen) * (hi - lo) + lo

        out = {}
        for name, p in self.params.items():
            local = name.rsplit(".", 1)[1]
            if how == "golden":
                if p.init in ("uniform", "normal"):
                    fan_in = int(np.prod(p.shape[1:])) if len(p.shape) > 1 else p.shape[0]
                    if p.layer_type == "embedding":
                        v = torch.randn(p.shape, generator=gen) * 0.5
                    else:
                        b = 1.5 / math.sqrt(max(fan_in, 1))
                        v = u(p.shape, -b, b)
                elif local == "running_var":
                    v = u(p.shape, 0.5, 1.5)
                elif p.init == "ones":
                    v = u(p.shape, 0.7, 1.3)
                else:  # biases, running_mean
                    v = u(p.shape, -0.2, 0.2)
            else:
                if p.init == "uniform":
                    v = u(p.shape, -p.scale, p.scale)
                elif p.init == "normal":
                    v = torch.randn(p.shape, generator=gen) * p.scale
                elif p.init == "ones":
                    v = torch.ones(p.shape)
                else:
                    v = torch.zeros(p.shape)
            out[name] = v.to(dtype)
        return out

    def check_weights(self, weights, what):
        """Every parameter and buffer present with its shape, and nothing else."""
        want = {n: p.shape for n, p in self.params.items()}
        missing = sorted(set(want) - set(weights))
        extra = sorted(set(weights) - set(want))
        bad = sorted(n for n in set(want) & set(weights) if tuple(weights[n].shape) != want[n])
        if missing or extra or bad:
            raise ConfigError(f"{what}: weights do not match the model: missing {missing}, unexpected {extra}, "
                              f"wrong shape {[(n, tuple(weights[n].shape), want[n]) for n in bad]}")

    # ---- forward -------------------------------------------------------------------------------

    def forward(self, w, x, targets, training=True):
        """The loss of one batch (and the logits). `w` maps full names to tensors; batchnorm
        running statistics in `w` are updated in place in training mode, as remat's forward."""
        vals = [None] * len(self.nodes)
        vals[0], vals[1] = x, targets
        for i, n in enumerate(self.nodes):
            if n.type == "input":
                continue
            ins = [vals[j] for j in n.inputs]
            p = [w[k] for k in n.params]
            vals[i] = self._apply(n, ins, p, training)
        return vals[self.loss_id], vals[self.logits_id]

    def _apply(self, n, ins, p, training):
        c, t, x = n.cfg, n.type, ins[0]
        if t in ("batchnorm2d", "layernorm") and x.is_floating_point() and x.dtype != p[0].dtype:
            x = x.to(p[0].dtype)  # under autocast: norms in fp32, as CUDA autocast runs them (CPU's 1.13 fails)
        if t == "linear":
            return F.linear(x, p[0], p[1] if c["bias"] else None)
        if t == "conv2d":
            return F.conv2d(x, p[0], p[1] if c["bias"] else None, (c["sh"], c["sw"]), (c["ph"], c["pw"]),
                            (c["dh"], c["dw"]), c["g"])
        if t == "batchnorm2d":
            return F.batch_norm(x, p[2], p[3], p[0], p[1], training=training, momentum=float(c["momentum"]),
                                eps=float(c["eps"]))
        if t == "layernorm":
            return F.layer_norm(x, (x.shape[-1],), p[0], p[1], float(c["eps"]))
        if t == "rmsnorm":
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + float(c["eps"])) * p[0]
        if t == "silu":
            return F.silu(x)
        if t == "mul":
            return ins[0] * ins[1]
        if t == "rope":
            return self._rope(x, c)
        if t == "relu":
            return F.relu(x)
        if t == "gelu":
            return F.gelu(x, approximate=c["approximate"])
        if t == "dropout":
            return F.dropout(x, float(c["p"]), training) if float(c["p"]) > 0 else x
        if t == "add":
            return ins[0] + ins[1]
        if t == "flatten":
            return x.reshape(x.shape[0], -1)
        if t == "maxpool2d":
            return F.max_pool2d(x, (c["kh"], c["kw"]), (c["sh"], c["sw"]), (c["ph"], c["pw"]))
        if t == "avgpool2d":
            return F.avg_pool2d(x, (c["kh"], c["kw"]), (c["sh"], c["sw"]), (c["ph"], c["pw"]),
                                count_include_pad=True)
        if t == "global_avgpool":
            return x.mean(dim=(2, 3))
        if t == "embedding":
            y = F.embedding(x.long(), p[0])
            if c["positions"] > 0:
                y = y + p[1][: x.shape[1]]
            return y
        if t == "attention":
            return self._attention(x, c, training)
        if t == "patch_tokens":
            return x.flatten(2).transpose(1, 2)
        if t == "position_embedding":
            return x + p[0][: x.shape[1]]
        if t == "mean_tokens":
            return x.mean(dim=1)
        if t == "concat":
            return torch.cat(ins, dim=1)
        if t == "upsample":
            return F.interpolate(x, scale_factor=2, mode="nearest")
        if t == "cross_entropy":
            v = x.shape[-1]
            return F.cross_entropy(x.reshape(-1, v), ins[1].reshape(-1).long(), ignore_index=self.ignore_index)
        raise ConfigError(f"no forward for {t}")

    @staticmethod
    def _rope_freqs(d, theta, sc):
        """Hugging Face's inverse frequencies (their _compute_*_parameters), in float64."""
        f = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
        kind = sc.get("type", "none")
        if kind == "linear":
            return f / float(sc["factor"])
        if kind == "llama3":
            factor, low, high = float(sc["factor"]), float(sc.get("low_freq_factor", 1)), float(sc.get("high_freq_factor", 4))
            old = float(sc.get("original_max_position", 8192))
            wavelen = 2 * math.pi / f
            g = torch.where(wavelen > old / low, f / factor, f)
            smooth = (old / wavelen - low) / (high - low)
            medium = ~(wavelen < old / high) & ~(wavelen > old / low)
            return torch.where(medium, (1 - smooth) * g / factor + smooth * g, g)
        return f

    @staticmethod
    def _rope(x, c):
        """The halves form (rotate_half) on q's and k's heads of the packed [B, T, (H + 2 KV) d]."""
        b, t, width = x.shape
        heads = c["heads"] + 2 * c["kv_heads"]
        d = width // heads
        turned = c["heads"] + c["kv_heads"]
        ang = torch.arange(t, dtype=torch.float64)[:, None] * Graph._rope_freqs(d, float(c["theta"]), c["scaling"])[None]
        cos = torch.cat([ang.cos(), ang.cos()], -1).to(x.dtype)
        sin = torch.cat([ang.sin(), ang.sin()], -1).to(x.dtype)
        z = x.reshape(b, t, heads, d)
        qk, v = z[:, :, :turned], z[:, :, turned:]
        rot = torch.cat([-qk[..., d // 2:], qk[..., : d // 2]], -1)
        qk = qk * cos[None, :, None] + rot * sin[None, :, None]
        return torch.cat([qk, v], 2).reshape(b, t, width)

    @staticmethod
    def _attention(qkv, c, training):
        b, t, width = qkv.shape
        h, kvh = c["heads"], c["kv_heads"]
        hs = width // (h + 2 * kvh)
        ch = h * hs
        q, k, v = qkv.split([h * hs, kvh * hs, kvh * hs], dim=2)
        q = q.reshape(b, t, h, hs).transpose(1, 2)
        # Grouped queries: query head j reads key/value head j // (h / kvh).
        k, v = (z.reshape(b, t, kvh, hs).transpose(1, 2).repeat_interleave(h // kvh, dim=1) for z in (k, v))
        if ATTENTION == "sdpa":
            drop = float(c["dropout"]) if training else 0.0
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=drop, is_causal=bool(c["causal"]))
            return y.transpose(1, 2).reshape(b, t, ch)
        s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        if c["causal"]:
            mask = torch.ones(t, t, dtype=torch.bool, device=qkv.device).triu(1)
            s = s.masked_fill(mask, float("-inf"))
        prob = torch.softmax(s, dim=-1)
        if training and float(c["dropout"]) > 0:
            prob = F.dropout(prob, float(c["dropout"]), True)
        return (prob @ v).transpose(1, 2).reshape(b, t, ch)


# ---- data (src/data/*.cpp) ---------------------------------------------------------------------

FORTUNES_DIR = "/usr/share/games/fortunes"
FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
GOLDEN_GAMMA = 0x9E3779B97F4A7C15
M64 = (1 << 64) - 1


def _read_maybe_gzip(path):
    with open(path, "rb") as f:
        b = f.read()
    return gzip.decompress(b) if b[:2] == b"\x1f\x8b" else b


def _text_corpus(path):
    """remat's load_text_corpus: regular files of a folder in sorted order, skipping hidden
    files, *.dat, *.u8 and symlinks to files already included; a newline after each file
    that lacks one. A file path loads that file."""
    if os.path.isfile(path):
        return _read_maybe_gzip(path)
    files, links = [], []
    for name in os.listdir(path):
        p = os.path.join(path, name)
        if not name or name.startswith(".") or name.endswith(".dat") or name.endswith(".u8"):
            continue
        if not os.path.isfile(p):
            continue
        (links if os.path.islink(p) else files).append(p)
    seen = {os.path.realpath(p) for p in files}
    for p in sorted(links):
        if os.path.realpath(p) not in seen:
            seen.add(os.path.realpath(p))
            files.append(p)
    text = bytearray()
    for p in sorted(files):
        text += _read_maybe_gzip(p)
        if text and text[-1:] != b"\n":
            text += b"\n"
    return bytes(text)


def _splitmix64(x):
    x = (x + GOLDEN_GAMMA) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


class _SplitMix:
    def __init__(self, seed):
        self.s = seed & M64

    def __call__(self):
        out = _splitmix64(self.s)
        self.s = (self.s + GOLDEN_GAMMA) & M64
        return out

    def uniform(self):
        return (self() >> 11) * 2.0 ** -53

    def normal(self):
        u1 = 1.0 - self.uniform()
        u2 = self.uniform()
        return math.sqrt(-2.0 * math.log(u1)) * math.cos(6.283185307179586 * u2)


def _uniform_below(gen, bound):
    threshold = ((1 << 64) - bound) % bound
    while True:
        r = gen()
        if r >= threshold:
            return r % bound


def _stream_seed(seed, stream, index):
    return _splitmix64((_splitmix64(seed ^ stream) + index) & M64)


PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85
AUGMENT_STREAM = 0x6175676D656E7431  # kAugmentStream (include/remat/data.h)


def _philox_uniform(seed, words):
    """include/remat/philox.h: philox::uniform(philox::word(seed, w)) for each w of `words`
    (a numpy uint64 array), as float32."""
    m32 = np.uint64(0xFFFFFFFF)
    b = words >> np.uint64(2)
    c0, c1 = (b >> np.uint64(16)) & m32, (b >> np.uint64(48)) & m32
    c2, c3 = b & np.uint64(0xFFFF), np.zeros_like(b)
    k0, k1 = seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF
    for r in range(10):
        if r:
            k0, k1 = (k0 + PHILOX_W0) & 0xFFFFFFFF, (k1 + PHILOX_W1) & 0xFFFFFFFF
        p0, p1 = np.uint64(PHILOX_M0) * c0, np.uint64(PHILOX_M1) * c2
        c0, c1, c2, c3 = ((p1 >> np.uint64(32)) ^ c1 ^ np.uint64(k0), p1 & m32,
                          (p0 >> np.uint64(32)) ^ c3 ^ np.uint64(k1), p0 & m32)
    comp = words & np.uint64(3)
    x = np.select([comp == 0, comp == 1, comp == 2], [c0, c1, c2], c3).astype(np.uint32)
    return x.astype(np.float32) * np.float32(2.3283064365386963e-10) + np.float32(1.1641532182693481e-10)


def _hflip_draws(seed, epoch, n, indices, p):
    """remat's hflip_draws (src/data/batch.cpp): sample `index` is mirrored in `epoch` when
    uniform(word(seed ^ kAugmentStream, epoch * n + index)) < p."""
    if p >= 1.0:
        return np.ones(len(indices), dtype=bool)
    if p <= 0.0:
        return np.zeros(len(indices), dtype=bool)
    words = np.uint64(epoch * n) + np.asarray(indices, dtype=np.uint64)
    return _philox_uniform((seed ^ AUGMENT_STREAM) & M64, words) < np.float32(p)


def _idx(path):
    b = _read_maybe_gzip(path)
    magic, = struct.unpack(">I", b[:4])
    nd = magic & 0xFF
    dims = struct.unpack(">" + "I" * nd, b[4:4 + 4 * nd])
    return np.frombuffer(b, dtype=np.uint8, offset=4 + 4 * nd).reshape(dims)


def _idx_file(d, stem):
    for p in (os.path.join(d, stem + ".gz"), os.path.join(d, stem)):
        if os.path.isfile(p):
            return p
    raise ConfigError(f"Fashion-MNIST file {stem} not found in {d}")


class Data:
    """Training batches in remat's order (data.shuffle false: 0, 1, ... epoch after epoch),
    mirrored as remat mirrors them (data.augment.hflip)."""

    def __init__(self, cfg, tokens, seq_len=0):
        dc = cfg["data"]
        seed = int(cfg["training"]["seed"])
        self.seed = seed
        self.hflip = float(dc["augment"]["hflip"])
        self.text = tokens
        self.seq_len = seq_len
        ds = dc["dataset"]
        if ds in ("fashion_mnist", "synthetic_images"):
            if tokens:
                raise ConfigError(f"{ds} gives images but the model takes tokens")
            if ds == "fashion_mnist":
                d = dc["path"] or os.environ.get("REMAT_FASHION_MNIST_DIR") or FASHION_MNIST_DIR
                lut = (np.arange(256, dtype=np.float32) / np.float32(255.0) - np.float32(0.2860)) / np.float32(0.3530)

                def split(prefix):
                    px = _idx(_idx_file(d, prefix + "-images-idx3-ubyte"))
                    lab = _idx(_idx_file(d, prefix + "-labels-idx1-ubyte"))
                    return (torch.from_numpy(lut[px][:, None, :, :].astype(np.float32)),
                            torch.from_numpy(lab.astype(np.int32)))
                self.images, self.labels = split("train")
                self.eval_images, self.eval_labels = split("t10k")
            else:
                size, shape, classes = int(dc["synthetic_size"]), dc["image_shape"], int(dc["classes"])
                # As remat: one set of the seed's classes, the next quarter evaluates.
                n_eval = max(size // 4, 1)
                imgs, labs = self._synthetic_images(size + n_eval, shape, classes, seed)
                self.images, self.labels = imgs[:size], labs[:size]
                self.eval_images, self.eval_labels = imgs[size:], labs[size:]
            self.n = self.labels.shape[0]
            self.n_eval = self.eval_labels.shape[0]
            return
        if not tokens:
            raise ConfigError(f"{ds} gives text but the model takes images")
        if ds == "text":
            if not dc["path"]:
                raw = _text_corpus(os.environ.get("REMAT_TEXT_CORPUS") or FORTUNES_DIR)
            elif os.path.isdir(dc["path"]):
                raw = _text_corpus(dc["path"])
            else:
                raw = _read_maybe_gzip(dc["path"])
            vocab = sorted(set(raw))
            lut = np.zeros(256, dtype=np.int32)
            lut[vocab] = np.arange(len(vocab), dtype=np.int32)
            toks = lut[np.frombuffer(raw, dtype=np.uint8)]
            self.vocab = len(vocab)
        else:
            toks = self._synthetic_text(int(dc["synthetic_size"]), int(dc["vocab"]), seed)
            self.vocab = int(dc["vocab"])
        n_eval = int(float(len(toks)) * float(dc["eval_fraction"]))
        self.tokens = torch.from_numpy(np.ascontiguousarray(toks[:len(toks) - n_eval]).astype(np.int32))
        self.eval_tokens = torch.from_numpy(np.ascontiguousarray(toks[len(toks) - n_eval:]).astype(np.int32))
        self.n = self._windows(self.tokens)
        self.n_eval = self._windows(self.eval_tokens)

    def _windows(self, toks):
        return (len(toks) - 1) // self.seq_len if len(toks) > self.seq_len else 0

    @staticmethod
    def _synthetic_text(n, v, seed):
        g = _SplitMix(_stream_seed(seed, 0x73616D706C657321, 0))
        out = np.empty(n, dtype=np.int32)
        t = _uniform_below(g, v)
        for i in range(n):
            out[i] = t
            t = (7 * t + 3) % v if _uniform_below(g, 4) != 0 else _uniform_below(g, v)
        return out

    @staticmethod
    def _synthetic_images(n, shape, classes, seed):
        per = int(np.prod(shape))
        protos = []
        for k in range(classes):
            g = _SplitMix(_stream_seed(seed, 0x70726F746F747970, k))
            protos.append(np.array([1.0 if g() >> 63 else -1.0 for _ in range(per)], dtype=np.float32))
        images = np.empty((n, per), dtype=np.float32)
        labels = np.empty(n, dtype=np.int32)
        for i in range(n):
            g = _SplitMix(_stream_seed(seed, 0x73616D706C657321, i))
            lab = _uniform_below(g, classes)
            labels[i] = lab
            noise = np.array([0.5 * g.normal() for _ in range(per)], dtype=np.float64).astype(np.float32)
            images[i] = protos[lab] + noise
        return torch.from_numpy(images.reshape(n, *shape)), torch.from_numpy(labels)

    def batch(self, k, b):
        """The k-th batch (from 0) of the in-order sampler with drop_last."""
        per_epoch = self.n // b
        if per_epoch == 0:
            raise ConfigError(f"the training set has {self.n} samples, fewer than one batch of {b}")
        start = (k % per_epoch) * b
        x, y = self._slice(False, start, b)
        if self.hflip > 0 and not self.text:
            flips = _hflip_draws(self.seed, k // per_epoch, self.n, range(start, start + b), self.hflip)
            x = torch.where(torch.from_numpy(flips)[:, None, None, None], x.flip(-1), x)
        return x, y

    def eval_batch(self, k, b):
        """Evaluation batch k: samples k*b .. k*b+b-1 of the evaluation set."""
        return self._slice(True, k * b, b)

    def _slice(self, ev, start, b):
        if not self.text:
            images, labels = (self.eval_images, self.eval_labels) if ev else (self.images, self.labels)
            return images[start:start + b], labels[start:start + b]
        toks, t = (self.eval_tokens if ev else self.tokens), self.seq_len
        x = torch.stack([toks[i * t:i * t + t] for i in range(start, start + b)])
        y = torch.stack([toks[i * t + 1:i * t + t + 1] for i in range(start, start + b)])
        return x, y


def model_vars(cfg, need_data=True):
    """$vocab as remat computes it (the corpus's vocabulary), plus the data set."""
    tokens = cfg["model"]["input"].get("type", "image") == "tokens"
    if not need_data and (not tokens or cfg["data"]["dataset"] == "synthetic_text"):
        return ({"vocab": int(cfg["data"]["vocab"])} if tokens else {}), None
    seq_len = int(cfg["model"]["input"]["seq_len"]) if tokens else 0
    data = Data(cfg, tokens, seq_len)
    return ({"vocab": data.vocab} if tokens else {}), data


# ---- optimizer (src/optim/optim.cpp: torch.optim formulas) ----------------------------------

def make_optimizer(cfg, g, w):
    oc = cfg["optimizer"]
    decay = [w[n] for n, p in g.params.items() if p.trainable and p.decay]
    plain = [w[n] for n, p in g.params.items() if p.trainable and not p.decay]
    groups = [{"params": decay, "weight_decay": float(oc["weight_decay"])},
              {"params": plain, "weight_decay": 0.0}]
    groups = [gr for gr in groups if gr["params"]]
    if oc["type"] == "adamw":
        return torch.optim.AdamW(groups, lr=float(oc["lr"]), betas=(float(oc["beta1"]), float(oc["beta2"])),
                                 eps=float(oc["eps"]))
    return torch.optim.SGD(groups, lr=float(oc["lr"]), momentum=float(oc["momentum"]),
                           dampening=float(oc["dampening"]), nesterov=bool(oc["nesterov"]))


class Trainer:
    """One training step as remat's loop: zero grads, forward, backward, clipping, lr, update."""

    def __init__(self, cfg, g, w, total, precision="fp32", device_type="cpu"):
        self.cfg, self.g, self.w, self.total = cfg, g, w, total
        # bf16: PyTorch's autocast (its GEMMs and convolutions in bf16, fp32 weights,
        # gradients and optimizer state): the mixed precision a PyTorch user would run.
        self.bf16 = precision == "bf16"
        self.device_type = device_type
        for n, p in g.params.items():
            w[n].requires_grad_(p.trainable)
        self.trainable = [w[n] for n, p in g.params.items() if p.trainable]
        self.opt = make_optimizer(cfg, g, w)
        self.step_no = 0

    def step(self, x, y):
        for t in self.trainable:
            t.grad = None
        with torch.autocast(self.device_type, dtype=torch.bfloat16, enabled=self.bf16):
            loss, _ = self.g.forward(self.w, x, y, training=True)
        loss = loss.float()
        loss.backward()
        self.step_no += 1
        clip = float(self.cfg["optimizer"]["grad_clip"])
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(self.trainable, clip)
        lr = scheduled_lr(self.cfg["optimizer"], self.cfg["schedule"], self.step_no, self.total)
        for gr in self.opt.param_groups:
            gr["lr"] = lr
        self.opt.step()
        return float(loss)


def load_weights(path, g):
    w, _ = st.load(path)
    g.check_weights(w, path)
    return {n: w[n].clone() for n in g.params}


def total_steps(cfg, data):
    tc = cfg["training"]
    if tc["steps"] > 0:
        return int(tc["steps"])
    return int(tc["epochs"]) * (data.n // int(tc["batch"]))


# ---- modes -------------------------------------------------------------------------------------------

def cmd_golden(a):
    cfg = load_config(a.config)
    batch = a.batch or int(cfg["training"]["batch"])
    vars_, _ = model_vars(cfg, need_data=False)
    g = Graph(cfg["model"], batch, vars_, a.config)
    for n in g.nodes:
        if (n.type == "dropout" and float(n.cfg["p"]) > 0) or (n.type == "attention" and float(n.cfg["dropout"]) > 0):
            sys.exit(f"golden: {n.name}: dropout must be 0 in a golden config (masks differ between remat and torch)")
    gen = torch.Generator().manual_seed(a.seed + 1)
    w32 = g.init_params("golden", a.seed)
    logits_dim = g.nodes[g.logits_id].shape[-1]
    if g.tokens:
        x = torch.randint(0, vars_["vocab"], g.input_shape, generator=gen, dtype=torch.int32)
        y = torch.randint(0, logits_dim, g.targets_shape, generator=gen, dtype=torch.int32)
        y.view(-1)[::7] = g.ignore_index  # some ignored targets
    else:
        x = torch.randn(g.input_shape, generator=gen)
        y = torch.randint(0, logits_dim, g.targets_shape, generator=gen, dtype=torch.int32)
    # float64 from the float32 values: the exact answer to float32 rounding.
    w64 = {n: v.double().requires_grad_(g.params[n].trainable) for n, v in w32.items()}
    loss, _ = g.forward(w64, x.double() if not g.tokens else x, y, training=True)
    loss.backward()
    tensors = {"input": x, "targets": y, "loss": loss.detach().reshape(1).float()}
    for n, v in w32.items():
        tensors["param/" + n] = v
    for n, p in g.params.items():
        if p.trainable:
            tensors["grad/" + n] = w64[n].grad.float()
        else:
            tensors["after/" + n] = w64[n].detach().float()
    rel = os.path.relpath(os.path.abspath(a.config), ROOT)
    meta = {"config": rel, "batch": batch, "vars": json.dumps(vars_, sort_keys=True), "seed": a.seed,
            "loss": repr(float(loss)), "reference": "torch float64 from float32 values",
            "torch": torch.__version__}
    out = a.out or os.path.join(ROOT, "tests", "golden", "twin",
                                os.path.splitext(os.path.basename(a.config))[0] + ".safetensors")
    st.save(out, tensors, meta)
    print(f"golden: {out}: loss {float(loss):.9g}, {len(g.params)} parameters/buffers, batch {batch}")


def _read_metrics(path):
    losses, times = {}, {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            if "loss" in r:
                losses[int(r["step"])] = float(r["loss"])
            if "step_ms" in r:
                times[int(r["step"])] = float(r["step_ms"])
    return losses, times


def cmd_curve(a):
    torch.set_num_threads(a.threads)
    cfg = load_config(os.path.join(a.run, "config.json"))
    if cfg["data"]["shuffle"]:
        sys.exit("curve: the run shuffles its data (data.shuffle true); the twin reproduces in-order batches only")
    vars_, data = model_vars(cfg)
    batch = int(cfg["training"]["batch"])
    g = Graph(cfg["model"], batch, vars_, cfg["source"])
    for n in g.nodes:
        if (n.type == "dropout" and float(n.cfg["p"]) > 0) or (n.type == "attention" and float(n.cfg["dropout"]) > 0):
            print(f"curve: warning: {n.name} has dropout; its masks differ from remat's", file=sys.stderr)
    w = load_weights(a.weights or os.path.join(a.run, "init.safetensors"), g)
    total = total_steps(cfg, data)
    steps = min(a.steps or total, total)
    tr = Trainer(cfg, g, w, total, a.precision or cfg["training"]["precision"])
    ref, _ = _read_metrics(os.path.join(a.run, "metrics.jsonl"))
    out = open(a.out, "w") if a.out else None
    worst, worst_step, diffs = 0.0, 0, []
    t0 = time.time()
    for k in range(steps):
        x, y = data.batch(k, batch)
        loss = tr.step(x, y)
        s = k + 1
        line = {"step": s, "loss": float(f"{loss:.9g}")}
        if s in ref:
            d = abs(loss - ref[s]) / abs(ref[s])
            diffs.append(d)
            line["remat_loss"] = ref[s]
            line["rel_diff"] = d
            if d > worst:
                worst, worst_step = d, s
        if out:
            out.write(json.dumps(line) + "\n")
        if a.verbose or s % 50 == 0 or s == steps:
            print(f"step {s}/{steps} | twin {loss:.6f} | remat {ref.get(s, float('nan')):.6f} | "
                  f"max rel diff so far {worst:.3e} (step {worst_step}) | {time.time() - t0:.0f}s", flush=True)
    if out:
        out.close()
    if not diffs:
        sys.exit("curve: metrics.jsonl has no loss for any step the twin ran")
    print(f"curve: {len(diffs)} steps compared: max relative loss difference {worst:.3e} at step {worst_step}, "
          f"mean {statistics.mean(diffs):.3e}, final twin {loss:.6f} remat {ref.get(steps, float('nan')):.6f}")
    if a.max_rel is not None and worst > a.max_rel:
        sys.exit(f"curve: max relative difference {worst:.3e} exceeds {a.max_rel}")


def _largest_divisor_at_most(n, cap):
    for b in range(min(n, cap), 1, -1):
        if n % b == 0:
            return b
    return 1


def cmd_eval(a):
    """Evaluation loss and accuracy of a run's final weights, as remat's end-of-run evaluation."""
    torch.set_num_threads(a.threads)
    cfg = load_config(os.path.join(a.run, "config.json"))
    vars_, data = model_vars(cfg)
    tc = cfg["training"]
    eval_b = _largest_divisor_at_most(max(data.n_eval, 1), int(tc["batch"]) if data.text else 500)
    g = Graph(cfg["model"], eval_b, vars_, cfg["source"])
    path = a.weights or os.path.join(a.run, "checkpoint", "model.safetensors")
    w = load_weights(path, g)
    batches = data.n_eval // eval_b
    if tc["eval_batches"] > 0:
        batches = min(batches, int(tc["eval_batches"]))
    loss_sum, correct, counted = 0.0, 0, 0
    with torch.no_grad():
        for k in range(batches):
            x, y = data.eval_batch(k, eval_b)
            loss, logits = g.forward(w, x, y, training=False)
            loss_sum += float(loss)
            yv = y.reshape(-1).long()
            keep = yv != g.ignore_index  # accuracy over the rows the loss counts
            pred = logits.reshape(-1, logits.shape[-1]).argmax(dim=1)
            correct += int((pred[keep] == yv[keep]).sum())
            counted += int(keep.sum())
    el, ea = loss_sum / batches, correct / counted
    print(f"eval {path}: {batches} batches of {eval_b}: loss {el:.6f}, accuracy {ea:.4f}")
    evals = []
    with open(os.path.join(a.run, "metrics.jsonl")) as f:
        evals = [json.loads(line) for line in f if "eval_loss" in line]
    if evals:
        r = evals[-1]
        print(f"remat (step {r['step']}): loss {r['eval_loss']:.6f}, accuracy {r['eval_accuracy']:.4f}; "
              f"relative loss difference {abs(el - r['eval_loss']) / abs(r['eval_loss']):.3e}")


def set_attention(name):
    global ATTENTION
    if name == "sdpa" and not hasattr(F, "scaled_dot_product_attention"):
        raise ConfigError(f"--attention sdpa needs PyTorch >= 2.0 (this is {torch.__version__})")
    ATTENTION = name


def cmd_time(a):
    set_attention(a.attention)
    torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    if dev.type == "cuda":
        # As remat: fp32 GEMMs unless TF32 is asked for (REMAT_TF32=1 there).
        torch.backends.cuda.matmul.allow_tf32 = a.tf32
        torch.backends.cudnn.allow_tf32 = a.tf32
    cfg = load_config(a.config)
    batch = a.batch or int(cfg["training"]["batch"])
    cfg["training"]["batch"] = batch
    vars_, data = model_vars(cfg)
    g = Graph(cfg["model"], batch, vars_, a.config)
    w = load_weights(a.weights, g) if a.weights else g.init_params("remat", 0)
    w = {n: t.to(dev) for n, t in w.items()}  # tied parameters share a name, so stay one tensor
    total = max(total_steps(cfg, data), a.steps + 1)
    tr = Trainer(cfg, g, w, total, a.precision, dev.type)
    times = []
    for k in range(a.steps + 1):
        t0 = time.perf_counter()
        x, y = data.batch(k, batch)
        tr.step(x.to(dev), y.to(dev))
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        ms = (time.perf_counter() - t0) * 1000.0
        if k > 0:  # the first step warms up
            times.append(ms)
    med = statistics.median(times)
    where = f"{a.threads} threads" if dev.type == "cpu" else a.device + (" (TF32)" if a.tf32 else "")
    if a.precision == "bf16":
        where += ", autocast bf16"
    print(f"twin {cfg['name'] or a.config}: batch {batch}, {where}: median {med:.2f} ms/step over "
          f"{len(times)} steps (mean {statistics.mean(times):.2f}, min {min(times):.2f})")
    for run in a.remat_run or []:
        _, rt = _read_metrics(os.path.join(run, "metrics.jsonl"))
        rts = [v for s, v in sorted(rt.items()) if s > 1]
        if not rts:
            print(f"remat {run}: no step_ms after step 1 (log_every 1 gives every step)")
            continue
        rm = statistics.median(rts)
        print(f"remat {run}: median {rm:.2f} ms/step over {len(rts)} steps; remat/twin = {rm / med:.3f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"config": a.config, "batch": batch, "threads": a.threads, "device": a.device,
                       "tf32": bool(a.tf32 and dev.type == "cuda"), "precision": a.precision,
                       "attention": a.attention, "median_ms": med,
                       "ms": times}, f)


def _set_path(obj, dotted, value):
    keys = dotted.split(".")
    for k in keys[:-1]:
        obj = obj.setdefault(k, {})
    obj[keys[-1]] = value


def _zero_dropout(layers):
    for spec in layers:
        if spec.get("type") == "repeat":
            _zero_dropout(spec["layers"])
        elif spec.get("type") == "dropout":
            spec["p"] = 0
        elif spec.get("type") == "attention":
            spec["dropout"] = 0


def cmd_derive(a):
    with open(a.config) as f:
        raw = json.load(f)
    raw = copy.deepcopy(raw)
    for item in a.overrides:
        key, _, val = item.partition("=")
        if key == "dropout":
            if float(val) != 0:
                sys.exit("derive: only dropout=0 is supported")
            _zero_dropout(raw["model"]["layers"])
            continue
        try:
            v = json.loads(val)
        except json.JSONDecodeError:
            v = val
        _set_path(raw, key, v)
    with open(a.out, "w") as f:
        json.dump(raw, f, indent=2)
        f.write("\n")
    load_config(a.out)  # sections and keys still valid
    print(f"derive: wrote {a.out}")


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("golden", help="write a golden file for a tiny config")
    p.add_argument("config")
    p.add_argument("--out", help="default: tests/golden/twin/<config stem>.safetensors")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=0, help="default: the config's")
    p.set_defaults(fn=cmd_golden)
    p = sub.add_parser("curve", help="train the twin from a remat run's init.safetensors")
    p.add_argument("--run", required=True, help="remat run folder (config.json, init.safetensors, metrics.jsonl)")
    p.add_argument("--weights", help="start weights (default: RUN/init.safetensors)")
    p.add_argument("--steps", type=int, default=0, help="default: the run's")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", help="write per-step losses (JSON lines)")
    p.add_argument("--max-rel", type=float, help="fail when the max relative loss difference exceeds this")
    p.add_argument("--precision", choices=("fp32", "bf16"),
                   help="bf16: the twin under torch.autocast (CPU, bfloat16), fp32 weights and optimizer "
                        "(default: the run's training.precision)")
    p.add_argument("--verbose", action="store_true")
    p.set_defaults(fn=cmd_curve)
    p = sub.add_parser("eval", help="evaluation loss of a remat run's final weights")
    p.add_argument("--run", required=True, help="remat run folder (config.json, checkpoint/, metrics.jsonl)")
    p.add_argument("--weights", help="default: RUN/checkpoint/model.safetensors")
    p.add_argument("--threads", type=int, default=2)
    p.set_defaults(fn=cmd_eval)
    p = sub.add_parser("time", help="median time of one twin training step")
    p.add_argument("config")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=0)
    p.add_argument("--weights", help="start weights (remat's init.safetensors or checkpoint/model.safetensors)")
    p.add_argument("--remat-run", action="append", help="remat run folder(s) to compare (median step_ms)")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    p.add_argument("--tf32", action="store_true", help="on cuda: TF32 matrix products (default fp32)")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                   help="bf16: torch.autocast with bfloat16 on the device (fp32 weights and optimizer)")
    p.add_argument("--attention", choices=("explicit", "sdpa"), default="explicit",
                   help="sdpa: PyTorch's scaled_dot_product_attention (torch >= 2.0)")
    p.add_argument("--json")
    p.set_defaults(fn=cmd_time)
    p = sub.add_parser("derive", help="write a config with overrides")
    p.add_argument("config")
    p.add_argument("out")
    p.add_argument("overrides", nargs="*", help="dotted.key=JSON_VALUE or dropout=0")
    p.set_defaults(fn=cmd_derive)
    a = ap.parse_args(argv)
    try:
        a.fn(a)
    except ConfigError as e:
        sys.exit(f"torch_reference: {e}")


if __name__ == "__main__":
    main(sys.argv[1:])
