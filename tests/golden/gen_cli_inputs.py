#!/usr/bin/env python3
"""Generates tests/data/cli_inputs/: small, odd inputs for the gradient and 16-bit
flags of `attn sdpa` and `attn forward`, which tests/test_cli_bad_inputs.sh feeds
to the program (truncating copies of its own where it needs broken files).

    python3 tests/golden/gen_cli_inputs.py        # from the repository root

Needs numpy and safetensors (numpy's writer).

    q.npy, k.npy, v.npy   float32 [1, 2, 3, 4]
    do.npy                float32 [1, 2, 3, 4], every value a multiple of 1/8 in
                          [-2, 2), so float16 holds it exactly
    do_f16.npy            do.npy's values as '<f2'
    do_i32.npy            int32 [1, 2, 3, 4]
    do_nan.npy            do.npy with NaN at [0, 1, 2, 3] (head 1, query 2, feature 3)
    q17_f16.npy           float16 [1, 3, 17, 3]: an odd head size and length
    w_f16.safetensors, w_bf16.safetensors
                          the chapter's weights (qkv.weight [24, 8], qkv.bias,
                          output.weight [8, 8], output.bias) in F16 and BF16
    x.npy, dy.npy         float32 [2, 3, 8]
    dy_wrong.npy          float32 [2, 3, 9]: one feature too many
"""
import os

import numpy as np
from safetensors.numpy import save_file

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "cli_inputs")
rng = np.random.default_rng(1201)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def bf16_bits(a):
    # Round to nearest even into bfloat16's 16 bits (numpy has no bfloat16 type);
    # the inputs are finite.
    u = a.astype(np.float32).view(np.uint32)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def main():
    os.makedirs(ROOT, exist_ok=True)
    for name in ("q", "k", "v"):
        np.save(os.path.join(ROOT, name + ".npy"), f32(1, 2, 3, 4))
    do = (rng.integers(-16, 16, size=(1, 2, 3, 4)) / 8.0).astype(np.float32)
    np.save(os.path.join(ROOT, "do.npy"), do)
    np.save(os.path.join(ROOT, "do_f16.npy"), do.astype(np.float16))
    np.save(os.path.join(ROOT, "do_i32.npy"), np.ones((1, 2, 3, 4), np.int32))
    nan = do.copy()
    nan[0, 1, 2, 3] = np.nan
    np.save(os.path.join(ROOT, "do_nan.npy"), nan)
    np.save(os.path.join(ROOT, "q17_f16.npy"), f32(1, 3, 17, 3).astype(np.float16))

    E = 8
    w = {"qkv.weight": f32(3 * E, E) / np.sqrt(E), "qkv.bias": f32(3 * E) / np.sqrt(E),
         "output.weight": f32(E, E) / np.sqrt(E), "output.bias": f32(E) / np.sqrt(E)}
    save_file({n: a.astype(np.float16) for n, a in w.items()},
              os.path.join(ROOT, "w_f16.safetensors"))
    # safetensors.numpy cannot write BF16 from a numpy dtype, so the header is
    # written here: the same layout, dtype "BF16", the bits from bf16_bits.
    import json
    import struct
    header, blobs, off = {}, [], 0
    for n, a in w.items():
        b = bf16_bits(a).tobytes()
        header[n] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(os.path.join(ROOT, "w_bf16.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    np.save(os.path.join(ROOT, "x.npy"), f32(2, 3, E))
    np.save(os.path.join(ROOT, "dy.npy"), f32(2, 3, E))
    np.save(os.path.join(ROOT, "dy_wrong.npy"), f32(2, 3, E + 1))

    with open(os.path.join(ROOT, "MANIFEST"), "w") as f:
        f.write("# odd inputs for tests/test_cli_bad_inputs.sh, made by "
                "tests/golden/gen_cli_inputs.py\n# numpy %s\n" % np.__version__)
        for name in sorted(os.listdir(ROOT)):
            if name != "MANIFEST":
                f.write(name + "\n")


if __name__ == "__main__":
    main()
