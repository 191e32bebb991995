"""VJP rules of shape manipulation: Reshape, Flatten, Squeeze, Unsqueeze,
Transpose, Concat."""
import numpy as np

from ..registry import register_vjp


def _reshape_back(ctx, gy):
    return ctx.g.reshape_like(gy, ctx.inputs[0])


for _op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze"):
    register_vjp(_op)(_reshape_back)


@register_vjp("Transpose")
def _transpose(ctx, gy):
    perm = ctx.attr("perm")
    if perm is None:  # default: reverse the axes
        perm = list(range(ctx.rank(ctx.inputs[0], "Transpose")))[::-1]
    return ctx.g.transpose(gy, [int(i) for i in np.argsort(perm)])


def _concat_size(ctx, x, axis):
    """Size of ``x`` along ``axis``: an int, or a 1-D int64 tensor name."""
    dim = ctx.shape(x)[axis]
    if isinstance(dim, int):
        return dim
    if ctx.opset < 10:
        ctx.fail(f"input {x!r} has a symbolic size on axis {axis}; opset < 10 "
                 "slices with static bounds only")
    return ctx.op("Gather", ctx.g.shape_of(x), ctx.g.int64s([axis]))


def _offset_add(ctx, start, size):
    if isinstance(start, int) and isinstance(size, int):
        return start + size
    as_tensor = [ctx.g.int64s([v]) if isinstance(v, int) else v
                 for v in (start, size)]
    return ctx.op("Add", *as_tensor)


def _slice(ctx, gy, start, end, axis):
    if ctx.opset < 10:
        return ctx.op("Slice", gy, starts=[start], ends=[end], axes=[axis])
    bounds = [ctx.g.int64s([v]) if isinstance(v, int) else v for v in (start, end)]
    return ctx.op("Slice", gy, *bounds, ctx.g.int64s([axis]))


@register_vjp("Concat")
def _concat(ctx, gy):
    rank = ctx.rank(ctx.outputs[0], "Concat")
    axis = ctx.normalize_axes([ctx.attr("axis")], rank)[0]
    start, grads = 0, []
    for x, need in zip(ctx.inputs, ctx.needs_grad):
        end = _offset_add(ctx, start, _concat_size(ctx, x, axis))
        grads.append(_slice(ctx, gy, start, end, axis) if need else None)
        start = end
    return tuple(grads)
