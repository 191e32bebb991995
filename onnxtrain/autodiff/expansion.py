"""Differentiate a node through other nodes that compute it.

Several rules do not write a gradient formula: they emit nodes computing
the node's outputs from its inputs (an expansion: a function body, the
equations of a recurrent op, a branch or body of control flow recomputed
under fresh names) and run the reverse pass over them. This module holds
what they share: a builder for subgraphs, the types of the new values, the
reverse pass over the expansion and the removal of the recomputed nodes no
gradient reads.
"""
from __future__ import annotations

from collections import ChainMap

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..graph import GraphBuilder, clean_shape, infer_value_types
from ..graph.scopes import node_reads, without_unread
from .backward import (_accumulate, _check_rules, _dependents, _path_nodes,
                       reverse_pass)

__all__ = ["differentiate_expansion", "differentiate_nodes", "outer_reads",
           "prune_unread", "record_types", "sub_builder"]


def sub_builder(ctx):
    """A builder for a subgraph sharing the outer builder's namespace (every
    name stays unique across scopes) and knowing the outer types."""
    sg = GraphBuilder(ctx.opset, (), ctx.g.types)
    sg._used = ctx.g._used  # noqa: SLF001 - one namespace for all scopes
    return sg


def outer_reads(nodes):
    """Names ``nodes`` read that none of them produced before (in order of
    first read; subgraph reads not included)."""
    produced, reads = set(), []
    for node in nodes:
        for name in node.input:
            if name and name not in produced and name not in reads:
                reads.append(name)
        produced.update(o for o in node.output if o)
    return reads


def prune_unread(nodes, start, stop):
    """Drop the nodes of ``nodes[start:stop]`` (in place) whose outputs no
    later node reads, directly or from one of its subgraphs."""
    needed = set().union(*map(node_reads, nodes[stop:]))
    nodes[start:stop] = without_unread(nodes[start:stop], needed)[0]


def record_types(g, nodes, inputs, outputs, constants=None, refine=False,
                 clean=True):
    """Infer the types of the values ``nodes`` compute into ``g.types``.

    For onnx shape inference only, the nodes become a model whose graph
    inputs are ``inputs`` and whose graph outputs are ``outputs``.

    Parameters
    ----------
    g : GraphBuilder
        Its ``types`` type the inputs and receive the inferred types; its
        opset is the model's (other domains are imported at version 1).
    nodes : list of onnx.NodeProto
    inputs : list of str
        Values the nodes read from outside. Those with a value in
        ``constants`` are given as initializers (so that inference sees the
        axes of an Unsqueeze, the sizes of a Split); the others are typed
        from ``g.types`` (no type when unknown).
    outputs : list of str
        Values declared as graph outputs (inputs among them are left out).
    constants : mapping of str to ndarray, default=None
        Values of constant inputs.
    refine : bool, default=False
        Whether the values the nodes produce take the inferred type even
        when ``g.types`` holds one (a second call, after constant folding,
        refines what the first found). Other names keep a type they have.
    clean : bool, default=True
        Whether the input shapes lose the dim names inference invented
        (see :func:`~onnxtrain.graph.clean_shape`); False keeps them, so
        that the values inferred share those dims with the outer graph.

    Returns
    -------
    dict of str to ndarray
        The constants given as initializers.
    """
    constants = constants or {}
    values, vis = {}, []
    for name in dict.fromkeys(i for i in inputs if i):
        if name in constants:
            values[name] = np.asarray(constants[name])
            continue
        info = g.types.get(name)
        if info is None:
            type_proto = onnx.TypeProto()
        else:
            shape = clean_shape(info[1]) if clean else info[1]
            type_proto = helper.make_tensor_type_proto(info[0], shape)
        vis.append(helper.make_value_info(name, type_proto))
    domains = {n.domain for n in nodes if n.domain not in ("", "ai.onnx")}
    graph = helper.make_graph(
        nodes, "expansion", vis,
        [helper.make_value_info(o, onnx.TypeProto())
         for o in dict.fromkeys(outputs) if o not in inputs],
        [numpy_helper.from_array(v, n) for n, v in values.items()])
    model = helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", g.opset)] + [
        helper.make_opsetid(d, 1) for d in sorted(domains)])
    produced = {o for n in nodes for o in n.output if o} if refine else set()
    for name, info in _infer_with_reshape_ranks(model).items():
        if name in produced:
            g.types[name] = info
        else:
            g.types.setdefault(name, info)
    return values


