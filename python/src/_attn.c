/* _attn: the attn library as a CPython extension module, in C, against the stable
 * ABI of Python 3.11 (Py_LIMITED_API), so one build serves every later CPython.
 *
 * Arrays come in through the buffer protocol (PEP 3118), which numpy arrays speak:
 * a float32 array, contiguous or a strided view with non-negative strides, is
 * described to the library as an attn_tensor over the caller's own memory, with
 * no copy. attn.sdpa also takes 16-bit arrays (SPEC section 10), in place too:
 * numpy's float16, ml_dtypes' bfloat16 (which numpy cannot export through the
 * buffer protocol, so its memory is read through a uint16 view of it), and
 * uint16 arrays of raw bits with dtype="bf16" or "f16"; so does a KV cache made
 * in 16 bits, whose own dtype says what its uint16 arrays hold. Outputs are numpy arrays
 * made by numpy.empty (looked up once, at import) or the caller's own `out=`
 * array. The GIL is released while a kernel runs;
 * the Py_buffer views held for the call keep every array alive meanwhile.
 *
 * This module is the thin layer; attn/__init__.py holds the Python-side
 * conveniences (weights from a dict or a file, the KVCache class). Library errors
 * become ValueError, MemoryError or OSError with the library's own message.
 */
/* CMake's USE_SABI defines it too; the file says it for any other build. */
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030B0000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "attn.h"

/* numpy.empty, numpy.dtype and the dtypes, looked up once at import. */
static PyObject *np_empty;
static PyObject *np_dtype_type;
/* Indexed by attn_dtype: float32, bool, int64, int32, then the storage of a
 * bfloat16 array (uint16: numpy has no bfloat16) and float16. */
static PyObject *np_dtype[6];
/* numpy.dtype(ml_dtypes.bfloat16), found the first time a call meets an array
 * that numpy cannot export (NULL until then, or while ml_dtypes is not imported). */
static PyObject *ml_bf16_dtype;
/* numpy.bool_, the type of a comparison of numpy values, taken as a bool where
 * an option is one. */
static PyObject *np_bool_type;
/* numpy.ma.MaskedArray, found the first time numpy.ma is in sys.modules (a
 * masked array cannot exist before): attn reads an array's memory, and would
 * read a masked array's hidden entries as numbers, so it refuses one. */
static PyObject *ma_type;

/* ---------------------------------------------------------------------------
 * Errors
 * ------------------------------------------------------------------------- */

/* A failed library call as a Python exception: out of memory is MemoryError, a
 * file that cannot be opened, read or written is OSError, everything else (shapes,
 * masks, arguments, malformed files) ValueError; the text is the library's. */
static PyObject *raise_status(int status, const attn_ctx *ctx)
{
    PyObject *type = PyExc_ValueError;
    if (status == ATTN_STATUS_NO_MEMORY)
        type = PyExc_MemoryError;
    else if (status == ATTN_STATUS_IO)
        type = PyExc_OSError;
    const char *msg = (ctx && ctx->message[0]) ? ctx->message : attn_strerror(status);
    PyErr_SetString(type, msg);
    return NULL;
}

/* ---------------------------------------------------------------------------
 * Arrays in: the buffer protocol
 * ------------------------------------------------------------------------- */

/* Every buffer a call holds, released together when it ends; hold[i] is the
 * uint16 view whose buffer view[i] is, for an ml_dtypes bfloat16 array (else
 * NULL). */
#define MAX_BUFS 32
typedef struct bufset {
    Py_buffer view[MAX_BUFS];
    PyObject *hold[MAX_BUFS];
    int n;
} bufset;

static void bufset_release(bufset *bs)
{
    for (int i = 0; i < bs->n; i++) {
        PyBuffer_Release(&bs->view[i]);
        Py_CLEAR(bs->hold[i]);
    }
    bs->n = 0;
}

/* A uint16 array: 16-bit values as raw bits, whose meaning the call's dtype=
 * keyword gives (not an attn_dtype of its own). */
#define DTYPE_RAW16 100

/* The attn dtype of a buffer's struct-module format, DTYPE_RAW16, or -1. Only
 * native or little-endian formats are taken: attn reads memory in the machine's
 * order. */
static int format_dtype(const char *fmt, Py_ssize_t itemsize)
{
    if (!fmt)
        return -1;
    if (*fmt == '@' || *fmt == '=' || *fmt == '<')
        fmt++;
    if (fmt[0] == '\0' || fmt[1] != '\0')
        return -1;
    switch (fmt[0]) {
    case 'f': return itemsize == 4 ? ATTN_DTYPE_F32 : -1;
    case 'e': return itemsize == 2 ? ATTN_DTYPE_F16 : -1;
    case 'H': return itemsize == 2 ? DTYPE_RAW16 : -1;
    case '?': return itemsize == 1 ? ATTN_DTYPE_BOOL : -1;
    case 'i': case 'l': case 'q':
        if (itemsize == 8) return ATTN_DTYPE_I64;
        if (itemsize == 4) return ATTN_DTYPE_I32;
        return -1;
    default: return -1;
    }
}

#define WANT_F32 (1u << ATTN_DTYPE_F32)
#define WANT_BOOL (1u << ATTN_DTYPE_BOOL)
#define WANT_INT ((1u << ATTN_DTYPE_I64) | (1u << ATTN_DTYPE_I32))
#define WANT_HALF ((1u << ATTN_DTYPE_BF16) | (1u << ATTN_DTYPE_F16))
/* What attn.sdpa takes for q, k, v and out. */
#define WANT_ATTN (WANT_F32 | WANT_HALF)

/* Whether obj is a numpy array of ml_dtypes.bfloat16. Such an array can only
 * exist once ml_dtypes has been imported, so this looks in sys.modules and never
 * imports it: attn does not need ml_dtypes, it reads its arrays when given them.
 * Never leaves an exception set. */
static int is_ml_bfloat16(PyObject *obj)
{
    if (!ml_bf16_dtype) {
        PyObject *ml = PyDict_GetItemString(PyImport_GetModuleDict(), "ml_dtypes"); /* borrowed */
        PyObject *type = ml ? PyObject_GetAttrString(ml, "bfloat16") : NULL;
        if (type) {
            ml_bf16_dtype = PyObject_CallFunctionObjArgs(np_dtype_type, type, NULL);
            Py_DECREF(type);
        }
        PyErr_Clear();
        if (!ml_bf16_dtype)
            return 0;
    }
    PyObject *dt = PyObject_GetAttrString(obj, "dtype");
    const int eq = dt ? PyObject_RichCompareBool(dt, ml_bf16_dtype, Py_EQ) : 0;
    Py_XDECREF(dt);
    PyErr_Clear();
    return eq == 1;
}

/* Whether obj is a numpy.ma.MaskedArray (see ma_type). Never leaves an
 * exception set. */
static int is_masked_array(PyObject *obj)
{
    if (!ma_type) {
        PyObject *ma = PyDict_GetItemString(PyImport_GetModuleDict(), "numpy.ma"); /* borrowed */
        ma_type = ma ? PyObject_GetAttrString(ma, "MaskedArray") : NULL;
        PyErr_Clear();
        if (ma_type && !PyType_Check(ma_type))
            Py_CLEAR(ma_type);
        if (!ma_type)
            return 0;
    }
    return PyType_IsSubtype(Py_TYPE(obj), (PyTypeObject *)ma_type);
}

/* Whether obj is numpy's bool scalar (numpy.bool_). */
static int is_np_bool(PyObject *obj)
{
    return np_bool_type && (PyObject *)Py_TYPE(obj) == np_bool_type;
}

/* numpy's name of obj's dtype ("float64"), for messages; the buffer's format
 * when obj has no dtype. */
static void dtype_name_of(PyObject *obj, const char *format, char *buf, size_t size)
{
    snprintf(buf, size, "an array of format '%s'", format ? format : "?");
    PyObject *dt = PyObject_GetAttrString(obj, "dtype");
    PyObject *str = dt ? PyObject_Str(dt) : NULL;
    const char *name = str ? PyUnicode_AsUTF8AndSize(str, NULL) : NULL;
    if (name)
        snprintf(buf, size, "%s", name);
    Py_XDECREF(str);
    Py_XDECREF(dt);
    PyErr_Clear();
}

/* What a set of dtypes reads as in a message. */
static const char *want_words(unsigned want)
{
    switch (want) {
    case WANT_F32: return "float32";
    case WANT_BOOL: return "bool";
    case WANT_INT: return "int64 or int32";
    case WANT_F32 | WANT_BOOL | WANT_INT: return "float32, int64, int32 or bool";
    case WANT_F32 | (1u << ATTN_DTYPE_BF16):
        return "float32 or bfloat16 (the KV cache's dtype: ml_dtypes.bfloat16, or uint16 "
               "bits)";
    case WANT_F32 | (1u << ATTN_DTYPE_F16):
        return "float32 or float16 (the KV cache's dtype, or uint16 bits of it)";
    case WANT_ATTN:
        return "float32, float16 or bfloat16 (ml_dtypes.bfloat16, or uint16 bits with "
               "dtype=\"bf16\")";
    default: return "of a supported dtype";
    }
}

/* The exception for an array whose buffer (with `flags`) was refused; called
 * with none set. Read-only where a writable array is wanted is ValueError; a
 * numpy dtype that the buffer protocol has no letter for (float8, or bfloat16
 * when it is not ml_dtypes') is TypeError naming it; anything else, the
 * exporter's own error, asked for again. */
static void buffer_refused(PyObject *obj, const char *name, unsigned want, int flags)
{
    Py_buffer probe;
    if ((flags & PyBUF_WRITABLE) &&
        PyObject_GetBuffer(obj, &probe, flags & ~PyBUF_WRITABLE) == 0) {
        PyBuffer_Release(&probe);
        PyErr_Format(PyExc_ValueError, "%s must be a writable array, not a read-only one", name);
        return;
    }
    PyErr_Clear();
    if (PyObject_HasAttrString(obj, "dtype")) {
        char got[64];
        dtype_name_of(obj, NULL, got, sizeof got);
        PyErr_Format(PyExc_TypeError, "%s must be %s, not %s", name, want_words(want), got);
        return;
    }
    if (PyObject_GetBuffer(obj, &probe, flags) == 0) {
        PyBuffer_Release(&probe); /* it worked this time: fail anyway, said plainly */
        PyErr_Format(PyExc_BufferError, "%s: the array's buffer could not be read", name);
    }
}

/* Describes obj's memory as an attn_tensor without copying it. `want` is a set
 * of dtypes; raw16 says what a uint16 array holds (ATTN_DTYPE_BF16 or
 * ATTN_DTYPE_F16: the call's dtype= keyword), or -1 when the call was not told,
 * and then a uint16 array is refused. *ml (when not NULL) becomes 1 for an
 * ml_dtypes bfloat16 array, so that an output can be made of the same kind. A
 * wrong type or dtype is TypeError; a rank outside 1..4, a negative stride (a
 * reversed view, which attn does not read) or a stride that is not a whole number
 * of elements is ValueError. On success the buffer is in bs. */
