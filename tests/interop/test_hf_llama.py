#!/usr/bin/env python3
"""remat's Llama against Hugging Face transformers' LlamaForCausalLM (no download).

A random LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
num_key_value_heads=2, intermediate_size=172, ...) model, its RMSNorm weights randomised
too, saved locally by save_pretrained in shards with an index; the remat config is
models/llama_tiny.json at the same sizes (its layer names, RoPE in the halves form,
grouped-query attention, SwiGLU). Then:
  1. weights: remat loads the sharded folder into exactly transformers' state dict, with
     q_proj, k_proj and v_proj stacked into remat's qkv;
  2. logits: remat's on the same ids equal transformers' (dropout off);
  3. training: 4 steps of remat train (--policy selective) and of transformers with
     torch.optim.AdamW (decay on the matrices, clipping, the same learning rates) give
     losses within 1e-4;
  4. round trip: remat -> export --format hf-llama -> from_pretrained (same logits) ->
     save_pretrained -> remat is bitwise; an export with --max-shard-size is sharded and
     loads the same; --dtype bf16 loads as torch's rounding of the checkpoint; re-exporting
     into the folder unsharded leaves no stale shard;
  5. a tied model (tie_word_embeddings, as SmolLM and Llama 3.2 1B) loads into a config
     whose head has tie_weight, with transformers' logits;
  6. a model with linear rope_scaling (factor 4) gives transformers' logits in a config whose
     rope layers scale so, is refused by one that does not, and exports its scaling;
  7. a config.json that disagrees (rope_theta, rope_scaling, num_key_value_heads) is
     refused naming the key.
"""
import json
import os
import shutil
import sys

from common import (ROOT, bitwise, check, cosine_lr, parse_args, print_losses, read_safetensors, remat_losses, run,
                    skip, train_like_remat)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
try:
    import numpy as np
    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM
except ImportError as e:
    skip(f"transformers is not importable from {sys.executable} ({e}); tools/bootstrap.sh installs the pinned "
         "version into its venv (tools/python/interop_python.sh)")

L, C, H, KV, F, V, P, SEQ, B = 2, 64, 4, 2, 172, 256, 64, 32, 4
D = C // H
EPS, THETA = 1e-5, 10000.0
STEPS, LR, WD, BETAS, ADAM_EPS, CLIP, WARMUP, MIN_RATIO = 4, 3e-3, 0.1, (0.9, 0.95), 1e-8, 1.0, 1, 0.1


def remat_config(work, name, tied, scaling=None):
    """models/llama_tiny.json at this test's sizes, on token shards."""
    with open(os.path.join(ROOT, "models", "llama_tiny.json")) as f:
        c = json.load(f)
    c["model"]["inputs"][0]["seq_len"] = SEQ
    sizes = {"embed": {"dim": C}, "qkv": {"out_features": (H + 2 * KV) * D}, "rope": {"heads": H, "kv_heads": KV,
             "theta": THETA}, "attn": {"heads": H, "kv_heads": KV}, "o_proj": {"out_features": C},
             "gate": {"out_features": F}, "up": {"out_features": F}, "down": {"out_features": C}}

    def walk(layers):
        for l in layers:
            if l["type"] == "repeat":
                l["count"] = L
                walk(l["layers"])
            if l["type"] == "rmsnorm":
                l["eps"] = EPS
            l.update(sizes.get(l["name"], {}))
            if l["name"] == "head" and tied:
                l["tie_weight"] = "embed"
            if l["type"] == "rope" and scaling:
                l["scaling"] = scaling
    walk(c["model"]["layers"])
    c["data"] = {"dataset": "token_shards", "vocab": V, "shuffle": False}
    c["optimizer"] = {"type": "adamw", "lr": LR, "weight_decay": WD, "beta1": BETAS[0], "beta2": BETAS[1],
                      "eps": ADAM_EPS, "grad_clip": CLIP}
    c["schedule"] = {"type": "cosine", "warmup_steps": WARMUP, "min_lr_ratio": MIN_RATIO}
    c["training"] = {"batch": B, "log_every": 1, "policy": "selective", "steps": STEPS}
    path = os.path.join(work, name)
    with open(path, "w") as f:
        json.dump(c, f, indent=2)
    return path


