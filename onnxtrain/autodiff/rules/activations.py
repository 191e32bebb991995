"""VJP rules of activations and normalizing activations (softmax family)."""
from ..registry import register_vjp


@register_vjp("Relu")
def _relu(ctx, gy):
    x = ctx.inputs[0]
    zero = ctx.const(0)
    return ctx.op("Where", ctx.op("Greater", x, zero), gy, zero)


@register_vjp("LeakyRelu")
def _leaky_relu(ctx, gy):
    x = ctx.inputs[0]
    alpha = ctx.const(ctx.attr("alpha", 0.01))
    negative = ctx.op("Mul", gy, alpha)
    return ctx.op("Where", ctx.op("Greater", x, ctx.const(0)), gy, negative)


@register_vjp("Sigmoid")
def _sigmoid(ctx, gy):
    # dy/dx = y (1 - y)
    y = ctx.outputs[0]
    return ctx.op("Mul", gy, ctx.op("Mul", y, ctx.op("Sub", ctx.const(1), y)))


@register_vjp("Tanh")
def _tanh(ctx, gy):
    # dy/dx = 1 - y^2
    y = ctx.outputs[0]
    return ctx.op("Mul", gy, ctx.op("Sub", ctx.const(1), ctx.op("Mul", y, y)))


def _softmax_axes(ctx):
    """Axes normalized over: one axis from opset 13, else every axis from
    ``axis`` on (the input is coerced to 2-D before opset 13)."""
    rank = ctx.rank(ctx.inputs[0], ctx.node.op_type)
    if ctx.opset >= 13:
        return ctx.normalize_axes([ctx.attr("axis", -1)], rank)
    first = ctx.normalize_axes([ctx.attr("axis", 1)], rank)[0]
    return list(range(first, rank))


@register_vjp("Softmax")
def _softmax(ctx, gy):
    # dx = y * (gy - sum(gy * y, axes))
    y = ctx.outputs[0]
    dot = ctx.g.reduce_sum(ctx.op("Mul", gy, y), _softmax_axes(ctx), keepdims=1)
    return ctx.op("Mul", y, ctx.op("Sub", gy, dot))


@register_vjp("LogSoftmax")
def _log_softmax(ctx, gy):
    # dx = gy - exp(y) * sum(gy, axes)
    total = ctx.g.reduce_sum(gy, _softmax_axes(ctx), keepdims=1)
    return ctx.op("Sub", gy, ctx.op("Mul", ctx.op("Exp", ctx.outputs[0]), total))
