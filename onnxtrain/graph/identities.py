"""Remove the Dropout nodes that copy their input.

A Dropout whose ratio is the constant 0, or whose ``training_mode`` is
omitted or the constant False, returns its input unchanged (its mask is all
true). Exporters write one per ``nn.Dropout`` even when the probability is 0
(transformers' ``BertConfig(hidden_dropout_prob=0)``: 73 of them in a
24-layer encoder), and each would cost the training graph its node and the
reverse pass a rule call. onnxruntime-training's graph transformers remove
them too.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from .builder import constant_node_value
from .scopes import subgraph_outer_reads

__all__ = ["remove_identity_dropouts"]


def _constant_values(graph):
    """name -> the initializers (TensorProto) and the Constant nodes
    (NodeProto), both converted when a Dropout reads them (an export holds
    thousands of Constant nodes and a few Dropouts)."""
    values = {i.name: i for i in graph.initializer}
    values.update((node.output[0], node) for node in graph.node
                  if node.op_type == "Constant" and node.domain in ("", "ai.onnx"))
    return values


def _value(constant):
    """numpy value of an initializer or a Constant node (None when it has
    none onnxtrain reads: sparse, string)."""
    if isinstance(constant, onnx.TensorProto):
        return numpy_helper.to_array(constant)
    return constant_node_value(constant)


def _is_identity(node, constants, opset):
    """Whether a Dropout node of ``opset`` (>= 12) copies its input."""
    if node.op_type != "Dropout" or node.domain not in ("", "ai.onnx") or opset < 12:
        return False
    ratio = node.input[1] if len(node.input) > 1 else ""
    training = node.input[2] if len(node.input) > 2 else ""
    if not training:
        return True
    for name, off in ((training, False), (ratio, 0)):
        constant = constants.get(name) if name else None
        value = None if constant is None else _value(constant)
        if value is not None:
            value = np.asarray(value).reshape(-1)
            if value.size == 1 and value[0] == off:
                return True
    return False


def remove_identity_dropouts(model, opset, in_place=False):
    """``model`` without the Dropout nodes that copy their input.

    Kept: a Dropout whose mask is read or a graph output, whose output is a
    graph output or is read inside a subgraph (outer-scope references are
    not renamed here).

    Parameters
    ----------
    model : onnx.ModelProto
        Not modified unless ``in_place``.
    opset : int
        Default-domain opset of ``model`` (before 12 Dropout has no
        ``training_mode`` input and nothing is removed).
    in_place : bool, default=False
        Edit ``model`` itself (a caller's own copy: no copy of its weights).

    Returns
    -------
    onnx.ModelProto
        ``model`` itself when nothing is removed or ``in_place``, else a
        copy; its nodes read each removed Dropout's input in place of its
        output.
    """
    rename = _identity_dropouts(model.graph, opset)
    if not rename:
        return model
    if not in_place:
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        model = copy
    nodes = model.graph.node
    removed = [i for i, node in enumerate(nodes)
               if node.op_type == "Dropout" and node.output[0] in rename]
    for index in reversed(removed):
        del nodes[index]
    for node in nodes:
        for i, name in enumerate(node.input):
            if name in rename:
                node.input[i] = _resolve(rename, name)
    return model


def _identity_dropouts(graph, opset):
    """output -> input of the Dropouts of ``graph`` to remove."""
    constants = _constant_values(graph)
    candidates = [n for n in graph.node if _is_identity(n, constants, opset)]
    if not candidates:
        return {}
    outputs = {o.name for o in graph.output}
    inner = set().union(*map(subgraph_outer_reads, graph.node))
    read = inner.union(*(node.input for node in graph.node))
    protected = outputs | inner
    rename = {}
    for node in candidates:
        mask = node.output[1] if len(node.output) > 1 else ""
        if (mask and (mask in read or mask in outputs)) or \
                node.output[0] in protected:
            continue
        rename[node.output[0]] = node.input[0]
    return rename


def _resolve(rename, name):
    """Follow ``rename`` through chains of removed Dropouts."""
    while name in rename:
        name = rename[name]
    return name
