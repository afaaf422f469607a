#!/usr/bin/env python3
"""remat's GPT-2 against Hugging Face transformers' GPT2LMHeadModel (no download).

A random GPT2Config(n_layer=2, n_embd=64, n_head=4, ...) model, its biases and layer norms
randomised too so that every tensor's mapping shows, is saved locally; then:
  1. weights: remat loads both layouts (save_pretrained's, and the published one with
     h.N.attn.bias buffers) into exactly the values of transformers' state dict;
  2. logits: remat's on the same ids equal transformers' within 1e-5 relative (dropout off);
  3. training: 4 steps of remat train (--policy selective) and of transformers with
     torch.optim.AdamW (the same decay groups, clipping and learning rates) give losses
     within 1e-4;
  4. round trip: remat -> export -> from_pretrained -> save_pretrained -> remat is bitwise;
  5. a pickled pytorch_model.bin is refused, and the conversion the message gives works;
  6. tools/data/make_shards.py --tokenizer hf:DIR writes what a transformers tokenizer encodes.
"""
import os
import re
import shutil
import sys

from common import (ROOT, bitwise, check, cosine_lr, parse_args, print_losses, read_safetensors, remat_losses, run,
                    skip, tiny_config, train_like_remat)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
try:
    import numpy as np
    import torch
    import transformers
    from safetensors.torch import save_file
    from transformers import GPT2Config, GPT2LMHeadModel
except ImportError as e:
    skip(f"transformers is not importable from {sys.executable} ({e}); tools/bootstrap.sh installs the pinned "
         "version into its venv (tools/python/interop_python.sh)")

L, C, H, V, P, SEQ, B = 2, 64, 4, 256, 64, 32, 4
STEPS, LR, WD, BETAS, EPS, CLIP, WARMUP, MIN_RATIO = 4, 3e-3, 0.1, (0.9, 0.95), 1e-8, 1.0, 1, 0.1


def remat_names():
    """Hugging Face name -> (remat name, Conv1D), written out independently of remat's table."""
    m = {"transformer.wte.weight": ("embed.weight", False), "transformer.wpe.weight": ("embed.pos_weight", False),
         "transformer.ln_f.weight": ("ln_f.weight", False), "transformer.ln_f.bias": ("ln_f.bias", False)}
    for i in range(L):
        for hf, rm, conv in [("ln_1", "ln1", False), ("attn.c_attn", "qkv", True), ("attn.c_proj", "proj", True),
                             ("ln_2", "ln2", False), ("mlp.c_fc", "fc", True), ("mlp.c_proj", "fc2", True)]:
            m[f"transformer.h.{i}.{hf}.weight"] = (f"h{i}.{rm}.weight", conv)
            m[f"transformer.h.{i}.{hf}.bias"] = (f"h{i}.{rm}.bias", False)
    return m


def as_remat(state):
    """transformers' state dict as remat's parameters (numpy), Conv1D weights transposed."""
    out = {}
    for hf, (rm, conv) in remat_names().items():
        t = state[hf].detach().cpu().numpy()
        out[rm] = np.ascontiguousarray(t.T) if conv else t
    return out


