"""The data the estimators feed a graph: one array of any rank (a table, a
batch of images or of sequences) or, for a graph of several inputs, one
array per input keyed by the input's name, all sliced along axis 0."""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from sklearn.utils.validation import check_array

from ..graph import elem_type_to_numpy, infer_value_types
from ._validation import _check_numeric, cast_within_range, check_batch_dim

__all__ = ["GraphInputs", "check_features", "data_inputs",
           "check_batch_dimension", "check_batchnorm_batches"]


class GraphInputs:
    """Arrays of several graph inputs, sliced together along axis 0.

    Pass it as ``X`` to the estimators for a graph with several inputs
    (``fit``, ``predict``, ``score``; a plain dict works there too), and
    where scikit-learn splits the rows (``GridSearchCV``, ``cross_validate``,
    ``train_test_split``), which a plain dict does not support.

    Parameters
    ----------
    arrays : dict
        ``input name -> array-like`` with the same number of rows (axis 0).

    Raises
    ------
    ValueError
        Empty, or arrays with different numbers of rows.
    """

    def __init__(self, arrays):
        if isinstance(arrays, GraphInputs):
            arrays = arrays.arrays
        self.arrays = {str(k): np.asarray(v) for k, v in dict(arrays).items()}
        if not self.arrays:
            raise ValueError("GraphInputs needs at least one array.")
        rows = {k: (v.shape[0] if v.ndim else None) for k, v in self.arrays.items()}
        if len(set(rows.values())) != 1 or None in rows.values():
            raise ValueError(f"The arrays of GraphInputs must have the same "
                             f"number of rows (axis 0); got {rows}.")

    @property
    def shape(self):
        """(n_samples,): what scikit-learn reads to count rows."""
        return (next(iter(self.arrays.values())).shape[0],)

    @property
    def ndim(self):
        return 1

    def __len__(self):
        return self.shape[0]

    def __getitem__(self, key):
        if isinstance(key, tuple):  # scikit-learn indexes with (rows, ...)
            key = key[0]
        if isinstance(key, str):
            return self.arrays[key]
        return GraphInputs({k: v[key] for k, v in self.arrays.items()})

    def keys(self):
        return self.arrays.keys()

    def __repr__(self):
        shapes = ", ".join(f"{k!r}: {v.dtype}{list(v.shape)}"
                           for k, v in self.arrays.items())
        return f"GraphInputs({{{shapes}}})"


def data_inputs(model):
    """Names of ``model``'s graph inputs that are not initializers (the
    data the estimators feed), in graph order."""
    inits = {i.name for i in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in inits]


def imputes_nan(model):
    """Whether ``model`` replaces NaN by values (an ``ai.onnx.ml`` Imputer
    whose ``replaced_value_float`` is NaN, as skl2onnx converts
    SimpleImputer): NaN in its inputs is then data, not an error."""
    for node in model.graph.node:
        if node.domain == "ai.onnx.ml" and node.op_type == "Imputer":
            for att in node.attribute:
                if att.name == "replaced_value_float" and np.isnan(att.f):
                    return True
    return False


def _check_one(array, input_name, name, types, allow_nan=False):
    """One array for one graph input: numeric, finite (NaN allowed with
    ``allow_nan``), the input's rank and static dims after axis 0, cast to
    its element type."""
    elem_type, shape = types[input_name]
    array = check_array(array, dtype=None, allow_nd=True, input_name=name,
                        ensure_2d=shape is None or len(shape) != 1,
                        ensure_all_finite="allow-nan" if allow_nan else True)
    _check_numeric(array, name)
    if shape is not None:
        if len(shape) != array.ndim:
            raise ValueError(
                f"{name} has shape {array.shape} ({array.ndim} dims) but the "
                f"model input {input_name!r} has {len(shape)} dims "
                f"{_shape_text(shape)}.")
        for axis, (dim, size) in enumerate(zip(shape[1:], array.shape[1:]), 1):
            if isinstance(dim, int) and dim > 0 and dim != size:
                if len(shape) == 2:
                    raise ValueError(
                        f"{name} has {size} features but the model input "
                        f"{input_name!r} takes {dim}.")
                raise ValueError(
                    f"{name} has shape {array.shape} but the model input "
                    f"{input_name!r} has shape {_shape_text(shape)} (axis "
                    f"{axis}: {dim}, got {size}).")
        check_batch_dim(shape, array, name, input_name)
    return cast_within_range(array, elem_type_to_numpy(elem_type), name,
                             f"the model input {input_name!r}")


def _shape_text(shape):
    return "(" + ", ".join("N" if d is None else str(d) for d in shape) + ")"


