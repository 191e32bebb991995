"""VJP rules of BatchNormalization, InstanceNormalization, LpNormalization
and LRN (closed form over a channel band matrix).

With xhat = (x - mean) / sqrt(var + eps) over the M elements of each
normalized group and y = scale * xhat + B, when mean and var are the
statistics of x itself (training-mode BatchNormalization, instance
normalization; Ioffe and Szegedy 2015, section 3):

    dx = scale / sqrt(var + eps) / M * (M dy - sum(dy) - xhat sum(dy xhat))

and when they are given (inference-mode BatchNormalization) dx is simply
scale / sqrt(var + eps) dy.
"""
from onnx import TensorProto

from ...graph.broadcasts import per_channel
from ...graph.training_mode import reads_batch_statistics
from ..registry import register_vjp


def _per_channel(ctx, v, rank):
    """(C,) -> (C, 1, ..., 1) broadcasting against (N, C, spatial...)."""
    return ctx.g.unsqueeze(v, list(range(1, rank - 1)))


def _spread(ctx, v, x, axes):
    """``v``, one value per group of statistics over ``axes`` of ``x``, as
    an elementwise operand against ``x``: expanded over small feature maps
    when the groups are channels
    (:func:`onnxtrain.graph.broadcasts.per_channel`, batch normalization),
    as is."""
    shape = ctx.shape(x)
    if shape is None or list(axes) != [0] + list(range(2, len(shape))):
        return v
    return per_channel(ctx.g, v, shape)


def _statistics(ctx, x, axes, eps):
    """(centered, inv_std, xhat) of ``x`` over ``axes`` (kept as size 1);
    the centering is the one of the running statistics' update
    (:func:`onnxtrain.graph.training_mode.with_running_statistics_updates`), which
    common-subexpression elimination then shares."""
    mean = ctx.g.reduce("ReduceMean", x, axes, keepdims=1)
    centered = ctx.op("Sub", x, _spread(ctx, mean, x, axes))
    var = ctx.g.reduce("ReduceMean", ctx.op("Mul", centered, centered), axes)
    inv_std = ctx.op("Reciprocal", ctx.op("Sqrt", ctx.op("Add", var, ctx.const(eps))))
    return centered, inv_std, ctx.op("Mul", centered, _spread(ctx, inv_std, x, axes))


def _batch_statistics_backward(ctx, x, gy, scale, axes, eps):
    """dx, and xhat, for statistics computed over ``axes`` of ``x``; any
    ``scale`` broadcasting against x (LayerNormalization's varies within a
    group)."""
    _, inv_std, xhat = _statistics(ctx, x, axes, eps)
    return normalized_backward(ctx, gy, scale, xhat, inv_std, axes)


def normalized_backward(ctx, gy, scale, xhat, inv_std, axes):
    """dx, and xhat, of y = scale * xhat + bias where xhat = (x - mean(x)) *
    inv_std normalizes ``x`` over ``axes`` (see the module docstring)."""
    g_hat = ctx.op("Mul", gy, scale)
    mean_g = ctx.g.reduce("ReduceMean", g_hat, axes, keepdims=1)
    mean_gx = ctx.g.reduce("ReduceMean", ctx.op("Mul", g_hat, xhat), axes, keepdims=1)
    inner = ctx.op("Sub", ctx.op("Sub", g_hat, mean_g), ctx.op("Mul", xhat, mean_gx))
    return ctx.op("Mul", inner, inv_std), xhat


def _group_scale_backward(ctx, x, gy, scale, axes, eps, per_group=None):
    """(dx, s2, s1) for statistics over ``axes`` and a ``scale`` constant
    within each group (one per channel: batch and instance normalization).

    With the sums over each group s1 = sum(dy) and s2 = sum(dy xhat) (kept
    as size-1 axes; the bias's and scale's gradients are their sums over
    the groups), dx = k (dy - s1 / M - xhat s2 / M) with
    k = scale / sqrt(var + eps): four passes over x for dx once the sums
    are taken, against eight for the general form. ``per_group``: a tensor
    of one value per group (default: the statistics themselves)."""
    _, inv_std, xhat = _statistics(ctx, x, axes, eps)
    return _from_sums(ctx, x, gy, scale, inv_std, xhat, None, axes,
                      inv_std if per_group is None else per_group)


