#!/usr/bin/env python3
"""Generates tests/data/help_examples/: the input files that the EXAMPLE(S) sections
of `attn sdpa --help`, `attn forward --help` and `attn decode --help` name, so that
tests/test_cli_help_examples.sh can run every example as printed, without Python.

    python3 tests/golden/gen_help_examples.py        # from the repository root

Needs numpy and safetensors (numpy's writer). The values are random draws from a
fixed seed; the test only asks that each example runs (exit 0) and writes the files
it names, since what the numbers should be is the golden tests' business.

    sdpa/     q.npy, k.npy, v.npy [1, 2, 6, 4]; do.npy [1, 2, 6, 4]; sinks.npy [2]
    forward/  mha.safetensors (the chapter's names, E = 16: 4 heads of 4);
              llama.safetensors holding two Llama-style layers, both E = 16 with
              head size 2: under 'model.layers.0.self_attn.' 32 query heads and
              8 key/value heads (the second example), and without a prefix 8 and
              2 (the fourth); x.npy [2, 5, 16]; ids.npy int64 [2, 5] with pad id 0
              at the ends, never first, so every causal row sees a key; dy.npy
              [2, 5, 16]
    decode/   llama.safetensors (the prefixed 32/8 layer); x.npy [1, 14, 16], more
              tokens than the example's --prefill 12
"""
import os

import numpy as np
from safetensors.numpy import save_file

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "help_examples")
rng = np.random.default_rng(20261201)


def f32(*shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def llama(prefix, heads, kv_heads, head_dim, embed):
    s = 1.0 / np.sqrt(embed)
    return {
        prefix + "q_proj.weight": f32(heads * head_dim, embed, scale=s),
        prefix + "k_proj.weight": f32(kv_heads * head_dim, embed, scale=s),
        prefix + "v_proj.weight": f32(kv_heads * head_dim, embed, scale=s),
        prefix + "o_proj.weight": f32(embed, heads * head_dim, scale=s),
    }


def main():
    for sub in ("sdpa", "forward", "decode"):
        os.makedirs(os.path.join(ROOT, sub), exist_ok=True)

    d = os.path.join(ROOT, "sdpa")
    for name in ("q", "k", "v", "do"):
        np.save(os.path.join(d, name + ".npy"), f32(1, 2, 6, 4))
    np.save(os.path.join(d, "sinks.npy"), f32(2))

    d = os.path.join(ROOT, "forward")
    E = 16
    s = 1.0 / np.sqrt(E)
    save_file({"qkv.weight": f32(3 * E, E, scale=s), "qkv.bias": f32(3 * E, scale=s),
               "output.weight": f32(E, E, scale=s), "output.bias": f32(E, scale=s)},
              os.path.join(d, "mha.safetensors"))
    prefixed = llama("model.layers.0.self_attn.", 32, 8, 2, E)
    save_file({**prefixed, **llama("", 8, 2, 2, E)}, os.path.join(d, "llama.safetensors"))
    np.save(os.path.join(d, "x.npy"), f32(2, 5, E))
    np.save(os.path.join(d, "ids.npy"), np.array([[5, 3, 7, 0, 0], [2, 9, 4, 6, 0]], np.int64))
    np.save(os.path.join(d, "dy.npy"), f32(2, 5, E))

    d = os.path.join(ROOT, "decode")
    save_file(prefixed, os.path.join(d, "llama.safetensors"))
    np.save(os.path.join(d, "x.npy"), f32(1, 14, E))

    with open(os.path.join(ROOT, "MANIFEST"), "w") as f:
        f.write("# inputs of the --help examples, made by tests/golden/gen_help_examples.py\n")
        f.write("# numpy %s\n" % np.__version__)
        for sub in ("sdpa", "forward", "decode"):
            for name in sorted(os.listdir(os.path.join(ROOT, sub))):
                f.write("%s/%s\n" % (sub, name))


if __name__ == "__main__":
    main()