def main():
    args = parse_args(__doc__)
    w = args.work
    remat = args.remat
    torch.manual_seed(0)
    torch.set_num_threads(2)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")

    # The model, with every tensor random (transformers starts biases at 0, norms at 1).
    cfg = GPT2Config(n_layer=L, n_embd=C, n_head=H, vocab_size=V, n_positions=P, resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0, activation_function="gelu_new", layer_norm_epsilon=1e-5)
    model = GPT2LMHeadModel(cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith(".bias"):
                p.normal_(0.0, 0.1)
            elif ".ln_" in n:
                p.normal_(1.0, 0.1)
    hf_dir = os.path.join(w, "hf")
    model.save_pretrained(hf_dir)  # save_pretrained's layout: transformer.h.N..., lm_head.weight left out
    state = model.state_dict()
    want = as_remat(state)

    # Shards of random bytes: the val file and two train files.
    rng = np.random.default_rng(1)
    shards = os.path.join(w, "shards")
    os.makedirs(shards)
    text = os.path.join(w, "text.txt")
    with open(text, "w", encoding="utf-8") as f:
        f.write("".join(chr(c) for c in rng.integers(32, 256, 12000)))
    run([sys.executable, os.path.join(ROOT, "tools", "data", "make_shards.py"), text, "--out", os.path.join(shards, "rand"),
         "--val-tokens", "2000", "--shard-tokens", "6000"])
    config, _ = tiny_config(
        w, dropout=0.0, optimizer={"type": "adamw", "lr": LR, "weight_decay": WD, "beta1": BETAS[0], "beta2": BETAS[1],
                                   "eps": EPS, "grad_clip": CLIP},
        schedule={"type": "cosine", "warmup_steps": WARMUP, "min_lr_ratio": MIN_RATIO},
        data={"shuffle": False}, training={"batch": B, "log_every": 1, "policy": "selective"})

    # 1. Weights, in both layouts.
    run([remat, "train", config, "--init-from", hf_dir, "--data", shards, "--steps", STEPS, "--out",
         os.path.join(w, "run"), "--device", "cpu", "--quiet"])
    check(not bitwise(read_safetensors(os.path.join(w, "run", "init.safetensors")), want),
          "save_pretrained layout: remat's weights are transformers' state dict, bit for bit")
    pub = os.path.join(w, "published")
    os.makedirs(pub)
    published = {k[len("transformer."):]: v.contiguous() for k, v in state.items()
                 if k.startswith("transformer.") and not k.endswith(".attn.bias") and not k.endswith("masked_bias")}
    for i in range(L):
        published[f"h.{i}.attn.bias"] = torch.tril(torch.ones(P, P)).view(1, 1, P, P)
        published[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    save_file(published, os.path.join(pub, "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(os.path.join(hf_dir, "config.json"), pub)
    out = run([remat, "train", config, "--init-from", os.path.join(pub, "model.safetensors"), "--data", shards,
               "--steps", 1, "--out", os.path.join(w, "run_pub"), "--device", "cpu"])
    check(f"{2 * L} attention mask buffers ignored" in out, "published layout: the mask buffers are ignored")
    check(not bitwise(read_safetensors(os.path.join(w, "run_pub", "init.safetensors")), want),
          "published layout (h.N..., wte.weight): remat's weights are transformers' state dict, bit for bit")

    # 2. Logits and loss on the val shard, dropout off.
    model.eval()
    val = os.path.join(shards, "rand_val_000000.bin")
    windows = (2000 - 1) // SEQ
    dump = os.path.join(w, "logits.safetensors")
    line = run([remat, "eval", config, "--init-from", hf_dir, "--data", val, "--batch", windows, "--device", "cpu",
                "--save-logits", dump, "--quiet"])
    remat_loss = float(re.search(r"loss (\S+)", line).group(1))
    d = read_safetensors(dump)
    with torch.no_grad():
        ids = torch.from_numpy(d["input_ids"].astype(np.int64))
        hf_logits = model(ids).logits
        hf_loss = torch.nn.functional.cross_entropy(hf_logits.reshape(-1, V),
                                                    torch.from_numpy(d["targets"].astype(np.int64)).reshape(-1)).item()
    a, b = d["logits"].astype(np.float64), hf_logits.numpy().astype(np.float64)
    max_rel = np.abs(a - b).max() / np.abs(b).max()
    elem_rel = (np.abs(a - b) / np.maximum(np.abs(b), 1e-3)).max()
    print(f"logits: {a.shape}, max |remat - hf| = {np.abs(a - b).max():.3e}, max |hf| = {np.abs(b).max():.3f}, "
          f"relative to it {max_rel:.3e}; elementwise relative (|hf| >= 1e-3) {elem_rel:.3e}")
    check(a.shape == (windows, SEQ, V) and max_rel <= 1e-5, f"logits equal transformers' within 1e-5 relative ({max_rel:.2e})")
    loss_rel = abs(remat_loss - hf_loss) / abs(hf_loss)
    print(f"eval loss: remat {remat_loss:.7f}, transformers {hf_loss:.7f}, relative difference {loss_rel:.2e}")
    check(loss_rel <= 1e-5, "the eval loss equals transformers' within 1e-5 relative")

    # 3. Training: the same batches (shuffle off: windows in file order), AdamW with decay on
    # the weights and embeddings only, clipping at 1.0, the same learning rates.
    losses = remat_losses(os.path.join(w, "run"))
    decay = [p for n, p in model.named_parameters() if n.endswith(".weight") and ".ln_" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (n.endswith(".weight") and ".ln_" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS)
    hf_losses = train_like_remat(model, shards, SEQ, B, STEPS, V, opt, CLIP,
                                 lambda step: cosine_lr(step, STEPS, LR, WARMUP, MIN_RATIO))
    worst = print_losses(losses, hf_losses)
    check(len(losses) == STEPS and worst <= 1e-4, f"{STEPS} training losses equal within 1e-4 (max {worst:.1e})")
    ckpt = read_safetensors(os.path.join(w, "run", "checkpoint", "model.safetensors"))
    after = as_remat(model.state_dict())
    wdiff = max(np.abs(ckpt[k] - after[k]).max() for k in after)
    print(f"weights after {STEPS} steps: max |remat - transformers| = {wdiff:.2e} (learning rate {LR})")

    # 4. Round trip: export, transformers loads it (same logits), saves it, remat loads that.
    exp = os.path.join(w, "exported")
    print(run([remat, "export", os.path.join(w, "run"), "--format", "hf-gpt2", exp]), end="")
    m2 = GPT2LMHeadModel.from_pretrained(exp)
    check(m2.config.n_layer == L and m2.config.n_head == H and m2.config.vocab_size == V and m2.config.tie_word_embeddings,
          "transformers loads the export with the model's config")
    check(not bitwise(as_remat(m2.state_dict()), ckpt), "the exported weights are the run's checkpoint, bit for bit")
    m2.eval()
    line = run([remat, "eval", config, "--init-from", os.path.join(w, "run"), "--data", val, "--batch", windows,
                "--device", "cpu", "--save-logits", dump, "--quiet"])
    d = read_safetensors(dump)
    with torch.no_grad():
        b2 = m2(torch.from_numpy(d["input_ids"].astype(np.int64))).logits.numpy().astype(np.float64)
    rel2 = np.abs(d["logits"] - b2).max() / np.abs(b2).max()
    check(rel2 <= 1e-5, f"the exported model's logits in transformers equal remat's ({rel2:.2e} relative)")
    exp2 = os.path.join(w, "resaved")
    m2.save_pretrained(exp2)
    run([remat, "train", config, "--init-from", exp2, "--data", shards, "--steps", 1, "--out", os.path.join(w, "run2"),
         "--device", "cpu", "--quiet"])
    check(not bitwise(read_safetensors(os.path.join(w, "run2", "init.safetensors")), ckpt),
          "remat -> export -> transformers -> save_pretrained -> remat: the weights are bitwise equal")

    # 5. A pickle is refused; the conversion the message gives makes a folder remat reads.
    pk = os.path.join(w, "pickled")
    model.save_pretrained(pk, safe_serialization=False)
    err = run([remat, "train", config, "--init-from", pk, "--data", shards, "--steps", 1, "--device", "cpu"], expect_rc=1)
    check("pytorch_model.bin is a pickled PyTorch checkpoint" in err, "pytorch_model.bin is refused")
    cmd = re.search(r'python3 -c "(.*)"', err).group(1)
    run([sys.executable, "-c", cmd])
    run([remat, "eval", config, "--init-from", pk + "-safetensors", "--data", val, "--batch", windows, "--device", "cpu",
         "--save-logits", dump, "--quiet"])
    d = read_safetensors(dump)
    model.eval()
    with torch.no_grad():
        b3 = model(torch.from_numpy(d["input_ids"].astype(np.int64))).logits.numpy().astype(np.float64)
    rel3 = np.abs(d["logits"] - b3).max() / np.abs(b3).max()
    check(rel3 <= 1e-5, f"the suggested conversion makes a checkpoint remat loads (logits {rel3:.2e} relative)")
    # 6. make_shards.py with a Hugging Face tokenizer: a byte-level BPE trained here (offline),
    # saved as GPT-2's tokenizer files; the shard holds tokenizer.encode(text) after <eos>.
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2TokenizerFast
    corpus = os.path.join(ROOT, "docs", "interop.md")
    bpe = ByteLevelBPETokenizer()
    bpe.train([corpus], vocab_size=400, min_frequency=2, special_tokens=["<|endoftext|>"], show_progress=False)
    tok_dir = os.path.join(w, "tokenizer")
    os.makedirs(tok_dir)
    bpe.save_model(tok_dir)
    tok = GPT2TokenizerFast(vocab_file=os.path.join(tok_dir, "vocab.json"), merges_file=os.path.join(tok_dir, "merges.txt"),
                            eos_token="<|endoftext|>", bos_token="<|endoftext|>", unk_token="<|endoftext|>")
    tok.save_pretrained(tok_dir)
    run([sys.executable, os.path.join(ROOT, "tools", "data", "make_shards.py"), corpus, "--out", os.path.join(w, "bpe", "doc"),
         "--tokenizer", f"hf:{tok_dir}", "--val-tokens", "0"])
    got = np.fromfile(os.path.join(w, "bpe", "doc_train_000001.bin"), dtype="<u2", offset=1024).tolist()
    with open(corpus, encoding="utf-8") as f:
        expect = [tok.eos_token_id] + tok.encode(f.read(), add_special_tokens=False)
    check(got == expect and max(got) > 256, f"make_shards.py --tokenizer hf:DIR wrote the tokenizer's {len(got)} ids (merges too)")
    print("interop transformers: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
