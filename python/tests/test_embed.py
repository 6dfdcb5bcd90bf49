"""What a program embedding attn from Python may hand in: arrays in any memory order,
read-only, misaligned or overlapping, empty axes, and calls from several threads at
once on shared weights and a shared KV cache. Each is either read correctly or
refused with a Python exception carrying the library's message, never run by luck."""
import threading

import numpy as np
import pytest

import attn


def qkv(B=2, H=4, T=9, D=8, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((B, H, T, D)).astype(np.float32) for _ in range(3))


def test_fortran_order_inputs_give_the_c_order_bits():
    """Fortran-ordered q, k, v and mask (every stride positive, the last axis not
    contiguous) are read in place and give the bits of their C-ordered copies."""
    q, k, v = qkv()
    mask = np.tril(np.ones((9, 9), bool))
    qf, kf, vf, mf = (np.asfortranarray(a) for a in (q, k, v, mask))
    assert qf.flags.f_contiguous and not qf.flags.c_contiguous
    want = attn.sdpa(q, k, v, mask=mask)
    got = attn.sdpa(qf, kf, vf, mask=mf)
    assert np.array_equal(got, want), "max difference %g" % np.abs(got - want).max()


def test_read_only_inputs_are_accepted():
    """Read-only q, k, v (flags.writeable False, and np.broadcast_to's views) are
    inputs like any other: nothing is written to them."""
    q, k, v = qkv()
    want = attn.sdpa(q, k, v)
    for a in (q, k, v):
        a.flags.writeable = False
    assert np.array_equal(attn.sdpa(q, k, v), want)
    kb = np.broadcast_to(k[:, :1], k.shape)  # one key/value head repeated, read-only
    vb = np.broadcast_to(v[:, :1], v.shape)
    assert not kb.flags.writeable
    assert np.allclose(attn.sdpa(q, kb, vb), attn.sdpa(q, kb.copy(), vb.copy()), atol=0, rtol=0)


def test_misaligned_float32_arrays_are_refused_with_the_librarys_message():
    """A float32 array at an odd byte offset of its buffer (np.frombuffer with
    offset=1) is a ValueError naming the argument and its alignment, as q and as out:
    C cannot read a float there, so it is never read by luck."""
    q, k, v = qkv(1, 1, 4, 4)
    raw = bytearray(q.nbytes + 4)
    mis = np.frombuffer(raw, np.float32, count=q.size, offset=1).reshape(q.shape)
    assert not mis.flags.aligned
    with pytest.raises(ValueError, match=r"q: data at .* not aligned to its float32 elements"):
        attn.sdpa(mis, k, v)
    with pytest.raises(ValueError, match=r"out: data at .* not aligned"):
        attn.sdpa(q, k, v, out=mis)
    ok = np.frombuffer(raw, np.float32, count=q.size, offset=4).reshape(q.shape)
    ok[...] = q
    assert np.array_equal(attn.sdpa(ok, k, v), attn.sdpa(q, k, v))


def test_arrays_aligned_to_their_own_elements_are_accepted():
    """The alignment check asks for the element's size only: float16 at a 2-byte
    offset of its buffer and a bool mask at an odd one give the bits of aligned
    copies, and an out whose size-1 axis has stride 0 (as_strided) owns its memory
    all the same."""
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((1, 2, 5, 8)).astype(np.float16) for _ in range(3))
    raw = bytearray(q.nbytes + 2)
    q2 = np.frombuffer(raw, np.float16, count=q.size, offset=2).reshape(q.shape)
    q2[...] = q
    assert np.array_equal(attn.sdpa(q2, k, v).view(np.uint16), attn.sdpa(q, k, v).view(np.uint16))
    qf, kf, vf = (a.astype(np.float32) for a in (q, k, v))
    tril = np.tril(np.ones((5, 5), bool))
    m1 = np.frombuffer(bytearray(26), np.bool_, count=25, offset=1).reshape(5, 5)
    m1[...] = tril
    assert np.array_equal(attn.sdpa(qf, kf, vf, mask=m1), attn.sdpa(qf, kf, vf, mask=tril))
    out = np.lib.stride_tricks.as_strided(np.empty((2, 5, 8), np.float32), shape=(1, 2, 5, 8),
                                          strides=(0, 160, 32, 4))
    got = attn.sdpa(qf, kf, vf, out=out)
    assert got is out
    assert np.array_equal(out, attn.sdpa(qf, kf, vf))


def test_out_that_overlaps_itself_or_q_is_refused_and_out_q_in_place_works():
    """out= with stride 0 on the query axis (every row to one place) and out= shifted
    one element into q are ValueErrors saying so; out=q itself, the in-place call the
    header allows, gives the bits of a separate out."""
    q, k, v = qkv()
    same_row = np.lib.stride_tricks.as_strided(np.empty(q.shape, np.float32), shape=q.shape,
                                               strides=q.strides[:2] + (0, q.strides[3]))
    with pytest.raises(ValueError, match="out .* overlaps itself"):
        attn.sdpa(q, k, v, out=same_row)
    big = np.zeros(q.size + 1, np.float32)
    big[:q.size] = q.ravel()
    qv, shifted = big[:q.size].reshape(q.shape), big[1:].reshape(q.shape)
    with pytest.raises(ValueError, match="out and q share memory"):
        attn.sdpa(qv, k, v, out=shifted)
    want = attn.sdpa(q, k, v)
    got = attn.sdpa(q, k, v, out=q)
    assert got is q
    assert np.array_equal(q, want)


