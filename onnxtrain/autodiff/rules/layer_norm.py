"""VJP rule of LayerNormalization in closed form, the function body's
expansion as the fallback.

With xhat = (x - mean) * inv_std over the normalized axes (``axis`` to the
last) and y = scale * xhat + bias, the same formula as training-mode
BatchNormalization (normalization.py) over those axes:

    dx = inv_std * (g - mean(g) - xhat * mean(g * xhat)),  g = dy * scale
    dscale = dy * xhat and dbias = dy, summed back to their shapes.

About 20 nodes per LayerNormalization instead of the ~80 of its
differentiated body (a transformer layer has two), the same values up to
rounding. The expansion still serves what the closed form does not:
element types other than float and double (float16, bfloat16 stash the
statistics in float32), and gradients reaching the Mean or InvStdDev
outputs.
"""
from onnx import TensorProto

from ..registry import register_vjp
from .functions import vjp_by_expansion
from .normalization import _batch_statistics_backward

_CLOSED_FORM_TYPES = (TensorProto.FLOAT, TensorProto.DOUBLE)


@register_vjp("LayerNormalization")
def _layer_norm(ctx, gy, *g_stats):
    x, scale = ctx.inputs[:2]
    bias = ctx.input(2)
    rank = ctx.g.rank(x)
    if (gy is None or any(g is not None for g in g_stats) or rank is None
            or ctx.g.types.get(x, (None,))[0] not in _CLOSED_FORM_TYPES):
        return vjp_by_expansion(ctx, gy, *g_stats)
    axis = ctx.attr("axis", -1)
    axis = axis + rank if axis < 0 else axis
    axes = list(range(axis, rank))
    gx, xhat = _batch_statistics_backward(ctx, x, gy, scale, axes,
                                          ctx.attr("epsilon", 1e-5))
    shape = ctx.shape(x)
    gscale = gbias = None
    if ctx.needs_grad[1]:
        gscale = ctx.sum_to(ctx.op("Mul", gy, xhat), shape, scale)
    if bias is not None and ctx.needs_grad[2]:
        gbias = ctx.sum_to(gy, shape, bias)
    return ((gx if ctx.needs_grad[0] else None), gscale, gbias)[:len(ctx.inputs)]
