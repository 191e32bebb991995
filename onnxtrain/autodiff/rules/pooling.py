"""VJP rules of pooling: MaxPool (through its indices), global pools,
AveragePool and LpPool (through the transpose of "sum every window": a
ConvTranspose by a kernel of ones, the window counts and divisors taken from
a Conv and an AveragePool of ones, so that padding, count_include_pad and
ceil_mode follow onnxruntime's kernels; on windows tiling the input, dY
divided by the window's size and repeated over each window)."""
import numpy as np
from onnx import TensorProto

from ..registry import register_vjp


@register_vjp("MaxPool")
def _max_pool(ctx, gy, g_indices=None):
    # the gradient goes to the element each window picked: the pool is run
    # again for its Indices (flat positions in X, padding not counted)
    x = ctx.inputs[0]
    tiled = _tiling_window(ctx, x)
    if tiled:
        return _tiled_max_pool(ctx, gy, x, tiled)
    # (column-major indices, storage_order=1, are recomputed row-major)
    row_major = not ctx.attr("storage_order", 0)
    indices = ctx.outputs[1] if len(ctx.outputs) > 1 and ctx.outputs[1] else None
    if indices is None or not row_major:
        attrs = dict(ctx.attributes, storage_order=0)
        _, indices = ctx.op("MaxPool", x, n_outputs=2, **attrs)
    kernel = ctx.attr("kernel_shape")
    strides = ctx.attr("strides") or [1] * len(kernel)
    dilations = ctx.attr("dilations") or [1] * len(kernel)
    # a dilated window spans (k - 1) * d + 1 elements
    overlap = any((k - 1) * d + 1 > s for k, s, d in zip(kernel, strides, dilations))
    minus_one = ctx.g.int64s([-1])
    args = (ctx.op("Reshape", ctx.zeros_like(x), minus_one),
            ctx.op("Reshape", indices, minus_one), ctx.op("Reshape", gy, minus_one))
    if ctx.opset >= 16:
        flat = ctx.g.scatter_add("ScatterElements", *args, ctx.dtype, axis=0)
    elif not overlap:  # Scatter is ScatterElements' name before opset 11
        flat = ctx.op("ScatterElements" if ctx.opset >= 11 else "Scatter", *args, axis=0)
    else:
        ctx.fail("overlapping windows need ScatterElements with "
                 f"reduction='add' (opset >= 16, model opset {ctx.opset})")
    return ctx.g.reshape_like(flat, x)


def _tiling_window(ctx, x):
    """The side k of a MaxPool's square 2-D windows where they tile X
    exactly (kernel k x k, strides k, no padding nor dilation, static H and
    W multiples of k), in float or double from opset 11; None otherwise.

    onnxruntime's MaxPool with Indices is a scalar kernel several times
    slower than the pool itself: on such windows _tiled_max_pool finds the
    picked elements without it.
    """
    kernel = ctx.attr("kernel_shape")
    shape = ctx.shape(x)
    if (ctx.opset < 11 or ctx.dtype not in (TensorProto.FLOAT, TensorProto.DOUBLE)
            or not kernel or len(kernel) != 2 or kernel[0] != kernel[1]
            or list(ctx.attr("strides") or [1, 1]) != list(kernel)
            or any(ctx.attr("pads") or [0])
            or any(d != 1 for d in ctx.attr("dilations") or [1])
            or ctx.attr("auto_pad", "NOTSET") not in ("NOTSET", "VALID")
            or shape is None or len(shape) != 4
            or not all(isinstance(d, int) and d > 0 for d in shape[2:])):
        return None
    k, (h, w) = int(kernel[0]), shape[2:]
    # the codes below, (k * k + 1) * k * W at most, stay exact in float32
    if h % k or w % k or (k * k + 1) * k * w >= 2 ** 24:
        return None
    return k