static int get_tensor_ex(bufset *bs, PyObject *obj, const char *name, unsigned want,
                         int writable, int raw16, attn_tensor *t, int *ml)
{
    if (ml)
        *ml = 0;
    if (bs->n >= MAX_BUFS) {
        PyErr_SetString(PyExc_RuntimeError, "attn: too many arrays in one call");
        return -1;
    }
    if (obj == Py_None || !PyObject_CheckBuffer(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be a numpy array, not %s", name,
                     obj == Py_None ? "None" : "an object without the buffer protocol");
        return -1;
    }
    if (is_masked_array(obj)) {
        PyErr_Format(PyExc_TypeError,
                     "%s is a numpy.ma.MaskedArray: attn would read its masked entries as "
                     "numbers and ignore its mask; pass %s.filled(value) or np.asarray(%s) "
                     "(to hide keys, pass a bool mask= instead)",
                     name, name, name);
        return -1;
    }
    Py_buffer *v = &bs->view[bs->n];
    bs->hold[bs->n] = NULL;
    int flags = PyBUF_STRIDES | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    int is_bf16 = 0;
    if (PyObject_GetBuffer(obj, v, flags) < 0) {
        /* numpy exports no buffer of a dtype it does not know (ml_dtypes'
         * bfloat16); the same memory is read through a uint16 view, which keeps
         * the array alive until the call ends. */
        PyErr_Clear();
        PyObject *u16 = is_ml_bfloat16(obj)
                            ? PyObject_CallMethod(obj, "view", "O", np_dtype[ATTN_DTYPE_BF16])
                            : NULL;
        if (!u16) {
            if (!PyErr_Occurred())
                buffer_refused(obj, name, want, flags);
            return -1;
        }
        if (PyObject_GetBuffer(u16, v, flags) < 0) {
            PyErr_Clear();
            buffer_refused(u16, name, want, flags);
            Py_DECREF(u16);
            return -1;
        }
        bs->hold[bs->n] = u16;
        is_bf16 = 1;
    }
    bs->n++;
    int dt = is_bf16 ? ATTN_DTYPE_BF16 : format_dtype(v->format, v->itemsize);
    if (dt == DTYPE_RAW16 && raw16 >= 0 && (want & (1u << raw16)))
        dt = raw16;
    if (ml)
        *ml = is_bf16;
    if (dt < 0 || dt == DTYPE_RAW16 || !(want & (1u << dt))) {
        char got[64];
        if (is_bf16)
            snprintf(got, sizeof got, "bfloat16");
        else
            dtype_name_of(obj, v->format, got, sizeof got);
        if (dt == DTYPE_RAW16 && (want & WANT_HALF))
            PyErr_Format(PyExc_TypeError,
                         "%s is uint16: pass dtype=\"bf16\" (or \"f16\") to say that it holds "
                         "bfloat16 (float16) bits, or pass float32, float16 or "
                         "ml_dtypes.bfloat16 values",
                         name);
        else if ((dt == ATTN_DTYPE_F16 || dt == ATTN_DTYPE_BF16) && !(want & WANT_HALF))
            PyErr_Format(PyExc_TypeError,
                         "%s must be %s, not %s: of attn's calls only sdpa and a KVCache "
                         "made with dtype=\"bf16\" or \"f16\" take 16-bit arrays (the "
                         "backward, multi-head attention and RoPE are float32 only)",
                         name, want_words(want), got);
        else
            PyErr_Format(PyExc_TypeError, "%s must be %s, not %s", name, want_words(want), got);
        return -1;
    }
    if (v->ndim < 1 || v->ndim > ATTN_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "%s must have 1 to %d dimensions, not %d", name,
                     ATTN_MAX_DIMS, v->ndim);
        return -1;
    }
    memset(t, 0, sizeof *t);
    t->data = v->buf;
    t->dtype = (attn_dtype)dt;
    t->ndim = v->ndim;
    for (int i = 0; i < ATTN_MAX_DIMS; i++) {
        t->shape[i] = 1;
        t->stride[i] = 1;
    }
    for (int i = 0; i < v->ndim; i++) {
        const Py_ssize_t s = v->strides[i];
        if (s < 0 || s % v->itemsize != 0) {
            PyErr_Format(PyExc_ValueError,
                         "%s: stride %zd bytes on axis %d is %s; pass np.ascontiguousarray(%s)",
                         name, s, i, s < 0 ? "negative (a reversed view)"
                                           : "not a whole number of elements", name);
            return -1;
        }
        t->shape[i] = v->shape[i];
        t->stride[i] = s / v->itemsize;
    }
    return 0;
}

/* get_tensor_ex for the float32, bool and integer arguments: no uint16 bits. */
static int get_tensor(bufset *bs, PyObject *obj, const char *name, unsigned want, int writable,
                      attn_tensor *t)
{
    return get_tensor_ex(bs, obj, name, want, writable, -1, t, NULL);
}

/* An optional array: None leaves *set 0. */
static int get_opt_tensor(bufset *bs, PyObject *obj, const char *name, unsigned want,
                          attn_tensor *t, int *set)
{
    *set = 0;
    if (!obj || obj == Py_None)
        return 0;
    if (get_tensor(bs, obj, name, want, 0, t) < 0)
        return -1;
    *set = 1;
    return 0;
}

/* ---------------------------------------------------------------------------
 * Arrays out: numpy.empty, then the same buffer path
 * ------------------------------------------------------------------------- */

/* A new numpy array of the given shape and dtype, described in t (its buffer is
 * held in bs). Returns a new reference or NULL. */
static PyObject *new_array(bufset *bs, int ndim, const int64_t *shape, attn_dtype dtype,
                           const char *name, attn_tensor *t)
{
    PyObject *tuple = PyTuple_New(ndim);
    if (!tuple)
        return NULL;
    for (int i = 0; i < ndim; i++) {
        PyObject *n = PyLong_FromLongLong(shape[i]);
        if (!n) {
            Py_DECREF(tuple);
            return NULL;
        }
        PyTuple_SetItem(tuple, i, n); /* steals n */
    }
    PyObject *arr = PyObject_CallFunctionObjArgs(np_empty, tuple, np_dtype[dtype], NULL);
    Py_DECREF(tuple);
    if (!arr)
        return NULL;
    if (get_tensor_ex(bs, arr, name, 1u << dtype, 1, dtype == ATTN_DTYPE_BF16 ? (int)dtype : -1,
                      t, NULL) < 0) {
        Py_DECREF(arr);
        return NULL;
    }
    return arr;
}

/* A bfloat16 array made by new_array (uint16) as the caller's kind of bfloat16
 * array: itself for uint16 bits, a view of it as ml_dtypes.bfloat16 when the
 * inputs were that. Steals arr; returns a new reference or NULL. */
static PyObject *as_ml_bfloat16(PyObject *arr, int ml)
{
    if (!ml || !arr)
        return arr;
    PyObject *view = PyObject_CallMethod(arr, "view", "O", ml_bf16_dtype);
    Py_DECREF(arr);
    return view;
}

/* ---------------------------------------------------------------------------
 * Options shared by sdpa, mha_forward, gqa_forward and KVCache.attend
 * ------------------------------------------------------------------------- */

typedef struct sdpa_opts {
    attn_sdpa_params p;
    attn_tensor mask, slopes, bias, sinks;
} sdpa_opts;

static int parse_causal(PyObject *obj, int *causal)
{
    if (!obj || obj == Py_None) {
        *causal = ATTN_CAUSAL_NONE;
        return 0;
    }
    if (PyUnicode_Check(obj)) {
        if (PyUnicode_CompareWithASCIIString(obj, "top_left") == 0) {
            *causal = ATTN_CAUSAL_TOP_LEFT;
            return 0;
        }
        if (PyUnicode_CompareWithASCIIString(obj, "bottom_right") == 0) {
            *causal = ATTN_CAUSAL_BOTTOM_RIGHT;
            return 0;
        }
        PyErr_Format(PyExc_ValueError,
                     "causal must be False, True, \"top_left\" or \"bottom_right\", not %R", obj);
        return -1;
    }
    if (is_np_bool(obj)) {
        const int t = PyObject_IsTrue(obj);
        if (t < 0)
            return -1;
        *causal = t ? ATTN_CAUSAL_TOP_LEFT : ATTN_CAUSAL_NONE;
        return 0;
    }
    if (!PyBool_Check(obj)) {
        /* The type too: numpy's True and an int 1 print as Python's would. */
        PyObject *tn = PyType_GetName(Py_TYPE(obj));
        PyErr_Format(PyExc_TypeError,
                     "causal must be False, True, \"top_left\" or \"bottom_right\", not %R (%S)",
                     obj, tn ? tn : Py_None);
        Py_XDECREF(tn);
        return -1;
    }
    *causal = obj == Py_True ? ATTN_CAUSAL_TOP_LEFT : ATTN_CAUSAL_NONE;
    return 0;
}

/* A Python float (or int) as a C float; None leaves *has 0. */
static int parse_opt_float(PyObject *obj, const char *name, float *out, int *has)
{
    *has = 0;
    if (!obj || obj == Py_None)
        return 0;
    const double d = PyFloat_AsDouble(obj);
    if (d == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be a number or None, not %R", name, obj);
        return -1;
    }
    /* A finite number past float32's range would reach the library as inf and be
     * reported as "inf"; say what was given instead. */
    if (isfinite(d) && !isfinite((float)d)) {
        PyErr_Format(PyExc_ValueError, "%s %R is beyond float32's range (magnitudes up to "
                     "3.4e38)", name, obj);
        return -1;
    }
    *out = (float)d;
    *has = 1;
    return 0;
}

/* One side of a window: an int (or anything with __index__), or None. Errors
 * name the window, which Python's own int conversion would not. */
static int parse_window_side(PyObject *window, PyObject *obj, int64_t *out)
{
    if (obj == Py_None) {
        *out = -1;
        return 0;
    }
    const long long n = PyLong_AsLongLong(obj);
    if (n == -1 && PyErr_Occurred()) {
        const int overflow = PyErr_ExceptionMatches(PyExc_OverflowError);
        PyErr_Clear();
        if (overflow)
            PyErr_Format(PyExc_ValueError, "window %R: a side is beyond int64's range", window);
        else
            PyErr_Format(PyExc_TypeError,
                         "window must be a pair (left, right) of ints (-1 or None: unbounded), "
                         "not %R",
                         window);
        return -1;
    }
    *out = n;
    return 0;
}

static int parse_window(PyObject *obj, attn_sdpa_params *p)
{
    if (!obj || obj == Py_None)
        return 0;
    /* Any sequence of two (a tuple, a list as a model's JSON config gives it, a numpy
     * array), not a string. */
    if (PyUnicode_Check(obj) || PyBytes_Check(obj) || !PySequence_Check(obj) ||
        PySequence_Size(obj) != 2) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError,
                     "window must be a pair (left, right) of ints (-1 or None: unbounded), not %R",
                     obj);
        return -1;
    }
    int64_t side[2];
    for (Py_ssize_t i = 0; i < 2; i++) {
        PyObject *item = PySequence_GetItem(obj, i);
        const int rc = item ? parse_window_side(obj, item, &side[i]) : -1;
        Py_XDECREF(item);
        if (rc < 0)
            return -1;
    }
    p->window_left = side[0];
    p->window_right = side[1];
    p->has_window = 1;
    return 0;
}

static int parse_empty_rows(PyObject *obj, attn_empty_rows *out)
{
    if (!obj || obj == Py_None) {
        *out = ATTN_EMPTY_ROWS_ERROR;
        return 0;
    }
    if (PyUnicode_Check(obj)) {
        if (PyUnicode_CompareWithASCIIString(obj, "error") == 0) {
            *out = ATTN_EMPTY_ROWS_ERROR;
            return 0;
        }
        if (PyUnicode_CompareWithASCIIString(obj, "zero") == 0) {
            *out = ATTN_EMPTY_ROWS_ZERO;
            return 0;
        }
    }
    PyErr_Format(PyExc_ValueError, "empty_rows must be \"error\" or \"zero\", not %R", obj);
    return -1;
}

