#!/usr/bin/env python3
"""Writes llm.c token shards (data.dataset "token_shards") from text files.

    tools/data/make_shards.py INPUT [INPUT ...] --out PREFIX [--tokenizer T] [--shard-tokens N] [--val-tokens N]

Shards are named as llm.c's scripts name them: PREFIX_val_000000.bin holds the first
--val-tokens tokens, PREFIX_train_000001.bin, PREFIX_train_000002.bin, ... the rest, at
most --shard-tokens each. remat (and llm.c) take the files named "val" for evaluation.
Each file: 256 little-endian int32 (magic 20240520, version 1, token count, zeros), then
the tokens as little-endian uint16. Files are written to a temporary name and renamed.

Tokenizers (--tokenizer):
  bytes           every byte of the UTF-8 text is a token (ids 0..255); no dependencies
  hf:NAME_OR_DIR  a Hugging Face tokenizer, AutoTokenizer.from_pretrained(NAME_OR_DIR) (needs
                  transformers; a folder works offline, e.g. one holding GPT-2's vocab.json
                  and merges.txt)
  tiktoken:NAME   a tiktoken encoding, e.g. tiktoken:gpt2 (needs tiktoken and its files)
--eot ID (default: the tokenizer's end-of-text token; none for bytes) is put before each
document; --docs blank-line splits a file into documents at blank lines (default: one
document per file).

Needs only the Python standard library (and the tokenizer's package).
"""
import argparse
import array
import os
import struct
import sys
import tempfile

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
MAX_TOKEN = 65535  # uint16


def make_tokenizer(spec):
    """Returns (encode(text) -> list of ids, end-of-text id or None)."""
    if spec == "bytes":
        return (lambda text: list(text.encode("utf-8"))), None
    kind, _, name = spec.partition(":")
    if kind == "hf" and name:
        try:
            from transformers import AutoTokenizer
        except ImportError as e:
            sys.exit(f"make_shards: --tokenizer {spec} needs transformers ({e}); tools/bootstrap.sh installs it")
        tok = AutoTokenizer.from_pretrained(name)
        return (lambda text: tok.encode(text, add_special_tokens=False)), tok.eos_token_id
    if kind == "tiktoken" and name:
        try:
            import tiktoken
        except ImportError as e:
            sys.exit(f"make_shards: --tokenizer {spec} needs tiktoken ({e})")
        enc = tiktoken.get_encoding(name)
        return enc.encode_ordinary, enc.eot_token
    sys.exit(f"make_shards: unknown tokenizer {spec!r} (expected bytes, hf:NAME_OR_DIR or tiktoken:NAME)")


def shard_bytes(tokens):
    """The bytes of one shard file holding `tokens` (a sequence of ints in [0, 65535])."""
    if not tokens:
        raise ValueError("a shard needs at least one token")
    if len(tokens) >= 2**31:
        raise ValueError(f"{len(tokens)} tokens do not fit the header's int32 count")
    header = [0] * HEADER_INTS
    header[0], header[1], header[2] = MAGIC, VERSION, len(tokens)
    body = array.array("H", tokens)  # raises OverflowError for ids outside uint16
    if sys.byteorder != "little":
        body.byteswap()
    return struct.pack(f"<{HEADER_INTS}i", *header) + body.tobytes()


def write_atomic(path, data):
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=os.path.basename(path) + ".tmp.")
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 is for secrets, not data
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def documents(path, mode):
    with open(path, "r", encoding="utf-8") as f:
        text = f.read()
    if mode == "file":
        return [text]
    docs = [d for d in text.split("\n\n") if d.strip()]
    return [d + "\n\n" for d in docs]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("inputs", nargs="+", help="UTF-8 text files")
    ap.add_argument("--out", required=True, help="prefix of the shard files, e.g. data/shakespeare")
    ap.add_argument("--tokenizer", default="bytes", help="bytes (default), hf:NAME_OR_DIR or tiktoken:NAME")
    ap.add_argument("--eot", default="auto", help="end-of-text id before each document: auto (the tokenizer's), none or an id")
    ap.add_argument("--docs", choices=["file", "blank-line"], default="file", help="what a document is")
    ap.add_argument("--val-tokens", type=int, default=None,
                    help="tokens of the val shard (default: a tenth of the tokens, at most 1048576; 0: no val shard)")
    ap.add_argument("--shard-tokens", type=int, default=100_000_000, help="most tokens per train shard (default 1e8)")
    args = ap.parse_args(argv)

    encode, eot = make_tokenizer(args.tokenizer)
    if args.eot == "none":
        eot = None
    elif args.eot != "auto":
        eot = int(args.eot)
    tokens = []
    for path in args.inputs:
        for doc in documents(path, args.docs):
            if eot is not None:
                tokens.append(eot)
            tokens.extend(encode(doc))
    bad = next((t for t in tokens if not 0 <= t <= MAX_TOKEN), None)
    if bad is not None:
        sys.exit(f"make_shards: token id {bad} does not fit llm.c's uint16 shards (0..{MAX_TOKEN})")
    n_val = args.val_tokens if args.val_tokens is not None else min(len(tokens) // 10, 1 << 20)
    if args.shard_tokens <= 0 or n_val < 0 or n_val >= len(tokens):
        sys.exit(f"make_shards: {len(tokens)} tokens cannot make a val shard of {n_val} and train shards of "
                 f"{args.shard_tokens}")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    written = []
    if n_val > 0:
        written.append((f"{args.out}_val_{0:06d}.bin", tokens[:n_val]))
    rest = tokens[n_val:]
    for k, begin in enumerate(range(0, len(rest), args.shard_tokens)):
        written.append((f"{args.out}_train_{k + 1:06d}.bin", rest[begin:begin + args.shard_tokens]))
    for path, toks in written:
        write_atomic(path, shard_bytes(toks))
        print(f"make_shards: {path}: {len(toks)} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