def _from_sums(ctx, x, gy, scale, inv_std, v, v_to_xhat, axes, per_group):
    """(dx, s2, s1) of :func:`_group_scale_backward` from ``v``, xhat
    itself (``v_to_xhat`` None) or x - mean with ``v_to_xhat`` = inv_std
    (xhat = v inv_std, s2 = inv_std sum(dy v))."""
    s1 = ctx.g.reduce_sum(gy, axes, keepdims=1)
    s2 = ctx.g.reduce_sum(ctx.op("Mul", gy, v), axes, keepdims=1)
    if v_to_xhat is not None:
        s2 = ctx.op("Mul", s2, v_to_xhat)
    k = ctx.op("Mul", scale, inv_std)
    k_m = ctx.op("Div", k, _group_size(ctx, x, per_group, axes))
    factor = ctx.op("Mul", s2, k_m)
    if v_to_xhat is not None:
        factor = ctx.op("Mul", factor, v_to_xhat)
    shift = ctx.op("Mul", v, _spread(ctx, factor, x, axes))
    gx = ctx.op("Sub", ctx.op("Sub", ctx.op("Mul", gy, _spread(ctx, k, x, axes)), shift),
                _spread(ctx, ctx.op("Mul", s1, k_m), x, axes))
    return gx, s2, s1


def _group_size(ctx, x, per_group, axes):
    """M, the elements of a group over ``axes``: a constant when those dims
    of x are static, else Size(x) / Size(per_group), ``per_group`` holding
    one value per group (the same nodes as the running statistics' update
    of :mod:`onnxtrain.graph.training_mode`, which common-subexpression
    elimination then shares)."""
    shape = ctx.shape(x)
    if shape is not None and all(isinstance(shape[a], int) for a in axes):
        size = 1
        for a in axes:
            size *= shape[a]
        return ctx.const(float(size))
    return ctx.g.cast(ctx.op("Div", ctx.op("Size", x), ctx.op("Size", per_group)),
                      ctx.dtype)


def _training_mode(ctx):
    if ctx.opset >= 14:
        return bool(ctx.attr("training_mode", 0))
    if len([o for o in ctx.outputs if o]) > 1:
        ctx.fail("training mode before opset 14 (outputs mean, var, saved_*): "
                 "export the model at opset 14 or later (torch.onnx.export(..., "
                 "opset_version=14)), where BatchNormalization has training_mode")
    return False


@register_vjp("BatchNormalization")
def _batch_norm(ctx, gy, *g_stats):
    x, scale, bias, mean, var = ctx.inputs[:5]
    rank = ctx.rank(x, "BatchNormalization")
    axes = [0] + list(range(2, rank))
    eps = ctx.attr("epsilon", 1e-5)
    scale_b = _per_channel(ctx, scale, rank)
    if _training_mode(ctx):
        gy = gy if gy is not None else ctx.op("Expand", ctx.const(0), ctx.g.shape_of(x))
        if _statistics_outputs(ctx):
            gx, s2, s1 = _node_statistics_backward(ctx, x, gy, scale_b, axes, eps)
        else:
            gx, s2, s1 = _group_scale_backward(ctx, x, gy, scale_b, axes, eps, scale)
        gx, g_mean, g_var = _running_statistics(ctx, gx, g_stats, axes, rank)
        return gx, ctx.g.squeeze(s2, axes), ctx.g.squeeze(s1, axes), g_mean, g_var
    if any(g is not None for g in g_stats):
        ctx.fail("a gradient reaching the mean or variance outputs in inference mode")
    inv_std = ctx.op("Reciprocal", ctx.op("Sqrt", ctx.op("Add", var, ctx.const(eps))))
    inv_std_b = _per_channel(ctx, inv_std, rank)
    centered = ctx.op("Sub", x, _per_channel(ctx, mean, rank))
    xhat = ctx.op("Mul", centered, inv_std_b)
    gx = ctx.op("Mul", gy, ctx.op("Mul", scale_b, inv_std_b))
    g_bias = _sum(ctx, gy, None, axes)
    g_mean = ctx.op("Neg", ctx.op("Mul", g_bias, ctx.op("Mul", scale, inv_std)))
    g_var = ctx.op("Mul", _sum(ctx, gy, xhat, axes), ctx.op("Mul", ctx.op(
        "Mul", scale, ctx.op("Mul", inv_std, inv_std)), ctx.const(-0.5)))
    return gx, _sum(ctx, gy, xhat, axes), g_bias, g_mean, g_var


