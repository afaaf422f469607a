"""Goldens for the bf16 conversions (include/remat/bf16.h, src/backends/cpu/bf16.*): PyTorch's
float32 -> bfloat16 rounding (Tensor.bfloat16(), round to nearest even) of chosen values:
exact ties both ways, their neighbours, subnormals, the overflow edge, infinities, signed
zeros, NaNs, and random bit patterns. "bits" holds the bf16 bits (as int32), "y" the bf16
value back in float32."""
import struct

import torch


def _f(u):
    return struct.unpack("<f", struct.pack("<I", u & 0xFFFFFFFF))[0]


def cases():
    g = torch.Generator().manual_seed(14)
    words = [
        0x00000000, 0x80000000,                  # signed zeros
        0x3F808000, 0x3F818000, 0xBF808000,      # ties: to even (down), to even (up), negative
        0x3F807FFF, 0x3F808001,                  # just below / above a tie
        0x00000001, 0x00008000, 0x00018000,      # subnormals: tiny, tie to 0, tie to 2
        0x00008001, 0x0000FFFF, 0x807FFFFF,      # subnormals rounding up, into the normals
        0x007FFFFF, 0x00800000,                  # largest subnormal, smallest normal
        0x7F7F7FFF, 0x7F7F8000, 0x7F7FFFFF,      # the overflow edge: stays, tie to inf, inf
        0xFF7F8000,
        0x7F800000, 0xFF800000,                  # infinities
        0x7FC00000, 0xFFC00000, 0x7F800001,      # NaNs: quiet, negative, signalling
        0x7FBFFFFF, 0x7FFFFFFF,
    ]
    n = 4096
    hi = torch.randint(0, 1 << 16, (n,), generator=g, dtype=torch.int64)
    lo = torch.randint(0, 1 << 16, (n,), generator=g, dtype=torch.int64)
    for i in range(n):
        kind = i % 4
        h, l = int(hi[i]), int(lo[i])
        if kind == 1:
            l = 0x8000                           # exact ties
        elif kind == 2:
            h &= 0x807F                          # subnormals (exponent 0)
        elif kind == 3:
            h = (h & 0x80FF) | 0x3F00            # ordinary magnitudes around 1
        words.append((h << 16) | l)
    x = torch.tensor([_f(u) for u in words], dtype=torch.float32)
    b = x.bfloat16()
    bits = b.view(torch.int16).to(torch.int32) & 0xFFFF
    yield "convert", {"x": x, "bits": bits, "y": b.float()}, {"count": len(words)}
