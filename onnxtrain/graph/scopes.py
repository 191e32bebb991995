"""Names a node reads, its subgraphs' reads from the enclosing scope
included (If branches, Loop and Scan bodies read outer values by name)."""
from __future__ import annotations

__all__ = ["subgraphs", "subgraph_outer_reads", "node_reads", "without_unread",
           "rename_values", "rename_graph_values"]


def subgraphs(node):
    """list of onnx.GraphProto: the graphs ``node``'s attributes hold (If
    branches, Loop and Scan bodies), in attribute order."""
    graphs = []
    for att in node.attribute:
        if att.HasField("g"):
            graphs.append(att.g)
        graphs.extend(att.graphs)
    return graphs


def subgraph_outer_reads(node):
    """set of str: the names ``node``'s subgraphs (any depth) read from the
    scope enclosing ``node``, i.e. not defined inside them."""
    names = set()
    for graph in subgraphs(node):
        defined = {i.name for i in graph.input}
        defined |= {i.name for i in graph.initializer}
        for sub in graph.node:
            names |= {i for i in sub.input if i and i not in defined}
            names |= subgraph_outer_reads(sub) - defined
            defined |= set(sub.output)
    return names


def graph_names(graph):
    """Every name ``graph`` uses at its top level (node names and outputs,
    inputs, initializers, outputs): those a rewrite adding nodes must not
    take."""
    used = {n for node in graph.node for n in list(node.output) + [node.name]}
    used |= {i.name for i in graph.input} | {i.name for i in graph.initializer}
    return used | {o.name for o in graph.output}


def node_reads(node):
    """set of str: ``node``'s non-empty inputs and
    :func:`subgraph_outer_reads`."""
    return {i for i in node.input if i} | subgraph_outer_reads(node)


def without_unread(nodes, needed):
    """``(kept, read)``: the nodes of ``nodes`` (topological order) that
    write a name of ``needed`` or one a later kept node reads
    (:func:`node_reads`), in their order, and the names those nodes read
    with ``needed``. One backward sweep; ``nodes`` is not modified."""
    read = set(needed)
    kept = []
    for node in reversed(nodes):
        if any(o in read for o in node.output if o):
            kept.append(node)
            read |= node_reads(node)
    kept.reverse()
    return kept, read


def rename_values(nodes, rename):
    """Make ``nodes`` read and write ``rename[name]`` for every name of the
    dict ``rename``, in place; in their subgraphs too, except the names a
    subgraph defines itself (its inputs, initializers and node outputs)."""
    if not rename:
        return
    for node in nodes:
        for field in (node.input, node.output):
            for i, name in enumerate(field):
                if name in rename:
                    field[i] = rename[name]
        for sub in subgraphs(node):
            inner = {i.name for i in sub.input} | {i.name for i in sub.initializer}
            inner |= {o for n in sub.node for o in n.output}
            rename_graph_values(sub, {k: v for k, v in rename.items() if k not in inner})


def rename_graph_values(graph, rename):
    """:func:`rename_values` on ``graph``'s nodes, and its inputs, outputs
    and value_info renamed too."""
    for values in (graph.input, graph.output, graph.value_info):
        for value in values:
            value.name = rename.get(value.name, value.name)
    rename_values(graph.node, rename)