/* Fills o from the keyword values (any may be NULL or None). */
static int parse_opts(bufset *bs, sdpa_opts *o, PyObject *mask, PyObject *causal,
                      PyObject *scale, PyObject *window, PyObject *softcap, PyObject *alibi,
                      PyObject *bias, PyObject *sinks, PyObject *empty_rows)
{
    attn_sdpa_params_init(&o->p);
    int set = 0, has = 0;
    if (get_opt_tensor(bs, mask, "mask", WANT_BOOL, &o->mask, &set) < 0)
        return -1;
    if (set)
        o->p.mask = &o->mask;
    if (parse_causal(causal, &o->p.causal) < 0)
        return -1;
    if (parse_opt_float(scale, "scale", &o->p.scale, &o->p.has_scale) < 0)
        return -1;
    if (parse_window(window, &o->p) < 0)
        return -1;
    if (parse_opt_float(softcap, "softcap", &o->p.softcap, &has) < 0)
        return -1;
    if (has && !(o->p.softcap > 0.0f)) {
        PyErr_Format(PyExc_ValueError, "softcap must be above 0 (or None), not %R", softcap);
        return -1;
    }
    if (alibi && alibi != Py_None && alibi != Py_False) {
        const int np_flag = is_np_bool(alibi) ? PyObject_IsTrue(alibi) : -1;
        if (alibi == Py_True || np_flag == 1) {
            o->p.alibi = 1;
        } else if (np_flag == 0) {
            /* numpy's False: no ALiBi. */
        } else if (!PyObject_CheckBuffer(alibi)) {
            PyErr_Format(PyExc_TypeError,
                         "alibi must be None, False, True or float32 slopes [H] (a numpy "
                         "array), not %R",
                         alibi);
            return -1;
        } else {
            if (get_tensor(bs, alibi, "alibi", WANT_F32, 0, &o->slopes) < 0)
                return -1;
            o->p.alibi = 1;
            o->p.alibi_slopes = &o->slopes;
        }
    }
    if (get_opt_tensor(bs, bias, "bias", WANT_F32, &o->bias, &set) < 0)
        return -1;
    if (set)
        o->p.bias = &o->bias;
    if (get_opt_tensor(bs, sinks, "sinks", WANT_F32, &o->sinks, &set) < 0)
        return -1;
    if (set)
        o->p.sinks = &o->sinks;
    return parse_empty_rows(empty_rows, &o->p.empty_rows);
}

/* The result: out alone, or a tuple (out[, weights][, lse]). Steals the refs. */
static PyObject *pack_result(PyObject *out, PyObject *weights, PyObject *lse)
{
    if (!weights && !lse)
        return out;
    PyObject *r = PyTuple_New(1 + (weights != NULL) + (lse != NULL));
    if (!r) {
        Py_DECREF(out);
        Py_XDECREF(weights);
        Py_XDECREF(lse);
        return NULL;
    }
    Py_ssize_t i = 0;
    PyTuple_SetItem(r, i++, out);
    if (weights)
        PyTuple_SetItem(r, i++, weights);
    if (lse)
        PyTuple_SetItem(r, i++, lse);
    return r;
}

/* The shape of t with its last axis replaced by `last` (lse: dropped). */
static int shape_with_last(const attn_tensor *t, int64_t last, int drop, int64_t *shape)
{
    for (int i = 0; i < t->ndim - 1; i++)
        shape[i] = t->shape[i];
    if (drop) {
        if (t->ndim == 1) {
            shape[0] = 1;
            return 1;
        }
        return t->ndim - 1;
    }
    shape[t->ndim - 1] = last;
    return t->ndim;
}

/* ---------------------------------------------------------------------------
 * sdpa
 * ------------------------------------------------------------------------- */

/* Small calls (the chapter's sizes) take their scratch from this much stack
 * instead of a malloc/free pair per call: at S1 that pair is a visible part of a
 * call of a few microseconds. A call that needs more allocates as usual. */
#define SMALL_WORKSPACE 16384

/* The optional outputs of an attention call shaped like q: the weights
 * [.., Tq, keys] when want_w, the log-sum-exp [.., Tq] when want_lse (then
 * p->lse points at it). 0, or -1 with an exception set. */
static int new_weights_and_lse(bufset *bs, const attn_tensor *q, int64_t keys, int want_w,
                               int want_lse, PyObject **w_arr, attn_tensor *weights,
                               PyObject **lse_arr, attn_tensor *lse, attn_sdpa_params *p)
{
    int64_t shape[ATTN_MAX_DIMS];
    if (want_w) {
        int nd = shape_with_last(q, keys, 0, shape);
        if (!(*w_arr = new_array(bs, nd, shape, ATTN_DTYPE_F32, "weights", weights)))
            return -1;
    }
    if (want_lse) {
        int nd = shape_with_last(q, 0, 1, shape);
        if (!(*lse_arr = new_array(bs, nd, shape, ATTN_DTYPE_F32, "lse", lse)))
            return -1;
        p->lse = lse;
    }
    return 0;
}

static void small_ctx_init(attn_ctx *ctx, void *ws, size_t size)
{
    attn_ctx_init(ctx);
    ctx->workspace = ws;
    ctx->workspace_size = size;
}

PyDoc_STRVAR(sdpa_doc,
"sdpa(q, k, v, *, mask=None, causal=False, scale=None, window=None, softcap=None,\n"
"     alibi=None, bias=None, sinks=None, return_weights=False, return_lse=False,\n"
"     empty_rows=\"error\", out=None, dtype=None)\n"
"--\n\n"
"Scaled dot-product attention: softmax(scale * q k^T [+ options]) v.\n\n"
"q [B, H, Tq, D], k [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv], numpy arrays of one\n"
"dtype: float32, float16, or bfloat16 (ml_dtypes.bfloat16 arrays, or uint16\n"
"arrays of bfloat16 bits with dtype=\"bf16\"); fewer than 4 dimensions read as\n"
"leading sizes of 1. Contiguous arrays and strided views with non-negative\n"
"strides are read in place, without a copy. 16-bit inputs accumulate in\n"
"float32 and give an output of their own dtype and kind of array.\n"
"Hkv may divide H (grouped-query attention; query head h reads key/value head\n"
"h // (H // Hkv)).\n\n"
"mask        bool, broadcasts to [B, H, Tq, Tk]; True means 'may attend'.\n"
"causal      False, True (= \"top_left\": query i sees keys j <= i) or\n"
"            \"bottom_right\" (query i sees keys j <= i + Tk - Tq).\n"
"scale       a float instead of 1/sqrt(D).\n"
"window      (left, right): key j visible iff i' - left <= j <= i' + right,\n"
"            i' = i + Tk - Tq; -1 or None means unbounded on that side.\n"
"softcap     c > 0: each score s becomes c * tanh(s / c).\n"
"alibi       True (the ALiBi paper's slopes) or float32 slopes [H].\n"
"bias        float32, broadcasts to [B, H, Tq, Tk], added to the scores.\n"
"sinks       float32 [H]: one logit per head in each row's softmax denominator.\n"
"empty_rows  \"error\" (a row with every key masked raises ValueError) or \"zero\".\n"
"out         optional writable array [B, H, Tq, Dv] of q's dtype to write into.\n"
"dtype       \"bf16\" or \"f16\": what uint16 arrays among q, k, v, out hold (raw\n"
"            bits); None (the default) refuses uint16 arrays.\n\n"
"Returns out [B, H, Tq, Dv] in q's dtype; with return_weights and/or return_lse\n"
"a tuple (out, weights [B, H, Tq, Tk], lse [B, H, Tq]) holding those asked for;\n"
"weights and lse are float32 whatever the inputs' dtype, as are mask, bias,\n"
"sinks and alibi's slopes.\n"
"Raises ValueError (shapes, masks, options), MemoryError, TypeError (an\n"
"array of another dtype, q, k and v of different dtypes). The GIL is released\n"
"while the kernel runs.");

/* The dtype= keyword of sdpa: what uint16 arrays hold (-1: not given). */
static int parse_raw16(PyObject *obj, int *raw16)
{
    *raw16 = -1;
    if (!obj || obj == Py_None)
        return 0;
    if (PyUnicode_Check(obj)) {
        if (PyUnicode_CompareWithASCIIString(obj, "bf16") == 0 ||
            PyUnicode_CompareWithASCIIString(obj, "bfloat16") == 0) {
            *raw16 = ATTN_DTYPE_BF16;
            return 0;
        }
        if (PyUnicode_CompareWithASCIIString(obj, "f16") == 0 ||
            PyUnicode_CompareWithASCIIString(obj, "float16") == 0) {
            *raw16 = ATTN_DTYPE_F16;
            return 0;
        }
    }
    PyErr_Format(PyExc_ValueError,
                 "dtype must be None, \"bf16\" or \"f16\" (what uint16 arrays of raw bits "
                 "hold), not %R",
                 obj);
    return -1;
}

/* q, k and v of one dtype, which dtype= (when given) names: TypeError naming
 * them otherwise. (out= is checked against q once it is read.) */
static int check_one_dtype(const attn_tensor *q, const attn_tensor *k, const attn_tensor *v,
                           int raw16)
{
    if (q->dtype != k->dtype || q->dtype != v->dtype) {
        PyErr_Format(PyExc_TypeError,
                     "q, k and v must share one dtype (float32, float16 or bfloat16), not "
                     "q %s, k %s, v %s",
                     attn_dtype_name(q->dtype), attn_dtype_name(k->dtype),
                     attn_dtype_name(v->dtype));
        return -1;
    }
    if (raw16 >= 0 && q->dtype != (attn_dtype)raw16) {
        PyErr_Format(PyExc_TypeError,
                     "dtype=\"%s\" says what uint16 arrays hold, but q, k and v are %s",
                     raw16 == ATTN_DTYPE_BF16 ? "bf16" : "f16", attn_dtype_name(q->dtype));
        return -1;
    }
    return 0;
}

