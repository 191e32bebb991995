"""Convolutions of small outputs as one matrix product over the batch.

onnxruntime's Conv kernel, when its weight is a graph input (a weight being
trained) rather than a constant, runs one GEMM per image whose width is the
number of output pixels: for the deep layers of a CNN (2x2 or 1x1 outputs
at 32x32 inputs) that is a matrix-vector product per image, reading the
whole weight once per image (far slower than one GEMM over the batch),
and its input gradient
(ConvTranspose) and weight gradient have the same shape of problem.

:func:`lower_small_convs` rewrites such a Conv (2-D, one group, no
dilation, explicit pads, static sizes, a weight among ``weights``) into
im2col and one MatMul: the input (N, C, H W) is transposed to
(C, H W, N), the batch minor; im2col is then one matrix product per
channel, a constant 0/1 gather matrix (K Ho Wo, H W)
(:func:`gather_matrix` transposed; padding is its zero rows) times it,
giving the columns as (C K, Ho Wo N) without moving them; the weight
reshaped to (M, C K) multiplies them; the bias is added and the product
(M, Ho, Wo, N) transposed back to (N, M, Ho, Wo). Transposing the input
rather than the columns moves K times less memory (the columns'
transposes, perm [1, 0, 2] with short runs, and their adjoints cost far
more). Every op is a standard one with a VJP rule, so the gradients
follow as products too: a GEMM for the weight, a GEMM and the gather
matrix's transpose for the input (no Pad or scatter: a Slice per tap
would put Pads in its adjoint). The values are the Conv's up to rounding.

Taps that read only padding for every output pixel are left out of the
product (:func:`_live_taps`): a 3x3 kernel over 1x1 images (the deep
layers of a CNN on small inputs) has 8 taps of 9 multiplying zeros in the forward
GEMM and in both gradients' GEMMs. The weight's live taps are picked by a
constant 0/1 matrix product (its adjoint, a product too, gives the dead
taps their zero gradient).

Depthwise Convs (``group`` = input channels = output channels, one
filter per channel, as MobileNets use them) over images of at most as
many pixels as the kernel has taps are lowered too, to an effective
weight per (input pixel, output pixel, channel) times the input
(:func:`_lower_depthwise`): onnxruntime runs their forward, input
gradient and weight gradient as one tiny GEMM per channel and image.

:func:`im2col_rows` builds the same columns as rows, by one Gather of
the padded input in (N, H, W, C) layout, for the weight gradient of the
Convs left to onnxruntime (``autodiff/rules/conv.py``), where nothing
differentiates them; :func:`im2col_columns` the same columns as
(channel, tap) rows. Where the weight gradient takes the columns form
(:func:`columns_form`) on a small map, :func:`convs_on_columns` runs the
training graph's forward Conv as one GEMM on those same columns (after
the reverse pass, which differentiated the Conv itself): onnxruntime's
Conv builds its own columns and runs a GEMM per image only as wide as the
map.
"""
from __future__ import annotations

import numpy as np
from onnx import helper

from .builder import GraphBuilder, rewrite_nodes
from .scopes import graph_names
from .shapes import infer_value_types

__all__ = ["lower_small_convs", "gather_matrix", "im2col_rows", "im2col_columns",
           "output_size", "columns_form", "convs_on_columns", "MAX_OUTPUT_PIXELS",
           "MAX_SHARED_PIXELS"]

#: Output sizes (Ho * Wo) up to which a Conv is lowered: above, onnxruntime's
#: per-image GEMM is wide enough and the lowering stops paying (forward and
#: both gradients of one Conv, ``benchmarks/``).
MAX_OUTPUT_PIXELS = 16
#: Largest gather matrix (H W x K Ho Wo elements) a lowering may store.
MAX_GATHER_SIZE = 1 << 20
#: Output sizes (Ho * Wo) up to which :func:`convs_on_columns` runs a Conv's
#: forward on its weight gradient's columns: onnxruntime's per-image GEMM
#: is as narrow as the map and scales poorly over threads there; on wider
#: maps its Conv is as fast and the product's transpose to NCHW costs more.
MAX_SHARED_PIXELS = 64

#: Relative per-element costs (ns) that choose the form of a Conv's weight
#: gradient: a Gather item, and a weight element moved by a transpose.
#: Only their ratio matters.
_GATHER_ITEM_NS, _TRANSPOSE_NS = 2.7, 0.93
#: Batch assumed when the graph's is symbolic: a small one (a larger one
#: only favours the columns form more).
_ASSUMED_BATCH = 8


