"""Utilities on prediction models: loading, choosing the weights to train,
replacing initializers, converting scikit-learn models."""
from __future__ import annotations

import os
from collections import OrderedDict

import numpy as np
import onnx
from onnx import numpy_helper

from .autodiff import trainable_initializers
from .graph import FLOAT_TYPES

__all__ = ["load_model", "select_weights", "get_train_initializer",
           "replace_initializers", "to_onnx"]


def load_model(model):
    """A ModelProto from a ModelProto (returned as is), bytes or a path.

    Raises
    ------
    TypeError
        For any other type.
    """
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray)):
        return onnx.load_model_from_string(bytes(model))
    if isinstance(model, (str, os.PathLike)):
        return onnx.load(os.fspath(model))
    raise TypeError(f"model_onnx must be an onnx.ModelProto, bytes or a path, "
                    f"not {type(model).__name__}.")


def select_weights(model, weights_to_train=None):
    """Validate ``weights_to_train`` against ``model``.

    Parameters
    ----------
    model : onnx.ModelProto
    weights_to_train : list of str, default=None
        None selects :func:`onnxtrain.autodiff.trainable_initializers`.

    Returns
    -------
    list of str

    Raises
    ------
    ValueError
        A name that is not a float initializer of the model (the message
        lists the candidates), a duplicate, or nothing to train.
    """
    candidates = trainable_initializers(model)
    if weights_to_train is None:
        if not candidates:
            raise ValueError(
                "The model has no float initializer reaching its outputs through "
                "differentiable ops: nothing to train. Coefficients stored in "
                "attributes (ai.onnx.ml LinearRegressor...) are not trainable.")
        return candidates
    names = [weights_to_train] if isinstance(weights_to_train, str) else list(
        weights_to_train)
    floats = {i.name for i in model.graph.initializer if i.data_type in FLOAT_TYPES}
    unknown = [n for n in names if n not in floats]
    if unknown:
        raise ValueError(f"weights_to_train {unknown} are not float initializers "
                         f"of the model; candidates: {candidates}.")
    if len(set(names)) != len(names):
        raise ValueError(f"weights_to_train has duplicates: {names}.")
    if not names:
        raise ValueError("weights_to_train is empty: nothing to train.")
    return names


def get_train_initializer(model):
    """Float initializers of ``model`` that training can change.

    Returns
    -------
    OrderedDict
        ``name -> (numpy.ndarray, onnx.TensorProto)`` for every float
        initializer reaching an output through differentiable ops, in graph
        order (the layout onnxcustom's function of the same name returned).
    """
    model = load_model(model)
    keep = set(trainable_initializers(model))
    return OrderedDict((i.name, (numpy_helper.to_array(i), i))
                       for i in model.graph.initializer if i.name in keep)


def replace_initializers(model, values):
    """A copy of ``model`` whose initializers ``values`` (name -> array) are
    replaced, each cast to the initializer's element type.

    Raises
    ------
    ValueError
        A name that is not an initializer, or a shape change.
    """
    new = onnx.ModelProto()
    new.CopyFrom(model)
    inits = {i.name: i for i in new.graph.initializer}
    for name, value in values.items():
        if name not in inits:
            raise ValueError(f"{name!r} is not an initializer of the model.")
        old = inits[name]
        array = np.asarray(value).astype(
            onnx.helper.tensor_dtype_to_np_dtype(old.data_type), copy=False)
        if tuple(array.shape) != tuple(old.dims):
            raise ValueError(f"Initializer {name!r} has shape {tuple(old.dims)}, "
                             f"the new value {array.shape}.")
        old.CopyFrom(numpy_helper.from_array(array, name))
    return new


def to_onnx(model, X=None, target_opset=None, black_op=None, options=None):
    """Convert a fitted scikit-learn model with skl2onnx.

    A thin wrapper kept so that code written for mlprodict's ``to_onnx``
    runs with its import changed.

    Parameters
    ----------
    model : fitted scikit-learn estimator
    X : numpy.ndarray, default=None
        A sample of the input (gives the input type and number of features).
    target_opset : int, default=None
        Default-domain opset (skl2onnx's latest tested one when None).
    black_op : set of str, default=None
        Op types the result must not contain.
    options : dict, default=None
        skl2onnx converter options.

    Returns
    -------
    onnx.ModelProto

    Raises
    ------
    ValueError
        If the converted graph contains an op in ``black_op``.
    """
    from skl2onnx import to_onnx as skl2onnx_to_onnx

    onx = skl2onnx_to_onnx(model, X, target_opset=target_opset, options=options)
    banned = sorted({n.op_type for n in onx.graph.node} & set(black_op or ()))
    if banned:
        raise ValueError(f"The converted graph contains the forbidden ops "
                         f"{banned} (black_op={sorted(black_op)}).")
    return onx