def hf_model(tied, seed, rope_scaling=None):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=V, hidden_size=C, intermediate_size=F, num_hidden_layers=L, num_attention_heads=H,
                      num_key_value_heads=KV, max_position_embeddings=P, rms_norm_eps=EPS, rope_theta=THETA,
                      tie_word_embeddings=tied, initializer_range=0.1, attention_dropout=0.0,
                      rope_scaling=rope_scaling)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.normal_(1.0, 0.1)
    return model


def as_remat(state, tied):
    """transformers' state dict as remat's parameters (numpy), written out independently of remat's table."""
    t = {k: v.detach().cpu().numpy() for k, v in state.items()}
    out = {"embed.weight": t["model.embed_tokens.weight"], "norm_f.weight": t["model.norm.weight"]}
    if not tied:
        out["head.weight"] = t["lm_head.weight"]
    for i in range(L):
        p = f"model.layers.{i}."
        out[f"h{i}.attn_norm.weight"] = t[p + "input_layernorm.weight"]
        out[f"h{i}.qkv.weight"] = np.concatenate([t[p + f"self_attn.{x}_proj.weight"] for x in "qkv"], axis=0)
        out[f"h{i}.o_proj.weight"] = t[p + "self_attn.o_proj.weight"]
        out[f"h{i}.mlp_norm.weight"] = t[p + "post_attention_layernorm.weight"]
        for x in ("gate", "up", "down"):
            out[f"h{i}.{x}.weight"] = t[p + f"mlp.{x}_proj.weight"]
    return out


def as_remat_torch(state):
    """as_remat of an untied state dict, kept as torch tensors (bf16 has no numpy type)."""
    out = {"embed.weight": state["model.embed_tokens.weight"], "norm_f.weight": state["model.norm.weight"],
           "head.weight": state["lm_head.weight"]}
    for i in range(L):
        p = f"model.layers.{i}."
        out[f"h{i}.attn_norm.weight"] = state[p + "input_layernorm.weight"]
        out[f"h{i}.qkv.weight"] = torch.cat([state[p + f"self_attn.{x}_proj.weight"] for x in "qkv"], 0)
        out[f"h{i}.o_proj.weight"] = state[p + "self_attn.o_proj.weight"]
        out[f"h{i}.mlp_norm.weight"] = state[p + "post_attention_layernorm.weight"]
        for x in ("gate", "up", "down"):
            out[f"h{i}.{x}.weight"] = state[p + f"mlp.{x}_proj.weight"]
    return out


def compare_logits(remat, config, init, val, windows, model, dump, what):
    run([remat, "eval", config, "--init-from", init, "--data", val, "--batch", windows, "--device", "cpu",
         "--save-logits", dump, "--quiet"])
    d = read_safetensors(dump)
    with torch.no_grad():
        b = model(torch.from_numpy(d["input_ids"].astype(np.int64))).logits.numpy().astype(np.float64)
    a = d["logits"].astype(np.float64)
    rel = np.abs(a - b).max() / np.abs(b).max()
    print(f"{what}: logits {a.shape}, max |remat - hf| = {np.abs(a - b).max():.3e}, max |hf| = {np.abs(b).max():.3f}, "
          f"relative to it {rel:.3e}")
    check(a.shape == (windows, SEQ, V) and rel <= 1e-5, f"{what}: logits equal transformers' within 1e-5 relative")
    return d


