"""release_freed_memory (onnxtrain/_utils/memory.py): the heaps' free
pages go back to the system, once per build of an estimator's runner."""
import ctypes
import sys

import numpy as np
import pytest

from onnxtrain._utils import memory
from onnxtrain.estimators import OrtGradientForwardBackwardOptimizer


def _resident_kb():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


@pytest.mark.skipif(not sys.platform.startswith("linux") or memory._malloc_trim() is None,
                    reason="glibc's malloc_trim")
def test_freed_small_blocks_leave_the_resident_memory():
    """64 MB in blocks of 64 kB (under glibc's mmap threshold: they come
    from the heap, whose free pages stay resident until a trim); one block
    of every 64 kept, so that the heap cannot shrink from its top."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    size = 64 << 10
    blocks = [libc.malloc(size) for _ in range(1024)]
    for block in blocks:
        ctypes.memset(block, 1, size)
    for k, block in enumerate(blocks):
        if k % 64:
            libc.free(block)
    before = _resident_kb()
    assert memory.release_freed_memory() is True
    assert before - _resident_kb() > 32 << 10  # kB: most of the 63 MB freed
    for block in blocks[::64]:
        libc.free(block)


def test_once_per_runner_built(monkeypatch, mlp_onnx):
    calls = []
    monkeypatch.setattr("onnxtrain.estimators._base.release_freed_memory",
                        lambda: calls.append(1))
    rng = np.random.RandomState(0)
    X = rng.randn(32, 5).astype(np.float32)
    y = X.sum(axis=1).astype(np.float32)
    est = OrtGradientForwardBackwardOptimizer(mlp_onnx(), max_iter=2, batch_size=8)
    est.fit(X, y)
    assert len(calls) == 1
    est.partial_fit(X, y)  # goes on with the same runner: nothing built
    assert len(calls) == 1
    est.fit(X, y)  # a new fit builds a new run and runner
    assert len(calls) == 2
