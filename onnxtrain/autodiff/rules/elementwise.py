"""VJP rules of elementwise arithmetic: y = f(a[, b]) with broadcasting."""
from onnx import TensorProto

from ...graph import FLOAT_TYPES
from ..registry import register_vjp


@register_vjp("Add", unbroadcast=True)
def _add(ctx, gy):
    return gy, gy


@register_vjp("Sub", unbroadcast=True)
def _sub(ctx, gy):
    return gy, (ctx.op("Neg", gy) if ctx.needs_grad[1] else None)


@register_vjp("Mul", unbroadcast=True)
def _mul(ctx, gy):
    a, b = ctx.inputs
    return (ctx.op("Mul", gy, b) if ctx.needs_grad[0] else None,
            ctx.op("Mul", gy, a) if ctx.needs_grad[1] else None)


@register_vjp("Div", unbroadcast=True)
def _div(ctx, gy):
    # y = a / b: dy/da = 1 / b, dy/db = -a / b^2 = -y / b
    _, b = ctx.inputs
    ga = ctx.op("Div", gy, b) if ctx.needs_grad[0] else None
    gb = None
    if ctx.needs_grad[1]:
        gb = ctx.op("Neg", ctx.op("Div", ctx.op("Mul", gy, ctx.outputs[0]), b))
    return ga, gb


@register_vjp("Neg")
def _neg(ctx, gy):
    return ctx.op("Neg", gy)


@register_vjp("Abs")
def _abs(ctx, gy):
    return ctx.op("Mul", gy, ctx.op("Sign", ctx.inputs[0]))


@register_vjp("Pow", unbroadcast=True)
def _pow(ctx, gy):
    # y = a^b: dy/da = b a^(b-1), dy/db = y log(a)
    a, b = ctx.inputs
    y = ctx.outputs[0]
    b_float = b
    if ctx.g.types.get(b, (ctx.dtype,))[0] != ctx.dtype:
        b_float = ctx.g.cast(b, ctx.dtype)
    ga = gb = None
    if ctx.needs_grad[0]:
        a_pow = ctx.op("Pow", a, ctx.op("Sub", b_float, ctx.const(1)))
        ga = ctx.op("Mul", gy, ctx.op("Mul", b_float, a_pow))
    if ctx.needs_grad[1]:  # 0 where y = 0 (a = 0, b > 0): log(a) is -inf
        gb = ctx.op("Mul", gy, ctx.op("Mul", y, ctx.op("Log", a)))
        gb = ctx.op("Where", ctx.op("Equal", y, ctx.const(0)), ctx.const(0), gb)
    return ga, gb


@register_vjp("Sqrt")
def _sqrt(ctx, gy):
    # y = sqrt(x): dy/dx = 0.5 / y
    return ctx.op("Div", ctx.op("Mul", gy, ctx.const(0.5)), ctx.outputs[0])


@register_vjp("Exp")
def _exp(ctx, gy):
    return ctx.op("Mul", gy, ctx.outputs[0])


@register_vjp("Log")
def _log(ctx, gy):
    return ctx.op("Div", gy, ctx.inputs[0])


@register_vjp("Reciprocal")
def _reciprocal(ctx, gy):
    # y = 1/x: dy/dx = -y^2
    y = ctx.outputs[0]
    return ctx.op("Neg", ctx.op("Mul", gy, ctx.op("Mul", y, y)))


@register_vjp("Identity")
def _identity(ctx, gy):
    return gy


@register_vjp("Cast")
def _cast(ctx, gy):
    source = ctx.g.types.get(ctx.inputs[0], (TensorProto.UNDEFINED,))[0]
    if source not in FLOAT_TYPES:
        return None
    return ctx.g.cast(gy, source)


@register_vjp("Sum", unbroadcast=True)
def _sum(ctx, gy):
    return (gy,) * len(ctx.inputs)


@register_vjp("Mean", unbroadcast=True)
def _mean(ctx, gy):
    share = ctx.op("Div", gy, ctx.const(len(ctx.inputs)))
    return (share,) * len(ctx.inputs)


@register_vjp("CastLike")
def _cast_like(ctx, gy):
    return _cast(ctx, gy), None


@register_vjp("Mod", unbroadcast=True)
def _mod(ctx, gy):
    # y = a - b q with q = trunc(a / b) (fmod=1) or floor(a / b) (fmod=0), an
    # integer, constant between jumps: dy/da = 1, dy/db = -q, q = (a - y) / b
    a, b = ctx.inputs
    quotient = ctx.op("Div", ctx.op("Sub", a, ctx.outputs[0]), b)
    return gy, ctx.op("Neg", ctx.op("Mul", gy, ctx.op("Round", quotient)))
