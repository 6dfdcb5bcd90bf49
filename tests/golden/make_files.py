#!/usr/bin/env python3
"""Writes tests/data/files/: small .npy and .safetensors files made by numpy and by
hand, valid ones (to check that attn reads what numpy writes) and malformed ones (to
check that attn refuses each with a message naming the problem).

MANIFEST lists every malformed file with a phrase its error message must contain:
    FILE<TAB>PHRASE
The C tests (test_npy, test_safetensors) and the shell tests read it. Run from the
repository root:  python3 tests/golden/make_files.py
Only numpy is needed (the safetensors files are written byte by byte).
"""
import json
import os
import struct

import numpy as np

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "files")
manifest = []


def path(name):
    return os.path.join(OUT, name)


def raw(name, data, phrase=None):
    with open(path(name), "wb") as f:
        f.write(data)
    if phrase is not None:
        manifest.append((name, phrase))


def npy_bytes(header, version=1, data=b"", pad=True):
    """An .npy file from a header dict text, padded as numpy pads it."""
    h = header.encode("latin1")
    pre = 10 if version == 1 else 12
    if pad:
        total = pre + len(h) + 1
        h += b" " * ((64 - total % 64) % 64) + b"\n"
    if version == 1:
        lenb = struct.pack("<H", len(h))
    else:
        lenb = struct.pack("<I", len(h))
    return b"\x93NUMPY" + bytes([version, 0]) + lenb + h + data