def output_size(size, kernel, strides, pads):
    """Spatial output sizes of a 2-D Conv without dilation (``pads``: begins
    then ends, as the ``pads`` attribute)."""
    return [(size[i] + pads[i] + pads[i + 2] - kernel[i]) // strides[i] + 1
            for i in range(2)]


def columns_form(n_batch, n_channels, m_out, pixels):
    """Whether a Conv's weight gradient uses :func:`im2col_columns` (Gather
    items of N values, (C K) L of them, and no transpose of the weight)
    rather than :func:`im2col_rows` (items of C values, N L K of them, and
    the (M, K, C) product transposed to (M, C, K)). Dropping the common
    terms, the columns cost ``_GATHER_ITEM_NS * L K (C - N)`` more in Gather
    items and ``_TRANSPOSE_NS * M C K`` less in transpose: the columns win
    for many channels or few input channels, the rows for wide maps of few
    channels.

    Parameters
    ----------
    n_batch : int or str
        N (a symbolic batch counts as ``_ASSUMED_BATCH``).
    n_channels, m_out : int
        Input and output channels.
    pixels : int
        Output pixels, Ho * Wo.

    Returns
    -------
    bool
    """
    n = n_batch if isinstance(n_batch, int) else _ASSUMED_BATCH
    return _GATHER_ITEM_NS * pixels * (n_channels - n) < _TRANSPOSE_NS * m_out * n_channels


def _attrs(node):
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _plan(node, types, weights, inits):
    """(kernel, strides, pads, (H, W), (Ho, Wo), element type, first tap,
    depthwise) of a Conv to lower, or None: the kernel and pads of the
    window of live taps starting at ``first`` (:func:`_live_taps`);
    ``depthwise`` for a Conv of ``group`` = input channels = output
    channels (one filter per channel; then the whole kernel, ``first``
    (0, 0)), else ``group`` is 1."""
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
    group = attrs.get("group", 1)
    depthwise = group > 1 and group == shape[1] == w.dims[0] and w.dims[1] == 1
    if (group != 1 and not depthwise) or any(d != 1 for d in attrs.get("dilations", [1, 1])) \
            or attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        return None
    kernel = list(w.dims[2:])
    strides = list(attrs.get("strides", [1, 1]))
    pads = list(attrs.get("pads", [0, 0, 0, 0]))
    size = shape[2:]
    out = output_size(size, kernel, strides, pads)
    if min(out) < 1 or out[0] * out[1] > MAX_OUTPUT_PIXELS or \
            (not depthwise and shape[1] != w.dims[1]):
        return None
    if depthwise:  # the whole kernel (see _lower_depthwise)
        if size[0] * size[1] > kernel[0] * kernel[1]:
            return None
        return kernel, strides, pads, size, out, x_type[0], [0, 0], True
    first, kernel, pads = _live_taps(kernel, strides, pads, size, out)
    if size[0] * size[1] * kernel[0] * kernel[1] * out[0] * out[1] > MAX_GATHER_SIZE:
        return None
    return kernel, strides, pads, size, out, x_type[0], first, depthwise


def _live_taps(kernel, strides, pads, size, out):
    """(first tap, kernel, pads) of the smallest window of kernel taps that
    reads any input pixel: a tap whose every output pixel reads padding
    multiplies zeros (a 3x3 kernel over 1x1 images: 8 of 9 taps). The
    Conv over the taps from ``first`` with the begin pads less ``first`` has the same output; the weight's other taps
    get a zero gradient, exactly their gradient in the full Conv."""
    first, trimmed, begins = [], [], []
    for axis in range(2):
        live = [i for i in range(kernel[axis])
                if any(0 <= a * strides[axis] + i - pads[axis] < size[axis]
                       for a in range(out[axis]))]
        if not live:  # every output pixel reads padding only: left as it is
            return [0, 0], list(kernel), list(pads)
        first.append(live[0])
        trimmed.append(live[-1] - live[0] + 1)
        begins.append(pads[axis] - live[0])
    # the end pads only set the output size, kept as computed
    return first, trimmed, begins + list(pads[2:])


def gather_matrix(kernel, strides, pads, size, out):
    """The 0/1 matrix ``P`` of shape (H W, K L) with ``x @ P`` the columns
    of im2col: ``P[h W + w, k L + l] = 1`` when tap ``k = (i, j)`` of output
    pixel ``l = (oh, ow)`` reads input pixel ``(h, w) = (oh s + i - pad,
    ow s + j - pad)``; a tap reading padding has a zero column."""
    (kh, kw), (sh, sw), (h, w), (oh, ow) = kernel, strides, size, out
    p = np.zeros((h * w, kh * kw * oh * ow))
    n_out = oh * ow
    for i in range(kh):
        for j in range(kw):
            for a in range(oh):
                for b in range(ow):
                    r, c = a * sh + i - pads[0], b * sw + j - pads[1]
                    if 0 <= r < h and 0 <= c < w:
                        p[r * w + c, (i * kw + j) * n_out + a * ow + b] = 1
    return p


