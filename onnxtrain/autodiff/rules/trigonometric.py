"""VJP rules of the trigonometric and hyperbolic functions and Erf.

Derivatives from any table of derivatives (e.g. Abramowitz and Stegun,
chapter 4 and 7.1.19 for erf).
"""
import math

from ..registry import register_vjp


def _times(ctx, gy, factor):
    return ctx.op("Mul", gy, factor)


def _over(ctx, gy, divisor):
    return ctx.op("Div", gy, divisor)


def _one_minus_x2(ctx):
    x = ctx.inputs[0]
    return ctx.op("Sub", ctx.const(1), ctx.op("Mul", x, x))


def _x2_plus(ctx, c):
    x = ctx.inputs[0]
    return ctx.op("Add", ctx.op("Mul", x, x), ctx.const(c))


@register_vjp("Sin")
def _sin(ctx, gy):
    return _times(ctx, gy, ctx.op("Cos", ctx.inputs[0]))


@register_vjp("Cos")
def _cos(ctx, gy):
    return ctx.op("Neg", _times(ctx, gy, ctx.op("Sin", ctx.inputs[0])))


@register_vjp("Tan")
def _tan(ctx, gy):
    # d tan x = 1 + tan^2 x
    y = ctx.outputs[0]
    return _times(ctx, gy, ctx.op("Add", ctx.const(1), ctx.op("Mul", y, y)))


@register_vjp("Asin")
def _asin(ctx, gy):
    return _over(ctx, gy, ctx.op("Sqrt", _one_minus_x2(ctx)))


@register_vjp("Acos")
def _acos(ctx, gy):
    return ctx.op("Neg", _over(ctx, gy, ctx.op("Sqrt", _one_minus_x2(ctx))))


@register_vjp("Atan")
def _atan(ctx, gy):
    return _over(ctx, gy, _x2_plus(ctx, 1))


@register_vjp("Sinh")
def _sinh(ctx, gy):
    return _times(ctx, gy, ctx.op("Cosh", ctx.inputs[0]))


@register_vjp("Cosh")
def _cosh(ctx, gy):
    return _times(ctx, gy, ctx.op("Sinh", ctx.inputs[0]))


@register_vjp("Asinh")
def _asinh(ctx, gy):
    return _over(ctx, gy, ctx.op("Sqrt", _x2_plus(ctx, 1)))


@register_vjp("Acosh")
def _acosh(ctx, gy):
    return _over(ctx, gy, ctx.op("Sqrt", _x2_plus(ctx, -1)))


@register_vjp("Atanh")
def _atanh(ctx, gy):
    return _over(ctx, gy, _one_minus_x2(ctx))


@register_vjp("Erf")
def _erf(ctx, gy):
    # d erf x = 2 / sqrt(pi) exp(-x^2)
    x = ctx.inputs[0]
    gauss = ctx.op("Exp", ctx.op("Neg", ctx.op("Mul", x, x)))
    return _times(ctx, gy, ctx.op("Mul", gauss, ctx.const(2 / math.sqrt(math.pi))))