def st_bytes(header_obj, data, header_len=None):
    h = json.dumps(header_obj, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    n = len(h) if header_len is None else header_len
    return struct.pack("<Q", n) + h + data


def main():
    os.makedirs(OUT, exist_ok=True)
    # ---- valid .npy files written by numpy --------------------------------------
    ref = (np.arange(24, dtype=np.float32).reshape(2, 3, 4) * 0.25 - 2.0)
    np.save(path("ref_f32.npy"), ref)                       # the reference values
    np.save(path("ref_f64.npy"), ref.astype(np.float64) / 3.0)
    np.save(path("ref_f64_as_f32.npy"), (ref.astype(np.float64) / 3.0).astype(np.float32))
    np.save(path("ref_be_f4.npy"), ref.astype(">f4"))
    np.save(path("ref_fortran.npy"), np.asfortranarray(ref))
    halfs = np.array([[0.0, -0.0, 1.0, -2.5], [65504.0, 6e-08, 1e-4, -np.inf],
                      [np.inf, 0.333, 1024.0, -65504.0]], dtype=np.float16)
    np.save(path("ref_f16.npy"), halfs)
    np.save(path("ref_f16_as_f32.npy"), halfs.astype(np.float32))
    np.save(path("ref_i32.npy"), np.arange(10, dtype=np.int32).reshape(2, 5) - 3)
    np.save(path("ref_i64.npy"), np.arange(10, dtype=np.int64).reshape(2, 5) * 1000000007)
    np.save(path("ref_bool.npy"), np.tril(np.ones((4, 4), dtype=bool)))
    np.save(path("ref_u8.npy"), np.tril(np.ones((4, 4), dtype=np.uint8)) * 7)
    with open(path("ref_v2.npy"), "wb") as f:
        np.lib.format.write_array(f, ref, version=(2, 0))
    # ---- malformed .npy --------------------------------------------------------
    good = open(path("ref_f32.npy"), "rb").read()
    raw("bad_magic.npy", b"\x93NUMPX" + good[6:], "not a .npy file")
    raw("bad_version.npy", good[:6] + b"\x09\x00" + good[8:], "version 9.0")
    raw("bad_short.npy", good[:7], "shorter than the 10-byte preamble")
    raw("bad_truncated_data.npy", good[:-5], "truncated")
    raw("bad_extra_data.npy", good + b"\x00" * 4, "promises 96 bytes of data")
    raw("bad_header_len.npy", good[:8] + struct.pack("<H", 65535) + good[10:],
        "runs past the end of the file")
    raw("bad_header_len_v2.npy",
        npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 2,
                  b"\0\0\0\0")[:8] + struct.pack("<I", 0xFFFFFFFF) + b" " * 64,
        "runs past the end of the file")
    f4 = "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }"
    raw("bad_shape_overflow.npy", npy_bytes(f4 % "(4294967296, 4294967296, 16)", 1, b"\0" * 16),
        "overflows 64 bits")
    raw("bad_shape_huge.npy", npy_bytes(f4 % "(99999999999999999999,)", 1, b"\0" * 16),
        "is larger than 9223372036854775807")
    raw("bad_dtype_complex.npy",
        npy_bytes("{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }", 1, b"\0" * 16),
        "dtype '<c8' is not supported")
    raw("bad_dtype_structured.npy",
        npy_bytes("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", 1,
                  b"\0" * 8),
        "structured dtypes")
    raw("bad_five_dims.npy", npy_bytes(f4 % "(1, 1, 1, 1, 2)", 1, b"\0" * 8),
        "5 dimensions")
    raw("bad_scalar.npy", npy_bytes(f4 % "()", 1, b"\0" * 4), "0-dimensional")
    raw("bad_empty.npy", npy_bytes(f4 % "(3, 0)", 1, b""), "is empty")
    raw("bad_dict.npy", npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2,) ", 1,
                                  b"\0" * 8), "bad .npy header")
    raw("bad_missing_key.npy", npy_bytes("{'descr': '<f4', 'shape': (2,), }", 1, b"\0" * 8),
        "lacks 'fortran_order'")
    raw("bad_unknown_key.npy",
        npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", 1,
                  b"\0" * 8), "unexpected key 'x'")
    # ---- valid .safetensors ---------------------------------------------------
    a = (np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5)
    b = np.arange(4, dtype=np.int64) * 3
    hdr = {"__metadata__": {"format": "pt"},
           "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
           "b": {"dtype": "I64", "shape": [4], "data_offsets": [24, 56]}}
    raw("ref_st.safetensors", st_bytes(hdr, a.tobytes() + b.tobytes()))
    # Written by the safetensors library itself, with each dtype attn converts, and
    # the float32 values numpy converts them to (ref_lib_<name>.npy).
    from safetensors.numpy import save_file
    rng = np.random.default_rng(5)
    lib = {
        "w32": rng.standard_normal((3, 4)).astype(np.float32),
        "w16": rng.standard_normal((2, 3, 4)).astype(np.float16),
        "w64": rng.standard_normal((5,)).astype(np.float64),
        "ids": np.arange(6, dtype=np.int64).reshape(2, 3),
        "mask": np.tril(np.ones((1, 1, 3, 3), dtype=bool)),
        "u8": np.arange(4, dtype=np.uint8),
        "i8": np.arange(4, dtype=np.int8),
        "five": np.zeros((1, 1, 1, 1, 2), dtype=np.float32),
        "scalar": np.array(1.5, dtype=np.float32),
        "empty": np.zeros((2, 0), dtype=np.float32),
    }
    save_file(lib, path("ref_lib.safetensors"), metadata={"format": "np", "note": "a\"b"})
    os.chmod(path("ref_lib.safetensors"), 0o644)
    for k in ("w32", "w16", "w64"):
        np.save(path("ref_lib_%s.npy" % k), lib[k].astype(np.float32))
    # BF16 by hand (numpy has no bfloat16): float32 values whose low 16 bits are zero
    # are exactly their bfloat16 upper halves.
    f = (rng.standard_normal(8).astype(np.float32).view(np.uint32) & 0xFFFF0000).view(np.float32)
    f[0], f[1] = np.inf, -0.0
    raw("ref_bf16.safetensors",
        st_bytes({"x": {"dtype": "BF16", "shape": [2, 4], "data_offsets": [0, 16]}},
                 (f.view(np.uint32) >> 16).astype("<u2").tobytes()))
    np.save(path("ref_bf16_as_f32.npy"), f.reshape(2, 4))
    # ---- malformed .safetensors -----------------------------------------------
    good_st = open(path("ref_st.safetensors"), "rb").read()
    data = a.tobytes() + b.tobytes()
    raw("bad_st_short.safetensors", good_st[:5], "shorter than the 8-byte header length")
    raw("bad_st_header_max.safetensors", struct.pack("<Q", 2**64 - 1) + good_st[8:],
        "header length 18446744073709551615 runs past the end of the file")
    raw("bad_st_truncated.safetensors", good_st[:-8], "out of range")
    raw("bad_st_truncated_header.safetensors", good_st[:40], "runs past the end of the file")

    def variant(name, change, phrase, extra=b""):
        h = json.loads(json.dumps(hdr))
        change(h)
        raw(name, st_bytes(h, data + extra), phrase)

    variant("bad_st_out_of_range.safetensors",
            lambda h: h["b"].update(data_offsets=[24, 64]), "out of range")
    variant("bad_st_overlap.safetensors",
            lambda h: (h["a"].update(data_offsets=[0, 24]),
                       h["b"].update(data_offsets=[16, 48])), "overlap", b"")
    variant("bad_st_gap.safetensors",
            lambda h: h["b"].update(data_offsets=[32, 64]), "belong to no tensor",
            b"\0" * 8)
    variant("bad_st_trailing.safetensors", lambda h: None, "belong to no tensor", b"\0" * 8)
    variant("bad_st_unknown_dtype.safetensors",
            lambda h: h["a"].update(dtype="F33"), "unknown dtype 'F33'")
    variant("bad_st_shape_overflow.safetensors",
            lambda h: h["a"].update(shape=[2**32, 2**32, 2]), "overflows 64 bits")
    variant("bad_st_size_mismatch.safetensors",
            lambda h: h["a"].update(shape=[2, 2]), "need 16 bytes but data_offsets")
    variant("bad_st_reversed.safetensors",
            lambda h: h["b"].update(data_offsets=[56, 24]), "end before they begin")
    variant("bad_st_missing_offsets.safetensors",
            lambda h: h["a"].pop("data_offsets"), "lacks 'data_offsets'")
    variant("bad_st_negative.safetensors",
            lambda h: h["a"].update(shape=[-2, 3]), "non-negative integers")
    unterminated = b'{"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},' + b" " * 6
    raw("bad_st_json.safetensors", struct.pack("<Q", len(unterminated)) + unterminated
        + a.tobytes(), "bad safetensors header")
    dup = b'{"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},' \
          b'"a":{"dtype":"I64","shape":[4],"data_offsets":[24,56]}}'
    dup += b" " * ((8 - len(dup) % 8) % 8)
    raw("bad_st_duplicate.safetensors", struct.pack("<Q", len(dup)) + dup + data,
        "appears twice")
    with open(os.path.join(OUT, "MANIFEST"), "w") as f:
        f.write("# malformed files and a phrase each one's error message contains;\n"
                "# written by tests/golden/make_files.py\n")
        for name, phrase in manifest:
            f.write("%s\t%s\n" % (name, phrase))


if __name__ == "__main__":
    main()