def im2col_rows(g, x, n_channels, kernel, strides, pads, size, out, flip=False):
    """im2col of ``x`` (N, C, H, W; C, H, W static, N any) as a
    (N Ho Wo, K C) tensor, row (n, oh, ow), column (tap, channel): ``x``
    transposed to (N, H, W, C), padded with zeros, its pixels flattened,
    then one Gather of the pixels each output pixel's taps read, every
    gathered item a contiguous run of C values. Memory moves only, for the
    weight gradient of a Conv (the backward differentiates none of these
    nodes). ``flip``: the taps in reverse order along each axis (the rows
    then meet the weight unflipped in a correlation with the flipped
    kernel). Faster than one unit-step Slice per tap (channel-major
    columns), im2col and the weight-gradient GEMM together."""
    (kh, kw), (sh, sw) = kernel, strides
    hp, wp = size[0] + pads[0] + pads[2], size[1] + pads[1] + pads[3]
    xt = g.op("Transpose", x, perm=[0, 2, 3, 1])  # (N, H, W, C)
    if any(pads):
        xt = g.op("Pad", xt, g.int64s([0, pads[0], pads[1], 0, 0, pads[2], pads[3], 0]))
    xt = g.op("Reshape", xt, g.int64s([0, hp * wp, n_channels]))
    rows_i = range(kh - 1, -1, -1) if flip else range(kh)
    cols_j = range(kw - 1, -1, -1) if flip else range(kw)
    taps = np.array([(a * sh + i) * wp + b * sw + j
                     for a in range(out[0]) for b in range(out[1])
                     for i in rows_i for j in cols_j], dtype=np.int64)
    rows = g.op("Gather", xt, g.int64s(taps), axis=1)  # (N, L K, C)
    return g.op("Reshape", rows, g.int64s([-1, kh * kw * n_channels]))


def im2col_columns(g, x, n_channels, kernel, strides, pads, size, out):
    """im2col of ``x`` (N, C, H, W; C, H, W static, N any) as a
    (C K, Ho Wo N) tensor, row (channel, tap), column (output pixel,
    image): ``x`` transposed to (C, H, W, N), the batch minor, padded with
    zeros, then one Gather of the pixels each tap reads for every output
    pixel, every gathered item a contiguous run of N values.

    The rows are in the weight's own (C, kh, kw) order, so that the weight
    gradient dY (M, Ho Wo N) @ columns^T comes out as (M, C, kh, kw) with
    no transpose of its own (:func:`im2col_rows` gives (tap, channel)
    columns, which a weight-sized transpose puts back)."""
    (kh, kw), (sh, sw) = kernel, strides
    hp, wp = size[0] + pads[0] + pads[2], size[1] + pads[1] + pads[3]
    xt = g.op("Transpose", x, perm=[1, 2, 3, 0])  # (C, H, W, N)
    if any(pads):
        xt = g.op("Pad", xt, g.int64s([0, pads[0], pads[1], 0, 0, pads[2], pads[3], 0]))
    xt = g.op("Reshape", xt, g.int64s([n_channels, hp * wp, -1]))
    taps = np.array([(a * sh + i) * wp + b * sw + j
                     for i in range(kh) for j in range(kw)
                     for a in range(out[0]) for b in range(out[1])], dtype=np.int64)
    columns = g.op("Gather", xt, g.int64s(taps), axis=1)  # (C, K L, N)
    return g.op("Reshape", columns, g.int64s([n_channels * kh * kw, -1]))


def _tap_selection(kernel, first, w_kernel):
    """The 0/1 matrix (kh kw, K') picking the live taps (the window of
    ``kernel`` from ``first``) out of a weight's ``w_kernel`` taps."""
    select = np.zeros((w_kernel[0] * w_kernel[1], kernel[0] * kernel[1]))
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            select[(first[0] + i) * w_kernel[1] + first[1] + j, i * kernel[1] + j] = 1
    return select


