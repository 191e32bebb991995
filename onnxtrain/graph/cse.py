"""Common-subexpression elimination over a node list.

The reverse pass emits each rule's shape arithmetic on its own (``Shape``
of the same tensor, the same ``Slice`` of it, the same broadcast test),
and the gradient of a value read by several nodes repeats it for each:
in the training graph of a transformer encoder a large share of the
nodes compute a value another node has already computed.

:func:`eliminate_common_subexpressions` keeps the first of the nodes that
apply the same operator with the same attributes to the same inputs
(after the renaming of the ones already merged) and reads its outputs in
place of the later ones'. Left alone: nodes whose outputs are graph
outputs (their names are the model's interface) or are read inside a
subgraph (outer-scope references, not renamed here), nodes holding
subgraphs, random operators (``Dropout``, ``Random*``, ``Multinomial``,
``Bernoulli``: two draws are not one) and nodes of other domains.
"""
from __future__ import annotations

import math

from onnx import NodeProto, TensorProto, numpy_helper

from .scopes import subgraph_outer_reads, subgraphs

__all__ = ["eliminate_common_subexpressions"]

#: Initializers of at most this many elements are compared by value in
#: :func:`eliminate_common_subexpressions` (shapes, axes, scalars; never
#: weights).
SMALL_CONSTANT = 64

#: Operators whose equal calls give different values.
RANDOM_OPS = frozenset({"Dropout", "RandomNormal", "RandomNormalLike",
                        "RandomUniform", "RandomUniformLike", "Multinomial",
                        "Bernoulli"})


def eliminate_common_subexpressions(nodes, keep=(), initializers=None):
    """``nodes`` (in topological order) without the nodes that recompute
    a value an earlier node computes.

    Parameters
    ----------
    nodes : list of onnx.NodeProto
        Not modified: a node whose inputs are renamed is a copy.
    keep : iterable of str
        Names that must stay produced by their own node (graph outputs),
        and initializers never merged away (graph inputs).
    initializers : list of onnx.TensorProto, default=None
        The graph's initializers (not modified). Given, equal small
        constants (same element type, shape and values, at most
        :data:`SMALL_CONSTANT` elements) are read under the first one's
        name, so that the nodes reading them merge too: builders name
        their own constants (the reverse pass and the running statistics'
        update each hold a ``[C, H, W]`` shape for the same Expand, which
        kept both Expands and the Subs after them).

    Returns
    -------
    list of onnx.NodeProto
        The kept nodes, reading the first node's outputs in place of the
        outputs of each node removed.
    list of onnx.TensorProto
        With ``initializers`` only: those still read (the merged constants
        left out).
    """
    keep = set(keep).union(*map(subgraph_outer_reads, nodes))
    rename = {} if initializers is None else _equal_constants(initializers, keep)
    merged = set(rename)
    first, kept, get = {}, [], rename.get
    for node in nodes:
        original = tuple(node.input)
        inputs = tuple(map(get, original, original))  # renamed, or as they are
        key = _key(node, inputs)
        earlier = None if key is None else first.get(key)
        if earlier is not None and not keep.intersection(node.output) and all(
                e or not o for e, o in zip(earlier.output, node.output)):
            rename.update((o, e) for o, e in zip(node.output, earlier.output) if o)
            continue
        if inputs != original:  # a copy reading the names kept
            copy = NodeProto()
            copy.CopyFrom(node)
            del copy.input[:]
            copy.input.extend(inputs)
            node = copy
        if key is not None:
            first.setdefault(key, node)
        kept.append(node)
    if initializers is None:
        return kept
    return kept, [t for t in initializers if t.name not in merged]


def _equal_constants(initializers, keep):
    """``name -> first name`` for the small initializers equal to an
    earlier one, names in ``keep`` left alone."""
    first, alias = {}, {}
    for tensor in initializers:
        if tensor.name in keep or tensor.data_location == TensorProto.EXTERNAL or \
                math.prod(tensor.dims) > SMALL_CONSTANT:
            continue
        # the builders' constants hold raw_data: its bytes are the value
        # (numpy_helper.to_array only for the typed numeric fields; a string
        # array's bytes would be its objects' addresses)
        if tensor.HasField("raw_data"):
            data = tensor.raw_data
        elif tensor.data_type == TensorProto.STRING:
            data = tuple(tensor.string_data)
        else:
            data = numpy_helper.to_array(tensor).tobytes()
        key = (tensor.data_type, tuple(tensor.dims), data)
        if key in first:
            alias[tensor.name] = first[key]
        else:
            first[key] = tensor.name
    return alias


def _key(node, inputs):
    """What equal computations share (op, inputs, attributes), None for a
    node never merged (random, another domain, holding subgraphs)."""
    if node.op_type in RANDOM_OPS or node.domain not in ("", "ai.onnx"):
        return None
    attributes = ()
    if len(node.attribute):
        if subgraphs(node):
            return None
        attributes = tuple(a.SerializeToString()
                           for a in sorted(node.attribute, key=lambda a: a.name))
    return node.op_type, inputs, len(node.output), attributes
