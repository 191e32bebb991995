"""The copy of the weights that a divergence rolls back to.

A :class:`~onnxtrain.training.run.TrainingRun` keeps, at the start of every
epoch (every ``partial_fit`` call is one), a copy of the weights when all
of them are finite: a non-finite loss puts it back (the weights at the end
of the last epoch whose loss was finite). The copy lives in memory while
the weights are small, in an anonymous temporary file from
:data:`ROLLBACK_FILE_MIN_BYTES` on: the trainer's weights and optimizer
state stay in memory, the copy is read back only after a divergence.
"""
from __future__ import annotations

import tempfile
import warnings
import weakref

import numpy as np

from ..runtime import ortvalue_dtype
from ..runtime.engine import copy_arrays

__all__ = ["ROLLBACK_FILE_MIN_BYTES", "WeightsCopy", "all_finite"]

#: Weights of at least this many bytes (all of them together) keep their
#: roll-back copy in an anonymous temporary file (``tempfile.TemporaryFile``
#: in the default temporary directory) rather than in memory. Rewriting a
#: file in place costs what a copy into arrays costs (the page cache takes
#: the writes); below this size the memory saved is small next to the
#: process's own, and a file descriptor per estimator is not worth it
#: (thousands of small fitted estimators may live at once).
ROLLBACK_FILE_MIN_BYTES = 16 * 2 ** 20

#: Elements per block of the exact finiteness check (a bool temporary of
#: this size, not of the array's).
_BLOCK = 1 << 16


def all_finite(array):
    """Whether every value of ``array`` is finite, with no temporary the
    size of the array.

    A sum is finite only if every addend is (an infinity or a NaN stays
    non-finite through any addition, and ``inf + -inf`` is NaN), so one
    pass summing the values answers True in the common case; a sum that is
    not finite (a non-finite value, or finite values whose sum overflowed)
    is checked again block by block with ``numpy.isfinite``, which is exact.

    Parameters
    ----------
    array : numpy.ndarray
        Any shape; float16 values are summed in float32 (a float16 sum of
        many values overflows at 65504).

    Returns
    -------
    bool
        True for arrays of integers or booleans, and for empty arrays.
    """
    if array.dtype.kind in "biu" or array.size == 0:
        return True
    try:
        accumulate = np.float32 if array.dtype == np.float16 else None
        with np.errstate(over="ignore", invalid="ignore"):
            total = np.add.reduce(array, axis=None, dtype=accumulate)
        if np.isfinite(total):
            return True
    except TypeError:  # a dtype numpy cannot add: the exact check decides
        pass
    if not array.flags.c_contiguous:
        return bool(np.isfinite(array).all())
    flat = array.reshape(-1)
    return all(np.isfinite(flat[start:start + _BLOCK]).all()
               for start in range(0, flat.size, _BLOCK))


def _bytes_of(array):
    """The bytes of a contiguous array, as a writable-if-it-is memoryview."""
    return memoryview(array.reshape(-1).view(np.uint8))


def _write_all(file, array):
    data = _bytes_of(array)
    while data.nbytes:  # a raw write may write part of it
        data = data[file.write(data):]


def _read_all(file, array):
    data = _bytes_of(array)
    while data.nbytes:
        count = file.readinto(data)
        if not count:
            raise OSError("The roll-back copy of the weights ended early.")
        data = data[count:]


class WeightsCopy:
    """The weights a divergence rolls back to, kept by a step runner and
    rewritten at every epoch: in memory (arrays reused from one copy to the
    next) below :data:`ROLLBACK_FILE_MIN_BYTES`, in an anonymous temporary
    file otherwise (rewritten in place, closed when this object goes away;
    never pickled: the runner that holds it is not).

    Parameters
    ----------
    cpu : bool
        Whether the weights are on the CPU (their ``numpy()`` is a view) or
        on a GPU (``numpy()`` copies to the host: one weight at a time for
        the file).

    Attributes
    ----------
    arrays : list of numpy.ndarray or None
        The copy kept in memory; None when it is in the file or not made.
    in_file : bool
        Whether the last copy kept is in the file.
    """

    def __init__(self, cpu):
        self.cpu = cpu
        self.arrays = None
        self.in_file = False
        self._file = None
        self._close = None
        self._nbytes = None
        self._no_file = False

    def keep(self, weights):
        """Copy ``weights`` (OrtValues) when every value is finite.

        Returns
        -------
        bool
            False (nothing written: the last copy is left as it was) when a
            value is not finite.

        Warns
        -----
        RuntimeWarning
            The file could not be written (no room in the temporary
            directory, say): this copy and the next ones stay in memory.
        """
        if self._nbytes is None:  # a runner's weights keep their shapes and types
            self._nbytes = sum(int(np.prod(w.shape())) * ortvalue_dtype(w).itemsize
                               for w in weights)
        if self._nbytes < ROLLBACK_FILE_MIN_BYTES or self._no_file:
            values = [w.numpy() for w in weights]  # views on the CPU
            if not all(all_finite(v) for v in values):
                return False
            if self.cpu:
                values = copy_arrays(values, self.arrays)
            self.arrays, self.in_file = values, False
            return True
        # every weight is checked before any is written: a refused copy
        # leaves the last one whole (on a GPU, two transfers of each)
        if not all(all_finite(w.numpy()) for w in weights):
            return False
        try:
            file = self._open()
            file.seek(0)
            for w in weights:
                _write_all(file, w.numpy())
        except OSError as exc:
            self.close()
            self._no_file = True
            warnings.warn(f"The copy of the weights a divergence goes back to "
                          f"stays in memory: its temporary file failed ({exc}).",
                          RuntimeWarning)
            return self.keep(weights)
        self.arrays, self.in_file = None, True
        return True

    def restore(self, weights):
        """Put the copy back into ``weights``, the trainer's OrtValues (no
        one else holds them), in place and one at a time: a runner bound
        to them sees the copy."""
        file = self._file if self.in_file else None
        if file is not None:
            file.seek(0)
        for i, w in enumerate(weights):
            if file is None:
                host = self.arrays[i]
            elif self.cpu:
                _read_all(file, w.numpy())  # a view: straight into the weight
                continue
            else:
                host = np.empty(tuple(w.shape()), dtype=ortvalue_dtype(w))
                _read_all(file, host)
            if self.cpu:
                np.copyto(w.numpy(), host)
            else:
                w.update_inplace(host)

    def _open(self):
        if self._file is None:
            self._file = tempfile.TemporaryFile(buffering=0)
            self._close = weakref.finalize(self, self._file.close)
        return self._file

    def close(self):
        """Close the file (if any); the next copy in a file opens another."""
        if self._close is not None:
            self._close()
        self._file = self._close = None
        self.in_file = False

