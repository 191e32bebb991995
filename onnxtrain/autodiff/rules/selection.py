"""VJP rules of ops selecting among their inputs: Min, Max, Where, Clip.

The gradient goes to the input selected. Between equal candidates (ties)
it goes to the first one, a subgradient (the finite-difference corpus
accepts any value between the one-sided derivatives there).
"""
from ..registry import register_vjp


def _extremum(ctx, gy):
    # Max/Min(x_0, x_1, ...): x_i receives gy where it is the first equal
    # to the result
    y = ctx.outputs[0]
    taken, grads = None, []
    for x in ctx.inputs:
        hit = ctx.op("Equal", x, y)
        if taken is not None:
            hit = ctx.op("And", hit, ctx.op("Not", taken))
        taken = hit if taken is None else ctx.op("Or", taken, hit)
        grads.append(ctx.masked(gy, hit))
    return tuple(grads)


register_vjp("Max", unbroadcast=True)(_extremum)
register_vjp("Min", unbroadcast=True)(_extremum)


@register_vjp("Where", unbroadcast=True)
def _where(ctx, gy):
    condition = ctx.inputs[0]
    return (None, ctx.masked(gy, condition) if ctx.needs_grad[1] else None,
            ctx.masked(gy, ctx.op("Not", condition)) if ctx.needs_grad[2] else None)


def _clip_bounds(ctx):
    """(low, high) names, None where absent (attributes before opset 11)."""
    if ctx.opset < 11:
        low, high = ctx.attr("min"), ctx.attr("max")
        return (None if low is None else ctx.const(low),
                None if high is None else ctx.const(high))
    return ctx.input(1), ctx.input(2)


@register_vjp("Clip", unbroadcast=True)
def _clip(ctx, gy):
    # y = min(max(x, low), high); ties go to x
    # (x's gradient a masked product, see ctx.masked: ReLU6 is a Clip)
    x = ctx.inputs[0]
    low, high = _clip_bounds(ctx)
    keep, g_low, g_high = None, None, None
    wants_low = len(ctx.needs_grad) > 1 and ctx.needs_grad[1]
    wants_high = len(ctx.needs_grad) > 2 and ctx.needs_grad[2]
    if low is not None:
        keep = ctx.op("Not", ctx.op("Less", x, low))
        if wants_low:
            g_low = ctx.masked(gy, ctx.op("Not", keep))
        x = ctx.op("Max", x, low)
    if high is not None:
        below = ctx.op("Not", ctx.op("Greater", x, high))
        if wants_high:
            g_high = ctx.masked(gy, ctx.op("Not", below))
        if g_low is not None:
            g_low = ctx.masked(g_low, below)
        keep = below if keep is None else ctx.op("And", keep, below)
    inside = gy if keep is None else ctx.masked(gy, keep)
    return (inside, g_low, g_high)[:len(ctx.inputs)]