static PyObject *py_sdpa(PyObject *self, PyObject *args, PyObject *kwargs)
{
    (void)self;
    static char *kwlist[] = {"q", "k", "v", "mask", "causal", "scale", "window", "softcap",
                             "alibi", "bias", "sinks", "return_weights", "return_lse",
                             "empty_rows", "out", "dtype", NULL};
    PyObject *qo, *ko, *vo, *mask = NULL, *causal = NULL, *scale = NULL, *window = NULL,
                            *softcap = NULL, *alibi = NULL, *bias = NULL, *sinks = NULL,
                            *empty_rows = NULL, *outo = NULL, *dtypeo = NULL;
    int want_w = 0, want_lse = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO|$OOOOOOOOppOOO", kwlist, &qo, &ko, &vo,
                                     &mask, &causal, &scale, &window, &softcap, &alibi, &bias,
                                     &sinks, &want_w, &want_lse, &empty_rows, &outo, &dtypeo))
        return NULL;
    bufset bs;
    bs.n = 0;
    attn_tensor q, k, v, out, weights, lse;
    sdpa_opts o;
    PyObject *out_arr = NULL, *w_arr = NULL, *lse_arr = NULL;
    int64_t shape[ATTN_MAX_DIMS];
    int raw16 = -1, q_ml = 0;
    _Alignas(64) unsigned char small_ws[SMALL_WORKSPACE];
    if (parse_raw16(dtypeo, &raw16) < 0 ||
        get_tensor_ex(&bs, qo, "q", WANT_ATTN, 0, raw16, &q, &q_ml) < 0 ||
        get_tensor_ex(&bs, ko, "k", WANT_ATTN, 0, raw16, &k, NULL) < 0 ||
        get_tensor_ex(&bs, vo, "v", WANT_ATTN, 0, raw16, &v, NULL) < 0 ||
        check_one_dtype(&q, &k, &v, raw16) < 0 ||
        parse_opts(&bs, &o, mask, causal, scale, window, softcap, alibi, bias, sinks,
                   empty_rows) < 0)
        goto fail;
    const int64_t Dv = v.shape[v.ndim - 1];
    const int64_t Tk = k.ndim >= 2 ? k.shape[k.ndim - 2] : 1;
    if (outo && outo != Py_None) {
        if (get_tensor_ex(&bs, outo, "out", WANT_ATTN, 1, raw16, &out, NULL) < 0)
            goto fail;
        if (out.dtype != q.dtype) {
            PyErr_Format(PyExc_TypeError, "out must be %s like q, k and v, not %s",
                         attn_dtype_name(q.dtype), attn_dtype_name(out.dtype));
            goto fail;
        }
        Py_INCREF(outo);
        out_arr = outo;
    } else {
        /* The output has the inputs' dtype, and q's kind of array for it. */
        int nd = shape_with_last(&q, Dv, 0, shape);
        if (!(out_arr = new_array(&bs, nd, shape, q.dtype, "out", &out)) ||
            !(out_arr = as_ml_bfloat16(out_arr, q_ml)))
            goto fail;
    }
    if (new_weights_and_lse(&bs, &q, Tk, want_w, want_lse, &w_arr, &weights, &lse_arr, &lse,
                            &o.p) < 0)
        goto fail;
    attn_ctx ctx;
    small_ctx_init(&ctx, small_ws, sizeof small_ws);
    int st;
    Py_BEGIN_ALLOW_THREADS
    st = attn_sdpa(&ctx, &q, &k, &v, &o.p, &out, want_w ? &weights : NULL);
    Py_END_ALLOW_THREADS
    attn_ctx_release(&ctx);
    if (st != ATTN_OK) {
        raise_status(st, &ctx);
        goto fail;
    }
    bufset_release(&bs);
    return pack_result(out_arr, w_arr, lse_arr);
fail:
    bufset_release(&bs);
    Py_XDECREF(out_arr);
    Py_XDECREF(w_arr);
    Py_XDECREF(lse_arr);
    return NULL;
}

/* ---------------------------------------------------------------------------
 * Masks
 * ------------------------------------------------------------------------- */

PyDoc_STRVAR(padding_mask_doc,
"padding_mask(token_ids, pad_id)\n--\n\n"
"Padding mask from token ids [B, T] (int64 or int32): a bool array [B, 1, 1, T],\n"
"False where the KEY is pad_id (a pad query still attends).");

static PyObject *py_padding_mask(PyObject *self, PyObject *args, PyObject *kwargs)
{
    (void)self;
    static char *kwlist[] = {"token_ids", "pad_id", NULL};
    PyObject *ids_o;
    long long pad;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OL", kwlist, &ids_o, &pad))
        return NULL;
    bufset bs;
    bs.n = 0;
    attn_tensor ids, mask;
    PyObject *arr = NULL;
    if (get_tensor(&bs, ids_o, "token_ids", WANT_INT, 0, &ids) < 0)
        goto fail;
    if (ids.ndim != 2) {
        PyErr_Format(PyExc_ValueError, "token_ids must be [B, T] (2 dimensions), not %d",
                     ids.ndim);
        goto fail;
    }
    const int64_t shape[4] = {ids.shape[0], 1, 1, ids.shape[1]};
    if (!(arr = new_array(&bs, 4, shape, ATTN_DTYPE_BOOL, "mask", &mask)))
        goto fail;
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    int st = attn_mask_padding(&ctx, &ids, pad, &mask);
    if (st != ATTN_OK) {
        raise_status(st, &ctx);
        goto fail;
    }
    bufset_release(&bs);
    return arr;
fail:
    bufset_release(&bs);
    Py_XDECREF(arr);
    return NULL;
}

PyDoc_STRVAR(causal_mask_doc,
"causal_mask(T)\n--\n\n"
"Causal mask: a bool array [1, 1, T, T], True where j <= i (position t sees\n"
"positions 0..t).");

static PyObject *py_causal_mask(PyObject *self, PyObject *args, PyObject *kwargs)
{
    (void)self;
    static char *kwlist[] = {"T", NULL};
    long long T;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "L", kwlist, &T))
        return NULL;
    if (T < 1) {
        PyErr_Format(PyExc_ValueError, "causal_mask: T must be at least 1, not %lld", T);
        return NULL;
    }
    bufset bs;
    bs.n = 0;
    attn_tensor mask;
    const int64_t shape[4] = {1, 1, T, T};
    PyObject *arr = new_array(&bs, 4, shape, ATTN_DTYPE_BOOL, "mask", &mask);
    if (!arr) {
        bufset_release(&bs);
        return NULL;
    }
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    int st = attn_mask_causal(&ctx, T, &mask);
    bufset_release(&bs);
    if (st != ATTN_OK) {
        Py_DECREF(arr);
        return raise_status(st, &ctx);
    }
    return arr;
}

/* ---------------------------------------------------------------------------
 * Multi-head attention (the chapter's fused projections, and GQA)
 * ------------------------------------------------------------------------- */

PyDoc_STRVAR(mha_forward_doc,
"_mha_forward(x, w_qkv, b_qkv, w_o, b_o, num_heads, *, mask=None, causal=False,\n"
"             scale=None, window=None, softcap=None, alibi=None, bias=None,\n"
"             sinks=None, empty_rows=\"error\", return_weights=False, threads=0)\n--\n\n"
"The chapter's multi-head self-attention: x [B, T, E], w_qkv [3E, E], b_qkv [3E],\n"
"w_o [E, E], b_o [E] (float32). Returns out [B, T, E] or (out, weights\n"
"[B, H, T, T]). Use attn.mha_forward, which also takes a dict or a file.");

static PyObject *py_mha_forward(PyObject *self, PyObject *args, PyObject *kwargs)
{
    (void)self;
    static char *kwlist[] = {"x", "w_qkv", "b_qkv", "w_o", "b_o", "num_heads", "mask",
                             "causal", "scale", "window", "softcap", "alibi", "bias", "sinks",
                             "empty_rows", "return_weights", "threads", NULL};
    PyObject *xo, *wqkv, *bqkv, *wo, *bo, *opt[9] = {NULL};
    long long H;
    int want_w = 0, threads = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOL|$OOOOOOOOOpi", kwlist, &xo, &wqkv,
                                     &bqkv, &wo, &bo, &H, &opt[0], &opt[1], &opt[2], &opt[3],
                                     &opt[4], &opt[5], &opt[6], &opt[7], &opt[8], &want_w,
                                     &threads))
        return NULL;
    bufset bs;
    bs.n = 0;
    attn_tensor x, out, weights;
    attn_mha_weights w;
    sdpa_opts o;
    PyObject *out_arr = NULL, *w_arr = NULL;
    if (get_tensor(&bs, xo, "x", WANT_F32, 0, &x) < 0 ||
        get_tensor(&bs, wqkv, "w_qkv", WANT_F32, 0, &w.w_qkv) < 0 ||
        get_tensor(&bs, bqkv, "b_qkv", WANT_F32, 0, &w.b_qkv) < 0 ||
        get_tensor(&bs, wo, "w_o", WANT_F32, 0, &w.w_o) < 0 ||
        get_tensor(&bs, bo, "b_o", WANT_F32, 0, &w.b_o) < 0 ||
        parse_opts(&bs, &o, opt[0], opt[1], opt[2], opt[3], opt[4], opt[5], opt[6], opt[7],
                   opt[8]) < 0)
        goto fail;
    if (x.ndim != 3) {
        PyErr_Format(PyExc_ValueError, "x must be [B, T, E] (3 dimensions), not %d", x.ndim);
        goto fail;
    }
    if (H < 1) {
        PyErr_Format(PyExc_ValueError, "num_heads must be at least 1, not %lld", H);
        goto fail;
    }
    if (!(out_arr = new_array(&bs, 3, x.shape, ATTN_DTYPE_F32, "out", &out)))
        goto fail;
    if (want_w) {
        const int64_t ws[4] = {x.shape[0], H, x.shape[1], x.shape[1]};
        if (!(w_arr = new_array(&bs, 4, ws, ATTN_DTYPE_F32, "weights", &weights)))
            goto fail;
    }
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.threads = threads;
    int st;
    Py_BEGIN_ALLOW_THREADS
    st = attn_mha_forward(&ctx, &w, H, &x, &o.p, &out, want_w ? &weights : NULL);
    Py_END_ALLOW_THREADS
    attn_ctx_release(&ctx);
    if (st != ATTN_OK) {
        raise_status(st, &ctx);
        goto fail;
    }
    bufset_release(&bs);
    return pack_result(out_arr, w_arr, NULL);
fail:
    bufset_release(&bs);
    Py_XDECREF(out_arr);
    Py_XDECREF(w_arr);
    return NULL;
}

/* ---------------------------------------------------------------------------
 * Gradients (SPEC section 8): what attn.torch's autograd functions call
 * ------------------------------------------------------------------------- */

/* The backward wrappers return their gradients as one tuple: it takes over the
 * first n of arr's n_alloc arrays and drops the rest (NULL when unused). On
 * failure every array is released, so the caller owns nothing either way. */
static PyObject *arrays_to_tuple(PyObject **arr, int n, int n_alloc)
{
    PyObject *r = PyTuple_New(n);
    for (int i = 0; i < n_alloc; i++) {
        if (r && i < n)
            PyTuple_SetItem(r, i, arr[i]); /* steals arr[i] */
        else
            Py_XDECREF(arr[i]);
    }
    return r;
}

PyDoc_STRVAR(sdpa_backward_doc,
"sdpa_backward(q, k, v, out, lse, dout, *, mask=None, causal=False, scale=None,\n"
"              window=None, softcap=None, alibi=None, bias=None, sinks=None,\n"
"              empty_rows=\"error\")\n--\n\n"
"The backward of sdpa (attn_sdpa_backward, SPEC section 8): the gradients of a\n"
"loss with respect to q, k and v (and to bias and sinks when given), from the\n"
"forward's inputs, its output and log-sum-exp, and dout, the loss's gradient\n"
"with respect to the output.\n\n"
"  q [B, H, Tq, D], k [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv]  float32, as given to sdpa\n"
"  out [B, H, Tq, Dv], lse [B, H, Tq]  the forward's: sdpa(..., return_lse=True)\n"
"  dout [B, H, Tq, Dv]  float32\n"
"  mask, causal, scale, window, softcap, alibi, bias, sinks, empty_rows: the\n"
"  forward's options, given again exactly as they were given to sdpa.\n\n"
"Returns new float32 arrays (dq, dk, dv) shaped like q, k and v, then dbias (the\n"
"bias's own shape: summed over the axes it was broadcast along) when bias is\n"
"given, then dsinks [H] when sinks are given. With grouped-query attention\n"
"(Hkv < H) dk and dv sum over the query heads that share a key/value head. A\n"
"masked key gets exactly zero gradient. Raises ValueError (naming the argument\n"
"and the shapes) and TypeError as sdpa does. The GIL is released while it runs.");

