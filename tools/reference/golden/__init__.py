"""Golden-value generators, one module per op family.

Each module defines ``cases()``, yielding ``(name, tensors, metadata)``: ``tensors`` maps
names to torch tensors (float32 or int32; inputs, outputs and gradients, see
tools/reference/gen_golden.py for the naming convention) and ``metadata`` maps keys to values that
are written as strings (op parameters).
"""