def test_empty_axes_are_value_errors_everywhere():
    """A size of 0 on any axis is a ValueError from sdpa, mha_forward, rope, a
    KVCache's append and attend, and the masks."""
    q, k, v = qkv()
    for axis in range(4):
        idx = [slice(None)] * 4
        idx[axis] = slice(0, 0)
        with pytest.raises(ValueError):
            attn.sdpa(q[tuple(idx)], k, v)
    rng = np.random.default_rng(1)
    w = {"qkv.weight": rng.standard_normal((48, 16)).astype(np.float32),
         "qkv.bias": np.zeros(48, np.float32),
         "output.weight": rng.standard_normal((16, 16)).astype(np.float32),
         "output.bias": np.zeros(16, np.float32)}
    with pytest.raises(ValueError):
        attn.mha_forward(np.zeros((2, 0, 16), np.float32), w, 4)
    with pytest.raises(ValueError):
        attn.rope(np.zeros((1, 2, 0, 8), np.float32))
    cache = attn.KVCache(1, 2, 8, 4)
    with pytest.raises(ValueError):
        cache.append(np.zeros((1, 2, 0, 4), np.float32), np.zeros((1, 2, 0, 4), np.float32))
    cache.append(np.ones((1, 2, 3, 4), np.float32), np.ones((1, 2, 3, 4), np.float32))
    with pytest.raises(ValueError):
        cache.attend(np.zeros((1, 2, 0, 4), np.float32))
    with pytest.raises(ValueError):
        attn.causal_mask(0)
    with pytest.raises(ValueError):
        attn.padding_mask(np.zeros((2, 0), np.int64), 0)


def run_threads(n, work):
    """Runs work(i) on n threads at once (started together) and returns the
    exceptions they raised."""
    errors = []
    go = threading.Barrier(n)

    def body(i):
        try:
            go.wait()
            work(i)
        except Exception as e:  # noqa: BLE001  (reported by the caller)
            errors.append("thread %d: %r" % (i, e))

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_threads_share_one_kv_cache_and_own_caches_and_get_one_threads_answer():
    """Four threads attend to one shared KVCache at once (its lock serialises them) and
    each also fills and attends a cache of its own in parallel; every result equals
    what one thread computed alone, bit for bit."""
    rng = np.random.default_rng(5)
    k, v = (rng.standard_normal((2, 2, 40, 16)).astype(np.float32) for _ in range(2))
    qs = [rng.standard_normal((2, 4, 1, 16)).astype(np.float32) for _ in range(4)]
    shared = attn.KVCache(2, 2, 64, 16)
    shared.append(k, v)
    want = [shared.attend(q) for q in qs]

    def work(i):
        own = attn.KVCache(2, 2, 64, 16)
        for t in range(0, 40, 8):
            own.append(k[:, :, t:t + 8], v[:, :, t:t + 8])
        for _ in range(50):
            got = shared.attend(qs[i])
            assert np.array_equal(got, want[i]), "shared cache: a different result"
            got = own.attend(qs[i])
            assert np.array_equal(got, want[i]), "own cache: a different result"

    errors = run_threads(4, work)
    assert not errors, errors


def test_threads_share_mha_weights_and_get_one_threads_answer():
    """Four threads run mha_forward at once on one weights dict: each result equals
    the single-threaded one bit for bit."""
    rng = np.random.default_rng(6)
    E, H = 32, 4
    w = {"qkv.weight": rng.standard_normal((3 * E, E)).astype(np.float32) / 8,
         "qkv.bias": rng.standard_normal(3 * E).astype(np.float32),
         "output.weight": rng.standard_normal((E, E)).astype(np.float32) / 8,
         "output.bias": rng.standard_normal(E).astype(np.float32)}
    xs = [rng.standard_normal((2, 33, E)).astype(np.float32) for _ in range(4)]
    want = [attn.mha_forward(x, w, H, causal=True) for x in xs]

    def work(i):
        for _ in range(50):
            got = attn.mha_forward(xs[i], w, H, causal=True)
            assert np.array_equal(got, want[i]), "a different result"

    errors = run_threads(4, work)
    assert not errors, errors


def test_byte_swapped_arrays_are_type_errors_never_read_as_floats():
    """A big-endian float32 q or out ('>f4', as read from a file of another machine) is a
    TypeError naming it, not a float32 whose bytes are read the wrong way round; so
    are big-endian token ids."""
    q, k, v = qkv(1, 2, 5, 4)
    with pytest.raises(TypeError, match=r"q must be float32.*not >f4"):
        attn.sdpa(q.astype(">f4"), k, v)
    with pytest.raises(TypeError, match=r"out must be float32.*not >f4"):
        attn.sdpa(q, k, v, out=np.empty(q.shape, ">f4"))
    with pytest.raises(TypeError, match="not >i8"):
        attn.padding_mask(np.array([[1, 2, 0]], ">i8"), 0)
    assert np.array_equal(attn.sdpa(q.astype(">f4").astype("<f4"), k, v), attn.sdpa(q, k, v))
