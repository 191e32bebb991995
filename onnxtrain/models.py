"""Utilities on prediction models: loading, choosing the weights to train,
replacing initializers, converting scikit-learn models."""
from __future__ import annotations

import os
from collections import OrderedDict

import numpy as np
import onnx
from onnx import numpy_helper

from .autodiff import is_nondifferentiable, trainable_initializers
from .autodiff.backward import _dependents, _is_float, _node_inputs
from .graph import FLOAT_TYPES, infer_value_types
from .training_mode import batchnorm_buffers, running_statistics

__all__ = ["load_model", "select_weights", "check_weights_reach_outputs",
           "get_train_initializer", "replace_initializers", "to_onnx",
           "add_loss_output"]


def load_model(model):
    """A ModelProto from a ModelProto (returned as is), bytes or a path.

    Raises
    ------
    TypeError
        For any other type.
    """
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray, memoryview)):
        return onnx.load_model_from_string(bytes(model))
    if isinstance(model, (str, os.PathLike)):
        return onnx.load(os.fspath(model))
    raise TypeError(
        f"expected an onnx.ModelProto, serialized bytes or a path to an ONNX "
        f"file, got {type(model).__module__}.{type(model).__qualname__}")


def select_weights(model, weights_to_train=None):
    """Validate ``weights_to_train`` against ``model``.

    Parameters
    ----------
    model : onnx.ModelProto
    weights_to_train : list of str, default=None
        None selects :func:`onnxtrain.autodiff.trainable_initializers`
        except the running statistics of BatchNormalization nodes
        (:func:`onnxtrain.training_mode.running_statistics`), which are
        never trained by gradient.

    Returns
    -------
    list of str

    Raises
    ------
    ValueError
        A name that is not a float initializer of the model (the message
        lists the candidates), a duplicate, nothing to train, the running
        statistic of a BatchNormalization in training mode (updated by each
        step, not trained), or weights
        none of which reaches a float output through differentiable ops
        (the message names the non-differentiable ops that stop their
        gradient).
    """
    statistics = set(running_statistics(model))
    candidates = [n for n in trainable_initializers(model) if n not in statistics]
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
    buffers = [n for n in batchnorm_buffers(model) if n in set(names)]
    if buffers:
        raise ValueError(
            f"weights_to_train {buffers} are running statistics of "
            "BatchNormalization nodes in training mode: each training step "
            "updates them with the momentum rule, they are not trained by "
            f"gradient. Leave them out; candidates: {candidates}.")
    if not names:
        raise ValueError("weights_to_train is empty: nothing to train.")
    if not set(names) & set(candidates):  # else one reaches: nothing to check
        check_weights_reach_outputs(model, names)
    return names


def check_weights_reach_outputs(model, names, outputs=None,
                                what="weights_to_train", target="the outputs",
                                types=None):
    """Raise ValueError when no weight of ``names`` reaches ``outputs``
    through differentiable ops, the case where
    :func:`onnxtrain.autodiff.backward` finds nothing to differentiate.

    Parameters
    ----------
    model : onnx.ModelProto
        Not modified.
    names : list of str
        The weights.
    outputs : list of str, default=None
        Default: the graph outputs (only float ones have gradients).
    what, target : str
        How the message calls ``names`` and ``outputs``.
    types : dict, default=None
        The model's :func:`~onnxtrain.graph.infer_value_types` (computed
        when None).

    Raises
    ------
    ValueError
        Naming the weights and the ops where their gradient stops: ops
        declared non-differentiable (Floor, ArgMax, Shape...) or producing
        no float value (a Cast to an integer type; TopK, whose values are
        float, is not one).
    """
    types = infer_value_types(model) if types is None else types
    ends = set(outputs or [o.name for o in model.graph.output])
    differentiable = _dependents(model.graph.node, names, types)
    if any(o in differentiable for o in ends if _is_float(types, o)):
        return
    # the message: where the gradient stops, whether the weights reach at all
    reached, stops = set(names), []
    for node in model.graph.node:
        inputs = _node_inputs(node)
        produced = [o for o in node.output if o]
        if reached & set(inputs):
            reached.update(produced)
        if any(i in differentiable for i in inputs) and (
                is_nondifferentiable(node.op_type, node.domain)
                or not any(_is_float(types, o) for o in produced)):
            stops.append(node)  # not TopK: its values are float
    if not reached & ends or not stops:
        raise ValueError(f"{what} {names} do not reach {target}: nothing to "
                         "train.")
    ops = list(dict.fromkeys(
        f"{n.op_type} node {n.name!r}" if n.name else n.op_type for n in stops))
    raise ValueError(
        f"{what} {names} reach {target} only through non-differentiable ops "
        f"({', '.join(ops)}): their gradient is zero, nothing to train.")


