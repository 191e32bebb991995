"""Convolutions of small outputs as one matrix product over the batch.

onnxruntime's Conv kernel, when its weight is a graph input (a weight being
trained) rather than a constant, runs one GEMM per image whose width is the
number of output pixels: for the deep layers of a CNN (2x2 or 1x1 outputs
at 32x32 inputs) that is a matrix-vector product per image, reading the
whole weight once per image (resnet18's layer4: 11 ms per 3x3 convolution
at batch 32 against 1.5 ms as one GEMM), and its input gradient
(ConvTranspose) and weight gradient have the same shape of problem.

:func:`lower_small_convs` rewrites such a Conv (2-D, one group, no
dilation, explicit pads, static sizes, a weight among ``weights``) into
im2col and one MatMul: the input transposed to (C, N, H, W) and padded,
one unit-step Slice per kernel tap (the spatial axes split by the
stride first; taps outside the rectangle of those reading data are dropped,
with their weight columns), the taps stacked to (C T, N Ho Wo),
the weight reshaped to (M, C T), their product reshaped and transposed back
to (N, M, Ho, Wo), the bias added. Every op is a standard one with a VJP
rule, so the gradients follow (a GEMM for the weight, a GEMM and the Slice
adjoints for the input), and the values are the Conv's up to rounding.
"""
from __future__ import annotations

import onnx
from onnx import helper

from .builder import GraphBuilder
from .shapes import infer_value_types

__all__ = ["lower_small_convs", "MAX_OUTPUT_PIXELS"]

#: Output sizes (Ho * Wo) up to which a Conv is lowered: above, onnxruntime's
#: per-image GEMM is wide enough (measured at 4x4 outputs: Conv 1.1 ms,
#: im2col and GEMM 1.6 ms; at 2x2: 6 ms and 1.5 ms).
MAX_OUTPUT_PIXELS = 4


def _attrs(node):
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _plan(node, types, weights, inits):
    """(kernel, strides, pads, (H, W), (Ho, Wo), taps) of a Conv to lower,
    or None."""
    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or \
            len(node.input) < 2 or node.input[1] not in weights:
        return None
    attrs = _attrs(node)
    w = inits.get(node.input[1])
    x_type = types.get(node.input[0])
    if w is None or len(w.dims) != 4 or x_type is None or x_type[1] is None:
        return None
    shape = x_type[1]
    if len(shape) != 4 or not all(isinstance(d, int) and d > 0 for d in shape[1:]):
        return None
    if attrs.get("group", 1) != 1 or any(d != 1 for d in attrs.get("dilations", [1, 1])) \
            or attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        return None
    kernel = list(w.dims[2:])
    strides = list(attrs.get("strides", [1, 1]))
    pads = list(attrs.get("pads", [0, 0, 0, 0]))
    size = shape[2:]
    out = [(size[i] + pads[i] + pads[i + 2] - kernel[i]) // strides[i] + 1
           for i in range(2)]
    if min(out) < 1 or out[0] * out[1] > MAX_OUTPUT_PIXELS or shape[1] != w.dims[1]:
        return None

    def reads_data(axis, k):
        return any(pads[axis] <= k + o * strides[axis] < pads[axis] + size[axis]
                   for o in range(out[axis]))

    # the rectangle of taps that read data (the others multiply padding)
    rows = [i for i in range(kernel[0]) if reads_data(0, i)]
    cols = [j for j in range(kernel[1]) if reads_data(1, j)]
    if not rows or not cols:
        return None
    box = (rows[0], rows[-1] + 1, cols[0], cols[-1] + 1)
    taps = [(i, j) for i in range(box[0], box[1]) for j in range(box[2], box[3])]
    return kernel, strides, pads, size, out, taps, box


