"""VJP rule of Dropout (the mask of the forward run is reused)."""
from ..registry import register_vjp


@register_vjp("Dropout", saved_outputs=(1,))
def _dropout(ctx, gy, g_mask=None):
    # training: y = x * mask / (1 - ratio); inference: y = x. Before opset 12
    # Dropout has no training mode in onnxruntime: the identity.
    if len(ctx.needs_grad) > 1 and ctx.needs_grad[1]:
        ctx.fail("the gradient of ratio (a non-differentiable input)")
    training = ctx.input(2) if ctx.opset >= 12 else None
    if training is None:
        return gy
    mask = ctx.outputs[1]
    ratio = ctx.input(1)
    ratio = ctx.const(0.5) if ratio is None else ctx.g.cast(ratio, ctx.dtype)
    scale = ctx.op("Div", ctx.const(1), ctx.op("Sub", ctx.const(1), ratio))
    scale = ctx.op("Where", training, scale, ctx.const(1))
    kept = ctx.op("Where", mask, gy, ctx.const(0))
    return ctx.op("Mul", kept, scale), None, None