def get_train_initializer(model):
    """Float initializers of ``model`` that training can change.

    Parameters
    ----------
    model : onnx.ModelProto, bytes or str
        The model, its serialized bytes or a path to an ONNX file (see
        :func:`load_model`); not modified.

    Returns
    -------
    OrderedDict
        ``name -> (numpy.ndarray, onnx.TensorProto)`` for every float
        initializer reaching an output through differentiable ops, in graph
        order (the layout onnxcustom's function of the same name returned).
        The TensorProtos are the model's own (not copies). Integer and
        rank-0 initializers are left out (see
        :func:`onnxtrain.autodiff.trainable_initializers`).

    Raises
    ------
    TypeError
        If ``model`` is not a ModelProto, bytes or a path.
    FileNotFoundError
        If the path does not exist.
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


def add_loss_output(model, loss="square_error", output_index=0,
                    label_name="label", weight_name=None, loss_output_name="loss"):
    """A training graph computing the loss of a prediction graph.

    Parameters
    ----------
    model : onnx.ModelProto, bytes or str
        Prediction graph; not modified.
    loss : str or loss object, default="square_error"
        See :func:`onnxtrain.losses.resolve_learning_loss`.
    output_index : int, default=0
        The output holding the prediction.
    label_name : str, default="label"
        New input receiving the expected values (shape of the prediction).
    weight_name : str, default=None
        New input receiving sample weights (shape (N,)), if given.
    loss_output_name : str, default="loss"
        The only output: the rank-0 batch loss.

    Returns
    -------
    onnx.ModelProto
        Inputs: the model's inputs, ``label_name`` (and ``weight_name``).

    Raises
    ------
    ValueError
        Names colliding with names of the model.
    """
    from .graph import infer_value_types, opset_of
    from .losses import resolve_learning_loss

    base = load_model(model)
    prediction = base.graph.output[output_index].name
    elem_type, shape = infer_value_types(base)[prediction]
    taken = {i.name for i in base.graph.input} | {o.name for o in base.graph.output}
    taken |= {o for n in base.graph.node for o in n.output}
    taken |= {i.name for i in base.graph.initializer}
    clash = [n for n in (label_name, weight_name, loss_output_name) if n in taken]
    if clash:
        raise ValueError(f"add_loss_output: names {clash} already exist in the model.")
    loss_model = resolve_learning_loss(loss).build_onnx(
        elem_type, max(opset_of(base) or 9, 9), weight_name=weight_name,
        rank=2 if shape is None else len(shape))
    prefix = "loss__"
    loss_model = onnx.compose.add_prefix(loss_model, prefix)
    rename = {f"{prefix}X1": label_name, f"{prefix}X2": prediction,
              f"{prefix}Y": loss_output_name}
    if weight_name:
        rename[f"{prefix}{weight_name}"] = weight_name
    nodes = []
    for node in loss_model.graph.node:
        node = onnx.helper.make_node(
            node.op_type, [rename.get(i, i) for i in node.input],
            [rename.get(o, o) for o in node.output], name=node.name,
            domain=node.domain, **{a.name: onnx.helper.get_attribute_value(a)
                                   for a in node.attribute})
        nodes.append(node)
    inputs = list(base.graph.input) + [
        onnx.helper.make_value_info(rename[i.name], i.type)
        for i in loss_model.graph.input if rename.get(i.name) != prediction]
    output = [o for o in loss_model.graph.output
              if rename.get(o.name) == loss_output_name][0]
    graph = onnx.helper.make_graph(
        list(base.graph.node) + nodes,
        base.graph.name, inputs,
        [onnx.helper.make_value_info(loss_output_name, output.type)],
        list(base.graph.initializer) + list(loss_model.graph.initializer))
    new = onnx.helper.make_model(graph, opset_imports=list(base.opset_import))
    new.ir_version = base.ir_version
    return new