static PyObject *py_sdpa_backward(PyObject *self, PyObject *args, PyObject *kwargs)
{
    (void)self;
    static char *kwlist[] = {"q",      "k",       "v",     "out",  "lse",   "dout",
                             "mask",   "causal",  "scale", "window", "softcap", "alibi",
                             "bias",   "sinks",   "empty_rows", NULL};
    PyObject *qo, *ko, *vo, *oo, *lo, *doo, *mask = NULL, *causal = NULL, *scale = NULL,
                                            *window = NULL, *softcap = NULL, *alibi = NULL,
                                            *bias = NULL, *sinks = NULL, *empty_rows = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOO|$OOOOOOOOO", kwlist, &qo, &ko, &vo,
                                     &oo, &lo, &doo, &mask, &causal, &scale, &window, &softcap,
                                     &alibi, &bias, &sinks, &empty_rows))
        return NULL;
    bufset bs;
    bs.n = 0;
    attn_tensor q, k, v, out, lse, dout, dq, dk, dv, dbias, dsinks;
    sdpa_opts o;
    PyObject *arr[5] = {NULL, NULL, NULL, NULL, NULL};
    if (get_tensor(&bs, qo, "q", WANT_F32, 0, &q) < 0 ||
        get_tensor(&bs, ko, "k", WANT_F32, 0, &k) < 0 ||
        get_tensor(&bs, vo, "v", WANT_F32, 0, &v) < 0 ||
        get_tensor(&bs, oo, "out", WANT_F32, 0, &out) < 0 ||
        get_tensor(&bs, lo, "lse", WANT_F32, 0, &lse) < 0 ||
        get_tensor(&bs, doo, "dout", WANT_F32, 0, &dout) < 0 ||
        parse_opts(&bs, &o, mask, causal, scale, window, softcap, alibi, bias, sinks,
                   empty_rows) < 0)
        goto fail;
    if (!(arr[0] = new_array(&bs, q.ndim, q.shape, ATTN_DTYPE_F32, "dq", &dq)) ||
        !(arr[1] = new_array(&bs, k.ndim, k.shape, ATTN_DTYPE_F32, "dk", &dk)) ||
        !(arr[2] = new_array(&bs, v.ndim, v.shape, ATTN_DTYPE_F32, "dv", &dv)))
        goto fail;
    /* dbias has the bias's own shape and dsinks the sinks' (the library checks
     * that the sinks are [H]); each only when its option was given. */
    attn_sdpa_grads g = {&dq, &dk, &dv, NULL, NULL};
    int n = 3;
    if (o.p.bias) {
        if (!(arr[n++] = new_array(&bs, o.bias.ndim, o.bias.shape, ATTN_DTYPE_F32, "dbias",
                                   &dbias)))
            goto fail;
        g.dbias = &dbias;
    }
    if (o.p.sinks) {
        if (!(arr[n++] = new_array(&bs, o.sinks.ndim, o.sinks.shape, ATTN_DTYPE_F32, "dsinks",
                                   &dsinks)))
            goto fail;
        g.dsinks = &dsinks;
    }
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    int st;
    Py_BEGIN_ALLOW_THREADS
    st = attn_sdpa_backward(&ctx, &q, &k, &v, &o.p, &out, &lse, &dout, &g);
    Py_END_ALLOW_THREADS
    attn_ctx_release(&ctx);
    if (st != ATTN_OK) {
        raise_status(st, &ctx);
        goto fail;
    }
    bufset_release(&bs);
    return arrays_to_tuple(arr, n, 5);
fail:
    bufset_release(&bs);
    for (int i = 0; i < 5; i++)
        Py_XDECREF(arr[i]);
    return NULL;
}

PyDoc_STRVAR(mha_backward_doc,
"_mha_backward(x, w_qkv, b_qkv, w_o, b_o, num_heads, dout, *, mask=None,\n"
"              causal=False, scale=None, window=None, softcap=None, alibi=None,\n"
"              bias=None, sinks=None, empty_rows=\"error\", threads=0)\n--\n\n"
"The backward of _mha_forward: x [B, T, E] and the weights as given to the forward,\n"
"dout [B, T, E] the loss's gradient with respect to its output. Returns new arrays\n"
"(dx [B, T, E], dw_qkv [3E, E], db_qkv [3E], dw_o [E, E], db_o [E]).");

static PyObject *py_mha_backward(PyObject *self, PyObject *args, PyObject *kwargs)
{
    (void)self;
    static char *kwlist[] = {"x", "w_qkv", "b_qkv", "w_o", "b_o", "num_heads", "dout", "mask",
                             "causal", "scale", "window", "softcap", "alibi", "bias", "sinks",
                             "empty_rows", "threads", NULL};
    PyObject *xo, *wqkv, *bqkv, *wo, *bo, *doo, *opt[9] = {NULL};
    long long H;
    int threads = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOLO|$OOOOOOOOOi", kwlist, &xo, &wqkv,
                                     &bqkv, &wo, &bo, &H, &doo, &opt[0], &opt[1], &opt[2],
                                     &opt[3], &opt[4], &opt[5], &opt[6], &opt[7], &opt[8],
                                     &threads))
        return NULL;
    bufset bs;
    bs.n = 0;
    attn_tensor x, dout, t[5];
    attn_mha_weights w;
    sdpa_opts o;
    PyObject *arr[5] = {NULL, NULL, NULL, NULL, NULL};
    if (get_tensor(&bs, xo, "x", WANT_F32, 0, &x) < 0 ||
        get_tensor(&bs, wqkv, "w_qkv", WANT_F32, 0, &w.w_qkv) < 0 ||
        get_tensor(&bs, bqkv, "b_qkv", WANT_F32, 0, &w.b_qkv) < 0 ||
        get_tensor(&bs, wo, "w_o", WANT_F32, 0, &w.w_o) < 0 ||
        get_tensor(&bs, bo, "b_o", WANT_F32, 0, &w.b_o) < 0 ||
        get_tensor(&bs, doo, "dout", WANT_F32, 0, &dout) < 0 ||
        parse_opts(&bs, &o, opt[0], opt[1], opt[2], opt[3], opt[4], opt[5], opt[6], opt[7],
                   opt[8]) < 0)
        goto fail;
    if (H < 1) {
        PyErr_Format(PyExc_ValueError, "num_heads must be at least 1, not %lld", H);
        goto fail;
    }
    /* Each gradient has its parameter's own shape (the library checks the shapes). */
    const attn_tensor *like[5] = {&x, &w.w_qkv, &w.b_qkv, &w.w_o, &w.b_o};
    static const char *names[5] = {"dx", "dw_qkv", "db_qkv", "dw_o", "db_o"};
    for (int i = 0; i < 5; i++)
        if (!(arr[i] = new_array(&bs, like[i]->ndim, like[i]->shape, ATTN_DTYPE_F32, names[i],
                                 &t[i])))
            goto fail;
    attn_mha_grads g = {&t[0], &t[1], &t[2], &t[3], &t[4]};
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.threads = threads;
    int st;
    Py_BEGIN_ALLOW_THREADS
    st = attn_mha_backward(&ctx, &w, H, &x, &o.p, &dout, &g);
    Py_END_ALLOW_THREADS
    attn_ctx_release(&ctx);
    if (st != ATTN_OK) {
        raise_status(st, &ctx);
        goto fail;
    }
    bufset_release(&bs);
    return Py_BuildValue("(NNNNN)", arr[0], arr[1], arr[2], arr[3], arr[4]);
fail:
    bufset_release(&bs);
    for (int i = 0; i < 5; i++)
        Py_XDECREF(arr[i]);
    return NULL;
}

/* RoPE's keywords as attn_rope_params (pairing None: the default). */
static int parse_rope(PyObject *pairing, double base, long long offset, attn_rope_params *rp)
{
    attn_rope_params_init(rp);
    if (pairing && pairing != Py_None) {
        if (PyUnicode_Check(pairing) &&
            PyUnicode_CompareWithASCIIString(pairing, "interleaved") == 0)
            rp->pairing = ATTN_ROPE_INTERLEAVED;
        else if (PyUnicode_Check(pairing) &&
                 PyUnicode_CompareWithASCIIString(pairing, "half") == 0)
            rp->pairing = ATTN_ROPE_HALF;
        else {
            PyErr_Format(PyExc_ValueError,
                         "pairing must be \"interleaved\" or \"half\", not %R", pairing);
            return -1;
        }
    }
    rp->base = (float)base;
    rp->offset = offset;
    return 0;
}

PyDoc_STRVAR(gqa_forward_doc,
"_gqa_forward(x, w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o, num_heads, num_kv_heads, *,\n"
"             mask=None, causal=False, scale=None, window=None, softcap=None,\n"
"             alibi=None, bias=None, sinks=None, empty_rows=\"error\",\n"
"             return_weights=False, rope=None, rope_base=10000.0, rope_offset=0,\n"
"             threads=0)\n--\n\n"
"Grouped-query self-attention with separate projections: x [B, T, E], w_q [H*D, E],\n"
"w_k and w_v [Hkv*D, E], w_o [E, H*D]; each bias optional (None). The options are\n"
"sdpa's; rope \"interleaved\" or \"half\" rotates q and k at positions\n"
"rope_offset + t between the projections and the attention (the weights are then\n"
"packed for the call: attn_gqa_pack, attn_mha_forward_packed_rope). threads: the\n"
"library's worker threads (0 or below: one per usable core). Returns out [B, T, E] or\n"
"(out, weights [B, H, T, T]). Use attn.mha_forward.");

/* The weights, head counts and options of a grouped-query call, as both
 * _gqa_forward and _gqa_backward take them. */
typedef struct gqa_args {
    attn_tensor x;
    attn_gqa_weights w;
    sdpa_opts o;
    attn_rope_params rope;
    int has_rope;
    long long H, Hkv;
} gqa_args;

static int parse_gqa(bufset *bs, gqa_args *a, PyObject *const *wobj, PyObject *xo,
                     PyObject *const *opt, PyObject *rope, double rope_base,
                     long long rope_offset)
{
    static const char *wnames[8] = {"w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o"};
    attn_tensor *wt[8] = {&a->w.w_q, &a->w.w_k, &a->w.w_v, &a->w.w_o,
                          &a->w.b_q, &a->w.b_k, &a->w.b_v, &a->w.b_o};
    memset(&a->w, 0, sizeof a->w);
    if (get_tensor(bs, xo, "x", WANT_F32, 0, &a->x) < 0)
        return -1;
    for (int i = 0; i < 8; i++) {
        int set;
        if (i < 4 ? get_tensor(bs, wobj[i], wnames[i], WANT_F32, 0, wt[i])
                  : get_opt_tensor(bs, wobj[i], wnames[i], WANT_F32, wt[i], &set))
            return -1;
    }
    if (parse_opts(bs, &a->o, opt[0], opt[1], opt[2], opt[3], opt[4], opt[5], opt[6], opt[7],
                   opt[8]) < 0)
        return -1;
    a->has_rope = rope && rope != Py_None;
    if (parse_rope(a->has_rope ? rope : NULL, rope_base, rope_offset, &a->rope) < 0)
        return -1;
    if (a->x.ndim != 3) {
        PyErr_Format(PyExc_ValueError, "x must be [B, T, E] (3 dimensions), not %d", a->x.ndim);
        return -1;
    }
    if (a->H < 1 || a->Hkv < 1) {
        PyErr_Format(PyExc_ValueError, "num_heads (%lld) and num_kv_heads (%lld) must be at "
                     "least 1", a->H, a->Hkv);
        return -1;
    }
    return 0;
}

