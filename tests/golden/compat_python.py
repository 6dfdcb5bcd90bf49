#!/usr/bin/env python3
"""Compatibility with Python's own readers and writers of the two file formats:
numpy (np.save / np.load) and Hugging Face's safetensors package.

Two directions:

(a) attn writes, Python reads. tests/golden/compat_writer.c is compiled against the
    built library (--build, default build/) and writes .npy and .safetensors files
    with attn_npy_save / attn_safetensors_save, and prints the values it wrote.
    numpy and safetensors load each file and every value must be equal, bit for bit
    (NaN as NaN). Nothing of this is committed but the one summary line at the head
    of tests/data/compat/EXPECTED, which says what was checked and with which
    versions.

(b) Python writes, attn reads. Files written by numpy and by safetensors (float32,
    float16, bfloat16, float64, int32, int64, bool, uint8, big-endian, Fortran order,
    npy format 1.0, 2.0 and 3.0, metadata) go to tests/data/compat/, with the values
    Python reads from them in EXPECTED. Headers that test the edges of the formats
    (npy version 1.1, leading zeros, "__metadata__": null, non-string metadata,
    names that are not UTF-8, ...) go there too, each tried with Python's reader;
    VERDICTS records whether Python accepts it and whether attn must, the two
    differing only where attn decided otherwise (the reason is on the line).
    tests/test_npy.c and tests/test_safetensors.c read both files; they need no
    Python.

Run from the repository root after `make build`:
    pip install numpy safetensors
    python3 tests/golden/compat_python.py [--build build]
"""
import argparse
import json
import math
import os
import platform
import shutil
import struct
import subprocess
import sys
import tempfile
import warnings

import numpy as np
import safetensors
from safetensors import safe_open
from safetensors.numpy import load as st_load, save_file

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
OUT = os.path.join(ROOT, "tests", "data", "compat")

# ---- value lines (the format of EXPECTED and of compat_writer's output) ---------------
# kind<TAB>file<TAB>tensor<TAB>file dtype<TAB>attn dtype<TAB>shape<TAB>values
# Floats are exact hexadecimal (float.hex of the float32 value), "nan" for any NaN;
# integers in decimal; a tensor name escapes \\, \n and \t.

ATTN_DTYPE = {"float32": "f32", "float64": "f32", "float16": "f32", "bfloat16": "f32",
              "int32": "i32", "int64": "i64", "bool": "bool", "uint8": "bool"}


def fmt_values(a32):
    """a32: the values as attn holds them (float32, int32, int64 or uint8)."""
    out = []
    for v in a32.reshape(-1):
        if a32.dtype == np.float32:
            out.append("nan" if math.isnan(v) else float(v).hex())
        else:
            out.append(str(int(v)))
    return " ".join(out)


def esc(name):
    return name.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")


def unesc(s):
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 1 < len(s):
            out.append({"n": "\n", "t": "\t", "\\": "\\"}[s[i + 1]])
            i += 2
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def line(kind, file, tensor, file_dtype, values):
    """values: what numpy reads, converted as attn converts it."""
    attn = ATTN_DTYPE[file_dtype]
    conv = {"f32": np.float32, "i32": np.int32, "i64": np.int64, "bool": np.uint8}[attn]
    a = np.ascontiguousarray(values).astype(conv)
    shape = ",".join(str(d) for d in values.shape)
    return "\t".join([kind, file, esc(tensor), file_dtype, attn, shape, fmt_values(a)])


def parse_values(attn, text):
    if attn == "f32":
        return np.array([float("nan") if t == "nan" else float.fromhex(t) for t in text.split()],
                        dtype=np.float32)
    return np.array([int(t) for t in text.split()],
                    dtype={"i32": np.int32, "i64": np.int64, "bool": np.uint8}[attn])


