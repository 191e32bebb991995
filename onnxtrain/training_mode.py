"""Layers that behave differently when training: BatchNormalization and
Dropout (as PyTorch exports them with ``training=TrainingMode.TRAINING``).

- A BatchNormalization node in training mode (``training_mode=1``)
  normalizes with the statistics of its batch. Its running mean and
  variance initializers are *buffers*: never trained by gradient, updated
  by every training step with the momentum rule (see
  :func:`with_running_statistics_updates`) and used by the inference graph.
- Dropout with a ``training_mode`` input drops values while training and is
  the identity in the inference graph.

:func:`inference_mode` turns a training graph into the inference graph
(what ``get_trained_onnx``, ``predict`` and the eval models run).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .autodiff.backward import implicit_inputs

__all__ = ["running_statistics", "batchnorm_buffers", "updated_name",
           "with_running_statistics_updates", "inference_mode"]

_DEFAULT_DOMAINS = ("", "ai.onnx")


def _is_batchnorm(node):
    return node.op_type == "BatchNormalization" and node.domain in _DEFAULT_DOMAINS


_HELPER = "bn_update__"  # prefix of the names of the update nodes


def _training_batchnorm(node):
    """A BatchNormalization in training mode (not one of the update's)."""
    return _is_batchnorm(node) and not node.name.startswith(_HELPER) and any(
        a.name == "training_mode" and a.i for a in node.attribute)


def _attribute(node, name, default):
    for att in node.attribute:
        if att.name == name:
            return helper.get_attribute_value(att)
    return default


def running_statistics(model):
    """Names of the initializers BatchNormalization nodes read as running
    mean and variance (inputs 3 and 4), in any mode, in node order: they are
    never weights to train by gradient.

    Parameters
    ----------
    model : onnx.ModelProto

    Returns
    -------
    list of str
    """
    inits = {i.name for i in model.graph.initializer}
    names = []
    for node in model.graph.node:
        if _is_batchnorm(node):
            names += [n for n in node.input[3:5] if n in inits and n not in names]
    return names


def batchnorm_buffers(model):
    """Running statistics of the BatchNormalization nodes in training mode:
    ``[mean_0, var_0, mean_1, var_1, ...]`` in node order, the values a
    training step updates.

    Raises
    ------
    ValueError
        A running statistic read by two nodes in training mode (two updates
        of one tensor), or one that is neither an initializer nor an input.
    """
    stored = {i.name for i in model.graph.initializer}
    stored |= {i.name for i in model.graph.input}
    buffers = []
    for node in model.graph.node:
        if not _training_batchnorm(node):
            continue
        for name in node.input[3:5]:
            if name not in stored:
                raise ValueError(
                    f"BatchNormalization node {node.name!r} in training mode "
                    f"reads its running statistic {name!r} from a computed "
                    "value; onnxtrain updates running statistics stored as "
                    "initializers only.")
            if name in buffers:
                raise ValueError(
                    f"The running statistic {name!r} is read by two "
                    "BatchNormalization nodes in training mode: each would "
                    "update it. Give each node its own statistics.")
            buffers.append(name)
    return buffers


def updated_name(buffer):
    """Name of the output holding ``buffer`` after a training step."""
    return f"{buffer}__new"


def with_running_statistics_updates(model, as_inputs=True):
    """A copy of ``model`` whose training steps also output the updated
    running statistics.

    For each BatchNormalization node in training mode with momentum ``m``
    (PyTorch exports ``m = 1 - torch_momentum``, 0.9 by default), over the
    ``M = size(X) / C`` values of each channel:

    - ``running_mean <- m * running_mean + (1 - m) * mean(X)``, the node's
      own second output (ONNX BatchNormalization-15);
    - ``running_var <- m * running_var + (1 - m) * var(X) * M / (M - 1)``:
      the unbiased batch variance, as PyTorch's ``BatchNorm`` updates it
      (ONNX's reference output uses the population variance ``var(X)``;
      the graph adds ``(1 - m) var(X) / (M - 1)`` to the node's third
      output, with ``var(X)`` from a second BatchNormalization of momentum
      0: nothing reads the running statistics after the node, whose outputs
      onnxruntime may write over its inputs in place).

    Parameters
    ----------
    model : onnx.ModelProto
        Not modified.
    as_inputs : bool, default=True
        True: the running statistics become graph inputs appended after the
        model's inputs (no longer initializers), so that a training loop
        feeds their current values. False: they stay initializers (the
        caller turns them into inputs, as the artifacts do with parameters).

    Returns
    -------
    model : onnx.ModelProto
        Outputs: the model's, then :func:`updated_name` of each buffer.
    buffers : list of str
        :func:`batchnorm_buffers` of ``model``.
    initial : dict
        ``buffer -> numpy.ndarray``, the initializers' values.

    Raises
    ------
    ValueError
        See :func:`batchnorm_buffers`; also a node in training mode before
        opset 14 (whose extra outputs are not the running statistics).
    """
    buffers = batchnorm_buffers(model)
    new = onnx.ModelProto()
    new.CopyFrom(model)
    if not buffers:
        return new, [], {}
    graph = new.graph
    opset = next((o.version for o in model.opset_import
                  if o.domain in _DEFAULT_DOMAINS), None)
    if opset is not None and opset < 14:
        raise ValueError("BatchNormalization in training mode needs opset >= 14 "
                         f"(the model has opset {opset}): export it again with "
                         "opset_version >= 14.")
    inits = {i.name: i for i in graph.initializer}
    computed = [b for b in buffers if b not in inits]
    if computed:
        raise ValueError(f"The running statistics {computed} are not "
                         "initializers: their initial values are unknown.")
    taken = {n for node in graph.node for n in list(node.input) + list(node.output)}
    taken |= set(inits) | {i.name for i in graph.input}
    counter = iter(range(10 ** 9))

    def fresh(base):
        name = f"{_HELPER}{base}"
        while name in taken:
            name = f"{_HELPER}{base}_{next(counter)}"
        taken.add(name)
        return name

    extra_nodes, extra_inits = [], []
    for node in graph.node:
        if not _training_batchnorm(node):
            continue
        while len(node.output) < 3:
            node.output.append("")
        for k in (1, 2):
            if not node.output[k]:
                node.output[k] = fresh(f"{node.name or 'bn'}_out{k}")
        mean, var = node.input[3], node.input[4]
        elem_type = inits[var].data_type
        dtype = helper.tensor_dtype_to_np_dtype(elem_type)
        rest = fresh("one_minus_momentum")
        extra_inits.append(numpy_helper.from_array(
            np.array(1 - _attribute(node, "momentum", 0.9), dtype=dtype), rest))
        one = fresh("one")
        extra_inits.append(numpy_helper.from_array(np.array(1, dtype=dtype), one))
        # the batch variance var(X), from a second node with momentum 0 on
        # zero statistics: nothing reads the running statistics after the
        # node, whose outputs onnxruntime may write over them in place
        zeros, batch_mean, batch_var, unused = (
            fresh("zeros"), fresh("batch_mean"), fresh("batch_var"), fresh("y"))
        extra_nodes += [
            helper.make_node("Sub", [node.input[1], node.input[1]], [zeros]),
            helper.make_node(
                "BatchNormalization", [node.input[0], node.input[1], node.input[2],
                                       zeros, zeros],
                [unused, batch_mean, batch_var], name=fresh("batch_statistics"),
                epsilon=_attribute(
                    node, "epsilon", 1e-5), momentum=0.0, training_mode=1),
        ]
        size_x, size_c, count = fresh("size_x"), fresh("size_c"), fresh("count")
        count_f, dof = fresh("count_f"), fresh("dof")
        scaled, correction = fresh("scaled"), fresh("correction")
        extra_nodes += [
            # M - 1 = size(X) / C - 1
            helper.make_node("Size", [node.input[0]], [size_x]),
            helper.make_node("Size", [node.input[1]], [size_c]),
            helper.make_node("Div", [size_x, size_c], [count]),
            helper.make_node("Cast", [count], [count_f], to=elem_type),
            helper.make_node("Sub", [count_f, one], [dof]),
            # out2 = m var + (1 - m) var(X); + (1 - m) var(X) / (M - 1)
            # gives m var + (1 - m) var(X) M / (M - 1)
            helper.make_node("Mul", [batch_var, rest], [scaled]),
            helper.make_node("Div", [scaled, dof], [correction]),
            helper.make_node("Add", [node.output[2], correction],
                             [updated_name(var)]),
            helper.make_node("Identity", [node.output[1]], [updated_name(mean)]),
        ]
    graph.node.extend(extra_nodes)
    graph.initializer.extend(extra_inits)
    for name in buffers:
        init = inits[name]
        graph.output.append(helper.make_tensor_value_info(
            updated_name(name), init.data_type, list(init.dims)))
    initial = {name: numpy_helper.to_array(inits[name]) for name in buffers}
    if as_inputs:
        kept = [i for i in graph.initializer if i.name not in set(buffers)]
        del graph.initializer[:]
        graph.initializer.extend(kept)
        # an export with keep_initializers_as_inputs=True lists them already
        inputs = [i for i in graph.input if i.name not in set(buffers)]
        del graph.input[:]
        graph.input.extend(inputs)
        graph.input.extend(helper.make_tensor_value_info(
            name, inits[name].data_type, list(inits[name].dims)) for name in buffers)
    return new, buffers, initial


def inference_mode(model, drop_outputs=()):
    """The inference graph of a training graph: BatchNormalization nodes in
    inference mode (``training_mode=0``, one output: they normalize with the
    running statistics), Dropout without its ``training_mode`` input (the
    identity), the outputs ``drop_outputs`` removed and the nodes no output
    needs any more pruned.

    Parameters
    ----------
    model : onnx.ModelProto
        Not modified.
    drop_outputs : iterable of str, default=()
        Graph outputs to remove; the updated running statistics of
        :func:`with_running_statistics_updates` always are.

    Returns
    -------
    onnx.ModelProto
        A copy (``model`` itself is returned when nothing changes).
    """
    drop = set(drop_outputs) | {
        updated_name(n) for node in model.graph.node if _is_batchnorm(node)
        for n in node.input[3:5]}
    changes = bool(drop & {o.name for o in model.graph.output})
    for node in model.graph.node:
        if _training_batchnorm(node) or (
                _is_batchnorm(node) and len([o for o in node.output if o]) > 1):
            changes = True
        elif node.op_type == "Dropout" and node.domain in _DEFAULT_DOMAINS \
                and len(node.input) >= 3 and node.input[2]:
            changes = True
    if not changes:
        return model
    new = onnx.ModelProto()
    new.CopyFrom(model)
    graph = new.graph
    for node in graph.node:
        if _is_batchnorm(node):
            for att in node.attribute:
                if att.name == "training_mode":
                    att.i = 0
            del node.output[1:]
        elif node.op_type == "Dropout" and node.domain in _DEFAULT_DOMAINS:
            del node.input[2:]
    outputs = [o for o in graph.output if o.name not in drop]
    del graph.output[:]
    graph.output.extend(outputs)
    _prune(graph)
    return new


def _prune(graph):
    """Remove the nodes no graph output needs, and the initializers no kept
    node reads."""
    needed = {o.name for o in graph.output}
    kept = []
    for node in reversed(graph.node):
        if needed & set(node.output):
            kept.append(node)
            needed |= {i for i in node.input if i} | set(implicit_inputs(node))
    kept.reverse()
    del graph.node[:]
    graph.node.extend(kept)
    inputs = {i.name for i in graph.input}
    inits = [i for i in graph.initializer if i.name in needed or i.name in inputs]
    del graph.initializer[:]
    graph.initializer.extend(inits)
