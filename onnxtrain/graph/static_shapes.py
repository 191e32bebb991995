"""Reshape targets known when the graph is built, written as constants.

Exporters compute a Reshape's target at run time from its input's shape:
``torch.onnx`` writes ``x.view(b, s, h, d)`` as Shape, Gather, Unsqueeze
and Concat nodes when ``b`` is the symbolic batch dimension (eight nodes
per attention layer of a BERT encoder). When shape inference knows every
dimension of the Reshape's output but at most one, the target is a
constant, with -1 for the unknown dimension (onnx's Reshape infers it from
the input's size), and the nodes that computed it go: fewer nodes to
differentiate, to write in every training graph and to run at every step.
The values are the same: the output keeps the shape inference gave it.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from .scopes import node_reads

__all__ = ["fold_reshape_targets"]


def _target(shape):
    """The constant target of a Reshape whose output has ``shape`` (ints
    for static dimensions), or None: more than one unknown dimension, or a
    static 0 (which the target would read as 'copy the input's')."""
    if shape is None:
        return None
    target = [d if isinstance(d, int) and not isinstance(d, bool) and d >= 0 else -1
              for d in shape]
    if target.count(-1) > 1 or 0 in target:
        return None
    return target


def fold_reshape_targets(model, types, in_place=False):
    """``model`` with the computed targets of its Reshapes replaced by
    constants where ``types`` knows the output's shape (see the module's
    docstring), and the nodes only those targets read removed.

    Parameters
    ----------
    model : onnx.ModelProto
        Not modified unless ``in_place``.
    types : dict
        ``model``'s :func:`~onnxtrain.graph.infer_value_types`; not
        modified.
    in_place : bool, default=False
        Edit ``model`` itself (a caller's own copy: no copy of its weights).

    Returns
    -------
    model : onnx.ModelProto
        ``model`` itself when nothing is folded or ``in_place``, else a copy.
    types : dict
        ``types`` itself, or a copy with the new constants' types.
    """
    graph = model.graph
    constants = {i.name for i in graph.initializer}
    constants |= {n.output[0] for n in graph.node if n.op_type == "Constant"}
    folds = {}
    for index, node in enumerate(graph.node):
        if node.op_type != "Reshape" or node.domain not in ("", "ai.onnx") \
                or len(node.input) < 2 or node.input[1] in constants:
            continue
        target = _target(types.get(node.output[0], (None, None))[1])
        if target is not None:
            folds[index] = target
    if not folds:
        return model, types
    if not in_place:
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        model = copy
        graph = model.graph
    readers = _reader_counts(graph)
    taken = set(readers) | constants | {o for node in graph.node for o in node.output}
    types = dict(types)
    replaced = []
    for index, target in folds.items():
        node = graph.node[index]
        name, k = f"{node.output[0]}__target", 0
        while name in taken:
            k += 1
            name = f"{node.output[0]}__target{k}"
        taken.add(name)
        readers[node.input[1]] -= 1
        readers[name] = 1
        replaced.append(node.input[1])
        graph.initializer.append(numpy_helper.from_array(
            np.array(target, dtype=np.int64), name))
        types[name] = (TensorProto.INT64, (len(target),))
        node.input[1] = name
    _remove_unread(graph, replaced, readers)
    return model, types


def _reader_counts(graph):
    """name -> number of nodes reading it (a subgraph's reads from the
    enclosing graph included), plus one for each graph output."""
    readers = {}
    for node in graph.node:
        for name in _reads(node):
            readers[name] = readers.get(name, 0) + 1
    for output in graph.output:
        readers[output.name] = readers.get(output.name, 0) + 1
    for value in graph.input:
        readers.setdefault(value.name, 0)
    return readers


def _reads(node):
    """The names ``node`` reads, once per input slot (a Concat reading a
    value twice counts twice), or once each for a node with subgraphs."""
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
           for a in node.attribute):
        return node_reads(node)
    return [name for name in node.input if name]


def _remove_unread(graph, names, readers):
    """Remove the nodes producing ``names`` and their ancestors once nothing
    reads their outputs (nor a graph output is one of them); ``readers``
    (:func:`_reader_counts`) is updated."""
    producer = {o: i for i, node in enumerate(graph.node) for o in node.output if o}
    dead, stack = set(), [producer[n] for n in names if n in producer]
    while stack:
        i = stack.pop()
        node = graph.node[i]
        if i in dead or any(readers.get(o, 0) for o in node.output if o):
            continue
        dead.add(i)
        for name in _reads(node):
            readers[name] -= 1
            if not readers[name] and name in producer:
                stack.append(producer[name])
    for i in sorted(dead, reverse=True):
        del graph.node[i]
