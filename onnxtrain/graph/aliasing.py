"""Which graph outputs may be written into the memory of a graph input.

An update step (``w_new = w - lr * g``, the optimizer models of
``generate_artifacts``, gradient accumulation ``buffer + g``) reads a
tensor and writes one of the same shape. Writing the result into the
input's own memory, as PyTorch's optimizers do, keeps one copy of every
parameter and of every gradient instead of two, and reuses memory the
process already touched. That is exact when the node writing the output is
element-wise (element ``i`` of the output depends on element ``i`` of its
same-shaped inputs only, read before it is written) and every other node
reading the input runs before it, i.e. is one of its ancestors: onnxruntime
runs a node only after the nodes it depends on, whatever the execution
mode, so an ancestor's read always comes first.
"""
from __future__ import annotations

__all__ = ["writes_after_reads", "ELEMENTWISE_WRITERS"]

#: Ops whose output element i reads only element i of same-shaped inputs.
ELEMENTWISE_WRITERS = frozenset({
    "Add", "Sub", "Mul", "Div", "Where", "Neg", "Max", "Min", "Sqrt",
    "Relu", "Clip", "Identity"})


def _subgraph_reads(node):
    """Names read by the nodes of ``node``'s subgraphs (any depth)."""
    names = set()
    for att in node.attribute:
        graphs = list(att.graphs) + ([att.g] if att.HasField("g") else [])
        for sub in graphs:
            for inner in sub.node:
                names.update(inner.input)
                names |= _subgraph_reads(inner)
    return names


def writes_after_reads(graph, pairs):
    """The ``(input, output)`` pairs of ``graph`` whose output may be written
    into the input's memory.

    Parameters
    ----------
    graph : onnx.GraphProto
    pairs : iterable of (str, str)
        A graph input and a graph output of the same dtype and shape.

    Returns
    -------
    set of (str, str)
        The pairs where the node writing the output is in the main graph,
        in the standard domain, element-wise (:data:`ELEMENTWISE_WRITERS`),
        and every node reading the input (in its subgraphs too) is that node
        or one of its ancestors. Shapes are not checked: the caller binds
        the input's own buffer, whose shape is the output's.
    """
    producer, readers, reads = {}, {}, []
    for index, node in enumerate(graph.node):
        for name in node.output:
            producer[name] = index
        reads.append(set(node.input) | _subgraph_reads(node))
        for name in reads[-1]:
            readers.setdefault(name, []).append(index)
    graph_outputs = {o.name for o in graph.output}
    safe = set()
    for source, target in pairs:
        writer = producer.get(target)
        if writer is None or target not in graph_outputs:
            continue
        node = graph.node[writer]
        if node.domain not in ("", "ai.onnx") or node.op_type not in ELEMENTWISE_WRITERS:
            continue
        ancestors = _ancestors(reads, producer, writer)
        if all(r == writer or r in ancestors for r in readers.get(source, ())):
            safe.add((source, target))
    return safe


def _ancestors(reads, producer, index):
    """Indices of the nodes node ``index`` depends on (``reads[i]``: the
    names node ``i`` reads)."""
    seen, stack = set(), [index]
    while stack:
        for name in reads[stack.pop()]:
            parent = producer.get(name)
            if parent is not None and parent not in seen:
                seen.add(parent)
                stack.append(parent)
    return seen
