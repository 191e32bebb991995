"""VJP rules of activations and normalizing activations (softmax family)."""
import math

import numpy as np

from ..registry import register_vjp


@register_vjp("Relu")
def _relu(ctx, gy):
    # gy * (y > 0), y = relu(x) (y > 0 exactly where x > 0): a cast mask and
    # a Mul run faster than Where in onnxruntime, and this rule sits
    # in every step of every MLP. Reading y rather than x leaves x with one
    # reader, the Relu, so onnxruntime fuses a Gemm/MatMul producing x with
    # the Relu (one pass over the activations less per step)
    return ctx.masked(gy, ctx.op("Greater", ctx.outputs[0], ctx.const(0)))


@register_vjp("LeakyRelu")
def _leaky_relu(ctx, gy):
    alpha = ctx.const(ctx.attr("alpha", 0.01))
    return ctx.op("Mul", gy, _positive_slope(ctx, ctx.const(1), alpha))


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


def _nan_as_zero(ctx, y):
    """A row of -inf makes a NaN softmax; ops such as Attention then mask
    the row. Its gradient is zero, not NaN."""
    return ctx.op("Where", ctx.op("IsNaN", y), ctx.const(0), y)


def _unmasked_product(ctx, x):
    """Whether ``x`` is a MatMul or Gemm, or one times (or divided by) a
    finite constant: attention scores with no mask added. A row of them is
    NaN or infinite only if the forward pass already overflowed (nothing
    then masks the row; PyTorch's gradient is NaN there too), so their
    softmax's gradient needs no NaN guard, two passes over the scores."""
    node = ctx.g.producer(x)
    if node is not None and node.op_type in ("Mul", "Div") and node.domain in ("", "ai.onnx"):
        value = ctx.constant_value(node.input[1])
        if value is None or not np.all(np.isfinite(value)) or value.size != 1:
            return False
        node = ctx.g.producer(node.input[0])
    return node is not None and node.op_type in ("MatMul", "Gemm") and \
        node.domain in ("", "ai.onnx")


@register_vjp("Softmax")
def _softmax(ctx, gy):
    # dx = y * (gy - sum(gy * y, axes))
    y = ctx.outputs[0]
    if not _unmasked_product(ctx, ctx.inputs[0]):
        y = _nan_as_zero(ctx, y)
    dot = ctx.g.reduce_sum(ctx.op("Mul", gy, y), _softmax_axes(ctx), keepdims=1)
    return ctx.op("Mul", y, ctx.op("Sub", gy, dot))


@register_vjp("LogSoftmax")
def _log_softmax(ctx, gy):
    # dx = gy - exp(y) * sum(gy, axes)
    total = ctx.g.reduce_sum(gy, _softmax_axes(ctx), keepdims=1)
    y = _nan_as_zero(ctx, ctx.outputs[0])
    dx = ctx.op("Sub", gy, ctx.op("Mul", ctx.op("Exp", y), total))
    return ctx.op("Where", ctx.op("IsNaN", ctx.outputs[0]), ctx.const(0), dx)


def _positive_slope(ctx, positive, negative):
    """The slope ``positive`` where the input is > 0, else ``negative``
    (finite values), selected by masks (:meth:`ctx.select`): the gradient
    is then ``gy`` times it, one product, so that an inf of ``gy`` stays
    where Where would have put it."""
    x = ctx.inputs[0]
    return ctx.select(ctx.op("Greater", x, ctx.const(0)), positive, negative)


@register_vjp("Elu")
def _elu(ctx, gy):
    # x <= 0: y = alpha (e^x - 1), dy/dx = y + alpha
    alpha = ctx.const(ctx.attr("alpha", 1.0))
    slope = ctx.op("Add", ctx.outputs[0], alpha)
    return ctx.op("Mul", gy, _positive_slope(ctx, ctx.const(1), slope))


@register_vjp("Selu")
def _selu(ctx, gy):
    # x > 0: y = gamma x; x <= 0: y = gamma alpha (e^x - 1), dy/dx = y + gamma alpha
    alpha = ctx.attr("alpha", 1.67326319217681884765625)
    gamma = ctx.attr("gamma", 1.05070102214813232421875)
    slope = ctx.op("Add", ctx.outputs[0], ctx.const(alpha * gamma))
    return ctx.op("Mul", gy, _positive_slope(ctx, ctx.const(gamma), slope))


@register_vjp("Celu")
def _celu(ctx, gy):
    # x <= 0: y = alpha (e^(x/alpha) - 1), dy/dx = e^(x/alpha); x > 0: 1,
    # e^(min(x, 0)/alpha) for both (no overflow of e^(x/alpha) at large x)
    alpha = ctx.const(ctx.attr("alpha", 1.0))
    x = ctx.op("Min", ctx.inputs[0], ctx.const(0))
    return ctx.op("Mul", gy, ctx.op("Exp", ctx.op("Div", x, alpha)))


@register_vjp("PRelu", unbroadcast=True)
def _prelu(ctx, gy):
    # y = x (x > 0), slope x (x <= 0)
    x, slope = ctx.inputs
    gx = ctx.op("Mul", gy, _positive_slope(ctx, ctx.const(1), slope))
    negative = ctx.masked(x, ctx.op("Not", ctx.op("Greater", x, ctx.const(0))))
    return gx, ctx.op("Mul", gy, negative)


@register_vjp("ThresholdedRelu")
def _thresholded_relu(ctx, gy):
    alpha = ctx.const(ctx.attr("alpha", 1.0))
    above = ctx.op("Greater", ctx.inputs[0], alpha)
    return ctx.masked(gy, above)