def _statistics_outputs(ctx):
    """Whether a training-mode node outputs its batch statistics: momentum
    0 makes its running mean and variance outputs the batch's mean and
    population variance (ONNX BatchNormalization-15), and
    :func:`onnxtrain.graph.training_mode.with_running_statistics_updates` marks
    the nodes it sets so for onnxruntime's CPU kernel (a model's own node
    of momentum 0 is not read so: onnxruntime's CUDA kernel outputs the
    unbiased variance)."""
    return reads_batch_statistics(ctx.node) and len(ctx.outputs) >= 3 and \
        bool(ctx.outputs[1]) and bool(ctx.outputs[2])


def _node_statistics_backward(ctx, x, gy, scale, axes, eps):
    """(dx, s2, s1) as :func:`_group_scale_backward`, the mean and variance
    read from the node's outputs (:func:`_statistics_outputs`), with
    c = x - mean in place of xhat: eight passes over x (the centering, two
    sums, four for dx) against twelve when the statistics are computed
    again."""
    rank = len(axes) + 1
    mean = _per_channel(ctx, ctx.outputs[1], rank)
    inv_std = _per_channel(ctx, ctx.op("Reciprocal", ctx.op(
        "Sqrt", ctx.op("Add", ctx.outputs[2], ctx.const(eps)))), rank)
    centered = ctx.op("Sub", x, _spread(ctx, mean, x, axes))
    return _from_sums(ctx, x, gy, scale, inv_std, centered, inv_std, axes,
                      ctx.inputs[1])


def _running_statistics(ctx, gx, g_stats, axes, rank):
    """Add the paths through running_mean = m input_mean + (1 - m) mean(x)
    and running_var = m input_var + (1 - m) var(x) (ONNX BatchNormalization-15,
    population variance) to dx; return dx, d input_mean, d input_var."""
    x = ctx.inputs[0]
    g_rm, g_rv = (list(g_stats) + [None, None])[:2]
    momentum = ctx.attr("momentum", 0.9)
    count = ctx.g.cast(ctx.op("Div", ctx.op("Size", x), ctx.op(
        "Size", ctx.inputs[1])), ctx.dtype)
    rest = ctx.op("Div", ctx.const(1 - momentum), count)
    g_mean = g_var = None
    if g_rm is not None:
        gx = ctx.op("Add", gx, ctx.op("Mul", _per_channel(ctx, g_rm, rank), rest))
        g_mean = ctx.op("Mul", g_rm, ctx.const(momentum))
    if g_rv is not None:
        centered = ctx.op("Sub", x, ctx.g.reduce("ReduceMean", x, axes, keepdims=1))
        twice = ctx.op("Mul", ctx.op("Mul", centered, ctx.const(2)), rest)
        gx = ctx.op("Add", gx, ctx.op("Mul", _per_channel(ctx, g_rv, rank), twice))
        g_var = ctx.op("Mul", g_rv, ctx.const(momentum))
    return gx, g_mean, g_var


