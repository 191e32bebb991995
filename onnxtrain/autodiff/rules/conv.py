"""VJP rules of Conv, ConvTranspose (its adjoint: Conv for dX, the Conv weight
gradient with X and dY swapped for dW) and Col2Im (adjoint: im2col as a Conv
by one-hot kernels).

With stride s, dilation d and padding (b, e) on every spatial axis:

- dX is the transposed convolution of dY with W, computed with
  ``output_padding = s - 1`` (long enough for every input row) and cropped
  to ``[b, b + X)``;
- dW[m, c, k] = sum over n and o of dY[n, m, o] Xpad[n, c, o s + k d]: a
  convolution of X (batch and channels swapped, groups kept apart) by dY
  with stride d and dilation s, cropped to the kernel size;
- dB is dY summed over every axis but the channels.

A 2-D depthwise Conv (``group`` = input channels = output channels, one
filter per channel) with static C, H, W takes dW tap by tap instead, in
channels-last layout: dW[c, k] = sum over n, o of the tap's strided slice
of Xpad (N, Ho, Wo, C) times dY (N, Ho, Wo, C), a Mul and a ReduceSum
over the leading axes per tap (onnxruntime's grouped Conv runs the Conv
form as one GEMM per channel over an im2col as large as the image).

A 2-D Conv of one group without dilation and with static C, H, W takes
dW as one GEMM instead, dY (M, N L) times the im2col rows or columns of X
(``graph/conv_gemm.im2col_rows``, ``im2col_columns``), and at stride 1
dX as the correlation of dY, padded by K - 1 - pad, with the flipped
weight (what ConvTranspose computes): one GEMM on the im2col rows of dY
for small images, onnxruntime's Conv for large ones. The same sums, in
the forms onnxruntime runs fastest.
"""
import numpy as np
from onnx import TensorProto

from ...graph import conv_gemm
from ...graph.conv_gemm import im2col_columns, im2col_rows, output_size
from ..registry import register_vjp


def conv_geometry(ctx, x, w):
    """``(kernel, strides, dilations, begins, ends)`` of a Conv-like node.

    SAME_* padding needs the static spatial sizes of ``x``.
    """
    rank = ctx.rank(x, ctx.node.op_type)
    n = rank - 2
    kernel = ctx.attr("kernel_shape") or list((ctx.shape(w) or ())[2:])
    if not all(isinstance(k, int) for k in kernel):
        ctx.fail("the kernel size must be static")
    strides = ctx.attr("strides") or [1] * n
    dilations = ctx.attr("dilations") or [1] * n
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    if auto_pad == "NOTSET":
        pads = ctx.attr("pads") or [0] * (2 * n)
        return kernel, strides, dilations, list(pads[:n]), list(pads[n:])
    if auto_pad == "VALID":
        return kernel, strides, dilations, [0] * n, [0] * n
    sizes = ctx.shape(x)[2:]
    if not all(isinstance(v, int) for v in sizes):
        ctx.fail(f"auto_pad={auto_pad} with symbolic spatial sizes")
    begins, ends = [], []
    for size, k, s, d in zip(sizes, kernel, strides, dilations):
        total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
        small = total // 2
        begins.append(small if auto_pad == "SAME_UPPER" else total - small)
        ends.append(total - begins[-1])
    return kernel, strides, dilations, begins, ends


def crop_spatial(ctx, v, begins, like, rank):
    """``v[:, :, b : b + size]`` with the spatial sizes of ``like``."""
    starts = ctx.g.int64s(begins)
    sizes = ctx.op("Slice", ctx.g.shape_of(like), ctx.g.int64s([2]),
                   ctx.g.int64s([rank]))
    return ctx.op("Slice", v, starts, ctx.op("Add", starts, sizes),
                  ctx.g.int64s(list(range(2, rank))))


def _shape_parts(ctx, x, *parts):
    """Concat of ``Shape(x)[a:b]`` for ``(a, b)`` pairs and int lists."""
    pieces = []
    for part in parts:
        if isinstance(part, tuple):
            a, b = part
            pieces.append(ctx.op("Slice", ctx.g.shape_of(x), ctx.g.int64s([a]),
                                 ctx.g.int64s([b])))
        else:
            pieces.append(ctx.g.int64s(part))
    return ctx.op("Concat", *pieces, axis=0)