def _lower_depthwise(g, node, plan, n_channels, w_kernel):
    """A depthwise Conv (one filter per channel) over an image of at most
    as many pixels as its kernel has taps, as products and elementwise
    ops, so that neither the forward nor the gradients run onnxruntime's
    grouped Conv and ConvTranspose, which loop over every group and image
    with a tiny GEMM each (MobileNetV2's 1x1 maps).

    With P (H W, K, L) the gather matrix (tap k of output pixel l reads
    input pixel p; padding reads nothing), the weights (K, C) become one
    effective weight per (input pixel, output pixel, channel),
    ``E = P w`` (H W, L, C), a constant times the weight; then ``y[l, n, c]
    = sum_p E[p, l, c] x[p, n, c]``: the input transposed to (H W, N, C)
    (a 2-D transpose of the (N C, H W) matrix: the channels stay the inner
    axis, so that every broadcast runs over contiguous rows), times E, the
    sum over p a product by ones (whose adjoint reads neither operand:
    ReduceSum's reads the products' shape, which kept them alive until the
    backward). H W <= K makes this no more work
    than im2col's K products per output value, and nothing but the input
    and E is kept for the gradients: an input gradient sum_l E dy, a
    weight gradient P^T sum_n x dy: less kernel time than onnxruntime's
    kernels or the im2col forms, and less live memory than the latter."""
    _, strides, pads, size, out, elem_type, _, _ = plan
    x, w = node.input[:2]
    bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
    n_taps, n_out, n_in = w_kernel[0] * w_kernel[1], out[0] * out[1], size[0] * size[1]
    gather = gather_matrix(w_kernel, strides, pads, size, out)  # (H W, K L)
    by_pixel = gather.reshape(n_in, n_taps, n_out).transpose(0, 2, 1)  # (H W, L, K)
    w = g.op("Transpose", g.op("Reshape", w, g.int64s([n_channels, n_taps])), perm=[1, 0])
    effective = g.op("MatMul", g.const(by_pixel.reshape(n_in * n_out, n_taps), elem_type), w)
    effective = g.op("Reshape", effective, g.int64s([n_in, n_out, 1, n_channels]))
    xt = g.op("Transpose", g.op("Reshape", x, g.int64s([-1, n_in])), perm=[1, 0])
    xt = g.op("Reshape", xt, g.int64s([n_in, 1, -1, n_channels]))  # (H W, 1, N, C)
    y = g.op("Reshape", g.op("Mul", xt, effective), g.int64s([n_in, -1]))
    if n_in > 1:
        y = g.op("MatMul", g.const(np.ones((1, n_in)), elem_type), y)
    y = g.op("Reshape", y, g.int64s([n_out, -1, n_channels]))  # (L, N, C)
    if bias is not None:
        y = g.op("Add", y, g.op("Reshape", bias, g.int64s([1, 1, n_channels])))
    y = g.op("Transpose", g.op("Reshape", y, g.int64s([n_out, -1])), perm=[1, 0])
    g.op("Reshape", y, g.int64s([-1, n_channels, out[0], out[1]]),
         outputs=[node.output[0]])


def _lower(g, node, plan, n_channels, m_out, w_kernel):
    kernel, strides, pads, size, out, elem_type, first, _ = plan
    x, w = node.input[:2]
    bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
    n_taps = kernel[0] * kernel[1]
    # the batch made the minor axis before im2col, on the input (K times
    # smaller than the columns): (N, C, H W) -> (C, H W, N)
    cols = g.op("Reshape", x, g.int64s([0, n_channels, size[0] * size[1]]))
    cols = g.op("Transpose", cols, perm=[1, 2, 0])
    gather = gather_matrix(kernel, strides, pads, size, out)
    if gather.shape[0] != gather.shape[1] or (gather != np.eye(len(gather))).any():
        # im2col as one product per channel: P^T (K L, H W) @ (C, H W, N)
        cols = g.op("MatMul", g.const(gather.T, elem_type), cols)
    # (C, K L, N) -> (C K, L N): one GEMM over the batch
    cols = g.op("Reshape", cols, g.int64s([n_channels * n_taps, -1]))
    if list(kernel) != list(w_kernel):
        # the taps reading only padding left out: the weight's (M C, K) taps
        # times a 0/1 selection (K, K'), whose adjoint is one GEMM too (a
        # Slice's, a Pad, runs much slower)
        select = _tap_selection(kernel, first, w_kernel)
        w = g.op("Reshape", w, g.int64s([m_out * n_channels, len(select)]))
        w = g.op("MatMul", w, g.const(select, elem_type))
    w2 = g.op("Reshape", w, g.int64s([m_out, n_channels * n_taps]))
    y = g.op("MatMul", w2, cols)  # (M, L N)
    if bias is not None:
        y = g.op("Add", y, g.op("Unsqueeze", bias, g.int64s([1])))
    # (M, Ho, Wo, N) -> (N, M, Ho, Wo)
    y = g.op("Reshape", y, g.int64s([m_out, out[0], out[1], -1]))
    g.op("Transpose", y, perm=[3, 0, 1, 2], outputs=[node.output[0]])


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
    g = GraphBuilder(opset, used_names=graph_names(graph))

    def lower(node):
        plan = _plan(node, types, weights, inits)
        if plan is None:
            return False
        dims = inits[node.input[1]].dims
        if plan[-1]:  # depthwise
            _lower_depthwise(g, node, plan, dims[0], dims[2:])
        else:
            _lower(g, node, plan, dims[1], dims[0], dims[2:])
        return True
    return rewrite_nodes(model, g, lower)


