"""The training model without gradient accumulation, for the calls that
overwrite the gradients (the first call, and every call after
``Module.lazy_reset_grad``, the usual training loop).

The training model of ``generate_artifacts`` ends each gradient with
``Where(lazy_reset_grad, grad, buffer + grad)``: a call that overwrites
still reads the buffer, adds it and selects, three passes over every
gradient; a gradient written by a Gemm (a weight gradient) is written
accumulated by that Gemm, its C being ``Where(lazy_reset_grad, 0,
buffer)``. The variant built here drops those nodes (and those C inputs)
and names the gradient itself as the output (no copy), and has neither the
buffer inputs nor the ``lazy_reset_grad`` input; everything else is the
same graph, so its outputs equal the training model's for
``lazy_reset_grad=True``.

On the CPU, a gradient ending in a Reshape of a product used nowhere else
(a Conv's weight gradient: a GEMM's (M, C K) result reshaped to the
weight's (M, C, kh, kw)) is output as the product itself
(:func:`unreshaped_outputs`): onnxruntime writes a Reshape's output into a
bound buffer by a copy, where the product's kernel writes it directly; the
module binds a view of the gradient buffer of the product's shape.
"""
from __future__ import annotations

import numpy as np
import onnx

from ..graph.scopes import subgraph_outer_reads
from ..graph.shapes import infer_value_types

__all__ = ["without_accumulation", "unreshaped_outputs"]

#: Ops whose output onnxruntime may alias to their input: an output
#: produced by one of them would be copied into a bound buffer as well.
_ALIASING = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"}


def without_accumulation(model, layout, unreshape=False):
    """The training model ``model`` (layout ``layout``, the training-model
    metadata) without its accumulation nodes; None when the graph does not
    end its gradients as ``generate_artifacts`` writes them (a model from
    elsewhere is then run as it is). ``unreshape``: also output the
    products behind the gradients' final Reshapes
    (:func:`unreshaped_outputs`), for a caller that binds views of the
    gradient buffers of their shapes."""
    lazy = layout.get("lazy_reset_grad")
    buffers = list(layout.get("buffers", ())) + list(
        layout.get("input_gradient_buffers", ()))
    graph = model.graph
    outputs = {o.name for o in graph.output}
    producers = {}
    for node in graph.node:
        for name in node.output:
            producers[name] = node
    selects = [n for n in graph.node if n.op_type == "Where" and n.input[0] == lazy
               and n.output[0] in outputs]
    uses = {}
    for node in graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    folded = _folded_gemms(graph, lazy, set(buffers), outputs, uses)
    groups = _groups(graph, lazy, set(buffers), outputs, uses, producers)
    if not lazy or folded is None or groups is None or len(selects) + len(folded) + \
            sum(len(pairs) for _, pairs in groups) != len(buffers):
        return None
    inner = set().union(*map(subgraph_outer_reads, graph.node))
    drop, rename, copies = {id(mask) for mask in folded.values()}, {}, []
    pairs = []  # (gradient, output)
    for nodes, group in groups:
        drop.update(map(id, nodes))
        pairs.extend(group)
    for where in selects:
        grad, added, out = where.input[1], where.input[2], where.output[0]
        add = producers.get(added)
        if add is None or add.op_type != "Add" or uses.get(added) != 1 or \
                grad not in add.input or not set(add.input) & set(buffers):
            return None
        drop.update((id(where), id(add)))
        pairs.append((grad, out))
    for grad, out in pairs:
        if grad in producers and grad not in outputs and grad not in rename \
                and grad not in inner:
            rename[grad] = out  # the gradient's node writes the output
        else:  # a graph input, an output already, or shared: one copy
            copies.append(onnx.helper.make_node("Identity", [grad], [out]))
    new = onnx.ModelProto()
    new.CopyFrom(model)
    del new.graph.node[:]
    for node in graph.node:
        if id(node) in drop:
            continue
        copy = new.graph.node.add()
        copy.CopyFrom(node)
        if id(node) in folded:
            del copy.input[2:]  # C: the masked buffer, zeros in this variant
        for i, name in enumerate(copy.input):
            copy.input[i] = rename.get(name, name)
        for i, name in enumerate(copy.output):
            copy.output[i] = rename.get(name, name)
    for copy in copies:  # the gradient may be renamed by another output
        copy.input[0] = rename.get(copy.input[0], copy.input[0])
    new.graph.node.extend(copies)
    removed = set(buffers) | {lazy}
    kept = [i for i in new.graph.input if i.name not in removed]
    del new.graph.input[:]
    new.graph.input.extend(kept)
    return _unreshape(new, set(layout["gradients"])) if unreshape else new


def _folded_gemms(graph, lazy, buffers, outputs, uses):
    """id(Gemm) -> its C's node, for the Gemms writing an accumulated
    gradient themselves (``onnxblock._training._fold_into_gemm``): C is
    ``Where(lazy, 0, buffer)`` read by that Gemm only. None when a Where
    reads ``lazy`` and a buffer otherwise (a pattern not known here)."""
    producers, readers = {}, {}
    for node in graph.node:
        for name in node.output:
            producers[name] = node
        if len(node.input) == 3 and node.op_type == "Gemm":
            readers[node.input[2]] = node
    inits = {i.name: i for i in graph.initializer}
    found = {}
    for node in graph.node:
        if node.op_type != "Where" or node.input[0] != lazy or \
                node.input[2] not in buffers:
            continue
        gemm = readers.get(node.output[0])
        if gemm is None or gemm.output[0] not in outputs or \
                uses.get(node.output[0]) != 1 or uses.get(node.input[2]) != 1 or \
                not _is_zero(inits, producers, node.input[1]):
            return None
        found[id(gemm)] = node
    return found


