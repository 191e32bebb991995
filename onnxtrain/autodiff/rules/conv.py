"""VJP rules of Conv.

With stride s, dilation d and padding (b, e) on every spatial axis:

- dX is the transposed convolution of dY with W, computed with
  ``output_padding = s - 1`` (long enough for every input row) and cropped
  to ``[b, b + X)``;
- dW[m, c, k] = sum over n and o of dY[n, m, o] Xpad[n, c, o s + k d]: a
  convolution of X (batch and channels swapped, groups kept apart) by dY
  with stride d and dilation s, cropped to the kernel size;
- dB is dY summed over every axis but the channels.
"""
from ..registry import register_vjp


def conv_geometry(ctx, x, w):
    """``(kernel, strides, dilations, begins, ends)`` of a Conv-like node.

    SAME_* padding needs the static spatial sizes of ``x``.
    """
    rank = ctx.rank(x, ctx.node.op_type)
    n = rank - 2
    kernel = ctx.attr("kernel_shape") or list(ctx.shape(w)[2:])
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


@register_vjp("Conv")
def _conv(ctx, gy):
    x, w = ctx.inputs[:2]
    rank = ctx.rank(x, "Conv")
    kernel, strides, dilations, begins, ends = conv_geometry(ctx, x, w)
    gx = gw = gb = None
    if ctx.needs_grad[0]:
        full = ctx.op("ConvTranspose", gy, w, strides=strides,
                      dilations=dilations, group=ctx.attr("group", 1),
                      kernel_shape=kernel,
                      output_padding=[s - 1 for s in strides])
        gx = crop_spatial(ctx, full, begins, x, rank)
    if ctx.needs_grad[1]:
        gw = _conv_weight_grad(ctx, x, gy, kernel, strides, dilations,
                               begins + ends, rank)
    if len(ctx.inputs) > 2 and ctx.needs_grad[2]:
        gb = ctx.g.reduce_sum(gy, [0] + list(range(2, rank)), keepdims=0)
    return (gx, gw, gb)[:len(ctx.inputs)]
