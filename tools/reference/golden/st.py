"""A minimal safetensors writer (the format: u64 little-endian header size, JSON header,
raw little-endian data), so that golden files need nothing beyond torch and numpy."""
import json
import os
import struct
import tempfile

import numpy as np
import torch

_DTYPES = {torch.float32: "F32", torch.int32: "I32"}


def save(path, tensors, metadata=None):
    header = {}
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    blobs = []
    offset = 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        if t.dtype not in _DTYPES:
            raise ValueError(f"{path}: tensor {name} has unsupported dtype {t.dtype}")
        data = t.numpy().astype(t.numpy().dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    d = os.path.dirname(path)
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def load(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    out = {}
    for name, e in header.items():
        b, en = e["data_offsets"]
        dt = {"F32": np.float32, "I32": np.int32}[e["dtype"]]
        out[name] = torch.from_numpy(np.frombuffer(raw[8 + n + b:8 + n + en], dtype=dt).copy()).reshape(e["shape"])
    return out, meta