def _lower(g, node, plan, n_channels, m_out):
    kernel, strides, pads, size, out, taps, box = plan
    x, w = node.input[:2]
    bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
    xt = g.op("Transpose", x, perm=[1, 0, 2, 3])  # (C, N, H, W)
    # padded, and long enough to split every spatial axis into (size / s, s)
    sh, sw = strides
    hp = -(-(size[0] + pads[0] + pads[2]) // sh) * sh
    wp = -(-(size[1] + pads[1] + pads[3]) // sw) * sw
    ends = [hp - size[0] - pads[0], wp - size[1] - pads[1]]
    if any(pads[:2]) or any(ends):
        xt = g.op("Pad", xt, g.int64s([0, 0, pads[0], pads[1], 0, 0] + ends))
    # (C, N, Hp/sh, sh, Wp/sw, sw): tap (i, j) is a unit-step slice (whose
    # gradient is one Pad) at (i // sh, i % sh, j // sw, j % sw)
    xt = g.op("Reshape", xt, g.int64s([n_channels, -1, hp // sh, sh, wp // sw, sw]))
    pieces = []
    for i, j in taps:
        start = [i // sh, i % sh, j // sw, j % sw]
        tap = g.op("Slice", xt, g.int64s(start),
                   g.int64s([start[0] + out[0], start[1] + 1,
                             start[2] + out[1], start[3] + 1]),
                   g.int64s([2, 3, 4, 5]))
        pieces.append(g.op("Reshape", tap, g.int64s([n_channels, 1, -1])))
    cols = pieces[0] if len(pieces) == 1 else g.op("Concat", *pieces, axis=1)
    cols = g.op("Reshape", cols, g.int64s([n_channels * len(taps), -1]))
    w2 = w
    if len(taps) < kernel[0] * kernel[1]:  # a unit-step slice: its adjoint is a Pad
        w2 = g.op("Slice", w, g.int64s([box[0], box[2]]), g.int64s([box[1], box[3]]),
                  g.int64s([2, 3]))
    w2 = g.op("Reshape", w2, g.int64s([m_out, -1]))
    y = g.op("MatMul", w2, cols)  # (M, N Ho Wo)
    if bias is not None:
        y = g.op("Add", y, g.op("Unsqueeze", bias, g.int64s([1])))
    y = g.op("Reshape", y, g.int64s([m_out, -1, out[0], out[1]]))
    g.op("Transpose", y, perm=[1, 0, 2, 3], outputs=[node.output[0]])


def lower_small_convs(model, weights, types=None):
    """``model`` with its small-output Conv nodes reading a weight of
    ``weights`` written as im2col and one MatMul (see the module doc);
    ``model`` itself when none qualifies.

    Parameters
    ----------
    model : onnx.ModelProto
    weights : iterable of str
        Initializers being trained (graph inputs of the training graph);
        a Conv with a constant weight keeps onnxruntime's fast kernels.
    types : dict, default=None
        ``model``'s :func:`~onnxtrain.graph.infer_value_types` when the
        caller has them (else inferred here, only when a Conv may qualify).

    Returns
    -------
    onnx.ModelProto
        A new model (the input is not modified) or ``model``.
    """
    weights = set(weights)
    graph = model.graph
    if not any(n.op_type == "Conv" and len(n.input) > 1 and n.input[1] in weights
               for n in graph.node):
        return model
    inits = {i.name: i for i in graph.initializer}
    types = infer_value_types(model) if types is None else types
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 13:  # Pad and Slice with inputs, Unsqueeze axes as an input
        return model
    used = {n for node in graph.node for n in list(node.output) + [node.name]}
    used |= {i.name for i in graph.input} | set(inits) | {o.name for o in graph.output}
    g = GraphBuilder(opset, used_names=used)
    nodes, lowered = [], False
    for node in graph.node:
        plan = _plan(node, types, weights, inits)
        if plan is None:
            nodes.append(node)
            continue
        dims = inits[node.input[1]].dims
        _lower(g, node, plan, dims[1], dims[0])
        nodes.extend(g.nodes)
        g.nodes.clear()
        lowered = True
    if not lowered:
        return model
    new = onnx.ModelProto()
    new.CopyFrom(model)
    del new.graph.node[:]
    new.graph.node.extend(nodes)
    new.graph.initializer.extend(g.initializers)
    return new