def _columns_plan(node, types, weights):
    """(C, M, kernel, strides, pads, (H, W), (Ho, Wo)) of a forward Conv
    whose weight gradient took the columns form (the choice of
    ``autodiff/rules/conv.py``: a 2-D Conv of one group, no dilation,
    explicit or no padding, static C, H, W and weight, the weight among
    ``weights``) on at most :data:`MAX_SHARED_PIXELS` output pixels, with
    more than one tap (a 1x1 Conv needs no columns); None otherwise."""
    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or \
            len(node.input) < 2 or node.input[1] not in weights:
        return None
    attrs = _attrs(node)
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if attrs.get("group", 1) != 1 or any(d != 1 for d in attrs.get("dilations", [1, 1])) \
            or auto_pad not in ("NOTSET", "VALID"):
        return None
    x_type, w_type = types.get(node.input[0]), types.get(node.input[1])
    if x_type is None or w_type is None or x_type[1] is None or w_type[1] is None:
        return None
    shape, w_shape = list(x_type[1]), list(w_type[1])
    if len(shape) != 4 or len(w_shape) != 4 or \
            not all(isinstance(d, int) and d > 0 for d in shape[1:] + w_shape):
        return None
    m_out, n_channels, kernel = w_shape[0], w_shape[1], w_shape[2:]
    strides = list(attrs.get("strides", [1, 1]))
    pads = [0] * 4 if auto_pad == "VALID" else list(attrs.get("pads", [0] * 4))
    if n_channels != shape[1] or kernel[0] * kernel[1] < 2 or len(strides) != 2:
        return None
    out = output_size(shape[2:], kernel, strides, pads)
    pixels = out[0] * out[1]
    if min(out) < 1 or pixels > MAX_SHARED_PIXELS or \
            not columns_form(shape[0], n_channels, m_out, pixels):
        return None
    return n_channels, m_out, kernel, strides, pads, shape[2:], out


def convs_on_columns(nodes, g, types, weights):
    """The forward ``nodes`` of a training graph with each Conv whose
    weight gradient the reverse pass took on :func:`im2col_columns` (see
    :func:`_columns_plan`) computed from those columns: the weight as
    (M, C K) times the columns (C K, Ho Wo N), then (M, Ho, Wo, N)
    transposed to (N, M, Ho, Wo). The columns are built by the same call in
    the same builder, so that common-subexpression elimination leaves one
    copy, read by the forward product and by the weight gradient's.

    Parameters
    ----------
    nodes : list of onnx.NodeProto
        The forward nodes, in order (not modified).
    g : GraphBuilder
        The reverse pass's builder: the new nodes' constants are its own
        (equal constants share a name); the new nodes are returned, not
        left in ``g.nodes``.
    types : dict
        Types of the forward values.
    weights : iterable of str
        The trained weights.

    Returns
    -------
    list of onnx.NodeProto
        ``nodes`` itself when no Conv qualifies.
    """
    if g.opset < 11:  # Pad's pads an input
        return nodes
    weights = set(weights)
    result, changed = [], False
    for node in nodes:
        plan = _columns_plan(node, types, weights)
        if plan is None:
            result.append(node)
            continue
        n_channels, m_out, kernel, strides, pads, size, out = plan
        mark = len(g.nodes)
        columns = im2col_columns(g, node.input[0], n_channels, kernel, strides, pads,
                                 size, out)
        w2 = g.op("Reshape", node.input[1],
                  g.int64s([m_out, n_channels * kernel[0] * kernel[1]]))
        y = g.op("MatMul", w2, columns)  # (M, Ho Wo N)
        if len(node.input) > 2 and node.input[2]:
            y = g.op("Add", y, g.unsqueeze(node.input[2], [1]))
        y = g.op("Reshape", y, g.int64s([m_out, out[0], out[1], -1]))
        g.op("Transpose", y, perm=[3, 0, 1, 2], outputs=[node.output[0]])
        result.extend(g.nodes[mark:])
        del g.nodes[mark:]
        changed = True
    return result if changed else nodes
