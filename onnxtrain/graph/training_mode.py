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

import onnx
from onnx import helper, numpy_helper

from .broadcasts import per_channel
from .builder import GraphBuilder, copy_fields, opset_of
from .scopes import without_unread
from .shapes import infer_value_types

__all__ = ["running_statistics", "batchnorm_buffers", "updated_name",
           "with_running_statistics_updates", "inference_mode",
           "reads_batch_statistics", "NODE_STATISTICS"]

_DEFAULT_DOMAINS = ("", "ai.onnx")


def _is_batchnorm(node):
    return node.op_type == "BatchNormalization" and node.domain in _DEFAULT_DOMAINS


_HELPER = "bn_update__"  # prefix of the names of the update nodes
_MASK = "bn_mask__"  # prefix of the Mul(statistic, 0) nodes
#: Prefix of the name of a training-mode BatchNormalization node whose
#: running-statistics outputs are its batch statistics (momentum 0), set by
#: ``with_running_statistics_updates(node_statistics=True)``.
NODE_STATISTICS = "bn_statistics__"


def _training_batchnorm(node):
    return _is_batchnorm(node) and any(
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
    masks = _masks(model.graph)
    buffers = []
    for node in model.graph.node:
        if not _training_batchnorm(node):
            continue
        for name in node.input[3:5]:
            name = masks.get(name, name)
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


def _masks(graph):
    """``zeros name -> statistic name`` of the zeros made from each
    statistic that :func:`with_running_statistics_updates` feeds
    BatchNormalization (``Mul(statistic, 0)``, then, for a node reading its
    batch statistics, a ``Where`` turning its NaNs into zeros)."""
    masks = {}
    for n in graph.node:
        if n.name.startswith(_MASK) and n.op_type == "Mul":
            masks[n.output[0]] = n.input[0]
        elif n.name.startswith(_MASK) and n.op_type == "Where" and n.input[1] in masks:
            masks[n.output[0]] = masks[n.input[1]]
    return masks


def reads_batch_statistics(node):
    """Whether a BatchNormalization node's running-statistics outputs are
    its batch's mean and population variance, for the gradient rule to read
    (see :func:`with_running_statistics_updates`)."""
    return node.name.startswith(NODE_STATISTICS) and \
        _attribute(node, "momentum", 0.9) == 0


def updated_name(buffer):
    """Name of the output holding ``buffer`` after a training step."""
    return f"{buffer}__new"


def with_running_statistics_updates(model, as_inputs=True, node_statistics=False,
                                    types=None):
    """A copy of ``model`` whose training steps also output the updated
    running statistics.

    For each BatchNormalization node in training mode with momentum ``m``
    (PyTorch exports ``m = 1 - torch_momentum``, 0.9 by default), over the
    ``M = size(X) / C`` values of each channel:

    - ``running_mean <- m * running_mean + (1 - m) * mean(X)``;
    - ``running_var <- m * running_var + (1 - m) * var(X) * M / (M - 1)``:
      the unbiased batch variance, as PyTorch's ``BatchNorm`` updates it
      (ONNX's reference uses the population variance ``var(X)``).

    By default the graph computes both from X with standard ops (the same
    on every execution provider). With ``node_statistics=True`` the node
    computes them: its momentum is set to 0, so that its running-statistics
    outputs are the batch's mean and population variance (ONNX
    BatchNormalization-15: ``running_mean = input_mean * momentum +
    mean * (1 - momentum)``), which the update and the gradient rule
    (``autodiff/rules/normalization.py``, for the nodes whose name starts
    with :data:`NODE_STATISTICS`) read instead of computing them again:
    four passes over X fewer per node in a training step. onnxruntime's
    CPU kernel follows the standard; its CUDA kernel (cuDNN) outputs the
    unbiased variance, hence a CPU-only option.

    Either way the node reads zeros in place of the statistics, a new
    value each run (its training-mode output ``Y`` does not depend on them,
    and onnxruntime writes its running-statistics outputs over those inputs
    in place); :func:`inference_mode` restores them.

    Parameters
    ----------
    model : onnx.ModelProto
        Not modified.
    as_inputs : bool, default=True
        True: the running statistics become graph inputs appended after the
        model's inputs (no longer initializers), so that a training loop
        feeds their current values. False: they stay initializers (the
        caller turns them into inputs, as the artifacts do with parameters).
    node_statistics : bool, default=False
        Whether the update and the gradients read the batch statistics from
        the node's outputs (see above; onnxruntime's CPU kernel only).
    types : dict, default=None
        ``model``'s :func:`~onnxtrain.graph.infer_value_types` if known
        (shape inference runs otherwise).

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
        opset 14 (whose extra outputs are not the running statistics), or
        one whose input rank shape inference does not find.
    """
    buffers = batchnorm_buffers(model)
    if not buffers:
        new = onnx.ModelProto()
        new.CopyFrom(model)
        return new, [], {}
    opset = opset_of(model)
    if opset is None or opset < 14:
        raise ValueError("BatchNormalization in training mode needs opset >= 14 "
                         f"(the model has opset {opset}): export it again with "
                         "opset_version >= 14.")
    source = model.graph
    inits = {i.name: i for i in source.initializer}
    computed = [b for b in buffers if b not in inits]
    if computed:
        raise ValueError(f"The running statistics {computed} are not "
                         "initializers: their initial values are unknown.")
    taken = {n for node in source.node for n in list(node.input) + list(node.output)}
    taken |= set(inits) | {i.name for i in source.input}
    types = infer_value_types(model) if types is None else types
    updates = GraphBuilder(opset, taken, types, prefix=_HELPER)
    masks = GraphBuilder(opset, taken, types, prefix=_MASK)
    nodes = []
    # onnxruntime refuses two nodes of one name (unnamed ones too)
    node_names = GraphBuilder(opset, {n.name for n in source.node})
    for original in source.node:
        node = original
        if _training_batchnorm(original):
            node = onnx.NodeProto()
            node.CopyFrom(original)
            start = len(masks.nodes)
            elem_type = inits[node.input[4]].data_type
            _name_outputs(masks, node)
            _momentum_update(updates, node, types, elem_type, node_statistics)
            _read_zeros(masks, node, elem_type, finite=node_statistics)
            if node_statistics:
                node.name = node_names.unique_name(
                    f"{NODE_STATISTICS}{node.name or 'BatchNormalization'}")
            nodes += masks.nodes[start:]
        nodes.append(node)
    # the new model gets only what it keeps, each copied once (a copy of the
    # whole model whose initializers were then replaced held them twice:
    # upb frees a message's memory only with the whole message, which
    # raised the peak of a fit's build)
    new = onnx.ModelProto()
    copy_fields(new, model, skip=("graph",))
    graph = copy_fields(new.graph, source,
                        skip=("node", "initializer", "input", "output"))
    graph.node.extend(nodes + updates.nodes)
    dropped = set(buffers) if as_inputs else set()
    graph.initializer.extend(i for i in source.initializer if i.name not in dropped)
    graph.initializer.extend(masks.initializers + updates.initializers)
    # an export with keep_initializers_as_inputs=True lists the buffers as
    # inputs already: they move to the end
    graph.input.extend(i for i in source.input if i.name not in dropped)
    graph.output.extend(source.output)
    for name in buffers:
        init = inits[name]
        graph.output.append(helper.make_tensor_value_info(
            updated_name(name), init.data_type, list(init.dims)))
    initial = {name: numpy_helper.to_array(inits[name]) for name in buffers}
    if as_inputs:
        graph.input.extend(helper.make_tensor_value_info(
            name, inits[name].data_type, list(inits[name].dims)) for name in buffers)
    return new, buffers, initial


def _momentum_update(g, node, types, elem_type, node_statistics=False):
    """Emit ``updated_name`` of the node's running mean and variance (see
    :func:`with_running_statistics_updates`) into the builder ``g``; with
    ``node_statistics`` from the node's outputs, its momentum set to 0 (they
    are then the batch statistics)."""
    x, scale, mean, var = (node.input[i] for i in (0, 1, 3, 4))
    shape = types.get(x, (None, None))[1]
    if shape is None:
        raise ValueError(f"The rank of the input {x!r} of BatchNormalization "
                         f"node {node.name!r} is unknown: add its shape to the "
                         "model (onnx.shape_inference).")
    momentum = _attribute(node, "momentum", 0.9)
    count = g.cast(g.op("Div", g.op("Size", x), g.op("Size", scale)), elem_type)
    correction = g.op("Div", count, g.op("Sub", count, g.const(1, elem_type)))
    if node_statistics:
        batch_mean, batch_var = node.output[1], node.output[2]
    else:
        axes = [0] + list(range(2, len(shape)))
        batch_mean = g.reduce("ReduceMean", x, axes)
        # the centering of the BatchNormalization gradient rule
        # (autodiff/rules/normalization.py), shared by common-subexpression
        # elimination
        centered = g.op("Sub", x, per_channel(g, batch_mean, shape))
        batch_var = g.reshape_like(
            g.reduce("ReduceMean", g.op("Mul", centered, centered), axes), var)
        batch_mean = g.reshape_like(batch_mean, mean)
    unbiased = g.op("Mul", batch_var, correction)
    for old, batch in ((mean, batch_mean), (var, unbiased)):
        if momentum == 0:
            # no Mul(statistic, 0): onnxruntime would merge it with the mask
            # of _read_zeros, whose buffer the node overwrites in place
            g.op("Identity", batch, outputs=[g.reserve(updated_name(old))])
        else:
            g.op("Add", g.op("Mul", old, g.const(momentum, elem_type)),
                 g.op("Mul", batch, g.const(1 - momentum, elem_type)),
                 outputs=[g.reserve(updated_name(old))])
    if node_statistics:
        _set_momentum(node, 0.0)


def _set_momentum(node, value):
    kept = [a for a in node.attribute if a.name != "momentum"]
    del node.attribute[:]
    node.attribute.extend(kept + [helper.make_attribute("momentum", value)])


def _name_outputs(g, node):
    """Give the node's running-statistics outputs names (new ones from
    ``g`` where the model leaves them out)."""
    while len(node.output) < 3:
        node.output.append("")
    for k in (1, 2):
        if not node.output[k]:
            node.output[k] = g.unique_name("statistic")


def _read_zeros(g, node, elem_type, finite=False):
    """Make ``node`` read ``Mul(statistic, 0)`` instead of its running
    statistics (nodes emitted into ``g``): onnxruntime writes the
    running-statistics outputs over those inputs in place (over an
    initializer too), while the update reads the statistics, so
    each input is a new value of its own every run. Its training-mode
    output ``Y`` does not depend on them; :func:`inference_mode` undoes it.
    ``finite``: the zeros also for a statistic that is inf or NaN (a batch
    variance that overflowed), which ``Mul`` makes NaN: the node's
    running-statistics outputs, ``input * momentum + batch * (1 -
    momentum)``, are NaN then even at momentum 0, where the gradient rule
    reads them."""
    zero = g.const(0, elem_type)
    for k in (3, 4):
        product = g.op("Mul", node.input[k], zero)
        node.input[k] = g.op("Where", g.op("Equal", product, zero), product, zero) \
            if finite else product


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
    masks = _masks(model.graph)
    drop = set(drop_outputs) | {
        updated_name(masks.get(n, n)) for node in model.graph.node
        if _is_batchnorm(node) for n in node.input[3:5]}
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
    masks = _masks(graph)
    for node in graph.node:
        if _is_batchnorm(node):
            if node.name.startswith(NODE_STATISTICS):
                node.name = node.name[len(NODE_STATISTICS):]
            for k in range(3, min(len(node.input), 5)):
                node.input[k] = masks.get(node.input[k], node.input[k])
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
    kept, needed = without_unread(list(graph.node), [o.name for o in graph.output])
    del graph.node[:]
    graph.node.extend(kept)
    inputs = {i.name for i in graph.input}
    inits = [i for i in graph.initializer if i.name in needed or i.name in inputs]
    del graph.initializer[:]
    graph.initializer.extend(inits)