def _infer_with_reshape_ranks(model):
    """:func:`~onnxtrain.graph.infer_value_types`, plus the rank of a Reshape
    whose target shape is computed (a Shape of a value with a symbolic dim)
    and whose output shape inference left unknown: the length of that 1-D shape.
    Reshape before opset 14 does not read the shape data inference
    propagates (SoftmaxCrossEntropyLoss's body at opset 13 reshapes its
    log-probabilities back to ``Shape(scores)``). The ranks found are given
    as value infos and inference runs again, so that the readers of the
    Reshape are typed too."""
    types = infer_value_types(model)
    for _ in range(8):  # one more Reshape typed per round at the most
        hints = []
        for node in model.graph.node:
            if (node.op_type != "Reshape" or node.domain not in ("", "ai.onnx")
                    or types.get(node.output[0], (0, None))[1] is not None
                    or node.input[0] not in types):
                continue
            target = types.get(node.input[1])
            if target is None or target[1] is None or len(target[1]) != 1 \
                    or not isinstance(target[1][0], int):
                continue
            hints.append(helper.make_tensor_value_info(
                node.output[0], types[node.input[0]][0], [None] * target[1][0]))
        if not hints:
            break
        model.graph.value_info.extend(hints)
        types = infer_value_types(model)
    return types


def differentiate_nodes(g, nodes, grads, wrt, constants):
    """Append ``nodes`` to ``g``, then their gradient nodes.

    The reverse pass runs over ``nodes`` (an expansion: nodes computing
    values from outer ones, whose types :func:`record_types` recorded); the
    nodes of ``nodes`` no gradient node reads are then dropped.

    Parameters
    ----------
    g : GraphBuilder
        Receives the nodes.
    nodes : list of onnx.NodeProto
    grads : dict of str to list of str
        Gradient parts reaching values of ``nodes`` (outputs of the
        expansion); those not depending on ``wrt`` are ignored.
    wrt : list of str
        Outer values the gradients are wanted of.
    constants : dict of str to ndarray
        Known values (initializers, Constant outputs) the rules may read.

    Returns
    -------
    dict of str to list of str
        The gradient parts reaching every value, ``wrt`` among them (sum
        them with :func:`~onnxtrain.autodiff.backward._accumulate`).

    Raises
    ------
    MissingVJPRuleError
        A node on the path has no VJP rule.
    """
    upstream = _dependents(nodes, list(wrt), g.types)
    grads = {n: parts for n, parts in grads.items() if n in upstream}
    path = _path_nodes(nodes, list(grads), upstream)
    _check_rules(path, upstream)
    start = len(g.nodes)
    g.nodes.extend(nodes)  # the expansion, recomputed from the outer values
    reverse_pass(g, path, grads, upstream, constants)
    prune_unread(g.nodes, start, start + len(nodes))
    return grads


def differentiate_expansion(ctx, nodes, outputs, grad_outputs, constants=()):
    """Gradients of the inputs of the node of ``ctx`` through its expansion.

    The VJP of an op defined by other ops (a function body, a recurrent
    op's equations): ``nodes`` compute the node's outputs from its inputs;
    they are recomputed in the gradient graph and the reverse pass runs
    over them (:func:`differentiate_nodes`).

    Parameters
    ----------
    ctx : VJPContext
        Context of the node differentiated.
    nodes : list of onnx.NodeProto
        The expansion, reading the node's inputs, with fresh names for its
        values, whose types are in ``ctx.g.types`` (see
        :func:`record_types`); not yet in ``ctx.g.nodes``.
    outputs : list of str
        The expansion's values standing for the node's outputs, in order.
    grad_outputs : tuple of (str or None)
        One gradient per node output (None: zero).
    constants : mapping of str to ndarray, default=()
        Values known in the expansion (its constants), added to those of
        ``ctx``.

    Returns
    -------
    tuple of (str or None)
        One gradient per node input; None where not needed (or for a
        repeated input, whose gradient its first occurrence receives).

    Raises
    ------
    MissingVJPRuleError
        A node of the expansion on the path has no VJP rule.
    """
    known = ChainMap(dict(constants), ctx.constants)
    wrt = [i for i, need in zip(ctx.inputs, ctx.needs_grad) if need]
    grads = {o: [gy] for o, gy in zip(outputs, grad_outputs) if gy}
    grads = differentiate_nodes(ctx.g, nodes, grads, wrt, known)
    result, seen = [], set()
    for name, need in zip(ctx.inputs, ctx.needs_grad):
        result.append(_accumulate(ctx.g, grads, name)
                      if need and name not in seen else None)
        seen.add(name)
    return tuple(result)
