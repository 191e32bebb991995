"""Which graph outputs may be written into the memory of a graph input.

An update step (``w_new = w - lr * g``, the optimizer models of
``generate_artifacts``, gradient accumulation ``buffer + g``) reads a
tensor and writes one of the same shape. Writing the result into the
input's own memory, as PyTorch's optimizers do, keeps one copy of every
parameter and of every gradient instead of two, and reuses memory the
process already touched.

onnxruntime runs a rewritten graph (fusions such as MatMul + Add into one
Gemm, Identity elimination, Reshape outputs sharing their input's memory),
so the rule is kept narrow enough to hold for the rewritten graph too:
the node writing the output and every node reading the input are
element-wise arithmetic (element ``i`` of an output depends on element
``i`` of same-shaped inputs only), and every reader runs before the writer
(is one of its ancestors: onnxruntime runs a node only after the nodes it
depends on, whatever the execution mode). No node that could alias the
input (Identity, Reshape...) or fold it into a non-element-wise kernel
(MatMul, Gemm...) may read it.
"""
from __future__ import annotations

from .scopes import node_reads

__all__ = ["writes_after_reads", "ELEMENTWISE_WRITERS"]

#: Arithmetic ops whose output element i reads only element i of
#: same-shaped inputs, and which onnxruntime's CPU graph rewrites fold into
#: no kernel of another kind when they read a graph input.
ELEMENTWISE_WRITERS = frozenset({
    "Add", "Sub", "Mul", "Div", "Where", "Neg", "Max", "Min", "Sqrt", "Abs",
    "Sign"})

#: Ops that may write into the memory of an input they do not read, when
#: every reader of that input runs before them (the artifacts' accumulating
#: weight gradients and vectors accumulated together).
_WRITERS_NOT_READING = frozenset({"Gemm", "Split"})
#: Readers copying the input into a new tensor, no element-wise kernel:
#: fine when they run before the writer.
_COPYING_READERS = frozenset({"Concat"})


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
        The pairs where every node reading the input (in their subgraphs
        too) is a main-graph, standard-domain :data:`ELEMENTWISE_WRITERS`
        node or a Concat, the node writing the output is an element-wise
        one too or a Gemm or Split not reading the input, every reader is
        the writer or one of its ancestors, and the input is not also a
        graph output. Shapes are not checked: the caller binds the input's
        own buffer, whose shape is the output's.
    """
    producer, readers, reads = {}, {}, []
    for index, node in enumerate(graph.node):
        for name in node.output:
            producer[name] = index
        reads.append(node_reads(node))
        for name in reads[-1]:
            readers.setdefault(name, []).append(index)
    graph_outputs = {o.name for o in graph.output}
    safe = set()
    for source, target in pairs:
        writer = producer.get(target)
        if writer is None or target not in graph_outputs:
            continue
        if source in graph_outputs or not all(
                _elementwise(graph.node[i], _COPYING_READERS)
                for i in readers.get(source, [])) or not (
                _elementwise(graph.node[writer]) or
                _writes_without_reading(graph.node[writer], reads[writer], source)):
            continue
        ancestors = _ancestors(reads, producer, writer)
        if all(r == writer or r in ancestors for r in readers.get(source, ())):
            safe.add((source, target))
    return safe


def _elementwise(node, also=frozenset()):
    return node.domain in ("", "ai.onnx") and (
        node.op_type in ELEMENTWISE_WRITERS or node.op_type in also) \
        and not any(att.type in (att.GRAPH, att.GRAPHS) for att in node.attribute)


def _writes_without_reading(node, reads, source):
    """Whether ``node`` is a Gemm or Split that does not read ``source``
    itself (``Gemm(A, B, Where(lazy, 0, buffer))``, ``Split`` of the
    concatenated accumulated vectors): it only writes, its inputs an
    ancestor's tensors."""
    return node.domain in ("", "ai.onnx") and node.op_type in _WRITERS_NOT_READING \
        and source not in reads


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
