"""VJP rules of ops selecting among their inputs: Min, Max, Where, Clip.

The gradient goes to the input selected. Between equal candidates (ties)
it goes to the first one, a subgradient (the finite-difference corpus
accepts any value between the one-sided derivatives there).
"""
from ..registry import register_vjp


def _extremum(ctx, gy):
    # Max/Min(x_0, x_1, ...): x_i receives gy where it is the first equal
    # to the result
    y, zero = ctx.outputs[0], ctx.const(0)
    taken, grads = None, []
    for x in ctx.inputs:
        hit = ctx.op("Equal", x, y)
        if taken is not None:
            hit = ctx.op("And", hit, ctx.op("Not", taken))
        taken = hit if taken is None else ctx.op("Or", taken, hit)
        grads.append(ctx.op("Where", hit, gy, zero))
    return tuple(grads)


register_vjp("Max", unbroadcast=True)(_extremum)
register_vjp("Min", unbroadcast=True)(_extremum)


@register_vjp("Where", unbroadcast=True)
def _where(ctx, gy):
    # Where, not ctx.masked: Where and Max/Min sanitize values (the input of
    # a Sqrt, a Log), whose gradient may be inf where they chose the other
    # input: it goes to zero there, as in PyTorch (inf * 0 would be NaN)
    condition, zero = ctx.inputs[0], ctx.const(0)
    return (None, ctx.op("Where", condition, gy, zero) if ctx.needs_grad[1] else None,
            ctx.op("Where", condition, zero, gy) if ctx.needs_grad[2] else None)


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
    x = ctx.inputs[0]
    low, high = _clip_bounds(ctx)
    wants_bounds = any(ctx.needs_grad[1:3])
    if low is not None and high is not None and not wants_bounds:
        # both bounds, an activation (ReLU6, Hardtanh): a masked product
        # (ctx.masked), much faster than Where; a Clip with one bound
        # sanitizes (sqrt(clamp(d2, min=0))) and keeps Where below
        # (x >= low and x <= high: where x < low the first is false, so x
        # itself, not max(x, low), may meet the second; NaN passes both)
        keep = ctx.op("And", ctx.op("Not", ctx.op("Less", x, low)),
                      ctx.op("Not", ctx.op("Greater", x, high)))
        return (ctx.masked(gy, keep), None, None)[:len(ctx.inputs)]
    zero = ctx.const(0)
    inside, g_low, g_high = gy, None, None
    if low is not None:
        above = ctx.op("Not", ctx.op("Less", x, low))
        g_low = ctx.op("Where", above, zero, inside)
        inside = ctx.op("Where", above, inside, zero)
        x = ctx.op("Max", x, low)
    if high is not None:
        below = ctx.op("Not", ctx.op("Greater", x, high))
        g_high = ctx.op("Where", below, zero, gy)
        inside = ctx.op("Where", below, inside, zero)
        g_low = g_low and ctx.op("Where", below, g_low, zero)
    return (inside, g_low, g_high)[:len(ctx.inputs)]