def _groups(graph, lazy, buffers, outputs, uses, producers):
    """[(nodes, [(gradient, output)])] for the vectors accumulated together
    (``onnxblock._training._accumulate_together``): ``Split(Where(lazy, G,
    Add(B, G)))`` with G a Concat of the gradients and B one of the
    buffers, the Split writing the outputs. None when such a Split does
    not read exactly that."""
    found = []
    for split in graph.node:
        where = producers.get(split.input[0]) if split.op_type == "Split" else None
        if where is None or where.op_type != "Where" or where.input[0] != lazy:
            continue
        if not set(split.output) <= outputs:
            return None
        add, grads = producers.get(where.input[2]), producers.get(where.input[1])
        if add is None or add.op_type != "Add" or where.input[1] not in add.input:
            return None
        other = add.input[0] if add.input[1] == where.input[1] else add.input[1]
        stacked = producers.get(other)
        if grads is None or stacked is None or \
                not grads.op_type == stacked.op_type == "Concat" or \
                len(grads.input) != len(split.output) or \
                not set(stacked.input) <= buffers or \
                len(set(stacked.input)) != len(stacked.input) or \
                uses.get(split.input[0]) != 1 or uses.get(where.input[2]) != 1 or \
                uses.get(other) != 1 or uses.get(where.input[1]) != 2:
            return None
        found.append(([split, where, add, grads, stacked],
                      list(zip(grads.input, split.output))))
    return found


def _is_zero(inits, producers, name):
    """Whether ``name`` is a constant (an initializer or a Constant node)
    whose every element is 0."""
    tensor = inits.get(name)
    if tensor is None and name in producers and producers[name].op_type == "Constant":
        tensor = next((a.t for a in producers[name].attribute if a.name == "value"), None)
    if tensor is None:
        return False
    return not np.any(onnx.numpy_helper.to_array(tensor))


def _unreshape(model, gradients):
    """``model`` (modified) with every gradient output ``Reshape(v)`` of a
    ``v`` of static shape, the output of a kernel that writes its own
    output (not an aliasing op) and read by nothing else, renamed to the
    output and the Reshape dropped; the output declared with ``v``'s
    shape."""
    graph = model.graph
    producers = {name: node for node in graph.node for name in node.output}
    uses = {}
    for node in graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    protected = {o.name for o in graph.output} | {i.name for i in graph.input} | \
        {i.name for i in graph.initializer}
    protected |= set().union(*map(subgraph_outer_reads, graph.node))
    candidates = {}
    for output in graph.output:
        reshape = producers.get(output.name)
        if output.name not in gradients or reshape is None or \
                reshape.op_type != "Reshape":
            continue
        source = producers.get(reshape.input[0])
        if source is None or source.op_type in _ALIASING or source.domain not in ("", "ai.onnx") \
                or uses.get(reshape.input[0]) != 1 or reshape.input[0] in protected:
            continue
        candidates[output.name] = (reshape, source)
    if not candidates:
        return model
    types = infer_value_types(model)
    shapes = {}
    for name, (reshape, _) in candidates.items():
        _, shape = types.get(reshape.input[0], (None, None))
        _, target = types.get(name, (None, None))
        if shape is not None and target is not None and \
                all(isinstance(d, int) for d in list(shape) + list(target)) and \
                int(np.prod(shape)) == int(np.prod(target)):
            shapes[name] = list(shape)
    dropped = {id(candidates[name][0]) for name in shapes}
    kept = [node for node in graph.node if id(node) not in dropped]
    for name in shapes:
        source = candidates[name][1]
        index = list(source.output).index(candidates[name][0].input[0])
        source.output[index] = name
    del graph.node[:]
    graph.node.extend(kept)
    stale = set(shapes) | {candidates[name][0].input[0] for name in shapes}
    infos = [v for v in graph.value_info if v.name not in stale]
    del graph.value_info[:]
    graph.value_info.extend(infos)
    for output in graph.output:
        if output.name in shapes:
            dims = output.type.tensor_type.shape
            del dims.dim[:]
            for d in shapes[output.name]:
                dims.dim.add().dim_value = d
    return model


def unreshaped_outputs(model, shapes):
    """Output name -> the static shape ``model`` declares for it, for the
    outputs of ``shapes`` (name -> the gradient's shape) declared with
    another shape of the same size (:func:`_unreshape`'s)."""
    found = {}
    for output in model.graph.output:
        if output.name not in shapes or not output.type.HasField("tensor_type"):
            continue
        dims = output.type.tensor_type.shape.dim
        declared = [d.dim_value if d.HasField("dim_value") else None for d in dims]
        expected = list(shapes[output.name])
        if None not in declared and declared != expected and \
                int(np.prod(declared)) == int(np.prod(expected)):
            found[output.name] = declared
    return found
