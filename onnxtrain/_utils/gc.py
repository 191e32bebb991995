"""The objects of the process frozen for Python's cyclic garbage collector
during graph builds.

A build creates tens of thousands of short-lived Python objects (protobuf
wrappers, dicts, tuples); their allocations trigger the collector's full
(oldest-generation) passes, which walk every object of the process, the
imported modules' included, a large part of a build's time.
``gc.freeze()`` at the start of
a build moves the objects that exist to the collector's permanent
generation, so that its passes during the build walk the build's own
objects only, and ``gc.unfreeze()`` at its end gives them back.
The young generations are collected just before the freeze: garbage there
(a dropped estimator's last cycles, say) is freed rather than frozen and
then left to the rare full collections of the oldest generation.
Collection itself goes on: the collector is never disabled, whatever
other threads do with ``gc.enable`` and ``gc.disable``.
"""
from __future__ import annotations

import functools
import gc
import threading

__all__ = ["gc_frozen"]

_LOCK = threading.Lock()
_DEPTH = 0
_FROZE = False


class _Frozen:
    """Context manager: ``gc.freeze()`` when the first section enters,
    ``gc.unfreeze()`` when the last one exits (sections nest and may run on
    several threads at once). A process that already holds frozen objects
    (its own ``gc.freeze()``, e.g. before forking workers) is left as it
    is: unfreezing would undo it."""

    def __enter__(self):
        global _DEPTH, _FROZE
        with _LOCK:
            if _DEPTH == 0:
                _FROZE = gc.get_freeze_count() == 0
                if _FROZE:
                    # young garbage is collected first rather than frozen:
                    # frozen, it would wait for a full collection after the
                    # build (cheap: the young generations are small)
                    gc.collect(1)
                    gc.freeze()
            _DEPTH += 1
        return self

    def __exit__(self, *exc):
        global _DEPTH
        with _LOCK:
            _DEPTH -= 1
            if _DEPTH == 0 and _FROZE:
                gc.unfreeze()
        return False


def gc_frozen(function=None):
    """The process's objects frozen for the cyclic collector while
    ``function`` runs (a decorator), or a context manager when called
    without argument (see the module docstring).

    Sections nest and may run on several threads at once: the objects are
    unfrozen when the last one exits. Nothing is frozen when the process
    already holds frozen objects. Cycles among objects that existed before
    the build are collected after it; a process forked during a build
    keeps them frozen.
    """
    if function is None:
        return _Frozen()

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        with _Frozen():
            return function(*args, **kwargs)
    return wrapper