/* attn_gqa_forward, or with RoPE the weights packed once for this call and
 * attn_mha_forward_packed_rope, the only forward the library has with RoPE
 * between the projections and the attention. Runs without the GIL. */
static int gqa_forward_run(attn_ctx *ctx, const gqa_args *a, attn_tensor *out,
                           attn_tensor *weights)
{
    if (!a->has_rope)
        return attn_gqa_forward(ctx, &a->w, a->H, a->Hkv, &a->x, &a->o.p, out, weights);
    attn_mha_packed *packed = NULL;
    int st = attn_gqa_pack(ctx, &a->w, a->H, a->Hkv, &packed);
    if (st == ATTN_OK)
        st = attn_mha_forward_packed_rope(ctx, packed, a->H, &a->x, &a->o.p, &a->rope, out,
                                          weights);
    attn_mha_packed_free(ctx, packed);
    return st;
}

static PyObject *py_gqa_forward(PyObject *self, PyObject *args, PyObject *kwargs)
{
    (void)self;
    static char *kwlist[] = {"x", "w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o",
                             "num_heads", "num_kv_heads", "mask", "causal", "scale", "window",
                             "softcap", "alibi", "bias", "sinks", "empty_rows",
                             "return_weights", "rope", "rope_base", "rope_offset", "threads",
                             NULL};
    PyObject *xo, *wobj[8], *opt[9] = {NULL}, *rope = NULL;
    double rope_base = 10000.0;
    long long rope_offset = 0;
    int want_w = 0, threads = 0;
    gqa_args a;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOOOOLL|$OOOOOOOOOpOdLi", kwlist, &xo,
                                     &wobj[0], &wobj[1], &wobj[2], &wobj[3], &wobj[4], &wobj[5],
                                     &wobj[6], &wobj[7], &a.H, &a.Hkv, &opt[0], &opt[1],
                                     &opt[2], &opt[3], &opt[4], &opt[5], &opt[6], &opt[7],
                                     &opt[8], &want_w, &rope, &rope_base, &rope_offset,
                                     &threads))
        return NULL;
    bufset bs;
    bs.n = 0;
    attn_tensor out, weights;
    PyObject *out_arr = NULL, *w_arr = NULL;
    if (parse_gqa(&bs, &a, wobj, xo, opt, rope, rope_base, rope_offset) < 0)
        goto fail;
    if (!(out_arr = new_array(&bs, 3, a.x.shape, ATTN_DTYPE_F32, "out", &out)))
        goto fail;
    if (want_w) {
        const int64_t ws[4] = {a.x.shape[0], a.H, a.x.shape[1], a.x.shape[1]};
        if (!(w_arr = new_array(&bs, 4, ws, ATTN_DTYPE_F32, "weights", &weights)))
            goto fail;
    }
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.threads = threads;
    int st;
    Py_BEGIN_ALLOW_THREADS
    st = gqa_forward_run(&ctx, &a, &out, want_w ? &weights : NULL);
    Py_END_ALLOW_THREADS
    attn_ctx_release(&ctx);
    if (st != ATTN_OK) {
        raise_status(st, &ctx);
        goto fail;
    }
    bufset_release(&bs);
    return pack_result(out_arr, w_arr, NULL);
fail:
    bufset_release(&bs);
    Py_XDECREF(out_arr);
    Py_XDECREF(w_arr);
    return NULL;
}

PyDoc_STRVAR(gqa_backward_doc,
"_gqa_backward(x, w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o, num_heads, num_kv_heads,\n"
"              dout, *, mask=None, causal=False, scale=None, window=None,\n"
"              softcap=None, alibi=None, bias=None, sinks=None, empty_rows=\"error\",\n"
"              rope=None, rope_base=10000.0, rope_offset=0, threads=0)\n--\n\n"
"The backward of _gqa_forward (attn_gqa_backward, SPEC section 8): x, the weights,\n"
"head counts, options and RoPE as given to the forward; dout [B, T, E] the loss's\n"
"gradient with respect to its output. Returns new arrays (dx [B, T, E], dw_q, dw_k,\n"
"dw_v, dw_o, db_q, db_k, db_v, db_o), each its parameter's shape; a bias the\n"
"weights do not have (None) still gets its gradient. mask, bias, sinks and ALiBi's\n"
"slopes are constants here (no gradient). Use attn.mha_backward.");

static PyObject *py_gqa_backward(PyObject *self, PyObject *args, PyObject *kwargs)
{
    (void)self;
    static char *kwlist[] = {"x", "w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o",
                             "num_heads", "num_kv_heads", "dout", "mask", "causal", "scale",
                             "window", "softcap", "alibi", "bias", "sinks", "empty_rows",
                             "rope", "rope_base", "rope_offset", "threads", NULL};
    PyObject *xo, *wobj[8], *doo, *opt[9] = {NULL}, *rope = NULL;
    double rope_base = 10000.0;
    long long rope_offset = 0;
    int threads = 0;
    gqa_args a;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOOOOLLO|$OOOOOOOOOOdLi", kwlist, &xo,
                                     &wobj[0], &wobj[1], &wobj[2], &wobj[3], &wobj[4], &wobj[5],
                                     &wobj[6], &wobj[7], &a.H, &a.Hkv, &doo, &opt[0], &opt[1],
                                     &opt[2], &opt[3], &opt[4], &opt[5], &opt[6], &opt[7],
                                     &opt[8], &rope, &rope_base, &rope_offset, &threads))
        return NULL;
    bufset bs;
    bs.n = 0;
    attn_tensor dout, t[9];
    PyObject *arr[9] = {NULL};
    if (parse_gqa(&bs, &a, wobj, xo, opt, rope, rope_base, rope_offset) < 0 ||
        get_tensor(&bs, doo, "dout", WANT_F32, 0, &dout) < 0)
        goto fail;
    /* The weights' shapes are checked against each other (and D found) before
     * the gradients are made in their shapes; a bias the weights lack gets the
     * rows of its projection. */
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    ctx.threads = threads;
    int64_t E = 0, D = 0;
    int st = attn_gqa_weights_check(&ctx, &a.w, a.H, a.Hkv, &E, &D);
    if (st != ATTN_OK) {
        raise_status(st, &ctx);
        attn_ctx_release(&ctx);
        goto fail;
    }
    static const char *names[9] = {"dx",   "dw_q", "dw_k", "dw_v", "dw_o",
                                   "db_q", "db_k", "db_v", "db_o"};
    const attn_tensor *like[5] = {&a.x, &a.w.w_q, &a.w.w_k, &a.w.w_v, &a.w.w_o};
    const int64_t brows[4] = {a.H * D, a.Hkv * D, a.Hkv * D, E};
    for (int i = 0; i < 9; i++) {
        PyObject *made = i < 5 ? new_array(&bs, like[i]->ndim, like[i]->shape, ATTN_DTYPE_F32,
                                           names[i], &t[i])
                               : new_array(&bs, 1, &brows[i - 5], ATTN_DTYPE_F32, names[i],
                                           &t[i]);
        if (!(arr[i] = made)) {
            attn_ctx_release(&ctx);
            goto fail;
        }
    }
    attn_gqa_grads g = {&t[0], &t[1], &t[2], &t[3], &t[4], &t[5], &t[6], &t[7], &t[8]};
    Py_BEGIN_ALLOW_THREADS
    st = attn_gqa_backward(&ctx, &a.w, a.H, a.Hkv, &a.x, &a.o.p, a.has_rope ? &a.rope : NULL,
                           &dout, &g);
    Py_END_ALLOW_THREADS
    attn_ctx_release(&ctx);
    if (st != ATTN_OK) {
        raise_status(st, &ctx);
        goto fail;
    }
    bufset_release(&bs);
    return arrays_to_tuple(arr, 9, 9);
fail:
    bufset_release(&bs);
    for (int i = 0; i < 9; i++)
        Py_XDECREF(arr[i]);
    return NULL;
}

/* ---------------------------------------------------------------------------
 * RoPE
 * ------------------------------------------------------------------------- */

PyDoc_STRVAR(rope_doc,
"rope(x, *, pairing=\"interleaved\", base=10000.0, offset=0, out=None)\n--\n\n"
"Rotary position embedding of x [B, H, T, D] (float32, D even): row t of each\n"
"(b, h) is rotated at position offset + t. pairing \"interleaved\" rotates\n"
"features (2k, 2k+1) (GPT-J), \"half\" features (k, k + D/2) (Llama). Returns a\n"
"new array, or writes into out (which may be x itself: in place).");

static PyObject *py_rope(PyObject *self, PyObject *args, PyObject *kwargs)
{
    (void)self;
    static char *kwlist[] = {"x", "pairing", "base", "offset", "out", NULL};
    PyObject *xo, *pairing = NULL, *outo = NULL;
    double base = 10000.0;
    long long offset = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|$OdLO", kwlist, &xo, &pairing, &base,
                                     &offset, &outo))
        return NULL;
    bufset bs;
    bs.n = 0;
    attn_tensor x, out;
    attn_rope_params rp;
    PyObject *arr = NULL;
    if (get_tensor(&bs, xo, "x", WANT_F32, 0, &x) < 0 || parse_rope(pairing, base, offset, &rp) < 0)
        goto fail;
    if (outo && outo != Py_None) {
        if (get_tensor(&bs, outo, "out", WANT_F32, 1, &out) < 0)
            goto fail;
        Py_INCREF(outo);
        arr = outo;
    } else if (!(arr = new_array(&bs, x.ndim, x.shape, ATTN_DTYPE_F32, "out", &out))) {
        goto fail;
    }
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    int st;
    Py_BEGIN_ALLOW_THREADS
    st = attn_rope_apply(&ctx, &rp, &x, &out);
    Py_END_ALLOW_THREADS
    if (st != ATTN_OK) {
        raise_status(st, &ctx);
        goto fail;
    }
    bufset_release(&bs);
    return arr;
fail:
    bufset_release(&bs);
    Py_XDECREF(arr);
    return NULL;
}

/* ---------------------------------------------------------------------------
 * KV cache: a capsule around attn_kv_cache (attn.KVCache wraps it)
 * ------------------------------------------------------------------------- */

#define KV_CAPSULE "attn._kv_cache"

static void kv_capsule_free(PyObject *cap)
{
    attn_kv_cache *c = PyCapsule_GetPointer(cap, KV_CAPSULE);
    attn_kv_cache_free(NULL, c);
}

static attn_kv_cache *kv_get(PyObject *cap)
{
    return PyCapsule_GetPointer(cap, KV_CAPSULE);
}

/* The storage dtype of a capsule kv_get accepted (see py_kv_create). */
static attn_dtype kv_dtype(PyObject *cap)
{
    return (attn_dtype)(intptr_t)PyCapsule_GetContext(cap);
}

/* What a cache of dtype dt takes for k, v, q and out: float32, and its own dtype
 * (a uint16 array then holds that dtype's bits, the cache saying which). */
static unsigned kv_want(attn_dtype dt)
{
    return WANT_F32 | (1u << dt);
}

static int kv_raw16(attn_dtype dt)
{
    return dt == ATTN_DTYPE_F32 ? -1 : (int)dt;
}

