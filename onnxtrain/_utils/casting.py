"""Casting numpy inputs to a graph's element type without silent overflow,
shared by the estimators and :class:`onnxtrain.api.Module` (numpy only, so
any layer may import it)."""
from __future__ import annotations

import numpy as np

__all__ = ["cast_within_range"]


def cast_within_range(array, dtype, name, target="the graph"):
    """``array`` cast to ``dtype``, refusing values the cast would turn into
    infinity (float64 beyond float32's range, ints beyond float16's).

    Parameters
    ----------
    array : numpy.ndarray
    dtype : numpy dtype
        The element type of the graph input ``array`` feeds.
    name : str
        Names the array in the message ("X", "Input 'x'"...).
    target : str, default="the graph"
        Names what has element type ``dtype`` in the message.

    Returns
    -------
    numpy.ndarray
        C-contiguous, of ``dtype`` (``array`` itself when it already is).

    Raises
    ------
    ValueError
        A finite value whose magnitude exceeds ``np.finfo(dtype).max``.
    """
    dtype = np.dtype(dtype)
    if dtype.kind == "f" and array.dtype != dtype and array.size \
            and array.dtype.kind in "iuf":
        largest = max(-float(array.min()), float(array.max()))  # no copy
        limit = float(np.finfo(dtype).max)
        if largest > limit:
            raise ValueError(
                f"{name} has values up to {largest:.4g} in magnitude, beyond "
                f"the range of {dtype} (largest {limit:.4g}), the element type "
                f"of {target}: the cast would turn them into infinity. Scale "
                f"the data, or train a graph in float64.")
    return np.ascontiguousarray(array, dtype=dtype)
