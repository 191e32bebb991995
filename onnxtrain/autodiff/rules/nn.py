"""VJP rule of Dropout (the mask of the forward run is reused)."""
import numpy as np

from ..registry import register_vjp


def _scalar(value):
    return None if value is None else np.asarray(value).reshape(-1)[0]


def _constant_scale(ctx, ratio, training):
    """What multiplies the kept elements' gradient when ``ratio`` (omitted:
    0.5) and ``training`` are constants: None when dy passes unchanged
    (training off, or a ratio of 0, which keeps every element), else
    1 / (1 - ratio) with 1 - ratio rounded to float32, as onnxruntime's
    kernel divides by it for every element type (a float64 Dropout of ratio
    0.4 divides by float32(0.6)). Raises LookupError when either is
    computed at run time."""
    on = _scalar(ctx.constant_value(training))
    rate = 0.5 if ratio is None else _scalar(ctx.constant_value(ratio))
    if on is None or rate is None:
        raise LookupError(ratio if rate is None else training)
    if not on or rate == 0:
        return None
    return 1 / np.float64(np.float32(1) - np.float32(rate))


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
    try:
        scale = _constant_scale(ctx, ctx.input(1), training)
    except LookupError:
        return _runtime_scale_vjp(ctx, gy, mask, training)
    if scale is None:
        return gy
    return ctx.masked(ctx.op("Mul", gy, ctx.const(scale)), mask), None, None


def _runtime_scale_vjp(ctx, gy, mask, training):
    """dx = where(mask, dy, 0) * (training ? 1 / (1 - ratio) : 1)."""
    ratio = ctx.input(1)
    ratio = ctx.const(0.5) if ratio is None else ctx.g.cast(ratio, ctx.dtype)
    scale = ctx.op("Div", ctx.const(1), ctx.op("Sub", ctx.const(1), ratio))
    scale = ctx.op("Where", training, scale, ctx.const(1))
    kept = ctx.masked(gy, mask)
    return ctx.op("Mul", kept, scale), None, None
