#!/usr/bin/python3
"""Writes NumPy's own .npy files for remat's reader tests into tests/golden/npy/.

    command -p python3 tools/reference/gen_npy_golden.py

Debian's python3-numpy writes them (numpy.save and numpy.lib.format.write_array), so the
reader is checked against the format's reference writer, not against remat's idea of it.
The values are formulas tests/test_data.cpp recomputes; the blobs data set is drawn from a
fixed seed (its exact values do not matter, only that its classes separate).
"""
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "golden", "npy")


def save(name, arr, version=None):
    path = os.path.join(OUT, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        np.lib.format.write_array(f, arr, version=version, allow_pickle=False)


def main():
    # Readable kinds: value k of the flattened array is k * 0.5 (floats) or k (integers).
    save("x_f32.npy", (np.arange(12, dtype="<f4") * 0.5).reshape(2, 1, 2, 3))
    save("x_f64_v2.npy", (np.arange(8, dtype="<f8") * 0.5).reshape(2, 4), version=(2, 0))
    save("x_u8.npy", np.array([[[0, 255], [51, 102]], [[1, 2], [3, 4]]], dtype="u1"))
    save("x_i16.npy", np.arange(-3, 3, dtype="<i2").reshape(2, 3))
    save("y_i64.npy", np.array([1, 0], dtype="<i8"))
    save("y_u8.npy", np.array([2, 1], dtype="u1"))
    save("y_col_i32.npy", np.array([[1], [0]], dtype="<i4"))
    # What the reader refuses, each for its own reason.
    save("fortran.npy", np.asfortranarray(np.arange(6, dtype="<f4").reshape(2, 3)))
    save("big_endian.npy", np.arange(6, dtype=">f4").reshape(2, 3))
    save("half.npy", np.arange(6, dtype="<f2").reshape(2, 3))
    save("structured.npy", np.zeros(2, dtype=[("a", "<f4"), ("b", "<i4")]))
    save("y_float.npy", np.array([1.0, 0.0], dtype="<f4"))
    save("x_nan.npy", np.array([[0.0, np.nan], [1.0, 2.0]], dtype="<f4").reshape(2, 1, 1, 2))
    # A data set a model can learn: 3 classes of 1x4x4 images around class-dependent means,
    # 96 to train and 24 to test (folder blobs), and the training half alone (blobs_train:
    # the evaluation set is then the held-out tail).
    rng = np.random.default_rng(7)
    means = rng.normal(0.0, 1.0, size=(3, 1, 4, 4)).astype("<f4")

    def draw(n):
        y = np.arange(n) % 3
        x = means[y] + 0.3 * rng.normal(0.0, 1.0, size=(n, 1, 4, 4))
        return x.astype("<f4"), y.astype("<i8")

    x, y = draw(96)
    save("blobs/train_x.npy", x)
    save("blobs/train_y.npy", y)
    save("blobs_train/train_x.npy", x)
    save("blobs_train/train_y.npy", y)
    x, y = draw(24)
    save("blobs/test_x.npy", x)
    save("blobs/test_y.npy", y)


if __name__ == "__main__":
    main()
