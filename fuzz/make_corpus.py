#!/usr/bin/env python3
"""Writes the seed corpora fuzz/corpus/<target>/ from tests/data and a few hand-made
edge cases. Standard library only. Run from anywhere; it rewrites the seed files it
makes (named seed_*) and leaves other files (crash reproducers, regress_*) alone.

    python3 fuzz/make_corpus.py
"""
import json
import os
import shutil
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data")
OUT = os.path.join(ROOT, "fuzz", "corpus")


def npy(descr, shape, data, fortran=False, version=1, pad=True):
    """A .npy file by hand (numpy's NEP 1 layout)."""
    shp = "(" + "".join("%d, " % s for s in shape).rstrip(" ")
    if len(shape) != 1:
        shp = shp.rstrip(",")
    shp += ")"
    hdr = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (
        descr, "True" if fortran else "False", shp)
    pre = 10 if version == 1 else 12
    if pad:
        total = pre + len(hdr) + 1
        hdr += " " * ((64 - total % 64) % 64)
    hdr += "\n"
    h = hdr.encode("latin-1")
    ln = struct.pack("<H", len(h)) if version == 1 else struct.pack("<I", len(h))
    return b"\x93NUMPY" + bytes([version, 0]) + ln + h + data


def safetensors(entries, metadata=None, raw_header=None):
    """entries: list of (name, dtype, shape, bytes), laid out in order."""
    head, off, blob = {}, 0, b""
    if metadata is not None:
        head["__metadata__"] = metadata
    for name, dt, shape, b in entries:
        head[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        off += len(b)
        blob += b
    h = raw_header if raw_header is not None else json.dumps(head).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + blob


def f32(vals):
    return struct.pack("<%df" % len(vals), *vals)


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed_" + name), "wb") as f:
        f.write(data)


def read(*p):
    with open(os.path.join(DATA, *p), "rb") as f:
        return f.read()


def main():
    files = sorted(os.listdir(os.path.join(DATA, "files")))
    # --- npy: every reference and malformed file, a few golden arrays, edge cases.
    for fn in files:
        if fn.endswith(".npy"):
            put("npy", fn, read("files", fn))
    for case, fn in [("mha_chapter_pad_causal", "ids.npy"), ("sdpa_3d_decode", "mask.npy"),
                     ("mha_single_f64_all_masks", "x.npy")]:
        put("npy", case + "_" + fn, read("golden", case, fn))
    put("npy", "v3_f4.npy", npy("<f4", [2], f32([1, 2]), version=3))
    put("npy", "fortran_3d_f2.npy", npy("<f2", [2, 3, 2], bytes(24), fortran=True))
    put("npy", "be_i8_4d.npy", npy(">i8", [1, 2, 1, 2], bytes(32)))
    put("npy", "be_f8_fortran.npy", npy(">f8", [2, 2], struct.pack(">4d", 1, 2, 3, 4), fortran=True))
    put("npy", "nan_inf.npy", npy("<f4", [3], f32([float("nan"), float("inf"), -0.0])))
    put("npy", "unpadded.npy", npy("<u1", [3], b"\x00\x01\xff", pad=False))
    put("npy", "python2_long.npy", npy("|b1", [2], b"\x01\x00").replace(b"(2,)", b"(2L,)"))
    put("npy", "dquote.npy", npy("<i4", [1], b"\x07\x00\x00\x00").replace(b"'", b'"'))
    put("npy", "zero_size.npy", npy("<f4", [0, 3], b""))
    put("npy", "six_dims.npy", npy("<f4", [1, 1, 1, 1, 1, 1], f32([1])))
    # --- safetensors: every file of tests/data, the golden weights, edge cases.
    golden = sorted(d for d in os.listdir(os.path.join(DATA, "golden"))
                    if os.path.exists(os.path.join(DATA, "golden", d, "weights.safetensors")))
    for fn in files:
        if fn.endswith(".safetensors"):
            put("safetensors", fn, read("files", fn))
    for case in golden:
        put("safetensors", case + ".safetensors", read("golden", case, "weights.safetensors"))
    put("safetensors", "empty_object.safetensors", safetensors([]))
    put("safetensors", "metadata.safetensors",
        safetensors([("a", "F32", [2], f32([1, 2]))], metadata={"format": "pt", "k": "v\u00e9"}))
    put("safetensors", "escapes.safetensors",
        safetensors([("a\\\"\u0001\u00e9\ud83d\ude00", "F16", [1, 2], bytes(4))]))
    put("safetensors", "all_dtypes.safetensors", safetensors(
        [("f64", "F64", [1], bytes(8)), ("bf16", "BF16", [2], bytes(4)),
         ("i32", "I32", [1], bytes(4)), ("i64", "I64", [1], bytes(8)),
         ("bool", "BOOL", [3], b"\x00\x01\x02"), ("u8", "U8", [1], b"\xff"),
         ("i8", "I8", [1], b"\x80"), ("scalar", "F32", [], f32([5])),
         ("empty", "F32", [0, 4], b""), ("five", "U8", [1, 1, 1, 1, 1], b"\x01")]))
    # --- weights: byte 0 = num_heads, byte 1 = prefix length, prefix, file.
    prefixes = {"mha_torch_prefix_mask": b"layers.0.attn."}
    for case in golden:
        p = prefixes.get(case, b"")
        for heads in (4, 2):
            put("weights", "%s_h%d" % (case, heads),
                bytes([heads, len(p)]) + p + read("golden", case, "weights.safetensors"))
    E = 4
    sep = [("p.%s_proj.weight" % c, "F32", [E, E], f32([0.1 * i for i in range(E * E)]))
           for c in "qkvo"] + [("p.k_proj.bias", "F32", [E], f32([1] * E))]
    put("weights", "separate_partial_bias", bytes([2, 2]) + b"p." + safetensors(sep))
    put("weights", "bad_heads_0", bytes([0, 0]) + read("golden", "mha_separate_t1", "weights.safetensors"))
    put("weights", "bad_heads_max", bytes([252, 0]) + read("golden", "mha_separate_t1", "weights.safetensors"))
    put("weights", "bad_heads_neg", bytes([251, 0]) + read("golden", "mha_separate_t1", "weights.safetensors"))
    # --- cli: byte 0 = subcommand (even forward, odd sdpa), NUL-separated arguments.
    def cli(cmd, *args):
        return bytes([cmd]) + b"\x00".join(a.encode() for a in args)
    put("cli", "forward_pad_causal", cli(0, "--weights", "w.safetensors", "--num-heads", "4",
        "--input", "x.npy", "--token-ids", "ids.npy", "--pad-id", "0", "--causal",
        "--output", "y.npy", "--attention", "a.npy"))
    put("cli", "forward_prefix_mask", cli(0, "--weights=wt.safetensors",
        "--prefix=layers.0.attn.", "--num-heads=4", "--input=xt.npy", "--mask=mt.npy",
        "--output=y.npy"))
    put("cli", "forward_separate", cli(0, "--weights", "ws.safetensors", "--num-heads", "2",
        "--input", "xs.npy", "--empty-rows", "zero", "--output", "y.npy"))
    put("cli", "forward_help", cli(0, "--help"))
    put("cli", "forward_missing", cli(0, "--weights", "w.safetensors"))
    put("cli", "forward_bad_heads", cli(0, "--weights", "w.safetensors", "--num-heads", "5",
        "--input", "x.npy", "--output", "y.npy"))
    put("cli", "sdpa_cross_mask", cli(1, "--query", "q.npy", "--key", "k.npy", "--value",
        "v.npy", "--mask", "m.npy", "--output", "o.npy", "--attention", "a.npy"))
    put("cli", "sdpa_3d", cli(1, "--query=q3.npy", "--key=k3.npy", "--value=v3.npy",
        "--mask=m3.npy", "--scale=0.5", "--output=o.npy"))
    put("cli", "sdpa_causal_bad", cli(1, "--query", "q.npy", "--key", "k.npy", "--value",
        "v.npy", "--causal", "--empty-rows", "zero", "--output", "o.npy"))
    put("cli", "sdpa_bad_files", cli(1, "--query", "bad.npy", "--key", "i32.npy", "--value",
        "bool.npy", "--output", "o.npy"))
    for t in ("npy", "safetensors", "weights", "cli"):
        d = os.path.join(OUT, t)
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        print("%-12s %3d files %7d bytes" % (t, len(os.listdir(d)), size))


if __name__ == "__main__":
    main()