def _tiled_max_pool(ctx, gy, x, k):
    """MaxPool's gradient on windows tiling X (see _tiling_window), exact:
    each window's gradient goes to the first element, in row-major order
    within the window, equal to its maximum, as onnxruntime's and
    PyTorch's indices pick between ties (a window holding NaN, which equals
    nothing, sends it to its first element).

    SpaceToDepth puts window position p = i * k + j on an axis of its own;
    the hits (X == Y) weighted by (k*k - p) * S + offset(p), with S = k * W
    and offset(p) = i * W + j the position in the window's k rows of X,
    have their maximum at the first hit, and that maximum mod S is its
    offset. The gradient is then scattered (one element per window, no
    sum) into X seen as rows of k * W: the window's k rows.
    """
    w = ctx.shape(x)[3]
    kk, span = k * k, k * w
    g = ctx.g
    windows = ctx.op("Reshape", ctx.op("SpaceToDepth", x, blocksize=k),
                     g.int64s([0, kk, -1]))
    y = ctx.op("Reshape", ctx.outputs[0], g.int64s([0, 1, -1]))
    weights = np.array([(kk - p) * span + (p // k) * w + p % k for p in range(kk)],
                       dtype=np.float64).reshape(1, kk, 1)
    # Mul by the cast mask rather than Where: onnxruntime's broadcasting Where
    # is much slower
    coded = ctx.op("Mul", g.cast(ctx.op("Equal", windows, y), ctx.dtype),
                   ctx.const(weights))
    first = g.reduce("ReduceMax", coded, [1], keepdims=0)
    # (mod by floor: Mod with fmod=1 is a slow per-element call on onnxruntime)
    size = ctx.const(float(span))
    offset = ctx.op("Sub", first, ctx.op("Mul", ctx.op("Floor", ctx.op("Div", first, size)),
                                         size))
    columns = g.int64s([-1, w // k])
    origin = g.int64s(np.arange(w // k) * k)
    indices = ctx.op("Add", ctx.op("Reshape", g.cast(offset, TensorProto.INT64), columns),
                     origin)
    rows = ctx.op("Reshape", ctx.zeros_like(x), g.int64s([-1, span]))
    scattered = ctx.op("ScatterElements", rows, indices,
                       ctx.op("Reshape", gy, columns), axis=1)
    return g.reshape_like(scattered, x)


@register_vjp("GlobalAveragePool")
def _global_average_pool(ctx, gy):
    x = ctx.inputs[0]
    count = ctx.op("Div", ctx.op("Size", x), ctx.op("Size", ctx.outputs[0]))
    spread = ctx.op("Expand", gy, ctx.g.shape_of(x))
    return ctx.op("Div", spread, ctx.g.cast(count, ctx.dtype))


@register_vjp("GlobalMaxPool")
def _global_max_pool(ctx, gy):
    # shared equally between ties, as ReduceMax
    x = ctx.inputs[0]
    rank = ctx.rank(x, "GlobalMaxPool")
    y = ctx.op("Expand", ctx.outputs[0], ctx.g.shape_of(x))
    hit = ctx.g.cast(ctx.op("Equal", x, y), ctx.dtype)
    ties = ctx.g.reduce_sum(hit, list(range(2, rank)), keepdims=1)
    spread = ctx.op("Expand", ctx.op("Div", gy, ties), ctx.g.shape_of(x))
    return ctx.op("Mul", spread, hit)



def _channels_as_batch(ctx, v):
    """(N, C, S...) -> (N*C, 1, S...)."""
    rest = ctx.op("Slice", ctx.g.shape_of(v), ctx.g.int64s([2]),
                  ctx.g.int64s([2 ** 31]))
    return ctx.op("Reshape", v, ctx.op("Concat", ctx.g.int64s([-1, 1]), rest,
                                       axis=0))


def _window_geometry(ctx, x):
    from .conv import conv_geometry
    kernel, strides, dilations, begins, ends = conv_geometry(ctx, x, None)
    if min(begins + ends) < 0:
        ctx.fail(f"negative pads {begins + ends}")
    return kernel, strides, dilations, begins, ends


def _window_sum_adjoint(ctx, g, x, geometry):
    """Transpose of "sum every pooling window" (zero padding): each element
    of ``x`` receives the sum of ``g`` over the windows that contain it, a
    ConvTranspose of ``g`` by a kernel of ones, cropped to ``x``."""
    from .conv import crop_spatial
    kernel, strides, dilations, begins, _ = geometry
    rank = len(kernel) + 2
    ones = ctx.const(np.ones([1, 1] + list(kernel)))
    full = ctx.op("ConvTranspose", _channels_as_batch(ctx, g), ones,
                  strides=strides, dilations=dilations, kernel_shape=kernel,
                  output_padding=[s - 1 for s in strides])
    return ctx.g.reshape_like(crop_spatial(ctx, full, begins, x, rank), x)


def _window_counts(ctx, x, gy, geometry):
    """Number of elements of ``x`` (padding excluded) in every window, shaped
    (1, 1, O...) like ``gy``'s spatial axes: a Conv of ones padded at the end
    by one more stride (ceil_mode's last windows), cropped to ``gy``."""
    from .conv import crop_spatial
    kernel, strides, dilations, begins, ends = geometry
    rank = len(kernel) + 2
    shape = ctx.op("Concat", ctx.g.int64s([1, 1]), ctx.op(
        "Slice", ctx.g.shape_of(x), ctx.g.int64s([2]), ctx.g.int64s([rank])),
        axis=0)
    ones_x = ctx.op("Expand", ctx.const(1), shape)
    counts = ctx.op("Conv", ones_x, ctx.const(np.ones([1, 1] + list(kernel))),
                    strides=strides, dilations=dilations, kernel_shape=kernel,
                    pads=begins + [e + s for e, s in zip(ends, strides)])
    return crop_spatial(ctx, counts, [0] * len(kernel), gy, rank), ones_x


@register_vjp("AveragePool")
def _average_pool(ctx, gy):
    # y = window sum / divisor; the divisor (count_include_pad, ceil_mode)
    # is onnxruntime's own: AveragePool(ones) = counts / divisor
    x = ctx.inputs[0]
    k = _tiling_window(ctx, x)
    if k is not None:
        return _tiled_average_pool(ctx, gy, x, k)
    geometry = _window_geometry(ctx, x)
    counts, ones_x = _window_counts(ctx, x, gy, geometry)
    ratio = ctx.op("AveragePool", ones_x, **ctx.attributes)
    safe = ctx.op("Max", counts, ctx.const(1))
    inverse = ctx.op("Where", ctx.op("Greater", counts, ctx.const(0)),
                     ctx.op("Div", ratio, safe), ctx.const(0))
    return _window_sum_adjoint(ctx, ctx.op("Mul", gy, inverse), x, geometry)


def _tiled_average_pool(ctx, gy, x, k):
    """AveragePool's gradient on windows tiling X (see _tiling_window: every
    window holds k * k elements, none of them padding): each element gets
    its window's dY / (k k). The columns are repeated by a product with a
    constant 0/1 matrix (Wo, W) (one nonzero term per sum), the rows by an
    Expand of whole rows: onnxruntime's Expand repeating single elements
    is slower than the ConvTranspose of the general rule."""
    h, w = ctx.shape(x)[2:]
    share = ctx.op("Div", gy, ctx.const(k * k))
    repeat = (np.arange(w)[None, :] // k == np.arange(w // k)[:, None]).astype(np.float64)
    share = ctx.op("MatMul", share, ctx.const(repeat))  # (N, C, Ho, W)
    share = ctx.op("Reshape", share, ctx.g.int64s([0, 0, h // k, 1, w]))
    share = ctx.op("Expand", share, ctx.g.int64s([1, 1, 1, k, 1]))
    return ctx.op("Reshape", share, ctx.g.int64s([0, 0, h, w]))


@register_vjp("LpPool")
def _lp_pool(ctx, gy):
    # y = (sum |x|^p)^(1/p): dx = sign(x) |x|^(p-1) * S^T(gy y^(1-p))
    x, y = ctx.inputs[0], ctx.outputs[0]
    p = float(ctx.attr("p", 2))
    geometry = _window_geometry(ctx, x)
    positive = ctx.op("Greater", y, ctx.const(0))
    y_safe = ctx.op("Where", positive, y, ctx.const(1))
    scale = ctx.op("Where", positive, ctx.op("Pow", y_safe, ctx.const(1 - p)),
                   ctx.const(0))
    spread = _window_sum_adjoint(ctx, ctx.op("Mul", gy, scale), x, geometry)
    local = ctx.op("Mul", ctx.op("Sign", x),
                   ctx.op("Pow", ctx.op("Abs", x), ctx.const(p - 1)))
    return ctx.op("Mul", local, spread)