def same(a, b):
    """Bit-for-bit equality of two arrays of one dtype, any NaN equal to any NaN."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    native = a.dtype.newbyteorder("=")
    a = np.ascontiguousarray(a, dtype=native).reshape(-1)
    b = np.ascontiguousarray(b, dtype=native).reshape(-1)
    if a.dtype.kind == "f":
        bits = "u%d" % a.dtype.itemsize
        nan = np.isnan(a)
        return bool((nan == np.isnan(b)).all() and (a[~nan].view(bits) ==
                                                    b[~nan].view(bits)).all())
    return bool((a == b).all())


# ---- (a) files attn wrote, read by numpy and safetensors ------------------------------

def check_attn_written(build):
    lib = os.path.join(ROOT, build)
    if not os.path.exists(os.path.join(lib, "libattn.so")):
        sys.exit("compat_python.py: %s/libattn.so not found; run `make build` first" % build)
    tmp = tempfile.mkdtemp(prefix="attn_compat_")
    try:
        exe = os.path.join(tmp, "compat_writer")
        cc = os.environ.get("CC", "cc")
        subprocess.run([cc, "-std=c11", "-O1", "-I", os.path.join(ROOT, "include"),
                        os.path.join(ROOT, "tests", "golden", "compat_writer.c"), "-o", exe,
                        "-L", lib, "-Wl,-rpath," + lib, "-lattn", "-lm"], check=True)
        text = subprocess.run([exe, tmp], check=True, capture_output=True, text=True).stdout
        files, values = set(), 0
        for ln in text.splitlines():
            kind, file, tensor, file_dtype, attn, shape, vals = ln.split("\t")
            tensor = unesc(tensor)
            want = parse_values(attn, vals)
            shape = tuple(int(d) for d in shape.split(","))
            path = os.path.join(tmp, file)
            if kind == "npy":
                got = np.load(path)
                with open(path, "rb") as f:
                    version = np.lib.format.read_magic(f)
                assert version == (1, 0), (file, version)
            else:
                got = st_load(open(path, "rb").read())[tensor]
                with safe_open(path, framework="numpy") as f:
                    assert tensor in f.keys(), (file, tensor)
            assert got.shape == shape, (file, tensor, got.shape, shape)
            assert got.dtype == np.dtype(file_dtype), (file, tensor, got.dtype, file_dtype)
            assert same(got.astype(want.dtype).reshape(-1), want), (file, tensor, got, want)
            files.add(file)
            values += want.size
        return len(files), len(text.splitlines()), values
    finally:
        shutil.rmtree(tmp)


# ---- (b) files Python writes, for attn to read -----------------------------------------

def path(name):
    return os.path.join(OUT, name)


def npy_header_file(name, header, data, version=(1, 0), pad=True):
    """An .npy file with a header dict written by hand (for the edge cases)."""
    h = header.encode("latin1" if version < (3, 0) else "utf8")
    pre = 10 if version[0] == 1 else 12
    if pad:
        total = pre + len(h) + 1
        h += b" " * ((64 - total % 64) % 64) + b"\n"
    size = struct.pack("<H", len(h)) if version[0] == 1 else struct.pack("<I", len(h))
    with open(path(name), "wb") as f:
        f.write(b"\x93NUMPY" + bytes(version) + size + h + data)


def st_raw_file(name, header, data):
    header = header if isinstance(header, bytes) else header.encode()
    header += b" " * ((8 - len(header) % 8) % 8)
    with open(path(name), "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + data)


def python_verdict(kind, name):
    """Whether Python's reader takes the file, and what it said."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if kind == "npy":
                np.load(path(name))
            else:
                with safe_open(path(name), framework="numpy") as f:
                    f.keys()
                    f.metadata()
        return "accept", "-"
    except Exception as e:  # the verdict is the point; any error is a refusal
        return "refuse", ("%s: %s" % (type(e).__name__, e)).replace("\t", " ").replace("\n", " ")[:150]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    args = ap.parse_args()
    n_files, n_arrays, n_values = check_attn_written(args.build)

    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    expected = []
    rng = np.random.default_rng(11)

    # -- numpy --
    base = (rng.standard_normal((2, 3, 4)) * 3).astype(np.float64)
    base.reshape(-1)[:4] = [0.0, -0.0, np.inf, -np.inf]
    base.reshape(-1)[4] = 1e-40  # a float32 subnormal after conversion
    halfs = np.array([[0.0, -0.0, 1.0, -2.5], [65504.0, 6e-08, 1e-4, -np.inf],
                      [np.inf, 0.333, 1024.0, np.nan]], dtype=np.float16)
    ints = np.array([[0, -1, 2**31 - 1, -2**31, 42], [7, 8, 9, 10, 11]])
    arrays = {
        "np_f32.npy": base.astype(np.float32),
        "np_f64.npy": base / 3.0,
        "np_f16.npy": halfs,
        "np_i32.npy": ints.astype(np.int32),
        "np_i64.npy": np.array([[0, -1, 2**63 - 1, -2**63, 42]], dtype=np.int64),
        "np_bool.npy": rng.standard_normal((2, 1, 3, 4)) > 0,
        "np_u8_ids.npy": np.array([[5, 0, 255, 17]], dtype=np.uint8),
        "np_be_f4.npy": base.astype(">f4"),
        "np_be_f8.npy": (base / 7.0).astype(">f8"),
        "np_be_f2.npy": halfs.astype(">f2"),
        "np_be_i4.npy": ints.astype(">i4"),
        "np_be_i8.npy": ints.astype(">i8"),
        "np_fortran_2d.npy": np.asfortranarray(base[0]),
        "np_fortran_3d_f16.npy": np.asfortranarray(base.astype(np.float16)),
        "np_fortran_4d_i64.npy": np.asfortranarray(np.arange(24, dtype=np.int64).reshape(1, 2, 3, 4)),
        "np_1d.npy": np.arange(7, dtype=np.float32) / 8,
    }
    for name, a in arrays.items():
        np.save(path(name), a)
    for version in ((1, 0), (2, 0), (3, 0)):
        name = "np_v%d.npy" % version[0]
        with open(path(name), "wb") as f:
            np.lib.format.write_array(f, base.astype(np.float32), version=version)
        arrays[name] = base.astype(np.float32)
    for name, a in arrays.items():
        back = np.load(path(name))
        assert back.dtype == a.dtype and same(back, a), name
        expected.append(line("npy", name, "-", back.dtype.name, back))

    # -- safetensors --
    st_arrays = {
        "f32": base.astype(np.float32),
        "f16": halfs,
        "f64": base / 3.0,
        "i32": ints.astype(np.int32),
        "i64": ints.astype(np.int64),
        "bool": np.tril(np.ones((1, 1, 3, 3), dtype=bool)),
        "u8": np.array([[5, 0, 255, 17]], dtype=np.uint8),
        "layers.0.attn.caf\u00e9 \u221a": np.arange(3, dtype=np.float32),
    }
    save_file(st_arrays, path("st_numpy.safetensors"),
              metadata={"format": "np", "note": "quote \" backslash \\ caf\u00e9"})
    back = st_load(open(path("st_numpy.safetensors"), "rb").read())
    for name, a in st_arrays.items():
        assert same(back[name], a), name
        expected.append(line("st", "st_numpy.safetensors", name, back[name].dtype.name, back[name]))
    # bfloat16: numpy has none, so the bytes are the upper halves of float32 values
    # whose lower halves are zero (exactly their bfloat16 values); the header is what
    # safetensors writes. Python's reader checks the header (VERDICTS).
    f = (rng.standard_normal(8).astype(np.float32).view(np.uint32) & 0xFFFF0000).view(np.float32)
    f[0], f[1], f[2] = np.inf, -0.0, np.nan
    st_raw_file("st_bf16.safetensors",
                json.dumps({"__metadata__": {"format": "pt"},
                            "x": {"dtype": "BF16", "shape": [2, 4], "data_offsets": [0, 16]}},
                           separators=(",", ":")),
                (f.view(np.uint32) >> 16).astype("<u2").tobytes())
    expected.append(line("st", "st_bf16.safetensors", "x", "bfloat16", f.reshape(2, 4)))

    # -- edge cases: what Python takes and what attn must do --
    # (kind, file, attn's verdict, phrase attn's message holds or "-", why they differ)
    cases = []
    f4 = "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }"
    d8 = b"\0" * 8

    def npy_case(name, header, attn, phrase="-", why="-", version=(1, 0), data=d8):
        npy_header_file(name, header, data, version)
        cases.append(("npy", name, attn, phrase, why))

    npy_case("edge_npy_v1_1.npy", f4 % "(2,)", "refuse", "version 1.1", version=(1, 1))
    npy_case("edge_npy_v2_1.npy", f4 % "(2,)", "refuse", "version 2.1", version=(2, 1))
    npy_case("edge_npy_v4.npy", f4 % "(2,)", "refuse", "version 4.0", version=(4, 0))
    npy_case("edge_npy_leading_zero.npy", f4 % "(02,)", "refuse", "leading zero")
    npy_case("edge_npy_one_tuple_no_comma.npy", f4 % "(2)", "refuse", "expected ','")
    npy_case("edge_npy_negative.npy", f4 % "(-2,)", "refuse", "without a sign")
    npy_case("edge_npy_python2_long.npy", f4 % "(2L,)", "accept")
    npy_case("edge_npy_v3_long.npy", f4 % "(2L,)", "refuse", "plain decimal integers",
             version=(3, 0))
    npy_case("edge_npy_double_quotes.npy",
             '{"descr": "<f4", "fortran_order": False, "shape": (2,)}', "accept")
    npy_case("edge_npy_escaped_descr.npy",
             "{'descr': '\\x3cf4', 'fortran_order': False, 'shape': (2,), }", "accept")
    npy_case("edge_npy_extra_key.npy",
             "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", "refuse",
             "unexpected key 'x'")
    npy_case("edge_npy_fortran_none.npy",
             "{'descr': '<f4', 'fortran_order': None, 'shape': (2,), }", "refuse",
             "must be True or False")
    npy_case("edge_npy_hex_size.npy", f4 % "(0x2,)", "refuse", "plain decimal integers",
             "numpy evaluates the header as Python, which reads 0x2; attn takes decimal "
             "sizes only, the one integer rule of both formats (numpy never writes 0x2)")
    npy_case("edge_npy_duplicate_key.npy",
             "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}",
             "refuse", "'descr' given twice",
             "Python keeps the last of two equal keys; attn refuses a key given twice")
    # A version 3.0 header with a byte that is not UTF-8 in a string.
    hdr = "{'descr': '<f4\xff', 'fortran_order': False, 'shape': (2,), }".encode("latin1")
    total = 12 + len(hdr) + 1
    hdr += b" " * ((64 - total % 64) % 64) + b"\n"
    with open(path("edge_npy_v3_not_utf8.npy"), "wb") as fh:
        fh.write(b"\x93NUMPY\x03\x00" + struct.pack("<I", len(hdr)) + hdr + d8)
    cases.append(("npy", "edge_npy_v3_not_utf8.npy", "refuse", "not valid UTF-8", "-"))

    T = '"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}'

    def st_case(name, header, attn, phrase="-", why="-", data=d8):
        st_raw_file(name, header, data)
        cases.append(("st", name, attn, phrase, why))

    st_case("edge_st_metadata_null.safetensors", '{"__metadata__":null,' + T + "}", "accept")
    st_case("edge_st_metadata_only_null.safetensors", '{"__metadata__":null}', "accept",
            data=b"")
    st_case("edge_st_metadata_int.safetensors", '{"__metadata__":{"k":1},' + T + "}",
            "refuse", "not a string")
    st_case("edge_st_metadata_object.safetensors",
            '{"__metadata__":{"k":{"a":"b"}},' + T + "}", "refuse", "not a string")
    st_case("edge_st_metadata_list.safetensors", '{"__metadata__":[],' + T + "}", "refuse",
            "must be an object of strings or null")
    st_case("edge_st_name_latin1.safetensors",
            b'{"\xe9":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', "refuse",
            "not valid UTF-8")
    st_case("edge_st_metadata_latin1.safetensors",
            b'{"__metadata__":{"k":"\xe9"},' + T.encode() + b"}", "refuse", "not valid UTF-8")
    st_case("edge_st_overlong_utf8.safetensors",
            b'{"\xc0\xaf":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', "refuse",
            "not valid UTF-8")
    st_case("edge_st_leading_zero_shape.safetensors",
            '{"a":{"dtype":"F32","shape":[02],"data_offsets":[0,8]}}', "refuse", "leading zero")
    st_case("edge_st_leading_zero_offset.safetensors",
            '{"a":{"dtype":"F32","shape":[2],"data_offsets":[00,8]}}', "refuse", "leading zero")
    st_case("edge_st_unknown_key.safetensors",
            '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":[1.5e3,{"y":null}]}}',
            "accept")
    st_case("edge_st_unknown_key_leading_zero.safetensors",
            '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":01}}', "refuse",
            "leading zero")
    st_case("edge_st_shape_float.safetensors",
            '{"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}}', "refuse",
            "plain decimal integers")
    st_case("edge_st_trailing_text.safetensors", "{" + T + "}x", "refuse",
            "unexpected text after the header object")
    st_case("edge_st_whitespace.safetensors", "\n{\t" + T + "}\r\n", "accept")
    st_case("edge_st_escaped_name.safetensors",
            '{"a\\/b\\u00e9":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', "accept")
    st_case("edge_st_lone_surrogate.safetensors",
            '{"a\\ud800":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', "refuse",
            "unpaired surrogate")
    st_case("edge_st_control_char.safetensors",
            '{"a\tb":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', "refuse",
            "control character")
    st_case("edge_st_bom.safetensors", b"\xef\xbb\xbf{" + T.encode() + b"}", "refuse",
            "expected '{'")
    st_case("edge_st_metadata_twice.safetensors",
            '{"__metadata__":{},"__metadata__":{},' + T + "}", "refuse", "given twice")
    st_case("edge_st_dtype_twice.safetensors",
            '{"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}}', "refuse",
            "'dtype' given twice")
    st_case("edge_st_empty_name.safetensors",
            '{"":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', "accept")
    st_case("edge_st_duplicate_name.safetensors", "{" + T + "," + T + "}", "refuse",
            "appears twice",
            "Python keeps the last of two equal names; attn refuses a name given twice")
    st_case("edge_st_nul_in_name.safetensors",
            '{"a\\u0000b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', "refuse",
            "holds a NUL character", "attn's tensor names are C strings")

    verdicts = []
    for kind, name, attn, phrase, why in cases:
        py, said = python_verdict(kind, name)
        if (py == attn) != (why == "-"):
            sys.exit("compat_python.py: %s: Python says %s (%s), attn is meant to %s and the "
                     "reason given is %r" % (name, py, said, attn, why))
        verdicts.append("\t".join([kind, name, py, attn, phrase, why, said]))

    versions = "numpy %s, safetensors %s, Python %s" % (np.__version__, safetensors.__version__,
                                                       platform.python_version())
    with open(os.path.join(OUT, "EXPECTED"), "w") as fh:
        fh.write("# Arrays written by numpy and safetensors, with the values Python reads\n"
                 "# (converted as attn converts them: floats to float32 by numpy's astype).\n"
                 "# kind, file, tensor, file dtype, attn dtype, shape, values; written by\n"
                 "# tests/golden/compat_python.py with %s.\n"
                 "# The other way, with the same versions: numpy and safetensors loaded the %d\n"
                 "# files (%d arrays, %d values) that attn wrote, every value equal bit for bit.\n"
                 % (versions, n_files, n_arrays, n_values))
        for ln in expected:
            fh.write(ln + "\n")
    with open(os.path.join(OUT, "VERDICTS"), "w") as fh:
        fh.write("# Edge cases of the two formats: kind, file, Python's verdict, attn's verdict,\n"
                 "# a phrase attn's message holds when it refuses, why the verdicts differ\n"
                 "# ('-' when they agree), what Python said. Written by\n"
                 "# tests/golden/compat_python.py with %s.\n" % versions)
        for ln in verdicts:
            fh.write(ln + "\n")
    for name in os.listdir(OUT):
        os.chmod(os.path.join(OUT, name), 0o644)
    print("compat_python.py: %s; attn -> Python: %d files, %d values; Python -> attn: %d "
          "arrays, %d edge cases" % (versions, n_files, n_values, len(expected), len(verdicts)))


if __name__ == "__main__":
    main()
