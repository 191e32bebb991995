"""Memory a build freed given back to the operating system.

A graph build allocates and frees many temporary objects: serialized
models, protobuf messages, copies of weights. glibc's ``malloc`` keeps the
memory of small and medium blocks it freed for later allocations of the
process; onnxruntime's arena, which takes its blocks from ``malloc`` too,
rarely fits in those holes. Without a trim, the pages a build touched stay
resident under the training's own, and add to its peak.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools

__all__ = ["release_freed_memory"]


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    """glibc's ``malloc_trim`` or None (another C library, another system)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def release_freed_memory():
    """Give the freed memory of the process's heaps back to the system
    (glibc's ``malloc_trim(0)``); nothing where the C library has no such
    function.

    Returns
    -------
    bool
        Whether memory was given back.
    """
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False
