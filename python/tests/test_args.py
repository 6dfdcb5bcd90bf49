"""Bad arguments of every kind raise a Python exception with a message; none crashes."""
import numpy as np
import pytest

import attn


def qkv(B=2, H=4, T=5, D=4, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((B, H, T, D)).astype(np.float32) for _ in range(3))


def test_wrong_dtype_is_a_type_error_naming_the_argument():
    """A float64 q is refused with TypeError naming q and float32 (no silent copy)."""
    q, k, v = qkv()
    with pytest.raises(TypeError, match="q must be float32"):
        attn.sdpa(q.astype(np.float64), k, v)
    with pytest.raises(TypeError, match="v must be float32"):
        attn.sdpa(q, k, v.astype(np.int32))
    with pytest.raises(TypeError, match="mask must be bool"):
        attn.sdpa(q, k, v, mask=np.ones((5, 5), np.float32))


@pytest.mark.parametrize("bad", [None, [1.0, 2.0], "q", 3.0, object()])
def test_not_an_array_is_a_type_error(bad):
    """None, a list, a string, a number or an object as q raise TypeError."""
    _, k, v = qkv()
    with pytest.raises(TypeError):
        attn.sdpa(bad, k, v)


def test_wrong_rank_is_a_value_error():
    """A rank-5 array and a rank-0 array raise ValueError naming the rank."""
    q, k, v = qkv()
    with pytest.raises(ValueError, match="1 to 4 dimensions, not 5"):
        attn.sdpa(q[None], k, v)
    with pytest.raises(ValueError, match="not 0"):
        attn.sdpa(np.float32(1.0), k, v)


def test_shape_errors_carry_the_librarys_message():
    """Mismatched head sizes and a mask that does not broadcast give the library's message."""
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"D=4.*D=3"):
        attn.sdpa(q, k[..., :3], v)
    with pytest.raises(ValueError, match=r"\(3, 3\).*\(2, 4, 5, 5\)"):
        attn.sdpa(q, k, v, mask=np.ones((3, 3), bool))
    with pytest.raises(ValueError, match="at least one key|all masked|masked"):
        attn.sdpa(q, k, v, mask=np.zeros((5, 5), bool))


def test_reversed_views_are_refused_and_empty_arrays_too():
    """A negative stride is a ValueError that says so; a size of 0 is a ValueError."""
    q, k, v = qkv()
    with pytest.raises(ValueError, match="negative"):
        attn.sdpa(q[:, :, ::-1], k, v)
    with pytest.raises(ValueError):
        attn.sdpa(q[:, :, :0], k, v)


def test_huge_sizes_fail_cleanly():
    """A mask whose broadcast shape would overflow, and an impossible KV cache, raise."""
    q, k, v = qkv()
    huge = np.lib.stride_tricks.as_strided(np.ones(1, bool), shape=(2**20, 2**20, 5, 5),
                                           strides=(0, 0, 0, 0))
    with pytest.raises(ValueError, match="broadcast"):
        attn.sdpa(q, k, v, mask=huge)
    # q of 2^56 * 5 rows (all one row in memory): its output cannot be allocated.
    big_q = np.lib.stride_tricks.as_strided(q, shape=(2**28, 2**28, 5, 4),
                                            strides=(0, 0) + q.strides[2:])
    with pytest.raises((ValueError, MemoryError)):
        attn.sdpa(big_q, k, v)
    with pytest.raises((ValueError, MemoryError)):
        attn.KVCache(2**40, 2**40, 2**40, 64)
    with pytest.raises((ValueError, MemoryError, OverflowError)):
        attn.causal_mask(2**40)


def test_bad_options_name_what_is_allowed():
    """causal, window, softcap and empty_rows refuse values outside their sets."""
    q, k, v = qkv()
    with pytest.raises(ValueError, match="bottom_right"):
        attn.sdpa(q, k, v, causal="sideways")
    with pytest.raises(TypeError):
        attn.sdpa(q, k, v, causal=1.5)
    with pytest.raises(TypeError, match="window"):
        attn.sdpa(q, k, v, window=3)
    with pytest.raises(TypeError, match="window"):
        attn.sdpa(q, k, v, window="12")
    with pytest.raises(TypeError, match="window"):
        attn.sdpa(q, k, v, window=[1, 2, 3])
    with pytest.raises(ValueError, match="softcap"):
        attn.sdpa(q, k, v, softcap=-1.0)
    with pytest.raises(ValueError, match="empty_rows"):
        attn.sdpa(q, k, v, empty_rows="skip")
    with pytest.raises(TypeError):
        attn.sdpa(q, k, v, scale="big")
    with pytest.raises(TypeError):
        attn.sdpa(q, k, v, 1.0)  # options are keyword-only


def test_out_must_be_writable_float32_of_the_right_shape():
    """A read-only out, a float64 out and an out of the wrong shape are refused."""
    q, k, v = qkv()
    ro = np.empty_like(q)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writable|read-only"):
        attn.sdpa(q, k, v, out=ro)
    with pytest.raises(TypeError):
        attn.sdpa(q, k, v, out=np.empty(q.shape, np.float64))
    with pytest.raises(ValueError):
        attn.sdpa(q, k, v, out=np.empty((2, 4, 5, 3), np.float32))


def test_files_that_cannot_be_read_raise_os_error(tmp_path):
    """A missing file is OSError; a malformed one is ValueError; both name the problem."""
    with pytest.raises(OSError):
        attn.load_npy(tmp_path / "missing.npy")
    bad = tmp_path / "bad.npy"
    bad.write_bytes(b"not an npy file at all")
    with pytest.raises(ValueError):
        attn.load_npy(bad)
    with pytest.raises(OSError):
        attn.load_safetensors(tmp_path / "missing.safetensors")
    with pytest.raises(OSError):
        attn.save_npy(tmp_path / "no" / "such" / "dir.npy", np.ones(3, np.float32))


def test_weights_with_no_known_names_say_what_was_looked_for():
    """mha_forward with a dict of unknown names lists the name sets it knows."""
    x = np.ones((1, 3, 8), np.float32)
    with pytest.raises(ValueError, match="qkv.weight"):
        attn.mha_forward(x, {"foo": np.ones((2, 2), np.float32)}, 2)
    with pytest.raises(TypeError):
        attn.mha_forward(x, 42, 2)


def test_window_is_any_pair():
    """A window given as a list (as a model's JSON config gives it), a tuple or a
    numpy array of two ints runs the same attention; None on a side is unbounded."""
    q, k, v = qkv()
    want = attn.sdpa(q, k, v, window=(1, 0))
    np.testing.assert_array_equal(attn.sdpa(q, k, v, window=[1, 0]), want)
    np.testing.assert_array_equal(attn.sdpa(q, k, v, window=np.array([1, 0])), want)
    np.testing.assert_array_equal(attn.sdpa(q, k, v, window=[None, 0]),
                                  attn.sdpa(q, k, v, window=(-1, 0)))
    assert not np.array_equal(want, attn.sdpa(q, k, v))
