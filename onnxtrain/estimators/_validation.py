"""Input validation shared by the estimators (scikit-learn's utilities)."""
from __future__ import annotations

import numbers

import numpy as np
from sklearn.utils._param_validation import Interval
from sklearn.utils.validation import check_array

from .._utils.casting import cast_within_range
from ..training.loop import validation_period

__all__ = ["Count", "cast_within_range", "check_batch_dim", "check_target_rank",
           "check_targets", "validation_period"]


class Count(Interval):
    """scikit-learn's ``Interval(numbers.Integral, low, None)`` constraint
    without the bools (True is an Integral; a count given as True is a
    mistake)."""

    def __init__(self, low=1):
        super().__init__(numbers.Integral, low, None, closed="left")

    def is_satisfied_by(self, val):
        return not isinstance(val, (bool, np.bool_)) and super().is_satisfied_by(val)


def _check_numeric(array, name):
    if array.dtype.kind not in "biuf":
        raise TypeError(f"{name} has dtype {array.dtype}; onnxtrain needs "
                        "numeric (bool, int or float) data. Encode object or "
                        "string columns first.")


def check_batch_dim(shape, X, name, input_name):
    """A model exported with a fixed batch size (torch.onnx.export without
    dynamic axes) takes batches of that size only: refuse other row counts
    here, before any weight is drawn, rather than in onnxruntime mid-fit."""
    if shape and isinstance(shape[0], int) and shape[0] != X.shape[0]:
        raise ValueError(
            f"{name} has {X.shape[0]} rows but the model input {input_name!r} "
            f"has a fixed batch dimension of {shape[0]}: export the model "
            "with a dynamic batch dimension (torch.onnx.export(..., "
            f"dynamic_axes={{{input_name!r}: {{0: 'batch'}}}}) or "
            "dynamic_shapes) so that it takes batches of any size.")


def check_targets(y, n_samples, name, dtype, ndim=None):
    """Validate targets (or sample weights): numeric, finite, ``n_samples``
    rows, cast to ``dtype``.

    Raises
    ------
    TypeError
        Non-numeric data.
    ValueError
        NaN or inf, another number of rows, a rank other than 1 (or 2),
        or values beyond the range of ``dtype``.
    """
    # allow_nd: the rank is checked below, with a message naming the shape
    y = check_array(y, dtype=None, ensure_2d=False, allow_nd=True,
                    input_name=name)
    _check_numeric(y, name)
    if y.shape[0] != n_samples:
        raise ValueError(f"{name} has {y.shape[0]} rows, X has {n_samples}.")
    if y.ndim > 2 or (ndim is not None and y.ndim != ndim):
        allowed = (" (1-D)" if ndim == 1
                   else " or (n_samples, n_outputs) (1-D or 2-D)")
        raise ValueError(f"{name} must have shape (n_samples,){allowed}, got "
                         f"shape {y.shape}.")
    return cast_within_range(y, dtype, name)


def check_target_rank(y, name="y"):
    """Refuse targets of rank above 2 naming their shape (scikit-learn's
    ``check_array`` only says "Found array with dim 3").

    Raises
    ------
    ValueError
        If ``y`` has more than 2 dimensions.
    """
    try:  # not np.shape: array-likes may refuse __array_function__
        shape = tuple(y.shape) if hasattr(y, "shape") else np.asarray(y).shape
    except (ValueError, TypeError):  # ragged: check_array says what is wrong
        return
    if len(shape) > 2:
        raise ValueError(f"{name} must have shape (n_samples,) or (n_samples, "
                         f"n_outputs) (1-D or 2-D), got shape {shape}.")


def check_sample_weight(sample_weight, n_samples, dtype):
    """Validate sample weights: shape (n_samples,) or (n_samples, 1)
    (onnxcustom's tests pass columns), numeric, finite, cast to ``dtype``.

    Returns
    -------
    ndarray of shape (n_samples,)

    Raises
    ------
    TypeError, ValueError
    """
    weight = check_array(sample_weight, dtype=None, ensure_2d=False,
                         allow_nd=True, input_name="sample_weight")
    if weight.ndim == 2 and weight.shape[1] == 1:
        weight = weight[:, 0]
    return check_targets(weight, n_samples, "sample_weight", dtype, ndim=1)


def check_use_numpy(use_numpy):
    """onnxcustom's ``fit(..., use_numpy=)`` chose between two data paths;
    onnxtrain has one, so the value only has to be None or a bool.

    Raises
    ------
    TypeError
        Any other value.
    """
    if use_numpy is not None and not isinstance(use_numpy, (bool, np.bool_)):
        raise TypeError(f"use_numpy must be None or a bool, got {use_numpy!r}.")
