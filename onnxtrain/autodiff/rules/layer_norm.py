"""VJP rule of LayerNormalization in closed form, the function body's
expansion as the fallback.

With xhat = (x - mean) * inv_std over the normalized axes (``axis`` to the
last) and y = scale * xhat + bias, the same formula as training-mode
BatchNormalization (normalization.py) over those axes:

    dx = inv_std * (g - mean(g) - xhat * mean(g * xhat)),  g = dy * scale
    dscale = dy * xhat and dbias = dy, summed back to their shapes.

About 20 nodes per LayerNormalization instead of the ~80 of its
differentiated body (a transformer layer has two), the same values up to
rounding. A float32 node's mean and inv_std are its own Mean and InvStdDev
outputs, which the forward run computes anyway (the reverse pass names
them: ``saved_outputs``), so that xhat costs one node (a
LayerNormalization of scale 1, static normalized dimensions) or two
(Sub, Mul) instead of eight; in
float64 they are recomputed, the saved ones being float32
(``stash_type``). The expansion still serves what the closed form does
not: element types other than float and double (float16, bfloat16 stash
the statistics in float32), and gradients reaching the Mean or InvStdDev
outputs.
"""
import numpy as np
from onnx import TensorProto

from ..registry import register_vjp
from .functions import vjp_by_expansion
from .normalization import _batch_statistics_backward, normalized_backward

_CLOSED_FORM_TYPES = (TensorProto.FLOAT, TensorProto.DOUBLE)


def _saved_statistics(ctx, x):
    """(mean, inv_std) outputs of the node when they have x's element type
    (float32 with the default stash_type), else None."""
    mean, inv_std = (ctx.outputs + ["", ""])[1:3]
    elem = ctx.g.types.get(x, (None,))[0]
    if not mean or not inv_std or ctx.attr("stash_type", 1) != elem or \
            ctx.g.types.get(mean, (None,))[0] != elem:
        return None
    return mean, inv_std


def _xhat(ctx, x, saved, axis):
    """(x - mean) * inv_std: one LayerNormalization of scale 1 (the
    forward's kernel on the same values: the same xhat) when the normalized
    dimensions are static, else from the saved statistics."""
    shape = ctx.shape(x)
    dims = None if shape is None else list(shape[axis:])
    if dims is None or not all(isinstance(d, int) and d > 0 for d in dims):
        return ctx.op("Mul", ctx.op("Sub", x, saved[0]), saved[1])
    ones = ctx.const(np.ones(dims))
    return ctx.op("LayerNormalization", x, ones, axis=axis,
                  epsilon=ctx.attr("epsilon", 1e-5))


def _float32_statistics(node):
    """Mean and InvStdDev (outputs 1 and 2) when they are float32, the
    default stash_type: onnx refuses them in float64."""
    stash = next((a.i for a in node.attribute if a.name == "stash_type"), 1)
    return (1, 2) if stash == TensorProto.FLOAT else ()


@register_vjp("LayerNormalization", saved_outputs=_float32_statistics)
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
    saved = _saved_statistics(ctx, x)
    if saved is None:
        gx, xhat = _batch_statistics_backward(ctx, x, gy, scale, axes,
                                              ctx.attr("epsilon", 1e-5))
    else:
        gx, xhat = normalized_backward(ctx, gy, scale, _xhat(ctx, x, saved, axis),
                                       saved[1], axes)
    shape = ctx.shape(x)
    gscale = gbias = None
    if ctx.needs_grad[1]:
        gscale = ctx.sum_to(ctx.op("Mul", gy, xhat), shape, scale)
    if bias is not None and ctx.needs_grad[2]:
        gbias = ctx.sum_to(gy, shape, bias)
    return ((gx if ctx.needs_grad[0] else None), gscale, gbias)[:len(ctx.inputs)]