def check_features(model, X, name="X", types=None, inputs=None):
    """Validate ``X`` for the data inputs of ``model`` and cast it to their
    types.

    Parameters
    ----------
    model : onnx.ModelProto
    X : array-like of shape (n_samples, ...), dict or GraphInputs
        An array of the first data input's rank (2 for a table; 4 for
        (n_samples, channels, height, width) images...), or, for a graph of
        several inputs, ``input name -> array`` with one entry per data
        input, the same number of rows each.
    name : str, default="X"
    types : dict, default=None
        The model's :func:`~onnxtrain.graph.infer_value_types`.
    inputs : list of str, default=None
        The data inputs (default: :func:`data_inputs`).

    Returns
    -------
    numpy.ndarray or GraphInputs
        Arrays cast to the inputs' element types (GraphInputs in the
        graph's input order).

    Raises
    ------
    TypeError
        Non-numeric data.
    ValueError
        Infinity, or NaN unless the graph imputes it (:func:`imputes_nan`:
        NaN is then a missing value); a rank or a static dimension the
        input does not take;
        one array for a graph of several inputs; keys that are not the
        graph's data inputs; dict arrays of different numbers of rows.
    """
    types = infer_value_types(model) if types is None else types
    names = data_inputs(model) if inputs is None else list(inputs)
    allow_nan = imputes_nan(model)
    if isinstance(X, (Mapping, GraphInputs)):
        given = list(X.keys())
        missing = [n for n in names if n not in given]
        unknown = [k for k in given if k not in names]
        if missing or unknown:
            raise ValueError(f"{name} must have one array per input of the "
                             f"model {names}; missing {missing}, unknown "
                             f"{unknown}.")
        values = X.arrays if isinstance(X, GraphInputs) else X
        return GraphInputs({n: _check_one(values[n], n, f"{name}[{n!r}]", types,
                                          allow_nan)
                            for n in names})
    if len(names) > 1:
        raise ValueError(f"The model takes {len(names)} inputs {names}: pass "
                         f"{name} as a dict (or onnxtrain.GraphInputs) of one "
                         "array per input name.")
    return _check_one(X, names[0], name, types, allow_nan)


def check_batch_dimension(model, sizes, inputs=None, types=None):
    """Refuse a graph whose data inputs have a fixed first (batch)
    dimension other than the batch sizes it would be fed.

    Parameters
    ----------
    model : onnx.ModelProto
    sizes : iterable of int
        Rows of the batches the graph will run on.
    inputs, types : optional
        Data inputs and :func:`~onnxtrain.graph.infer_value_types`.

    Raises
    ------
    ValueError
        Naming the input, its fixed dimension, the sizes and the fix
        (export with a dynamic batch dimension).
    """
    types = infer_value_types(model) if types is None else types
    sizes = sorted(set(int(s) for s in sizes))
    for name in (data_inputs(model) if inputs is None else inputs):
        shape = types.get(name, (None, None))[1]
        if not shape or not isinstance(shape[0], int) or shape[0] <= 0:
            continue
        if any(s != shape[0] for s in sizes):
            raise ValueError(
                f"The model input {name!r} has a fixed batch dimension of "
                f"{shape[0]} (shape {_shape_text(shape)}) but is fed batches of "
                f"{sizes} rows. Export the model with a dynamic batch "
                f"dimension: torch.onnx.export(..., dynamic_axes={{{name!r}: "
                "{0: 'N'}, <output>: {0: 'N'}}) (dynamo=False), or "
                "dynamic_shapes with dynamo=True; or set the first dim of the "
                "input to a symbolic name (dim_param).")


def check_batchnorm_batches(model, sizes, types=None, inputs=None):
    """Refuse batches of one row when a training-mode BatchNormalization of
    the graph normalizes one value per channel and row (its input is (N, C),
    or its other dimensions are all 1): the unbiased variance of a single
    value is 0 / 0 and the running variance would become NaN (PyTorch
    refuses such a batch: "Expected more than 1 value per channel when
    training").

    Parameters
    ----------
    model : onnx.ModelProto
    sizes : iterable of int
        Rows of the batches the graph will run on.
    types : dict, optional
        :func:`~onnxtrain.graph.infer_value_types` of ``model``.
    inputs : list of str, optional
        The data inputs (default :func:`data_inputs`): a BatchNormalization
        counts when its first dimension is theirs (the rows), not another
        one (N * T after a reshape).

    Raises
    ------
    ValueError
        Naming the node and the sizes.
    """
    if 1 not in {int(s) for s in sizes}:
        return
    types = infer_value_types(model) if types is None else types
    rows = {(types.get(name, (None, None))[1] or (None,))[0]
            for name in (data_inputs(model) if inputs is None else inputs)}
    rows = {d for d in rows if isinstance(d, str)}
    for node in model.graph.node:
        if node.op_type != "BatchNormalization" or node.domain not in ("", "ai.onnx") \
                or not any(a.name == "training_mode" and a.i for a in node.attribute):
            continue
        shape = types.get(node.input[0], (None, None))[1]
        if not shape or len(shape) < 2 or shape[0] not in rows \
                or not all(isinstance(d, int) for d in shape[2:]) \
                or int(np.prod(shape[2:], dtype=np.int64)) != 1:
            continue
        raise ValueError(
            f"A batch of 1 row reaches BatchNormalization node "
            f"{node.name or node.output[0]!r} in training mode, whose input "
            f"{_shape_text(shape)} holds one value per channel and row: a single "
            "value has no unbiased variance and the running variance would become "
            "NaN (PyTorch refuses such a batch too). Choose a batch_size that "
            "leaves no batch of 1 row (the last batch holds the remainder), or "
            "drop a row.")