@register_vjp("Softplus")
def _softplus(ctx, gy):
    return ctx.op("Mul", gy, ctx.op("Sigmoid", ctx.inputs[0]))


@register_vjp("Softsign")
def _softsign(ctx, gy):
    # y = x / (1 + |x|): dy/dx = 1 / (1 + |x|)^2
    denominator = ctx.op("Add", ctx.const(1), ctx.op("Abs", ctx.inputs[0]))
    return ctx.op("Div", gy, ctx.op("Mul", denominator, denominator))


@register_vjp("HardSigmoid")
def _hard_sigmoid(ctx, gy):
    # y = max(0, min(1, alpha x + beta)): slope alpha strictly inside (0, 1)
    alpha = ctx.attr("alpha", 0.2)
    z = ctx.op("Add", ctx.op("Mul", ctx.inputs[0], ctx.const(alpha)),
               ctx.const(ctx.attr("beta", 0.5)))
    inside = ctx.op("And", ctx.op("Greater", z, ctx.const(0)),
                    ctx.op("Less", z, ctx.const(1)))
    return ctx.masked(ctx.op("Mul", gy, ctx.const(alpha)), inside)


@register_vjp("HardSwish")
def _hard_swish(ctx, gy):
    # y = x max(0, min(1, x/6 + 1/2)): dy/dx = 0 (x < -3), x/3 + 1/2, 1 (x > 3)
    x = ctx.inputs[0]
    inner = ctx.op("Add", ctx.op("Div", x, ctx.const(3)), ctx.const(0.5))
    slope = ctx.op("Where", ctx.op("Greater", x, ctx.const(3)), ctx.const(1),
                   ctx.op("Where", ctx.op("Less", x, ctx.const(-3)),
                          ctx.const(0), inner))
    return ctx.op("Mul", gy, slope)


@register_vjp("Shrink")
def _shrink(ctx, gy):
    lambd = ctx.attr("lambd", 0.5)
    x = ctx.inputs[0]
    outside = ctx.op("Or", ctx.op("Less", x, ctx.const(-lambd)),
                     ctx.op("Greater", x, ctx.const(lambd)))
    return ctx.masked(gy, outside)


@register_vjp("Mish")
def _mish(ctx, gy):
    # y = x tanh(sp), sp = softplus(x): dy/dx = t + x sigmoid(x) (1 - t^2)
    x = ctx.inputs[0]
    t = ctx.op("Tanh", ctx.op("Softplus", x))
    one_minus_t2 = ctx.op("Sub", ctx.const(1), ctx.op("Mul", t, t))
    tail = ctx.op("Mul", ctx.op("Mul", x, ctx.op("Sigmoid", x)), one_minus_t2)
    return ctx.op("Mul", gy, ctx.op("Add", t, tail))


@register_vjp("Swish")
def _swish(ctx, gy):
    # y = x s, s = sigmoid(alpha x): dy/dx = s + alpha x s (1 - s)
    x = ctx.inputs[0]
    alpha = ctx.const(ctx.attr("alpha", 1.0))
    s = ctx.op("Sigmoid", ctx.op("Mul", x, alpha))
    tail = ctx.op("Mul", ctx.op("Mul", ctx.op("Mul", x, alpha), s),
                  ctx.op("Sub", ctx.const(1), s))
    return ctx.op("Mul", gy, ctx.op("Add", s, tail))


def _gelu_tanh_slope(ctx, x, x2):
    # y = x/2 (1 + t), t = tanh(u), u = c (x + 0.044715 x^3), c = sqrt(2/pi):
    # dy/dx = (1 + t)/2 + x/2 (1 - t^2) c (1 + 3 0.044715 x^2)
    c = math.sqrt(2 / math.pi)
    cube = ctx.op("Mul", ctx.op("Mul", x2, x), ctx.const(0.044715))
    t = ctx.op("Tanh", ctx.op("Mul", ctx.op("Add", x, cube), ctx.const(c)))
    du = ctx.op("Mul", ctx.op("Add", ctx.const(1), ctx.op(
        "Mul", x2, ctx.const(3 * 0.044715))), ctx.const(c))
    one_minus_t2 = ctx.op("Sub", ctx.const(1), ctx.op("Mul", t, t))
    tail = ctx.op("Mul", ctx.op("Mul", x, one_minus_t2), du)
    return ctx.op("Mul", ctx.op("Add", ctx.op("Add", ctx.const(1), t), tail),
                  ctx.const(0.5))


def _gelu_exact_slope(ctx, x, x2):
    # y = x Phi(x): dy/dx = Phi(x) + x phi(x)
    cdf = ctx.op("Mul", ctx.op("Add", ctx.const(1), ctx.op(
        "Erf", ctx.op("Mul", x, ctx.const(1 / math.sqrt(2))))), ctx.const(0.5))
    pdf = ctx.op("Mul", ctx.op("Exp", ctx.op("Mul", x2, ctx.const(-0.5))),
                 ctx.const(1 / math.sqrt(2 * math.pi)))
    return ctx.op("Add", cdf, ctx.op("Mul", x, pdf))


@register_vjp("Gelu")
def _gelu(ctx, gy):
    # Hendrycks and Gimpel 2016, exact and tanh approximation
    x = ctx.inputs[0]
    x2 = ctx.op("Mul", x, x)
    if ctx.attr("approximate", "none") == "tanh":
        return ctx.op("Mul", gy, _gelu_tanh_slope(ctx, x, x2))
    return ctx.op("Mul", gy, _gelu_exact_slope(ctx, x, x2))