static PyObject *py_kv_create(PyObject *self, PyObject *args)
{
    (void)self;
    attn_kv_cache_config cfg;
    long long B, Hkv, cap, D, Dv;
    const char *dtype = "f32";
    if (!PyArg_ParseTuple(args, "LLLLL|s", &B, &Hkv, &cap, &D, &Dv, &dtype))
        return NULL;
    cfg.batch = B;
    cfg.kv_heads = Hkv;
    cfg.capacity = cap;
    cfg.head_dim = D;
    cfg.value_dim = Dv;
    if (strcmp(dtype, "f32") == 0) {
        cfg.dtype = ATTN_DTYPE_F32;
    } else if (strcmp(dtype, "bf16") == 0) {
        cfg.dtype = ATTN_DTYPE_BF16;
    } else if (strcmp(dtype, "f16") == 0) {
        cfg.dtype = ATTN_DTYPE_F16;
    } else {
        PyErr_Format(PyExc_TypeError, "KV cache dtype must be \"f32\", \"bf16\" or \"f16\", "
                     "not \"%s\"", dtype);
        return NULL;
    }
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    attn_kv_cache *c = NULL;
    int st = attn_kv_cache_create(&ctx, &cfg, NULL, 0, &c);
    if (st != ATTN_OK)
        return raise_status(st, &ctx);
    PyObject *capsule = PyCapsule_New(c, KV_CAPSULE, kv_capsule_free);
    if (!capsule) {
        attn_kv_cache_free(NULL, c);
        return NULL;
    }
    /* The capsule's context remembers the storage dtype, which the library keeps
     * to itself: the calls below need it to read uint16 bits and make arrays. */
    if (PyCapsule_SetContext(capsule, (void *)(intptr_t)cfg.dtype) < 0) {
        Py_DECREF(capsule);
        return NULL;
    }
    return capsule;
}

static PyObject *py_kv_length(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap;
    long long seq;
    if (!PyArg_ParseTuple(args, "OL", &cap, &seq))
        return NULL;
    attn_kv_cache *c = kv_get(cap);
    if (!c)
        return NULL;
    return PyLong_FromLongLong(attn_kv_cache_length(c, seq));
}

static PyObject *py_kv_append(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap, *ko, *vo, *pairing;
    long long first;
    double base;
    if (!PyArg_ParseTuple(args, "OLOOOd", &cap, &first, &ko, &vo, &pairing, &base))
        return NULL;
    attn_kv_cache *c = kv_get(cap);
    if (!c)
        return NULL;
    bufset bs;
    bs.n = 0;
    attn_tensor k, v;
    attn_rope_params rp;
    const attn_dtype cdt = kv_dtype(cap);
    if (get_tensor_ex(&bs, ko, "k", kv_want(cdt), 0, kv_raw16(cdt), &k, NULL) < 0 ||
        get_tensor_ex(&bs, vo, "v", kv_want(cdt), 0, kv_raw16(cdt), &v, NULL) < 0 ||
        (pairing != Py_None && parse_rope(pairing, base, 0, &rp) < 0)) {
        bufset_release(&bs);
        return NULL;
    }
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    int st;
    Py_BEGIN_ALLOW_THREADS
    st = attn_kv_cache_append(&ctx, c, first, &k, &v, pairing != Py_None ? &rp : NULL);
    Py_END_ALLOW_THREADS
    bufset_release(&bs);
    if (st != ATTN_OK)
        return raise_status(st, &ctx);
    Py_RETURN_NONE;
}

static PyObject *py_kv_truncate(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap;
    long long seq, length;
    if (!PyArg_ParseTuple(args, "OLL", &cap, &seq, &length))
        return NULL;
    attn_kv_cache *c = kv_get(cap);
    if (!c)
        return NULL;
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    int st = attn_kv_cache_truncate(&ctx, c, seq, length);
    if (st != ATTN_OK)
        return raise_status(st, &ctx);
    Py_RETURN_NONE;
}

/* Copies of sequence seq's keys and values [1, Hkv, length, D] in the cache's
 * dtype (bfloat16 as uint16 bits; attn.KVCache views them as ml_dtypes' when it
 * was made with that dtype), copies so that they stay valid whatever happens to
 * the cache afterwards. */
static PyObject *py_kv_view(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap;
    long long seq;
    if (!PyArg_ParseTuple(args, "OL", &cap, &seq))
        return NULL;
    attn_kv_cache *c = kv_get(cap);
    if (!c)
        return NULL;
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    attn_tensor kview, vview, kc, vc;
    int st = attn_kv_cache_view(&ctx, c, seq, &kview, &vview);
    if (st != ATTN_OK)
        return raise_status(st, &ctx);
    bufset bs;
    bs.n = 0;
    PyObject *ka = new_array(&bs, kview.ndim, kview.shape, kview.dtype, "k", &kc);
    PyObject *va = ka ? new_array(&bs, vview.ndim, vview.shape, vview.dtype, "v", &vc) : NULL;
    if (va) {
        st = attn_tensor_copy(&ctx, &kview, &kc);
        if (st == ATTN_OK)
            st = attn_tensor_copy(&ctx, &vview, &vc);
    }
    bufset_release(&bs);
    if (!va || st != ATTN_OK) {
        Py_XDECREF(ka);
        Py_XDECREF(va);
        return va ? raise_status(st, &ctx) : NULL;
    }
    return pack_result(ka, va, NULL);
}

static PyObject *py_kv_attend(PyObject *self, PyObject *args, PyObject *kwargs)
{
    (void)self;
    static char *kwlist[] = {"cache", "first", "q", "capacity", "pairing", "base", "mask",
                             "causal", "scale", "window", "softcap", "alibi", "bias", "sinks",
                             "return_weights", "return_lse", "empty_rows", NULL};
    PyObject *cap, *qo, *pairing = Py_None, *mask = NULL, *causal = NULL, *scale = NULL,
                        *window = NULL, *softcap = NULL, *alibi = NULL, *bias = NULL,
                        *sinks = NULL, *empty_rows = NULL;
    long long first, capacity;
    double base = 10000.0;
    int want_w = 0, want_lse = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OLOL|$OdOOOOOOOOppO", kwlist, &cap, &first,
                                     &qo, &capacity, &pairing, &base, &mask, &causal, &scale,
                                     &window, &softcap, &alibi, &bias, &sinks, &want_w,
                                     &want_lse, &empty_rows))
        return NULL;
    attn_kv_cache *c = kv_get(cap);
    if (!c)
        return NULL;
    bufset bs;
    bs.n = 0;
    attn_tensor q, out, weights, lse, vview;
    attn_rope_params rp;
    sdpa_opts o;
    PyObject *out_arr = NULL, *w_arr = NULL, *lse_arr = NULL;
    int64_t shape[ATTN_MAX_DIMS];
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    const attn_dtype cdt = kv_dtype(cap);
    int q_ml = 0;
    if (get_tensor_ex(&bs, qo, "q", kv_want(cdt), 0, kv_raw16(cdt), &q, &q_ml) < 0 ||
        (pairing != Py_None && parse_rope(pairing, base, 0, &rp) < 0) ||
        parse_opts(&bs, &o, mask, causal, scale, window, softcap, alibi, bias, sinks,
                   empty_rows) < 0)
        goto fail;
    /* The value width comes from the cache: view sequence `first` (any sequence
     * with keys has the same Dv; an empty one is refused by attend itself). */
    int64_t Dv = q.shape[q.ndim - 1];
    if (attn_kv_cache_view(&ctx, c, first, NULL, &vview) == ATTN_OK)
        Dv = vview.shape[vview.ndim - 1];
    attn_ctx_init(&ctx);
    {
        int nd = shape_with_last(&q, Dv, 0, shape);
        /* out in q's dtype, as attn.sdpa: the library rounds it once. */
        if (!(out_arr = new_array(&bs, nd, shape, q.dtype, "out", &out)))
            goto fail;
    }
    if (new_weights_and_lse(&bs, &q, capacity, want_w, want_lse, &w_arr, &weights, &lse_arr,
                            &lse, &o.p) < 0)
        goto fail;
    int st;
    Py_BEGIN_ALLOW_THREADS
    st = attn_kv_cache_attend(&ctx, c, first, &q, &o.p, pairing != Py_None ? &rp : NULL, &out,
                              want_w ? &weights : NULL);
    Py_END_ALLOW_THREADS
    attn_ctx_release(&ctx);
    if (st != ATTN_OK) {
        raise_status(st, &ctx);
        goto fail;
    }
    bufset_release(&bs);
    /* The same kind of array as q (uint16 bits or ml_dtypes.bfloat16), as sdpa. */
    out_arr = as_ml_bfloat16(out_arr, q_ml);
    if (!out_arr) {
        Py_XDECREF(w_arr);
        Py_XDECREF(lse_arr);
        return NULL;
    }
    return pack_result(out_arr, w_arr, lse_arr);
fail:
    bufset_release(&bs);
    Py_XDECREF(out_arr);
    Py_XDECREF(w_arr);
    Py_XDECREF(lse_arr);
    return NULL;
}

/* ---------------------------------------------------------------------------
 * Files: .npy and .safetensors, through attn's own readers and writers
 * ------------------------------------------------------------------------- */

/* A numpy array holding a copy of a loaded attn_array (which is then freed). */
static PyObject *array_from_loaded(attn_ctx *ctx, attn_array *a)
{
    bufset bs;
    bs.n = 0;
    attn_tensor t;
    PyObject *arr = new_array(&bs, a->tensor.ndim, a->tensor.shape, a->tensor.dtype, "array", &t);
    if (arr) {
        const size_t bytes = (size_t)attn_tensor_numel(&a->tensor) * attn_dtype_size(t.dtype);
        memcpy(t.data, a->tensor.data, bytes);
    }
    bufset_release(&bs);
    attn_array_free(ctx, a);
    return arr;
}

PyDoc_STRVAR(load_npy_doc,
"load_npy(path, *, keep_half=False)\n--\n\n"
"Reads a .npy file with attn's reader: float32/float64/float16 become float32,\n"
"int32 and int64 stay, bool and uint8 become bool; 1 to 4 dimensions. With\n"
"keep_half=True a float16 file stays float16, bit for bit.\n"
"Raises OSError (cannot read) or ValueError (malformed, unsupported dtype).");

static PyObject *py_load_npy(PyObject *self, PyObject *args, PyObject *kwargs)
{
    (void)self;
    static char *kwlist[] = {"path", "keep_half", NULL};
    PyObject *path;
    int keep_half = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&|$p", kwlist, PyUnicode_FSConverter, &path,
                                     &keep_half))
        return NULL;
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    attn_array a;
    int st;
    Py_BEGIN_ALLOW_THREADS
    st = attn_npy_load_flags(&ctx, PyBytes_AsString(path), keep_half ? ATTN_LOAD_HALF : 0u, &a);
    Py_END_ALLOW_THREADS
    Py_DECREF(path);
    if (st != ATTN_OK)
        return raise_status(st, &ctx);
    return array_from_loaded(&ctx, &a);
}

PyDoc_STRVAR(save_npy_doc,
"save_npy(path, array)\n--\n\n"
"Writes a float32, int32, int64 or bool array (1 to 4 dimensions, any\n"
"non-negative strides) as a .npy file through attn's output writer.");

