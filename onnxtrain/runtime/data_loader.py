"""Mini-batches of a dataset as numpy arrays or OrtValues (onnxcustom's
``OrtDataLoader``)."""
from __future__ import annotations

import numpy as np
from onnxruntime import OrtValue

from .devices import parse_device

__all__ = ["OrtDataLoader"]


def _rows(name, value, n_rows):
    array = np.ascontiguousarray(value)
    if array.ndim == 0 or array.shape[0] != n_rows:
        raise ValueError(f"OrtDataLoader: {name} has shape {array.shape}, "
                         f"expected {n_rows} rows as X.")
    return array


class OrtDataLoader:
    """Iterate over a dataset by mini-batches of consecutive rows.

    Parameters
    ----------
    X : array-like of shape (n_samples, ...)
        Features; referenced as they are when C-contiguous (a C-contiguous
        copy otherwise), copied to the device for ``data_ort`` and for each
        batch of :meth:`iter_ortvalue`.
    y : array-like of shape (n_samples,) or (n_samples, n_targets)
        Targets; a 1-D ``y`` is stored as a column (n_samples, 1).
    sample_weight : array-like of shape (n_samples,) or (n_samples, 1), default=None
        Stored with shape (n_samples,); each batch then carries its weights.
    batch_size : int, default=20
        Rows per batch. The batches cover every row once per iteration; the
        last one holds the remaining ``n_samples % batch_size`` rows when
        that is not 0. A ``batch_size`` of 0 or more than ``n_samples`` gives
        one batch with all rows.
    device : {"cpu", "cuda", "cuda:N"}, default="cpu"
        Where :meth:`iter_ortvalue` places the batches.
    random_iter : bool, default=True
        Shuffle the rows (a new permutation from numpy's global random state
        at every iteration); False keeps the dataset order.

    Attributes
    ----------
    desc : list of (shape, dtype)
        Shape and dtype of X, y and (if given) sample_weight.
    data_np, data_ort : tuple
        The whole dataset as numpy arrays and as OrtValues on ``device``.

    Raises
    ------
    ValueError
        ``y`` or ``sample_weight`` do not have X's number of rows, or
        ``batch_size`` is negative.
    onnxtrain.exceptions.DeviceError
        Unknown device, or CUDA without onnxruntime's CUDA provider.

    Notes
    -----
    onnxcustom drew ``n_samples // batch_size`` batches at random start
    positions (rows could be seen twice or not at all in one pass) and gave
    every batch ``batch_size`` rows; this loader shuffles once per pass and
    gives every row once, the last batch being smaller when the division is
    not exact (scikit-learn's ``gen_batches`` convention).
    """

    def __init__(self, X, y, sample_weight=None, batch_size=20, device="cpu",
                 random_iter=True):
        X = np.ascontiguousarray(X)
        if X.ndim == 0:
            raise ValueError("OrtDataLoader: X must have one row per sample.")
        y = _rows("y", y, X.shape[0])
        if y.ndim == 1:
            y = y.reshape((-1, 1))
        if sample_weight is not None:
            sample_weight = _rows("sample_weight", sample_weight,
                                  X.shape[0]).reshape((-1,))
        if int(batch_size) < 0:
            raise ValueError(f"OrtDataLoader: batch_size={batch_size!r} "
                             "must be >= 0.")
        self.device = parse_device(device)
        self.batch_size = int(batch_size)
        self.random_iter = bool(random_iter)
        self.X_np, self.y_np, self.w_np = X, y, sample_weight
        self._to_device()

    def _to_device(self):
        self.X_ort = self._ortvalue(self.X_np)
        self.y_ort = self._ortvalue(self.y_np)
        self.w_ort = None if self.w_np is None else self._ortvalue(self.w_np)

    def _ortvalue(self, array):
        # The C-level OrtValue onnxcustom yielded (``onnxruntime.OrtValue(v)``
        # wraps it in the public class). It owns its buffer: one made by
        # ortvalue_from_numpy on the CPU borrows the array's memory and only
        # the Python wrapper keeps the array alive.
        value = OrtValue.ortvalue_from_shape_and_type(
            array.shape, array.dtype, self.device.type, self.device.index)
        value.update_inplace(np.ascontiguousarray(array))
        return value._ortvalue

    @property
    def desc(self):
        return [(a.shape, a.dtype) for a in self.data_np]

    @property
    def data_np(self):
        if self.w_np is None:
            return self.X_np, self.y_np
        return self.X_np, self.y_np, self.w_np

    @property
    def data_ort(self):
        if self.w_ort is None:
            return self.X_ort, self.y_ort
        return self.X_ort, self.y_ort, self.w_ort

    def __len__(self):
        """Number of rows (samples)."""
        return self.X_np.shape[0]

    def __repr__(self):
        return (f"{type(self).__name__}(..., ..., batch_size={self.batch_size!r}, "
                f"device={str(self.device)!r})")

    def __getstate__(self):
        return {"X_np": self.X_np, "y_np": self.y_np, "w_np": self.w_np,
                "batch_size": self.batch_size, "random_iter": self.random_iter,
                "device": str(self.device)}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.device = parse_device(self.device)
        self._to_device()

    def batch_indices(self):
        """The rows of each batch of one pass (a generator): index arrays
        when ``random_iter``, else slices (the numpy batches are then views
        of the dataset)."""
        n = len(self)
        order = np.random.permutation(n) if self.random_iter else None
        size = self.batch_size if 0 < self.batch_size < n else n
        for start in range(0, n, size):
            yield (slice(start, start + size) if order is None
                   else order[start:start + size])

    def iter_numpy(self):
        """One pass over the data: tuples ``(X, y[, sample_weight])`` of
        numpy arrays, one per batch (views of the dataset unless
        ``random_iter``).

        Raises
        ------
        RuntimeError
            The loader's device is not the CPU.
        """
        if self.device.type != "cpu":
            raise RuntimeError("OrtDataLoader.iter_numpy needs device='cpu', "
                               f"not {str(self.device)!r}; use iter_ortvalue.")
        for rows in self.batch_indices():
            yield tuple(a[rows] for a in self.data_np)

    def iter_ortvalue(self):
        """One pass over the data: tuples ``(X, y[, sample_weight])`` of
        onnxruntime's C-level OrtValues (``onnxruntime.capi._pybind_state.
        OrtValue``, as onnxcustom yielded) on the loader's device, one per
        batch."""
        for rows in self.batch_indices():
            yield tuple(self._ortvalue(a[rows]) for a in self.data_np)
