#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets (tests/fuzz/corpus/{idx,safetensors,token_shards,npy}).

Run from anywhere: python3 tests/fuzz/make_corpus.py. The files are committed; this
script only documents how they were made. IDX inputs follow harness.h: u16 LE length of
the label file, the label file, then the image file.
"""
import gzip
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def idx(dims, data, type_code=0x08):
    return bytes([0, 0, type_code, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + bytes(data)


def gz(b):
    return gzip.compress(b, compresslevel=9, mtime=0)


def pair(labels, images):
    return struct.pack("<H", len(labels)) + labels + images


def safetensors(header, data):
    h = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(h)) + h + data


def write(kind, name, payload):
    d = os.path.join(HERE, "corpus", kind)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(payload)


labels = idx([3], [0, 9, 4])
images = idx([3, 2, 2], range(0, 240, 20))
write("idx", "valid_raw", pair(labels, images))
write("idx", "valid_gzip", pair(gz(labels), gz(images)))
write("idx", "valid_mixed", pair(labels, gz(images)))
write("idx", "gzip_two_members", pair(gz(labels[:5]) + gz(labels[5:]), gz(images)))
write("idx", "label_out_of_range", pair(idx([2], [1, 10]), idx([2, 1, 1], [7, 8])))
write("idx", "count_mismatch", pair(idx([2], [1, 2]), idx([3, 1, 1], [1, 2, 3])))
write("idx", "truncated_data", pair(labels, images[:-3]))
write("idx", "float_type", pair(labels, idx([1], [0, 0, 0, 0], type_code=0x0D)))
write("idx", "huge_dims", pair(labels, idx([0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF], [])))

f32 = struct.pack("<4f", 1.0, -2.0, 0.5, 3.25)
i32 = struct.pack("<2i", 7, -1)
write("safetensors", "valid", safetensors(
    {"__metadata__": {"step": "3"},
     "w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
     "ids": {"dtype": "I32", "shape": [2], "data_offsets": [16, 24]},
     "empty": {"dtype": "F32", "shape": [0, 3], "data_offsets": [24, 24]},
     "h": {"dtype": "BF16", "shape": [1], "data_offsets": [24, 26]}},
    f32 + i32 + b"\x80\x3f"))
write("safetensors", "empty_header", safetensors({}, b""))
write("safetensors", "scalar", safetensors({"s": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]}}, f32[:4]))
write("safetensors", "bad_offsets", safetensors({"t": {"dtype": "F32", "shape": [4], "data_offsets": [8, 4]}}, f32))
write("safetensors", "bad_json", struct.pack("<Q", 9) + b'{"a":[1,]')


def shard(tokens, magic=20240520, version=1, count=None, reserved=None):
    header = [0] * 256
    header[0], header[1], header[2] = magic, version, len(tokens) if count is None else count
    if reserved is not None:
        header[3] = reserved
    return struct.pack("<256i", *header) + struct.pack(f"<{len(tokens)}H", *tokens)


tokens = [50256, 15496, 11, 995, 0, 65535, 7, 7, 3, 1, 2, 40000, 9]
write("token_shards", "valid", shard(tokens))
write("token_shards", "valid_one_token", shard([42]))
write("token_shards", "bad_magic", shard(tokens, magic=20240521))
write("token_shards", "llama3_magic", shard(tokens, magic=20240801))
write("token_shards", "bad_version", shard(tokens, version=2))
write("token_shards", "zero_count", shard([], count=0))
write("token_shards", "negative_count", shard(tokens, count=-5))
write("token_shards", "reserved_set", shard(tokens, reserved=1))
write("token_shards", "truncated_tokens", shard(tokens)[:-3])
write("token_shards", "truncated_header", shard(tokens)[:100])
write("token_shards", "trailing_bytes", shard(tokens) + b"\0\0")
write("token_shards", "huge_count", shard(tokens, count=0x7FFFFFFF))


def npy(descr, shape, data, major=1, fortran=False):
    dims = "".join(f"{d}, " for d in shape) if len(shape) != 1 else f"{shape[0]},"
    header = f"{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': ({dims.rstrip(', ') if len(shape) != 1 else dims}), }}"
    len_bytes = 2 if major == 1 else 4
    pad = (64 - (6 + 2 + len_bytes + len(header) + 1) % 64) % 64
    header = (header + " " * pad + "\n").encode()
    size = struct.pack("<H" if major == 1 else "<I", len(header))
    return b"\x93NUMPY" + bytes([major, 0]) + size + header + data


f32_6 = struct.pack("<6f", 0, 0.5, 1, 1.5, 2, 2.5)
write("npy", "valid_f32", npy("<f4", [2, 1, 1, 3], f32_6))
write("npy", "valid_u8_v2", npy("|u1", [2, 2, 2], bytes(range(0, 240, 30)), major=2))
write("npy", "valid_i16_flat", npy("<i2", [3, 2], struct.pack("<6h", -3, -2, -1, 0, 1, 2)))
write("npy", "fortran", npy("<f4", [2, 3], f32_6, fortran=True))
write("npy", "big_endian", npy(">f4", [2, 3], struct.pack(">6f", *range(6))))
write("npy", "truncated", npy("<f4", [2, 1, 1, 3], f32_6)[:-2])
write("npy", "huge_shape", npy("<f4", [99999999999, 99999999999], f32_6))
write("npy", "nan", npy("<f4", [2, 3], struct.pack("<6f", 0, float("nan"), 1, 2, 3, 4)))
