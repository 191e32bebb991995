"""VJP rules of shape manipulation: Reshape, Flatten, Squeeze, Unsqueeze,
Transpose, Concat."""
import numpy as np

from ..registry import register_vjp


def _reshape_back(ctx, gy):
    target = _constant_target(ctx.shape(ctx.inputs[0]), ctx.shape(ctx.outputs[0]))
    if target is None:  # the input's run-time shape
        return ctx.g.reshape_like(gy, ctx.inputs[0])
    return ctx.op("Reshape", gy, ctx.g.int64s(target))


def _constant_target(x_shape, y_shape):
    """A constant Reshape target taking a tensor of shape ``y_shape`` back
    to ``x_shape`` (no Shape node), or None: the static dims (above 0), 0
    (copy the dim) for a symbolic dim that ``y_shape`` has at the same
    axis, and -1 for one other dim when every other one is static."""
    if x_shape is None:
        return None
    target, unknown = [], []
    for axis, dim in enumerate(x_shape):
        if isinstance(dim, int):
            if dim <= 0:
                return None
            target.append(dim)
        elif dim is not None and y_shape is not None and axis < len(y_shape) \
                and y_shape[axis] == dim:
            target.append(0)
        else:
            unknown.append(axis)
            target.append(-1)
    if not unknown:
        return target
    if len(unknown) == 1 and 0 not in target:
        return target
    return None


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
