"""Scalar operands widened where onnxruntime's CPU broadcast is slow.

onnxruntime's CPU element-wise kernels walk the output in runs over which
each input is either read contiguously or broadcast, one call per run. A
dimension of size 1 in the output breaks a run, so a tensor whose last
dimensions are 1 (``(32, 512, 1, 1)``: a CNN's feature maps at 1x1, a 1x1
convolution's weight ``(512, 256, 1, 1)``) meeting a scalar is walked one
element per call: microbenchmarked at ``(32, 512, 1, 1)``, Mul by a scalar
takes 134 us against 7 us with the scalar as a ``(512, 1, 1)`` tensor, and
the same Mul on ``(32, 512)`` 3 us. In resnet18's training step at 32x32
inputs (profiled) these were the ReLU gradients' comparisons at layer4,
the average pool's gradient and the momentum update of the 1x1
downsampling weights: 2.6 ms of a 70 ms step.

:func:`avoid_slow_broadcasts` gives such a scalar operand the shape of the
other operand's last dimensions, from its innermost dimension larger than
1 on (``(512, 1, 1)`` above), so that the run covers them: a new
initializer for a constant, an ``Expand`` for a computed value. The
values and the output's shape are unchanged.

Reductions keeping their dimensions have the same fault: ReduceSum over
axes (0, 2, 3) of ``(32, 512, 1, 1)`` takes 43 us, over axis 0 alone
14 us, the same sums. :func:`avoid_slow_broadcasts` also leaves the
static size-1 axes out of such reductions.
"""
from __future__ import annotations

import math

import numpy as np
from onnx import helper, numpy_helper

from .shapes import infer_value_types

__all__ = ["avoid_slow_broadcasts", "may_broadcast_slowly", "ELEMENTWISE_BROADCASTS"]

#: Standard ops broadcasting their inputs element by element.
ELEMENTWISE_BROADCASTS = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Greater", "Less", "Equal",
    "GreaterOrEqual", "LessOrEqual", "And", "Or", "Xor", "Max", "Min",
    "Where", "PRelu", "BitShift"})

#: Calls (output elements up to the innermost dimension larger than 1,
#: a symbolic dimension counted as this many) from which a scalar operand
#: is widened; below, the per-call cost is a few microseconds at most.
MIN_RUNS = 1024


def _broadcast(shapes):
    rank = max(len(s) for s in shapes)
    padded = [(1,) * (rank - len(s)) + tuple(s) for s in shapes]
    out = []
    for dims in zip(*padded):
        sizes = {d for d in dims if d != 1}
        out.append(sizes.pop() if len(sizes) == 1 else (1 if not sizes else None))
    return tuple(out)


def _slow_suffix(shape):
    """The shape's dimensions from its innermost one larger than 1 on, when
    ones follow it, they are static and the broadcast would make at least
    :data:`MIN_RUNS` calls; else None."""
    if not shape or shape[-1] != 1:
        return None
    inner = max((i for i, d in enumerate(shape) if d != 1), default=None)
    if inner is None or not all(isinstance(d, int) for d in shape[inner:]):
        return None
    runs = math.prod(d if isinstance(d, int) and d > 0 else MIN_RUNS
                     for d in shape[:inner + 1])
    return tuple(shape[inner:]) if runs >= MIN_RUNS else None