def main():
    args = parse_args(__doc__)
    w = args.work
    remat = args.remat
    torch.set_num_threads(2)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")

    model = hf_model(tied=False, seed=0)
    hf_dir = os.path.join(w, "hf")
    model.save_pretrained(hf_dir, max_shard_size="200KB", safe_serialization=True)
    shards = sorted(n for n in os.listdir(hf_dir) if n.endswith(".safetensors"))
    check(len(shards) > 1 and os.path.exists(os.path.join(hf_dir, "model.safetensors.index.json")),
          f"save_pretrained wrote {len(shards)} shards and an index")
    state = model.state_dict()
    want = as_remat(state, tied=False)

    rng = np.random.default_rng(1)
    data = os.path.join(w, "shards")
    os.makedirs(data)
    text = os.path.join(w, "text.txt")
    with open(text, "w", encoding="utf-8") as f:
        f.write("".join(chr(c) for c in rng.integers(32, 256, 12000)))
    run([sys.executable, os.path.join(ROOT, "tools", "data", "make_shards.py"), text, "--out", os.path.join(data, "rand"),
         "--val-tokens", "2000", "--shard-tokens", "6000"])
    config = remat_config(w, "llama_hf_tiny.json", tied=False)

    # 1. Weights from the sharded folder.
    out = run([remat, "train", config, "--init-from", hf_dir, "--data", data, "--steps", STEPS, "--out",
               os.path.join(w, "run"), "--device", "cpu"])
    check("Hugging Face Llama" in out, "the files are read as Hugging Face Llama")
    check(not bitwise(read_safetensors(os.path.join(w, "run", "init.safetensors")), want),
          "remat's weights are transformers' state dict, bit for bit (q, k, v stacked into qkv)")

    # 2. Logits on the val shard.
    model.eval()
    val = os.path.join(data, "rand_val_000000.bin")
    windows = (2000 - 1) // SEQ
    dump = os.path.join(w, "logits.safetensors")
    compare_logits(remat, config, hf_dir, val, windows, model, dump, "loaded")

    # 3. Training: the same batches, AdamW with decay on the matrices only.
    losses = remat_losses(os.path.join(w, "run"))
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=ADAM_EPS)
    hf_losses = train_like_remat(model, data, SEQ, B, STEPS, V, opt, CLIP,
                                 lambda step: cosine_lr(step, STEPS, LR, WARMUP, MIN_RATIO))
    worst = print_losses(losses, hf_losses)
    check(len(losses) == STEPS and worst <= 1e-4, f"{STEPS} training losses equal within 1e-4 (max {worst:.1e})")
    ckpt = read_safetensors(os.path.join(w, "run", "checkpoint", "model.safetensors"))
    after = as_remat(model.state_dict(), tied=False)
    print(f"weights after {STEPS} steps: max |remat - transformers| = "
          f"{max(np.abs(ckpt[k] - after[k]).max() for k in after):.2e} (learning rate {LR})")

    # 4. Round trip, one file and sharded.
    exp = os.path.join(w, "exported")
    print(run([remat, "export", os.path.join(w, "run"), "--format", "hf-llama", exp]), end="")
    m2 = LlamaForCausalLM.from_pretrained(exp)
    c2 = m2.config
    check(c2.num_hidden_layers == L and c2.num_attention_heads == H and c2.num_key_value_heads == KV and
          c2.intermediate_size == F and c2.vocab_size == V and not c2.tie_word_embeddings and
          c2.rope_theta == THETA and abs(c2.rms_norm_eps - EPS) < 1e-12, "transformers loads the export's config")
    check(not bitwise(as_remat(m2.state_dict(), tied=False), ckpt), "the exported weights are the checkpoint, bit for bit")
    m2.eval()
    compare_logits(remat, config, os.path.join(w, "run"), val, windows, m2, dump, "exported")
    exp2 = os.path.join(w, "resaved")
    m2.save_pretrained(exp2, safe_serialization=True)
    run([remat, "train", config, "--init-from", exp2, "--data", data, "--steps", 1, "--out", os.path.join(w, "run2"),
         "--device", "cpu", "--quiet"])
    check(not bitwise(read_safetensors(os.path.join(w, "run2", "init.safetensors")), ckpt),
          "remat -> export -> transformers -> save_pretrained -> remat: the weights are bitwise equal")
    sharded = os.path.join(w, "exported_sharded")
    line = run([remat, "export", os.path.join(w, "run"), "--format", "hf-llama", sharded, "--max-shard-size", "100KB"])
    files = sorted(n for n in os.listdir(sharded) if n.endswith(".safetensors"))
    check(len(files) > 2 and "shards" in line and os.path.exists(os.path.join(sharded, "model.safetensors.index.json")),
          f"--max-shard-size 100KB: {len(files)} shards and an index")
    m3 = LlamaForCausalLM.from_pretrained(sharded)
    check(not bitwise(as_remat(m3.state_dict(), tied=False), ckpt), "transformers loads the sharded export, bit for bit")
    half = os.path.join(w, "exported_bf16")
    run([remat, "export", os.path.join(w, "run"), "--format", "hf-llama", half, "--dtype", "bf16"])
    m5 = LlamaForCausalLM.from_pretrained(half, torch_dtype=torch.bfloat16)
    want16 = {k: torch.from_numpy(np.ascontiguousarray(v)).to(torch.bfloat16) for k, v in ckpt.items()}
    got16 = as_remat_torch(m5.state_dict())
    check(m5.config.torch_dtype == torch.bfloat16 and sorted(got16) == sorted(want16) and
          all(torch.equal(got16[k], want16[k]) for k in want16),
          "--dtype bf16: transformers loads the checkpoint rounded as torch's .to(torch.bfloat16), bit for bit")
    run([remat, "export", os.path.join(w, "run"), "--format", "hf-llama", sharded])
    check(sorted(os.listdir(sharded)) == ["config.json", "model.safetensors"],
          "re-exported unsharded into the same folder: no stale shard or index is left")

    # 5. Tied embeddings.
    tied = hf_model(tied=True, seed=2)
    tied_dir = os.path.join(w, "hf_tied")
    tied.save_pretrained(tied_dir, safe_serialization=True)
    tied_config = remat_config(w, "llama_hf_tiny_tied.json", tied=True)
    tied.eval()
    compare_logits(remat, tied_config, tied_dir, val, windows, tied, dump, "tied")

    # 6. Linear RoPE scaling (position interpolation): transformers' LlamaLinearScalingRotaryEmbedding.
    scaled = hf_model(tied=False, seed=3, rope_scaling={"type": "linear", "factor": 4.0})
    scaled_dir = os.path.join(w, "hf_linear")
    scaled.save_pretrained(scaled_dir, safe_serialization=True)
    scaled_config = remat_config(w, "llama_hf_tiny_linear.json", tied=False, scaling={"type": "linear", "factor": 4})
    scaled.eval()
    compare_logits(remat, scaled_config, scaled_dir, val, windows, scaled, dump, "rope_scaling linear 4")
    err = run([remat, "eval", config, "--init-from", scaled_dir, "--data", val, "--device", "cpu"], expect_rc=1)
    check("rope_scaling is" in err, "linear-scaled weights into an unscaled config are refused")
    run([remat, "train", scaled_config, "--init-from", scaled_dir, "--data", data, "--steps", 1, "--out",
         os.path.join(w, "run_linear"), "--device", "cpu", "--quiet"])
    exp_scaled = os.path.join(w, "exported_linear")
    run([remat, "export", os.path.join(w, "run_linear"), "--format", "hf-llama", exp_scaled])
    m4 = LlamaForCausalLM.from_pretrained(exp_scaled)
    check(m4.config.rope_scaling == {"type": "linear", "factor": 4.0}, "the export's config.json keeps the scaling")

    # 7. A config.json that disagrees.
    for key, value, expect in [("rope_theta", 500000.0, "rope_theta is 500000"),
                               ("rope_scaling", {"type": "dynamic", "factor": 2.0}, "rope_scaling is"),
                               ("num_key_value_heads", 4, "num_key_value_heads is 4")]:
        bad = os.path.join(w, "bad_" + key)
        shutil.copytree(hf_dir, bad)
        with open(os.path.join(bad, "config.json")) as f:
            j = json.load(f)
        j[key] = value
        with open(os.path.join(bad, "config.json"), "w") as f:
            json.dump(j, f)
        err = run([remat, "eval", config, "--init-from", bad, "--data", val, "--device", "cpu"], expect_rc=1)
        check(expect in err and "config.json" in err, f"a config.json with {key} {json.dumps(value)} is refused, naming it")
    print("interop transformers llama: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
