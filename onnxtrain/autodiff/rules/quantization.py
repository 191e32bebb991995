"""VJP rules of quantization ops whose float outputs depend smoothly on
their input: DynamicQuantizeLinear's scale."""
from ..registry import register_vjp


def _extremum_share(ctx, x, op_type):
    """``[x == R(x)] / count(x == R(x))`` with R = ReduceMax or ReduceMin
    over every axis: the gradient of R(x), shared equally between ties (as
    the ReduceMax rule), and R(x) itself (keepdims)."""
    extremum = ctx.g.reduce(op_type, x, None, keepdims=1)
    hit = ctx.g.cast(ctx.op("Equal", x, extremum), ctx.dtype)
    return ctx.op("Div", hit, ctx.g.reduce_sum(hit, None, keepdims=1)), extremum


@register_vjp("DynamicQuantizeLinear")
def _dynamic_quantize_linear(ctx, g_y=None, g_scale=None, g_zero_point=None):
    """VJP of DynamicQuantizeLinear through its float output
    ``y_scale = (max(0, max(x)) - min(0, min(x))) / 255`` (ONNX spec,
    opset 11): ``dx = dscale / 255 * ([max x > 0] d max(x) - [min x < 0]
    d min(x))``, ties shared equally. y and y_zero_point are uint8 (no
    gradient); at ``max(x) = 0`` or ``min(x) = 0`` (a kink of the clamp
    to 0) the one-sided derivative 0 is taken."""
    if g_scale is None:
        return None
    x = ctx.inputs[0]
    zero = ctx.const(0)
    d_max, top = _extremum_share(ctx, x, "ReduceMax")
    d_min, bottom = _extremum_share(ctx, x, "ReduceMin")
    d_max = ctx.op("Mul", d_max, ctx.g.cast(ctx.op("Greater", top, zero), ctx.dtype))
    d_min = ctx.op("Mul", d_min, ctx.g.cast(ctx.op("Less", bottom, zero), ctx.dtype))
    scale = ctx.op("Div", g_scale, ctx.const(255.0))
    return ctx.op("Mul", ctx.op("Sub", d_max, d_min), scale)
