"""A process that forks after attn's worker threads started, and a signal during
a call: the child's calls must run (not wait on a pool its parent's threads held)
and give the parent's bits; after a KeyboardInterrupt raised by a handler while a
call ran, the next calls give the same bits as before."""
import multiprocessing
import os
import signal
import sys
import time

import numpy as np
import pytest

import attn

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork here")


def inputs(T=256, seed=0):
    # Large enough that the library uses its worker threads (several heads and
    # query tiles), small enough to take milliseconds.
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((1, 8, T, 64)).astype(np.float32) for _ in range(3))


def wait_child(pid, limit=30.0):
    """The child's exit code, or kill it and fail after `limit` seconds (a hang)."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail("the forked child hung in its first attn call")


def test_a_child_forked_after_the_pool_started_calls_attn_with_the_parents_bits():
    q, k, v = inputs()
    ref = attn.sdpa(q, k, v, causal=True)
    x = q[0].transpose(1, 0, 2).reshape(1, 256, 512)[:, :64]
    rng = np.random.default_rng(1)
    w = {"qkv.weight": rng.standard_normal((1536, 512)).astype(np.float32) * 0.05,
         "output.weight": rng.standard_normal((512, 512)).astype(np.float32) * 0.05}
    ref_mha = attn.mha_forward(x, w, 8)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 3
        try:
            same = (np.array_equal(attn.sdpa(q, k, v, causal=True), ref)
                    and np.array_equal(attn.mha_forward(x, w, 8), ref_mha))
            code = 0 if same else 4
        finally:
            os._exit(code)
    assert wait_child(pid) == 0, "the child's results differ from the parent's (4) or it failed (3)"


def _one_call(_):
    q, k, v = inputs()
    return attn.sdpa(q, k, v, causal=True).tobytes()


def test_multiprocessing_fork_workers_give_the_parents_bits():
    q, k, v = inputs()
    ref = attn.sdpa(q, k, v, causal=True).tobytes()
    with multiprocessing.get_context("fork").Pool(2) as pool:
        got = pool.map_async(_one_call, range(4)).get(timeout=60)
    assert got == [ref] * 4


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="no setitimer here")
def test_a_keyboard_interrupt_during_calls_leaves_attn_usable():
    q, k, v = inputs(T=1024)
    ref = attn.sdpa(q, k, v, causal=True)

    def interrupt(*_):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.005)
        with pytest.raises(KeyboardInterrupt):
            for _ in range(1000):  # the handler runs between two calls, or after one
                attn.sdpa(q, k, v, causal=True)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert np.array_equal(attn.sdpa(q, k, v, causal=True), ref)
