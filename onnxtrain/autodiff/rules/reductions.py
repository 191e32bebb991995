"""VJP rules of reductions: ReduceSum and ReduceMean (axes as attribute or
input, by opset)."""
from ..registry import register_vjp


def _expand_back(ctx, gy):
    """Broadcast ``gy`` back to the input's shape; None if the op is a no-op."""
    x = ctx.inputs[0]
    axes = ctx.axes()
    if not axes and ctx.attr("noop_with_empty_axes", 0):
        return None
    if axes and not ctx.attr("keepdims", 1):
        rank = ctx.rank(x, ctx.node.op_type)
        gy = ctx.g.unsqueeze(gy, sorted(ctx.normalize_axes(axes, rank)))
    return ctx.op("Expand", gy, ctx.g.shape_of(x))


@register_vjp("ReduceSum")
def _reduce_sum(ctx, gy):
    gx = _expand_back(ctx, gy)
    return gy if gx is None else gx


@register_vjp("ReduceMean")
def _reduce_mean(ctx, gy):
    # each input element contributes 1 / (number of reduced elements)
    gx = _expand_back(ctx, gy)
    if gx is None:
        return gy
    count = ctx.op("Div", ctx.op("Size", ctx.inputs[0]),
                   ctx.op("Size", ctx.outputs[0]))
    return ctx.op("Div", gx, ctx.g.cast(count, ctx.dtype))