def _conv_weight_grad(ctx, x, gy, kernel, strides, dilations, pads, rank):
    group = ctx.attr("group", 1)
    spatial = list(range(3, rank + 1))
    big = 2 ** 31
    # X (N, C, S) -> (C/g, g N, S)
    xg = ctx.op("Reshape", x, _shape_parts(ctx, x, (0, 1), [group, -1], (2, big)))
    xg = ctx.op("Transpose", xg, perm=[2, 1, 0] + spatial)
    xg = ctx.op("Reshape", xg, _shape_parts(ctx, xg, (0, 1), [-1], (3, big)))
    # dY (N, M, O) -> (M, N, O) with the groups kept in order
    gk = ctx.op("Reshape", gy, _shape_parts(ctx, gy, (0, 1), [group, -1], (2, big)))
    gk = ctx.op("Transpose", gk, perm=[1, 2, 0] + spatial)
    gk = ctx.op("Reshape", gk, _shape_parts(ctx, gk, [-1], (2, 3), (3, big)))
    gw = ctx.op("Conv", xg, gk, group=group, strides=dilations,
                dilations=strides, pads=pads)
    gw = ctx.op("Transpose", gw, perm=[1, 0] + list(range(2, rank)))
    return ctx.op("Slice", gw, ctx.g.int64s([0] * len(kernel)),
                  ctx.g.int64s(kernel), ctx.g.int64s(list(range(2, rank))))


def _bias_grad(ctx, gy, rank):
    """dB of Conv and ConvTranspose: dY summed over the batch and spatial
    axes (None without B or when B needs no gradient)."""
    if len(ctx.inputs) > 2 and ctx.needs_grad[2]:
        return ctx.g.reduce_sum(gy, [0] + list(range(2, rank)), keepdims=0)
    return None


@register_vjp("Conv")
def _conv(ctx, gy):
    x, w = ctx.inputs[:2]
    rank = ctx.rank(x, "Conv")
    kernel, strides, dilations, begins, ends = conv_geometry(ctx, x, w)
    gx = gw = None
    if ctx.needs_grad[0]:
        gx = _conv_input_grad_gemm(ctx, x, w, gy, kernel, strides, dilations,
                                   begins + ends)
        if gx is None:
            gx = _conv_input_grad_transposed(ctx, x, w, gy, kernel, strides, dilations,
                                             begins, ends, rank)
    if ctx.needs_grad[1]:
        gw = _conv_weight_grad_gemm(ctx, x, w, gy, kernel, strides, dilations,
                                    begins + ends)
        if gw is None:
            gw = _depthwise_weight_grad(ctx, x, w, gy, kernel, strides, dilations,
                                        begins + ends)
        if gw is None:
            gw = _conv_weight_grad(ctx, x, gy, kernel, strides, dilations,
                                   begins + ends, rank)
    return (gx, gw, _bias_grad(ctx, gy, rank))[:len(ctx.inputs)]


def _conv_weight_grad_gemm(ctx, x, w, gy, kernel, strides, dilations, pads):
    """dW of a 2-D Conv of one group, no dilation and static C, H, W as
    one GEMM, dW (M, C K) = dY (M, N L) @ im2col(X)^T (N L, C K); None
    when the Conv is not such a one. onnxruntime runs the Conv form (X by
    dY) as one thin GEMM per input channel, N = kernel taps wide, slower
    than these GEMMs.

    The im2col is :func:`~onnxtrain.graph.conv_gemm.im2col_columns` (no
    transpose of the product) or
    :func:`~onnxtrain.graph.conv_gemm.im2col_rows`, whichever
    :func:`~onnxtrain.graph.conv_gemm.columns_form` finds cheaper (the
    columns then also serve the forward of small maps:
    :func:`~onnxtrain.graph.conv_gemm.convs_on_columns`)."""
    static = _static_2d(ctx, x, w, strides, dilations)
    if static is None:
        return None
    size, w_shape = static[0][1:], static[1]
    out = output_size(size, kernel, strides, pads)
    if min(out) < 1:
        return None
    m_out, n_channels = w_shape[0], w_shape[1]
    if conv_gemm.columns_form(ctx.shape(x)[0], n_channels, m_out, out[0] * out[1]):
        columns = im2col_columns(ctx.g, x, n_channels, kernel, strides, pads, size, out)
        # dY as (M, Ho Wo N), the columns' order
        g2 = ctx.op("Transpose", gy, perm=[1, 2, 3, 0])
        g2 = ctx.op("Reshape", g2, ctx.g.int64s([m_out, -1]))
        gw = ctx.op("Gemm", g2, columns, transB=1)
        return ctx.op("Reshape", gw, ctx.g.int64s([m_out, n_channels] + list(kernel)))
    rows = im2col_rows(ctx.g, x, n_channels, kernel, strides, pads, size, out)
    g2 = ctx.op("Transpose", gy, perm=[1, 0, 2, 3])
    g2 = ctx.op("Reshape", g2, ctx.g.int64s([m_out, -1]))
    # (M, K C): the taps major, the channels minor, as the rows' columns
    gw = ctx.op("Reshape", ctx.op("MatMul", g2, rows),
                ctx.g.int64s([m_out, kernel[0], kernel[1], n_channels]))
    return ctx.op("Transpose", gw, perm=[0, 3, 1, 2])


