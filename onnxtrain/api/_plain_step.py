"""The training model without gradient accumulation, for the calls that
overwrite the gradients (the first call, and every call after
``Module.lazy_reset_grad``, the usual training loop).

The training model of ``generate_artifacts`` ends each gradient with
``Where(lazy_reset_grad, grad, buffer + grad)``: a call that overwrites
still reads the buffer, adds it and selects, three passes over every
gradient. The variant built here drops those nodes and names the gradient
itself as the output (no copy), and has neither the buffer inputs nor the
``lazy_reset_grad`` input; everything else is the same graph, so its
outputs equal the training model's for ``lazy_reset_grad=True``.
"""
from __future__ import annotations

import onnx

from ..graph.scopes import subgraph_outer_reads

__all__ = ["without_accumulation"]


def without_accumulation(model, layout):
    """The training model ``model`` (layout ``layout``, the training-model
    metadata) without its accumulation nodes; None when the graph does not
    end its gradients as ``generate_artifacts`` writes them (a model from
    elsewhere is then run as it is)."""
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
    if not lazy or len(selects) != len(buffers):
        return None
    uses = {}
    for node in graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    inner = set().union(*map(subgraph_outer_reads, graph.node))
    drop, rename, copies = set(), {}, []
    for where in selects:
        grad, added, out = where.input[1], where.input[2], where.output[0]
        add = producers.get(added)
        if add is None or add.op_type != "Add" or uses.get(added) != 1 or \
                grad not in add.input or not set(add.input) & set(buffers):
            return None
        drop.update((id(where), id(add)))
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
    return new