def _sum(ctx, gy, factor, axes):
    """sum(gy * factor) over ``axes``, keeping only the channel axis."""
    v = gy if factor is None else ctx.op("Mul", gy, factor)
    return ctx.g.reduce_sum(v, axes, keepdims=0)


@register_vjp("InstanceNormalization")
def _instance_norm(ctx, gy):
    x, scale, _ = ctx.inputs
    rank = ctx.rank(x, "InstanceNormalization")
    axes = list(range(2, rank))
    scale_b = _per_channel(ctx, scale, rank)
    gx, s2, s1 = _group_scale_backward(ctx, x, gy, scale_b, axes,
                                       ctx.attr("epsilon", 1e-5))
    # the sums are per instance and channel (N, C): the parameters' sum N
    groups = [0] + axes
    return gx, ctx.g.reduce_sum(s2, groups, keepdims=0), ctx.g.reduce_sum(s1, groups, keepdims=0)


@register_vjp("LpNormalization")
def _lp_normalization(ctx, gy):
    # y = x / ||x||_p along axis: dx = (dy - d sum(dy y)) / ||x||_p with
    # d = y for p = 2 and d = sign(x) for p = 1
    p, axis = ctx.attr("p", 2), ctx.attr("axis", -1)
    if p not in (1, 2):
        ctx.fail(f"p={p} (the standard allows 1 and 2)")
    x, y = ctx.inputs[0], ctx.outputs[0]
    norm = ctx.g.reduce("ReduceL2" if p == 2 else "ReduceL1", x, [axis])
    dot = ctx.g.reduce_sum(ctx.op("Mul", gy, y), [axis], keepdims=1)
    direction = y if p == 2 else ctx.op("Sign", x)
    is_zero = ctx.op("Equal", norm, ctx.const(0))  # y = 0 there: no gradient
    safe = ctx.op("Where", is_zero, ctx.const(1), norm)
    gx = ctx.op("Div", ctx.op("Sub", gy, ctx.op("Mul", direction, dot)), safe)
    return ctx.op("Where", is_zero, ctx.const(0), gx)


@register_vjp("LRN")
def _lrn(ctx, gy):
    # y = x s^-b, s_c = bias + alpha/size sum of x^2 over the channel window
    # W(c) = [c - lo, c + hi]: band matrix B[c, c'] = [c' in W(c)]
    x = ctx.inputs[0]
    if ctx.opset < 12:
        ctx.fail(f"the channel window sums need Einsum (opset >= 12, model "
                 f"opset {ctx.opset})")
    size = ctx.attr("size")
    alpha, beta = ctx.attr("alpha", 1e-4), ctx.attr("beta", 0.75)
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    i64 = TensorProto.INT64
    c = ctx.op("Range", ctx.const(0, i64), ctx.op("Squeeze", ctx.op(
        "Gather", ctx.g.shape_of(x), ctx.g.int64s([1]))), ctx.const(1, i64))
    d = ctx.op("Sub", ctx.g.unsqueeze(c, [0]), ctx.g.unsqueeze(c, [1]))
    band = ctx.g.cast(ctx.op("And", ctx.op("Greater", d, ctx.const(-lo - 1, i64)),
                             ctx.op("Less", d, ctx.const(hi + 1, i64))), ctx.dtype)
    window = ctx.op("Einsum", band, ctx.op("Mul", x, x), equation="cd,nd...->nc...")
    s = ctx.op("Add", ctx.const(ctx.attr("bias", 1.0)),
               ctx.op("Mul", ctx.const(alpha / size), window))
    s_pow = ctx.op("Pow", s, ctx.const(-beta))
    inner = ctx.op("Mul", ctx.op("Mul", gy, x), ctx.op("Div", s_pow, s))
    back = ctx.op("Einsum", band, inner, equation="cd,nc...->nd...")
    return ctx.op("Sub", ctx.op("Mul", gy, s_pow), ctx.op("Mul", ctx.op(
        "Mul", ctx.const(2 * alpha * beta / size), x), back))
