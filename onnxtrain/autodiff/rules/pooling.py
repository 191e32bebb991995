"""VJP rules of pooling: MaxPool (through its indices), global pools,
AveragePool and LpPool (through the transpose of "sum every window": a
ConvTranspose by a kernel of ones, the window counts and divisors taken from
a Conv and an AveragePool of ones, so that padding, count_include_pad and
ceil_mode follow onnxruntime's kernels)."""
import numpy as np

from ..registry import register_vjp


@register_vjp("MaxPool")
def _max_pool(ctx, gy, g_indices=None):
    # the gradient goes to the element each window picked: the pool is run
    # again for its Indices (flat positions in X, padding not counted)
    x = ctx.inputs[0]
    # (column-major indices, storage_order=1, are recomputed row-major)
    row_major = not ctx.attr("storage_order", 0)
    indices = ctx.outputs[1] if len(ctx.outputs) > 1 and ctx.outputs[1] else None
    if indices is None or not row_major:
        attrs = dict(ctx.attributes, storage_order=0)
        _, indices = ctx.op("MaxPool", x, n_outputs=2, **attrs)
    kernel = ctx.attr("kernel_shape")
    strides = ctx.attr("strides") or [1] * len(kernel)
    overlap = any(k > s for k, s in zip(kernel, strides))
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
    geometry = _window_geometry(ctx, x)
    counts, ones_x = _window_counts(ctx, x, gy, geometry)
    ratio = ctx.op("AveragePool", ones_x, **ctx.attributes)
    safe = ctx.op("Max", counts, ctx.const(1))
    inverse = ctx.op("Where", ctx.op("Greater", counts, ctx.const(0)),
                     ctx.op("Div", ratio, safe), ctx.const(0))
    return _window_sum_adjoint(ctx, ctx.op("Mul", gy, inverse), x, geometry)


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