def avoid_slow_broadcasts(model, types=None, keep=()):
    """``model`` with the scalar operands of element-wise ops widened where
    onnxruntime's broadcast would walk the output one element per call, and
    the static size-1 axes left out of reductions keeping their dimensions
    (see the module docstring).

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

    Returns
    -------
    onnx.ModelProto
        A new model, or ``model`` itself when nothing qualifies.
    """
    graph = model.graph
    types = infer_value_types(model) if types is None else types
    keep = set(keep)
    inits = {i.name: i for i in graph.initializer}
    taken = {n for node in graph.node for n in list(node.input) + list(node.output)}
    taken |= set(inits) | {v.name for v in list(graph.input) + list(graph.output)}
    widened, new_inits, nodes = {}, [], []
    counter = [0]

    def fresh(base):
        while True:
            counter[0] += 1
            name = f"{base}__widened{counter[0]}"
            if name not in taken:
                taken.add(name)
                return name

    changed = False
    for node in graph.node:
        axes = _narrowed_axes(node, types, inits)
        if axes is not None:
            copy = type(node)()
            copy.CopyFrom(node)
            if len(node.input) > 1:
                name = fresh(f"{node.input[1]}_narrowed")
                new_inits.append(numpy_helper.from_array(np.array(axes, np.int64), name))
                copy.input[1] = name
            else:
                att = next(a for a in copy.attribute if a.name == "axes")
                del att.ints[:]
                att.ints.extend(axes)
            nodes.append(copy)
            changed = True
            continue
        plan = _plan(node, types)
        if plan is None:
            nodes.append(node)
            continue
        suffix, scalars = plan
        new_inputs = list(node.input)
        for index in scalars:
            name = node.input[index]
            if name in keep:
                continue
            rank = len(types[name][1])
            shape = (1,) * (rank - len(suffix)) + suffix
            key = (name, shape)
            if key not in widened:
                if name in inits:
                    value = numpy_helper.to_array(inits[name])
                    array = np.ascontiguousarray(np.broadcast_to(
                        value.reshape(()), shape))
                    widened[key] = fresh(name)
                    new_inits.append(numpy_helper.from_array(array, widened[key]))
                else:
                    target = fresh(f"{name}_shape")
                    new_inits.append(numpy_helper.from_array(
                        np.array(shape, dtype=np.int64), target))
                    widened[key] = fresh(name)
                    nodes.append(helper.make_node(
                        "Expand", [name, target], [widened[key]],
                        name=fresh(f"{name}_expand")))
            new_inputs[index] = widened[key]
        if new_inputs != list(node.input):
            copy = type(node)()
            copy.CopyFrom(node)
            del copy.input[:]
            copy.input.extend(new_inputs)
            node, changed = copy, True
        nodes.append(node)
    if not changed:
        return model
    new = type(model)()
    new.CopyFrom(model)
    del new.graph.node[:]
    new.graph.node.extend(nodes)
    new.graph.initializer.extend(new_inits)
    return new


def _narrowed_axes(node, types, inits):
    """The axes of a reduction keeping its dimensions without those of
    static size 1, when it lists such an axis and another one; else None."""
    if not node.op_type.startswith("Reduce") or node.domain not in ("", "ai.onnx"):
        return None
    attrs = {a.name: a for a in node.attribute}
    if "keepdims" in attrs and attrs["keepdims"].i == 0:
        return None
    if len(node.input) > 1 and node.input[1]:
        if node.input[1] not in inits:
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


def _plan(node, types):
    """(suffix, indices of the scalar inputs to widen) or None."""
    if node.op_type not in ELEMENTWISE_BROADCASTS or node.domain not in ("", "ai.onnx") \
            or len(node.input) < 2 or not all(node.input):
        return None
    shapes = [types.get(name, (None, None))[1] for name in node.input]
    if any(s is None for s in shapes):
        return None
    out = _broadcast(shapes)
    suffix = _slow_suffix(out)
    if suffix is None:
        return None
    scalars = [i for i, s in enumerate(shapes)
               if all(d == 1 for d in s) and len(s) <= len(out)]
    # only scalars meeting a larger operand (the condition of Where is one)
    if not scalars or len(scalars) == len(shapes):
        return None
    return suffix, scalars


def may_broadcast_slowly(types):
    """Whether a value of ``types`` (``name -> (elem_type, shape)``, from
    :func:`~onnxtrain.graph.infer_value_types`) ends in static dimensions
    of size 1 after a larger one. On a forward graph's types: a cheap test
    for a training graph that :func:`avoid_slow_broadcasts` may change (its
    gradients and updates have the forward's shapes), before the shape
    inference that pass runs."""
    return any(shape is not None and _slow_suffix(shape) is not None
               for _, shape in types.values())