def _depthwise_weight_grad(ctx, x, w, gy, kernel, strides, dilations, pads):
    """dW of a 2-D depthwise Conv with static C, H, W as a sum per tap in
    channels-last layout (see the module's docstring); None for other
    Convs."""
    x_shape, w_shape = ctx.shape(x), ctx.shape(w)
    if x_shape is None or w_shape is None or len(x_shape) != 4 or \
            not all(isinstance(d, int) for d in list(x_shape[1:]) + list(w_shape)):
        return None
    n_channels, size = x_shape[1], x_shape[2:]
    if ctx.attr("group", 1) != n_channels or list(w_shape[:2]) != [n_channels, 1]:
        return None
    out = [(size[i] + pads[i] + pads[i + 2] - dilations[i] * (kernel[i] - 1) - 1)
           // strides[i] + 1 for i in range(2)]
    if min(out) < 1:
        return None
    xt = ctx.op("Transpose", x, perm=[0, 2, 3, 1])
    if any(pads):
        xt = ctx.op("Pad", xt, ctx.g.int64s([0, pads[0], pads[1], 0,
                                              0, pads[2], pads[3], 0]))
    gt = ctx.op("Transpose", gy, perm=[0, 2, 3, 1])
    axes, steps = ctx.g.int64s([1, 2]), ctx.g.int64s(list(strides))
    taps = []
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            begin = [i * dilations[0], j * dilations[1]]
            end = [b + s * (o - 1) + 1 for b, s, o in zip(begin, strides, out)]
            tap = ctx.op("Slice", xt, ctx.g.int64s(begin), ctx.g.int64s(end), axes, steps)
            taps.append(ctx.g.reduce_sum(ctx.op("Mul", tap, gt), [0, 1, 2], keepdims=0))
    # (K C), taps major -> (C, 1, kh, kw)
    gw = ctx.op("Reshape", ctx.op("Concat", *taps, axis=0),
                ctx.g.int64s([kernel[0] * kernel[1], n_channels]))
    return ctx.op("Reshape", ctx.op("Transpose", gw, perm=[1, 0]),
                  ctx.g.int64s([n_channels, 1] + list(kernel)))


def _static_2d(ctx, x, w, strides, dilations):
    """(x's static (C, H, W), w's shape) of a 2-D Conv of one group without
    dilation, with static channels, sizes and weight; None otherwise."""
    x_shape, w_shape = ctx.shape(x), ctx.shape(w)
    if x_shape is None or w_shape is None or len(x_shape) != 4 or \
            not all(isinstance(d, int) for d in list(x_shape[1:]) + list(w_shape)) or \
            ctx.attr("group", 1) != 1 or any(d != 1 for d in dilations) or \
            len(strides) != 2:
        return None
    return list(x_shape[1:]), list(w_shape)


def _conv_input_grad_transposed(ctx, x, w, gy, kernel, strides, dilations, begins,
                                ends, rank):
    """dX as the transposed convolution of dY with W. With static spatial
    sizes, ConvTranspose's own pads crop it to X (the output padding
    ``H - ((Ho - 1) s + (k - 1) d + 1 - pads)``, below the stride, puts
    back the rows the Conv's floor left out): no border computed, then
    sliced off. Otherwise the full output (``output_padding = s - 1``),
    cropped to X."""
    group = ctx.attr("group", 1)
    x_shape, y_shape = ctx.shape(x), ctx.shape(ctx.outputs[0])  # dY's shape
    sizes = list(x_shape[2:]) if x_shape is not None else []
    outs = list(y_shape[2:]) if y_shape is not None else []
    if len(sizes) == len(outs) == len(kernel) and \
            all(isinstance(v, int) for v in sizes + outs):
        extra = [h - ((o - 1) * s + (k - 1) * d + 1 - b - e) for h, o, k, s, d, b, e in
                 zip(sizes, outs, kernel, strides, dilations, begins, ends)]
        if all(0 <= v < s for v, s in zip(extra, strides)):
            return ctx.op("ConvTranspose", gy, w, strides=strides, dilations=dilations,
                          group=group, kernel_shape=kernel, pads=begins + ends,
                          output_padding=extra)
    full = ctx.op("ConvTranspose", gy, w, strides=strides, dilations=dilations,
                  group=group, kernel_shape=kernel,
                  output_padding=[s - 1 for s in strides])
    return crop_spatial(ctx, full, begins, x, rank)


#: Input pixels (H W) from which the input gradient of a stride-1 Conv is
#: a Conv of dY by the flipped, transposed weight rather than one GEMM on
#: the im2col rows of dY: onnxruntime's Conv kernel, one GEMM per image as
#: wide as the image, then needs no layout transposes; below, the GEMM is
#: faster (forward and both gradients of one Conv).
_CONV_DX_MIN_PIXELS = 256


def _conv_input_grad_gemm(ctx, x, w, gy, kernel, strides, dilations, pads):
    """dX of a stride-1 Conv (see :func:`_static_2d`) as the correlation of
    dY, padded by K - 1 - pad, with the flipped weight; None for other
    Convs (ConvTranspose then).

    Below :data:`_CONV_DX_MIN_PIXELS` input pixels, one GEMM: dX (N H W, C)
    = im2col rows of dY, taps in reverse order (N H W, K M) @ W as (K M, C),
    then back to (N, C, H, W) (faster than ConvTranspose and its crop);
    from there, onnxruntime's Conv of dY by W transposed to (C, M, kh, kw)
    and flipped."""
    static = _static_2d(ctx, x, w, strides, dilations)
    if static is None or any(s != 1 for s in strides):
        return None
    (n_channels, h, w_size), (m_out, _, kh, kw) = static
    flipped = [kh - 1 - pads[0], kw - 1 - pads[1], kh - 1 - pads[2], kw - 1 - pads[3]]
    out = output_size([h, w_size], kernel, [1, 1], pads)
    if min(flipped) < 0 or min(out) < 1:
        return None
    if h * w_size >= _CONV_DX_MIN_PIXELS:
        return ctx.op("Conv", gy, _flipped_transposed_weight(ctx, w, m_out, n_channels, kh, kw),
                      kernel_shape=list(kernel), pads=flipped)
    # the taps of dY's rows in reverse order meet the weight unflipped
    rows = im2col_rows(ctx.g, gy, m_out, kernel, [1, 1], flipped, out, [h, w_size],
                       flip=True)
    wt = ctx.op("Transpose", w, perm=[2, 3, 0, 1])  # (kh, kw, M, C)
    wt = ctx.op("Reshape", wt, ctx.g.int64s([kh * kw * m_out, n_channels]))
    gx = ctx.op("Reshape", ctx.op("MatMul", rows, wt),
                ctx.g.int64s([-1, h, w_size, n_channels]))
    return ctx.op("Transpose", gx, perm=[0, 3, 1, 2])


def _flipped_transposed_weight(ctx, w, m_out, n_channels, kh, kw):
    """W (M, C, kh, kw) as (C, M, kh, kw) with both spatial axes reversed,
    the weight of the Conv computing dX.

    Reversing both spatial axes reverses the kh kw taps in row-major
    order: in float and double, a product of W as (M C, kh kw) by the
    constant anti-identity, exact (one product by 1, the others by 0;
    an inf or NaN weight spreads NaN over its taps) and run by
    onnxruntime's GEMM on every thread, where its Slice with negative steps
    copies element by element on one thread (several times slower); the
    Slice for the other types."""
    taps = kh * kw
    if taps == 1:  # a 1x1 kernel is its own flip
        return ctx.op("Transpose", w, perm=[1, 0, 2, 3])
    if ctx.dtype not in (TensorProto.FLOAT, TensorProto.DOUBLE):
        last = ctx.g.int64s([-1, -1])  # both spatial axes reversed
        return ctx.op("Slice", ctx.op("Transpose", w, perm=[1, 0, 2, 3]), last,
                      ctx.g.int64s([-2 ** 63, -2 ** 63]), ctx.g.int64s([2, 3]), last)
    wt = ctx.op("Reshape", w, ctx.g.int64s([m_out * n_channels, taps]))
    wt = ctx.op("MatMul", wt, ctx.const(np.eye(taps)[::-1].copy()))
    wt = ctx.op("Reshape", wt, ctx.g.int64s([m_out, n_channels, kh, kw]))
    wt = ctx.op("Transpose", wt, perm=[1, 0, 2, 3])
    return wt


def _conv_transpose_pads(ctx, x, kernel, strides, dilations):
    """``(begins, ends)`` cropped from the full transposed convolution
    (SAME_UPPER puts the odd pixel at the end, as onnxruntime does)."""
    n = len(kernel)
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    out = list(ctx.attr("output_shape") or [])[-n:]
    if auto_pad == "VALID" or (auto_pad == "NOTSET" and not out):
        pads = ctx.attr("pads") or [0] * (2 * n)
        return list(pads[:n]), list(pads[n:])
    sizes = ctx.shape(x)[2:]
    if not all(isinstance(v, int) for v in sizes):
        ctx.fail(f"auto_pad={auto_pad} or output_shape with symbolic sizes")
    adj = ctx.attr("output_padding") or [0] * n
    begins, ends = [], []
    for i, (size, k, s, d) in enumerate(zip(sizes, kernel, strides, dilations)):
        target = out[i] if out else size * s
        total = max(0, (size - 1) * s + adj[i] + (k - 1) * d + 1 - target)
        head = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
        begins.append(head)
        ends.append(total - head)
    return begins, ends


@register_vjp("ConvTranspose")
def _conv_transpose(ctx, gy):
    # Y = crop(full), full[i s + k d] += X[i] W[k]: dX is the Conv of dY
    # (padded back by the crop) with W, dW the Conv weight gradient with
    # the roles of X and dY swapped
    x, w = ctx.inputs[:2]
    rank = ctx.rank(x, "ConvTranspose")
    kernel, strides, dilations, _, _ = conv_geometry(ctx, x, w)
    begins, ends = _conv_transpose_pads(ctx, x, kernel, strides, dilations)
    if min(begins + ends) < 0:
        ctx.fail(f"negative pads {begins + ends}")
    gx = gw = None
    if ctx.needs_grad[0]:
        gx = ctx.op("Conv", gy, w, strides=strides, dilations=dilations,
                    group=ctx.attr("group", 1), pads=begins + ends)
        gx = crop_spatial(ctx, gx, [0] * len(kernel), x, rank)
    if ctx.needs_grad[1]:
        gw = _conv_weight_grad(ctx, gy, x, kernel, strides, dilations,
                               begins + ends, rank)
    return (gx, gw, _bias_grad(ctx, gy, rank))[:len(ctx.inputs)]


@register_vjp("Col2Im")
def _col2im(ctx, gy):
    # the adjoint of Col2Im (summing blocks into the image) is im2col: a
    # Conv of every image channel by the K = prod(block_shape) one-hot
    # kernels, whose output (N C, K, L...) is the (N, C K, L) input layout
    x, image_shape, block_shape = ctx.inputs
    i64 = TensorProto.INT64
    count = ctx.op("ReduceProd", block_shape, keepdims=1)
    k = ctx.op("Range", ctx.const(0, i64), ctx.op("Squeeze", count),
               ctx.const(1, i64))
    eye = ctx.g.cast(ctx.op("Equal", ctx.g.unsqueeze(k, [1]),
                            ctx.g.unsqueeze(k, [0])), ctx.dtype)
    kernel = ctx.op("Reshape", eye, ctx.op("Concat", count, ctx.g.int64s([1]),
                                           block_shape, axis=0))
    rest = ctx.op("Slice", ctx.g.shape_of(gy), ctx.g.int64s([2]),
                  ctx.g.int64s([2 ** 31]))
    images = ctx.op("Reshape", gy, ctx.op("Concat", ctx.g.int64s([-1, 1]),
                                          rest, axis=0))
    cols = ctx.op("Conv", images, kernel, strides=ctx.attr("strides"),
                  dilations=ctx.attr("dilations"), pads=ctx.attr("pads"))
    return ctx.g.reshape_like(cols, x), None, None
