"""Operands and reductions rewritten where onnxruntime's CPU broadcast is
slow.

onnxruntime's CPU element-wise kernels walk the output in runs over which
each input is either read contiguously or broadcast, one call per run. An
operand of lower rank than the output, meeting a tensor whose last
dimensions are 1 (``(32, 512, 1, 1)``: a CNN's feature maps at 1x1, a 1x1
convolution's weight ``(512, 256, 1, 1)``), is walked one element per
call, far slower than the same operand given the output's rank. In a CNN's
training step these are the ReLU gradients' comparisons at 1x1 maps, the
average pool's gradient and the updates of 1x1 convolution weights.

:func:`avoid_slow_broadcasts` gives such a scalar operand the output's rank
(a reshaped initializer for a constant, a Reshape of a computed value; not
a tensor of the other operand's trailing shape, which is slow on maps of
one dimension 1 only). The values
and the output's shape are unchanged.

Reductions keeping their dimensions have the same fault: ReduceSum over
axes (0, 2, 3) of ``(N, C, 1, 1)`` is slower than over axis 0 alone, the
same sums. :func:`avoid_slow_broadcasts` also leaves the
static size-1 axes out of such reductions.
"""
from __future__ import annotations

import math

import numpy as np
from onnx import helper, numpy_helper

from .builder import SMALL_SPATIAL_SIZE, GraphBuilder, opset_of, with_nodes
from .shapes import infer_value_types
from .symbolic import broadcast_shapes

__all__ = ["avoid_slow_broadcasts", "may_broadcast_slowly", "per_channel",
           "ELEMENTWISE_BROADCASTS"]

#: Standard ops broadcasting their inputs element by element.
ELEMENTWISE_BROADCASTS = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Greater", "Less", "Equal",
    "GreaterOrEqual", "LessOrEqual", "And", "Or", "Xor", "Max", "Min",
    "Where", "PRelu", "BitShift"})

#: Calls (output elements up to the innermost dimension larger than 1,
#: a symbolic dimension counted as this many) from which a scalar operand
#: is padded; below, the per-call cost is a few microseconds at most.
MIN_RUNS = 1024


def _ends_in_ones(shape):
    """Whether ``shape`` ends in static dimensions of size 1 after a larger
    one, with at least :data:`MIN_RUNS` elements up to that one (a
    broadcast against a lower-rank operand would make as many calls)."""
    if not shape or shape[-1] != 1:
        return False
    inner = max((i for i, d in enumerate(shape) if d != 1), default=None)
    if inner is None or not all(isinstance(d, int) for d in shape[inner:]):
        return False
    return math.prod(d if isinstance(d, int) and d > 0 else MIN_RUNS
                     for d in shape[:inner + 1]) >= MIN_RUNS


def avoid_slow_broadcasts(model, types=None, keep=(), forward_types=None):
    """``model`` with the scalar operands of element-wise ops given the
    output's rank where onnxruntime's broadcast would walk the output one
    element per call, and the static size-1 axes left out of reductions
    keeping their dimensions (see the module docstring).

    Parameters
    ----------
    model : onnx.ModelProto
        Not modified. Only its main graph is rewritten.
    types : dict, default=None
        ``model``'s :func:`~onnxtrain.graph.infer_value_types` if known.
    keep : iterable of str, default=()
        Values every reader keeps reading as they are (an interface that a
        later rewrite matches, e.g. the ``lazy_reset_grad`` condition of the
        artifacts' gradient accumulation).
    forward_types : dict, default=None
        The types of the forward graph ``model`` was built from (a training
        graph's gradients and updates have its shapes): when none of them
        ends in size-1 dimensions (:func:`may_broadcast_slowly`), ``model``
        is returned as it is, without the shape inference of ``model``.

    Returns
    -------
    onnx.ModelProto
        A new model, or ``model`` itself when nothing qualifies.
    """
    if forward_types is not None and not may_broadcast_slowly(forward_types):
        return model
    graph = model.graph
    types = infer_value_types(model) if types is None else types
    keep = set(keep)
    inits = {i.name: i for i in graph.initializer}
    taken = {n for node in graph.node for n in list(node.input) + list(node.output)}
    taken |= set(inits) | {v.name for v in list(graph.input) + list(graph.output)}
    # an initializer that is also a graph input may be fed another value
    overridable = set(inits) & {i.name for i in graph.input}
    padded, new_inits, nodes = {}, [], []
    names = GraphBuilder(opset_of(model) or 1, used_names=taken)

    def fresh(base):
        return names.unique_name(f"{base}__padded")

    changed = False
    for node in graph.node:
        axes = _narrowed_axes(node, types, inits, overridable)
        inputs = list(node.input)
        if axes is not None and len(node.input) > 1:
            inputs[1] = fresh(f"{node.input[1]}_narrowed")
            new_inits.append(numpy_helper.from_array(np.array(axes, np.int64), inputs[1]))
        elif axes is None:
            for index in _scalars_to_pad(node, types):
                name, rank = node.input[index], len(types[node.output[0]][1])
                if name in keep:
                    continue
                key = (name, rank)
                if key not in padded:
                    padded[key] = fresh(name)
                    shape = (1,) * rank
                    if name in inits and name not in overridable:
                        value = numpy_helper.to_array(inits[name]).reshape(shape)
                        new_inits.append(numpy_helper.from_array(value, padded[key]))
                    else:
                        target = fresh(f"{name}_shape")
                        new_inits.append(numpy_helper.from_array(
                            np.array(shape, dtype=np.int64), target))
                        nodes.append(helper.make_node(
                            "Reshape", [name, target], [padded[key]],
                            name=fresh(f"{name}_reshape")))
                inputs[index] = padded[key]
        if inputs == list(node.input) and axes is None:
            nodes.append(node)
            continue
        copy = type(node)()
        copy.CopyFrom(node)
        del copy.input[:]
        copy.input.extend(inputs)
        if axes is not None and len(node.input) < 2:
            att = next(a for a in copy.attribute if a.name == "axes")
            del att.ints[:]
            att.ints.extend(axes)
        nodes.append(copy)
        changed = True
    if not changed:
        return model
    return with_nodes(model, nodes, new_inits)


