#!/usr/bin/env python3
"""The PyTorch twin of remat's translation configs (models/nmt_de.json): the same
encoder-decoder (pre-norm blocks, learned positions, key-length masks, causal decoder
self-attention, cross-attention to the memory, GELU, the head tied to the target embedding),
the same corpus folder and tokenizer, optimizer, schedule, clipping, batch and steps;
greedy decoding and sacrebleu's BLEU on the test split, as `remat translate`.

It needs torch, sentencepiece and sacrebleu: the benchmark venv of the README
(python3 -m venv DIR && DIR/bin/pip install torch numpy sentencepiece sacrebleu).

    DIR/bin/python tools/reference/torch_nmt.py train models/nmt_de.json --corpus CORPUS --out OUT [--seed S]
    DIR/bin/python tools/reference/torch_nmt.py time models/nmt_de.json --corpus CORPUS [--steps N] [--threads 2]

train  Trains the twin from its own initial weights (drawn by torch from the seed, with
       remat's initialisations), then translates the test split greedily and scores it;
       writes OUT/metrics.jsonl (loss per 10 steps, the final BLEU), OUT/test.hyp.
time   The median time of one training step after 3 warm-up steps (30 steps unless --steps).

The twin is a separate implementation of the config's semantics, written from
docs/config.md and docs/translation.md, not a translation of remat's code: agreement of
its BLEU with remat's is evidence that both implement the same model.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PAD, UNK, BOS, EOS = 0, 1, 2, 3


def resolve(v, vocab):
    return vocab if v == "$vocab" else v


class Spec:
    """What the twin needs of an nmt config (shape of models/nmt_de.json)."""

    def __init__(self, cfg):
        m = cfg["model"]
        inputs = {i["name"]: i for i in m["inputs"]}
        self.S, self.T = inputs["src"]["seq_len"], inputs["tgt"]["seq_len"]
        self.vocab = cfg["data"].get("vocab", 4000)
        layers = {l["name"]: l for l in m["layers"]}
        emb = layers["src_embed"]
        self.d, self.emb_std = emb["dim"], emb.get("init_std", 1.0)
        enc, dec = layers["enc"], layers["dec"]
        self.n_enc, self.n_dec = enc["count"], dec["count"]
        el = {l["name"]: l for l in enc["layers"]}
        self.heads = el["attn"]["heads"]
        self.attn_p = el["attn"].get("dropout", 0.0)
        self.ff = el["fc"]["out_features"]
        self.p = layers["src_drop"]["p"]
        loss = layers["loss"]
        self.smoothing = loss.get("label_smoothing", 0.0)
        o, s, t = cfg["optimizer"], cfg.get("schedule", {}), cfg["training"]
        self.lr, self.betas, self.eps = o["lr"], (o.get("beta1", 0.9), o.get("beta2", 0.999)), o.get("eps", 1e-8)
        self.wd, self.clip = o.get("weight_decay", 0.0), o.get("grad_clip", 0.0)
        self.warmup, self.min_ratio = s.get("warmup_steps", 0), s.get("min_lr_ratio", 0.0)
        self.cosine = s.get("type", "constant") == "cosine"
        self.batch, self.epochs, self.steps = t["batch"], t.get("epochs", 0), t.get("steps", 0)
        self.seed = t.get("seed", 1)


def attention(q, k, v, heads, key_len, causal, p, training):
    """q [B, Tq, D], k, v [B, Tk, D]: softmax(q k^T / sqrt(dh) + masks) v, dropout on the
    probabilities; keys at or past key_len[b] and (causal) later keys masked."""
    B, Tq, D = q.shape
    Tk = k.shape[1]
    dh = D // heads
    q = q.view(B, Tq, heads, dh).transpose(1, 2)
    k = k.view(B, Tk, heads, dh).transpose(1, 2)
    v = v.view(B, Tk, heads, dh).transpose(1, 2)
    s = q @ k.transpose(-1, -2) / math.sqrt(dh)
    mask = torch.zeros(B, 1, Tq, Tk, dtype=torch.bool)
    if key_len is not None:
        mask |= (torch.arange(Tk)[None, :] >= key_len[:, None])[:, None, None, :]
    if causal:
        mask |= torch.ones(Tq, Tk, dtype=torch.bool).triu(1)[None, None]
    s = s.masked_fill(mask, float("-inf"))
    a = F.dropout(torch.softmax(s, dim=-1), p, training)
    return (a @ v).transpose(1, 2).reshape(B, Tq, D)


class Block(nn.Module):
    def __init__(self, sp, cross):
        super().__init__()
        d = sp.d
        self.sp, self.cross = sp, cross
        self.ln1, self.qkv, self.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        if cross:
            self.ln2, self.q, self.kv, self.cross_proj = nn.LayerNorm(d), nn.Linear(d, d), nn.Linear(d, 2 * d), nn.Linear(d, d)
        self.ln_ff, self.fc, self.fc2 = nn.LayerNorm(d), nn.Linear(d, sp.ff), nn.Linear(sp.ff, d)

    def forward(self, x, src_len, memory=None):
        sp, d, tr = self.sp, self.sp.d, self.training
        h = self.qkv(self.ln1(x))
        causal = self.cross  # the decoder's self-attention is causal, the encoder's reads the source's keys
        a = attention(h[..., :d], h[..., d:2 * d], h[..., 2 * d:], sp.heads, None if causal else src_len, causal,
                      sp.attn_p, tr)
        x = x + F.dropout(self.proj(a), sp.p, tr)
        if self.cross:
            kv = self.kv(memory)
            a = attention(self.q(self.ln2(x)), kv[..., :d], kv[..., d:], sp.heads, src_len, False, sp.attn_p, tr)
            x = x + F.dropout(self.cross_proj(a), sp.p, tr)
        return x + F.dropout(self.fc2(F.gelu(self.fc(self.ln_ff(x)))), sp.p, tr)


class Twin(nn.Module):
    def __init__(self, sp):
        super().__init__()
        self.sp = sp
        d, V = sp.d, sp.vocab
        self.src_embed, self.src_pos = nn.Parameter(torch.empty(V, d)), nn.Parameter(torch.empty(sp.S, d))
        self.tgt_embed, self.tgt_pos = nn.Parameter(torch.empty(V, d)), nn.Parameter(torch.empty(sp.T, d))
        for p in (self.src_embed, self.src_pos, self.tgt_embed, self.tgt_pos):
            nn.init.normal_(p, 0.0, sp.emb_std)
        self.enc = nn.ModuleList(Block(sp, False) for _ in range(sp.n_enc))
        self.memory = nn.LayerNorm(d)
        self.dec = nn.ModuleList(Block(sp, True) for _ in range(sp.n_dec))
        self.ln_f = nn.LayerNorm(d)

    def forward(self, src, src_len, tgt):
        sp, tr = self.sp, self.training
        x = F.dropout(self.src_embed[src] + self.src_pos[: src.shape[1]], sp.p, tr)
        for b in self.enc:
            x = b(x, src_len)
        mem = self.memory(x)
        y = F.dropout(self.tgt_embed[tgt] + self.tgt_pos[: tgt.shape[1]], sp.p, tr)
        for b in self.dec:
            y = b(y, src_len, mem)
        return self.ln_f(y) @ self.tgt_embed.t()  # the head tied to the target embedding, no bias


def load_split(corpus, name, sp_model, S, T):
    """The pairs that fit (source + </s> in S, <s>/</s> + target in T), as remat keeps them."""
    pairs = []
    with open(os.path.join(corpus, name + ".tsv"), encoding="utf-8") as f:
        for line in f:
            s, t = line.rstrip("\n").split("\t")
            si, ti = sp_model.encode(s), sp_model.encode(t)
            if len(si) + 1 <= S and len(ti) + 1 <= T:
                pairs.append((s, t, si, ti))
    return pairs


def make_batch(pairs, S, T):
    B = len(pairs)
    src = torch.full((B, S), PAD, dtype=torch.long)
    tgt = torch.full((B, T), PAD, dtype=torch.long)
    lab = torch.full((B, T), PAD, dtype=torch.long)
    ln = torch.zeros(B, dtype=torch.long)
    for r, (_, _, si, ti) in enumerate(pairs):
        src[r, : len(si)] = torch.tensor(si)
        src[r, len(si)] = EOS
        ln[r] = len(si) + 1
        tgt[r, 0] = BOS
        tgt[r, 1: len(ti) + 1] = torch.tensor(ti)
        lab[r, : len(ti)] = torch.tensor(ti)
        lab[r, len(ti)] = EOS
    return src, ln, tgt, lab


def lr_at(sp, step, total):
    if sp.warmup > 0 and step <= sp.warmup:
        return sp.lr * step / sp.warmup
    if sp.cosine:
        t = min(1.0, (step - sp.warmup) / max(1, total - sp.warmup))
        floor = sp.lr * sp.min_ratio
        return floor + (sp.lr - floor) * 0.5 * (1 + math.cos(math.pi * t))
    return sp.lr


def optimizer(model, sp):
    decay = [model.src_embed, model.src_pos, model.tgt_embed, model.tgt_pos]
    decay += [m.weight for m in model.modules() if isinstance(m, nn.Linear)]
    ids = {id(p) for p in decay}
    rest = [p for p in model.parameters() if id(p) not in ids]  # biases and norm parameters
    return torch.optim.AdamW([{"params": decay, "weight_decay": sp.wd}, {"params": rest, "weight_decay": 0.0}],
                             lr=sp.lr, betas=sp.betas, eps=sp.eps)


def step_fn(model, opt, sp, batch, lr):
    src, ln, tgt, lab = batch
    for g in opt.param_groups:
        g["lr"] = lr
    logits = model(src, ln, tgt)
    loss = F.cross_entropy(logits.reshape(-1, sp.vocab), lab.reshape(-1), ignore_index=PAD,
                           label_smoothing=sp.smoothing)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if sp.clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), sp.clip)
    opt.step()
    return loss.item()


@torch.no_grad()
def greedy(model, sp, pairs, batch):
    model.eval()
    out = []
    for i in range(0, len(pairs), batch):
        chunk = pairs[i: i + batch]
        src, ln, _, _ = make_batch(chunk, sp.S, sp.T)
        B = len(chunk)
        tgt = torch.full((B, sp.T), PAD, dtype=torch.long)
        tgt[:, 0] = BOS
        hyp = [[] for _ in range(B)]
        done = [False] * B
        for t in range(sp.T):
            best = model(src, ln, tgt)[:, t].argmax(-1)
            for r in range(B):
                if done[r]:
                    continue
                if best[r].item() == EOS:
                    done[r] = True
                    continue
                hyp[r].append(best[r].item())
                if t + 1 < sp.T:
                    tgt[r, t + 1] = best[r]
            if all(done):
                break
        out += hyp
    model.train()
    return out


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["train", "time"])
    ap.add_argument("config")
    ap.add_argument("--corpus", required=True, help="the corpus folder (remat corpus --out)")
    ap.add_argument("--out", help="train: the folder for metrics.jsonl and test.hyp")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    import sacrebleu
    import sentencepiece as spm

    torch.set_num_threads(a.threads)
    with open(a.config, encoding="utf-8") as f:
        sp = Spec(json.load(f))
    seed = sp.seed if a.seed is None else a.seed
    torch.manual_seed(seed)
    tok = spm.SentencePieceProcessor(model_file=os.path.join(a.corpus, "tokenizer.model"))
    assert tok.get_piece_size() == sp.vocab, "the tokenizer's size is not data.vocab"
    train = load_split(a.corpus, "train", tok, sp.S, sp.T)
    model = Twin(sp)
    opt = optimizer(model, sp)
    per_epoch = len(train) // sp.batch
    total = sp.steps or sp.epochs * per_epoch
    if a.steps:
        total = a.steps
    elif a.mode == "time":
        total = 30
    gen = torch.Generator().manual_seed(seed)
    order, pos = [], 0
    times, log = [], []
    t0 = time.time()
    for step in range(1, total + 1):
        if pos + sp.batch > len(order):
            order, pos = torch.randperm(len(train), generator=gen).tolist(), 0
        batch = make_batch([train[i] for i in order[pos: pos + sp.batch]], sp.S, sp.T)
        pos += sp.batch
        ts = time.perf_counter()
        loss = step_fn(model, opt, sp, batch, lr_at(sp, step, total))
        times.append(time.perf_counter() - ts)
        if a.mode == "train" and (step % 10 == 0 or step == total):
            log.append({"step": step, "loss": loss})
            if step % 100 == 0 or step == total:
                print(f"step {step}/{total} | loss {loss:.4f} | {1000 * statistics.median(times[-100:]):.1f} ms/step",
                      flush=True)
    if a.mode == "time":
        print(json.dumps({"median_step_ms": 1000 * statistics.median(times[3:]), "steps": total, "threads": a.threads}))
        return 0
    test = load_split(a.corpus, "test", tok, sp.S, sp.T)
    hyps = [tok.decode(h) for h in greedy(model, sp, test, sp.batch)]
    bleu = sacrebleu.corpus_bleu(hyps, [[t for _, t, _, _ in test]])
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "test.hyp"), "w", encoding="utf-8") as f:
        f.write("".join(h + "\n" for h in hyps))
    with open(os.path.join(a.out, "metrics.jsonl"), "w", encoding="utf-8") as f:
        for r in log:
            f.write(json.dumps(r) + "\n")
        f.write(json.dumps({"test_bleu": bleu.score, "test_pairs": len(test), "seconds": time.time() - t0,
                            "seed": seed}) + "\n")
    print(f"test: {bleu} ({len(test)} pairs) | {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