static PyObject *py_save_npy(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *path, *ao;
    if (!PyArg_ParseTuple(args, "O&O", PyUnicode_FSConverter, &path, &ao))
        return NULL;
    bufset bs;
    bs.n = 0;
    attn_tensor t;
    if (get_tensor(&bs, ao, "array", WANT_F32 | WANT_BOOL | WANT_INT, 0, &t) < 0) {
        Py_DECREF(path);
        bufset_release(&bs);
        return NULL;
    }
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    int st;
    Py_BEGIN_ALLOW_THREADS
    st = attn_npy_save(&ctx, PyBytes_AsString(path), &t);
    Py_END_ALLOW_THREADS
    Py_DECREF(path);
    bufset_release(&bs);
    if (st != ATTN_OK)
        return raise_status(st, &ctx);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(load_safetensors_doc,
"load_safetensors(path, *, keep_half=False)\n--\n\n"
"Reads every tensor of a .safetensors file into a dict {name: array}, in the\n"
"file's order (F32/F16/BF16/F64 become float32; I32, I64 stay; BOOL, U8 bool).\n"
"With keep_half=True F16 and BF16 stay as stored, bit for bit: F16 as float16,\n"
"BF16 as uint16 arrays of bfloat16 bits (numpy has no bfloat16; .view(\n"
"ml_dtypes.bfloat16) reads them as values, or pass them to attn.sdpa with\n"
"dtype=\"bf16\").");

static PyObject *py_load_safetensors(PyObject *self, PyObject *args, PyObject *kwargs)
{
    (void)self;
    static char *kwlist[] = {"path", "keep_half", NULL};
    PyObject *path;
    int keep_half = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&|$p", kwlist, PyUnicode_FSConverter, &path,
                                     &keep_half))
        return NULL;
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    attn_safetensors *sf = NULL;
    int st = attn_safetensors_open(&ctx, PyBytes_AsString(path), &sf);
    Py_DECREF(path);
    if (st != ATTN_OK)
        return raise_status(st, &ctx);
    PyObject *d = PyDict_New();
    const int64_t n = d ? attn_safetensors_count(sf) : 0;
    for (int64_t i = 0; i < n; i++) {
        const char *name = attn_safetensors_name(sf, i);
        attn_array a;
        st = attn_safetensors_get_flags(&ctx, sf, name, keep_half ? ATTN_LOAD_HALF : 0u, &a);
        if (st != ATTN_OK) {
            raise_status(st, &ctx);
            Py_CLEAR(d);
            break;
        }
        PyObject *arr = array_from_loaded(&ctx, &a);
        if (!arr || PyDict_SetItemString(d, name, arr) < 0) {
            Py_XDECREF(arr);
            Py_CLEAR(d);
            break;
        }
        Py_DECREF(arr);
    }
    attn_safetensors_close(&ctx, sf);
    return d;
}

PyDoc_STRVAR(save_safetensors_doc,
"save_safetensors(path, tensors)\n--\n\n"
"Writes a dict {name: array} (float32, int32, int64 or bool arrays) as one\n"
".safetensors file, in the dict's order, through attn's output writer.");

static PyObject *py_save_safetensors(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *path, *dict;
    if (!PyArg_ParseTuple(args, "O&O!", PyUnicode_FSConverter, &path, &PyDict_Type, &dict))
        return NULL;
    const Py_ssize_t n = PyDict_Size(dict);
    PyObject *result = NULL;
    Py_buffer *views = PyMem_Calloc(n ? (size_t)n : 1, sizeof *views);
    attn_tensor *ts = PyMem_Calloc(n ? (size_t)n : 1, sizeof *ts);
    const char **names = PyMem_Calloc(n ? (size_t)n : 1, sizeof *names);
    Py_ssize_t held = 0, pos = 0;
    PyObject *key, *val;
    if (!views || !ts || !names) {
        PyErr_NoMemory();
        goto done;
    }
    while (PyDict_Next(dict, &pos, &key, &val)) {
        if (!PyUnicode_Check(key)) {
            PyErr_SetString(PyExc_TypeError, "save_safetensors: names must be str");
            goto done;
        }
        names[held] = PyUnicode_AsUTF8AndSize(key, NULL);
        if (!names[held])
            goto done;
        /* One bufset per tensor, moved into views[] so any number can be held. */
        bufset one;
        one.n = 0;
        if (get_tensor(&one, val, names[held], WANT_F32 | WANT_BOOL | WANT_INT, 0, &ts[held]) < 0) {
            bufset_release(&one);
            goto done;
        }
        views[held++] = one.view[0];
    }
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    int st = attn_safetensors_save(&ctx, PyBytes_AsString(path), names, ts, n);
    if (st != ATTN_OK)
        raise_status(st, &ctx);
    else
        result = Py_NewRef(Py_None);
done:
    for (Py_ssize_t i = 0; i < held; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(ts);
    PyMem_Free(names);
    Py_DECREF(path);
    return result;
}

/* ---------------------------------------------------------------------------
 * PyTorch's CPU generator (attn.Generator wraps it): for the chapter's experiment
 * ------------------------------------------------------------------------- */

#define RNG_CAPSULE "attn._rng"

static void rng_capsule_free(PyObject *cap)
{
    PyMem_Free(PyCapsule_GetPointer(cap, RNG_CAPSULE));
}

static PyObject *py_rng_new(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned long long seed;
    if (!PyArg_ParseTuple(args, "K", &seed))
        return NULL;
    attn_rng *rng = PyMem_Malloc(sizeof *rng);
    if (!rng)
        return PyErr_NoMemory();
    attn_rng_seed(rng, seed);
    PyObject *cap = PyCapsule_New(rng, RNG_CAPSULE, rng_capsule_free);
    if (!cap)
        PyMem_Free(rng);
    return cap;
}

/* fill(cap, array, kind, a, b): kind 0 = randn into the float32 array, 1 =
 * nn.Linear's initialisation of array (weight [out, in]) and b (bias [out]). */
static PyObject *py_rng_fill(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *cap, *wo, *bo;
    int kind;
    if (!PyArg_ParseTuple(args, "OOiO", &cap, &wo, &kind, &bo))
        return NULL;
    attn_rng *rng = PyCapsule_GetPointer(cap, RNG_CAPSULE);
    if (!rng)
        return NULL;
    bufset bs;
    bs.n = 0;
    attn_tensor w, b;
    if (get_tensor(&bs, wo, "array", WANT_F32, 1, &w) < 0 ||
        (kind == 1 && get_tensor(&bs, bo, "bias", WANT_F32, 1, &b) < 0)) {
        bufset_release(&bs);
        return NULL;
    }
    if (!attn_tensor_is_contiguous(&w) || (kind == 1 && (!attn_tensor_is_contiguous(&b) ||
                                                         w.ndim != 2 || b.ndim != 1 ||
                                                         b.shape[0] != w.shape[0]))) {
        bufset_release(&bs);
        PyErr_SetString(PyExc_ValueError, "attn.Generator: contiguous arrays of matching shapes");
        return NULL;
    }
    if (kind == 0)
        attn_rng_randn(rng, w.data, attn_tensor_numel(&w));
    else
        attn_rng_linear_init(rng, w.data, b.data, w.shape[0], w.shape[1]);
    bufset_release(&bs);
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------------
 * Dispatch information
 * ------------------------------------------------------------------------- */

PyDoc_STRVAR(arch_doc,
"arch()\n--\n\n"
"The instruction set the fast kernels use, as a dict: 'selected' (ref, scalar,\n"
"avx2, avx512, avx512bf16 or amx), 'reason' (why: the CPU, or the ATTN_ARCH\n"
"variable), 'best'\n"
"(what the CPU supports) and 'threads' (the cores the process may run on, the default thread count).");

static PyObject *py_arch(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    attn_ctx ctx;
    attn_ctx_init(&ctx);
    return Py_BuildValue("{s:s,s:s,s:s,s:i}", "selected", attn_arch_name(attn_arch_selected(&ctx)),
                         "reason", attn_arch_reason(&ctx), "best", attn_arch_name(attn_arch_best()),
                         "threads", attn_threads_online());
}

static PyMethodDef methods[] = {
    {"sdpa", (PyCFunction)(void (*)(void))py_sdpa, METH_VARARGS | METH_KEYWORDS, sdpa_doc},
    {"padding_mask", (PyCFunction)(void (*)(void))py_padding_mask, METH_VARARGS | METH_KEYWORDS,
     padding_mask_doc},
    {"causal_mask", (PyCFunction)(void (*)(void))py_causal_mask, METH_VARARGS | METH_KEYWORDS,
     causal_mask_doc},
    {"_mha_forward", (PyCFunction)(void (*)(void))py_mha_forward, METH_VARARGS | METH_KEYWORDS,
     mha_forward_doc},
    {"_gqa_forward", (PyCFunction)(void (*)(void))py_gqa_forward, METH_VARARGS | METH_KEYWORDS,
     gqa_forward_doc},
    {"_gqa_backward", (PyCFunction)(void (*)(void))py_gqa_backward, METH_VARARGS | METH_KEYWORDS,
     gqa_backward_doc},
    {"sdpa_backward", (PyCFunction)(void (*)(void))py_sdpa_backward,
     METH_VARARGS | METH_KEYWORDS, sdpa_backward_doc},
    {"_mha_backward", (PyCFunction)(void (*)(void))py_mha_backward,
     METH_VARARGS | METH_KEYWORDS, mha_backward_doc},
    {"rope", (PyCFunction)(void (*)(void))py_rope, METH_VARARGS | METH_KEYWORDS, rope_doc},
    {"_kv_create", py_kv_create, METH_VARARGS, NULL},
    {"_kv_length", py_kv_length, METH_VARARGS, NULL},
    {"_kv_append", py_kv_append, METH_VARARGS, NULL},
    {"_kv_truncate", py_kv_truncate, METH_VARARGS, NULL},
    {"_kv_view", py_kv_view, METH_VARARGS, NULL},
    {"_kv_attend", (PyCFunction)(void (*)(void))py_kv_attend, METH_VARARGS | METH_KEYWORDS, NULL},
    {"load_npy", (PyCFunction)(void (*)(void))py_load_npy, METH_VARARGS | METH_KEYWORDS,
     load_npy_doc},
    {"save_npy", py_save_npy, METH_VARARGS, save_npy_doc},
    {"load_safetensors", (PyCFunction)(void (*)(void))py_load_safetensors,
     METH_VARARGS | METH_KEYWORDS, load_safetensors_doc},
    {"save_safetensors", py_save_safetensors, METH_VARARGS, save_safetensors_doc},
    {"_rng_new", py_rng_new, METH_VARARGS, NULL},
    {"_rng_fill", py_rng_fill, METH_VARARGS, NULL},
    {"arch", py_arch, METH_NOARGS, arch_doc},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_attn",
                                    "attn's C library (use the attn package).", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__attn(void);
PyMODINIT_FUNC PyInit__attn(void)
{
    PyObject *np = PyImport_ImportModule("numpy");
    if (!np)
        return NULL;
    np_empty = PyObject_GetAttrString(np, "empty");
    PyObject *dtype = PyObject_GetAttrString(np, "dtype");
    np_bool_type = PyObject_GetAttrString(np, "bool_");
    Py_DECREF(np);
    if (!np_empty || !dtype || !np_bool_type)
        return NULL;
    np_dtype_type = dtype;
    static const char *names[6] = {"float32", "bool", "int64", "int32", "uint16", "float16"};
    for (int i = 0; i < 6; i++) {
        np_dtype[i] = PyObject_CallFunction(dtype, "s", names[i]);
        if (!np_dtype[i])
            return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddStringConstant(m, "__version__", ATTN_VERSION_STRING) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