def _narrowed_axes(node, types, inits, overridable=()):
    """The axes of a reduction keeping its dimensions without those of
    static size 1, when it lists such an axis and another one; else None."""
    if not node.op_type.startswith("Reduce") or node.domain not in ("", "ai.onnx"):
        return None
    attrs = {a.name: a for a in node.attribute}
    if "keepdims" in attrs and attrs["keepdims"].i == 0:
        return None
    if len(node.input) > 1 and node.input[1]:
        if node.input[1] not in inits or node.input[1] in overridable:
            return None
        axes = [int(a) for a in numpy_helper.to_array(inits[node.input[1]]).ravel()]
    elif "axes" in attrs:
        axes = list(attrs["axes"].ints)
    else:
        return None
    shape = types.get(node.input[0], (None, None))[1]
    if shape is None or not axes:
        return None
    axes = [a + len(shape) if a < 0 else a for a in axes]
    if not all(0 <= a < len(shape) for a in axes):
        return None
    kept = [a for a in axes if shape[a] != 1]
    if not kept or len(kept) == len(axes):
        return None
    return kept


def _scalars_to_pad(node, types):
    """Indices of the inputs of an element-wise ``node`` holding one value
    in a rank below its output's, when the output ends in dimensions of
    size 1 (:func:`_ends_in_ones`)."""
    if node.op_type not in ELEMENTWISE_BROADCASTS or node.domain not in ("", "ai.onnx") \
            or len(node.input) < 2 or not all(node.input):
        return []
    shapes = [types.get(name, (None, None))[1] for name in node.input]
    out = types.get(node.output[0], (None, None))[1]
    if out is None or any(s is None for s in shapes) or \
            not _ends_in_ones(broadcast_shapes(shapes)):
        return []
    return [i for i, s in enumerate(shapes)
            if len(s) < len(out) and all(d == 1 for d in s)]


def may_broadcast_slowly(types):
    """Whether a value of ``types`` (``name -> (elem_type, shape)``, from
    :func:`~onnxtrain.graph.infer_value_types`) ends in static dimensions
    of size 1 after a larger one: the test of ``forward_types`` in
    :func:`avoid_slow_broadcasts`."""
    return any(_ends_in_ones(shape) for _, shape in types.values())


def per_channel(g, v, shape):
    """``v``, one value per channel (shape ``(1, C, 1, ...)`` or
    ``(C, 1, ...)``), as the operand of an elementwise op with a tensor
    of ``shape`` ``(N, C, spatial...)``, written into the builder ``g``:
    expanded to ``shape[1:]`` when the spatial size is static and 2 to
    :data:`~onnxtrain.graph.builder.SMALL_SPATIAL_SIZE`, else ``v`` itself.

    onnxruntime's CPU broadcast loops over the ``N C`` runs of
    ``H W`` contiguous elements, a call per run: at small feature maps
    (2x2, 4x4) the Expand to ``(C, H, W)`` plus a Mul over runs of
    ``C H W`` is much faster; at larger maps the Expand no longer pays.
    The values are the same.
    """
    if shape is None or len(shape) < 3 or \
            not all(isinstance(d, int) and d > 0 for d in shape[1:]):
        return v
    if not 2 <= math.prod(shape[2:]) <= SMALL_SPATIAL_SIZE:
        return v
    return g.op("Expand", v, g.int64s(list(shape[1:])))
