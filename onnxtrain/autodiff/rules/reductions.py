"""VJP rules of reductions (axes as attribute or input, by opset).

Every rule broadcasts the output gradient back to the input's shape with
:func:`_expand_back` (identity when ``noop_with_empty_axes`` leaves the
input unreduced) and multiplies it by the local derivative.
"""

import numpy as np
from onnx import TensorProto

from ..registry import register_vjp


def _axes_input(ctx):
    """Name of an axes input (opset 13+ ReduceSum, 18+ others) or None."""
    return None if "axes" in ctx.attributes else ctx.input(1)


def _is_noop(ctx):
    """Static no-op: no axes at all and ``noop_with_empty_axes=1``."""
    return (ctx.attr("noop_with_empty_axes", 0) and not ctx.attr("axes")
            and _axes_input(ctx) is None)


def _reduce(ctx, op_type, v, keepdims):
    """``op_type`` over the node's axes (attribute, constant or run-time
    input), with its ``noop_with_empty_axes``."""
    if _is_noop(ctx):
        return v
    name = _axes_input(ctx)
    if name is None:
        return ctx.g.reduce(op_type, v, ctx.attr("axes"), keepdims)
    return ctx.op(op_type, v, name, keepdims=int(keepdims),
                  noop_with_empty_axes=ctx.attr("noop_with_empty_axes", 0))


def _static_axes(ctx):
    """The reduced axes known at build time: a list, None for every axis,
    [] for none (``noop_with_empty_axes``), False when computed at run
    time."""
    if "axes" in ctx.attributes:
        return list(ctx.attributes["axes"]) or None
    name = _axes_input(ctx)
    if name is None:
        return None
    value = ctx.constant_value(name)
    if value is None:
        return False
    axes = [int(a) for a in np.asarray(value).reshape(-1)]
    return axes or ([] if ctx.attr("noop_with_empty_axes", 0) else None)


def _expand_back(ctx, v):
    """Broadcast ``v`` (shaped like the output) back to the input's shape.

    With ``keepdims=0``, ``v`` first gets the reduced axes back: none to
    add for a reduction over every axis (Expand broadcasts the scalar), an
    Unsqueeze at axes known at build time, else the shape of the reduction
    with ``keepdims=1`` (run-time axes).
    """
    axes = _static_axes(ctx)
    if _is_noop(ctx) or axes == []:
        return v
    x = ctx.inputs[0]
    if not ctx.attr("keepdims", 1) and axes is not None:
        rank = ctx.g.rank(x)
        if axes is not False and rank is not None:
            v = ctx.g.unsqueeze(v, sorted(set(ctx.normalize_axes(axes, rank))))
        else:
            kept = _reduce(ctx, "ReduceSum", x, keepdims=1)
            v = ctx.op("Reshape", v, ctx.g.shape_of(kept))
    return ctx.op("Expand", v, ctx.g.shape_of(x))


def _count(ctx):
    """Number of input elements per output element, in the node's type: a
    constant when the reduced dimensions are static."""
    x = ctx.inputs[0]
    axes, shape = _static_axes(ctx), ctx.shape(x)
    if axes is not False and shape is not None:
        reduced = range(len(shape)) if axes is None else ctx.normalize_axes(axes, len(shape))
        sizes = [shape[a] for a in set(reduced)]
        if all(isinstance(d, int) and d > 0 for d in sizes):
            return ctx.const(float(np.prod(sizes, dtype=np.float64)))
    size = ctx.op("Size", x)
    if axes is not None:
        size = ctx.op("Div", size, ctx.op("Size", ctx.outputs[0]))
    return ctx.g.cast(size, ctx.dtype)


def _reduce_like(ctx, v, op_type="ReduceSum"):
    """``op_type`` of ``v`` over the node's axes, with its keepdims."""
    return _reduce(ctx, op_type, v, ctx.attr("keepdims", 1))


@register_vjp("ReduceSum")
def _reduce_sum(ctx, gy):
    return _expand_back(ctx, gy)


@register_vjp("ReduceMean")
def _reduce_mean(ctx, gy):
    # each input element contributes 1 / (number of reduced elements)
    return ctx.op("Div", _expand_back(ctx, gy), _count(ctx))


@register_vjp("ReduceSumSquare")
def _reduce_sum_square(ctx, gy):
    two_x = ctx.op("Mul", ctx.inputs[0], ctx.const(2))
    return ctx.op("Mul", _expand_back(ctx, gy), two_x)


@register_vjp("ReduceL1")
def _reduce_l1(ctx, gy):
    return ctx.op("Mul", _expand_back(ctx, gy), ctx.op("Sign", ctx.inputs[0]))


@register_vjp("ReduceL2")
def _reduce_l2(ctx, gy):
    # d||x|| / dx = x / ||x||, taken as 0 where the norm is 0
    y = _expand_back(ctx, ctx.outputs[0])
    zero = ctx.const(0)
    is_zero = ctx.op("Equal", y, zero)
    safe = ctx.op("Where", is_zero, ctx.const(1), y)
    ratio = ctx.op("Where", is_zero, zero, ctx.op("Div", ctx.inputs[0], safe))
    return ctx.op("Mul", _expand_back(ctx, gy), ratio)


@register_vjp("ReduceLogSum")
def _reduce_log_sum(ctx, gy):
    # y = log(sum(x)): dy/dx = 1 / sum(x) = exp(-y)
    inv_sum = ctx.op("Exp", ctx.op("Neg", ctx.outputs[0]))
    return _expand_back(ctx, ctx.op("Mul", gy, inv_sum))


@register_vjp("ReduceLogSumExp")
def _reduce_log_sum_exp(ctx, gy):
    # dy/dx = exp(x - y), the softmax of x over the reduced axes
    y = _expand_back(ctx, ctx.outputs[0])
    weight = ctx.op("Exp", ctx.op("Sub", ctx.inputs[0], y))
    return ctx.op("Mul", _expand_back(ctx, gy), weight)


def _reduce_extremum(ctx, gy):
    # the gradient goes to the elements equal to the extremum, shared
    # equally between ties (a subgradient)
    y = _expand_back(ctx, ctx.outputs[0])
    hit = ctx.g.cast(ctx.op("Equal", ctx.inputs[0], y), ctx.dtype)
    ties = _expand_back(ctx, _reduce_like(ctx, hit))
    return ctx.op("Div", ctx.op("Mul", _expand_back(ctx, gy), hit), ties)


register_vjp("ReduceMax")(_reduce_extremum)
register_vjp("ReduceMin")(_reduce_extremum)


@register_vjp("ReduceProd")
def _reduce_prod(ctx, gy):
    # d prod / dx_i = product of the other elements: prod(nonzero) / x_i with
    # no zero, prod(nonzero) at the only zero, 0 with two zeros or more
    x = ctx.inputs[0]
    zero, one = ctx.const(0), ctx.const(1)
    is_zero = ctx.op("Equal", x, zero)
    nonzero_x = ctx.op("Where", is_zero, one, x)
    prod = _expand_back(ctx, _reduce_like(ctx, nonzero_x, "ReduceProd"))
    zeros = _expand_back(ctx, _reduce_like(ctx, ctx.g.cast(is_zero, ctx.dtype)))
    others = ctx.op("Where", ctx.op("Equal", zeros, zero),
                    ctx.op("Div", prod, nonzero_x),
                    ctx.op("Where", ctx.op("And", is_zero, ctx.op(
                        "Equal", zeros, one)), prod, zero))
    return ctx.op("Mul", _expand_back(ctx, gy), others)


@register_vjp("CumSum")
def _cumsum(ctx, gy):
    # the adjoint of a running sum is the running sum in the other direction
    return ctx.op("CumSum", gy, ctx.inputs[1], exclusive=ctx.attr("exclusive", 0),
                  reverse=1 - ctx.attr("reverse", 0))




@register_vjp("CumProd")
def _cumprod(ctx, gy):
    # y_j = prod of x_k over k in S(j): dy_j/dx_i = [i in S(j)] times the
    # product over S(j) without x_i, the CumProd (same attributes) of x with
    # x_i set to 1, one copy per i along a new leading axis (no division:
    # exact at zeros); [i in S(j)] is the CumSum of the one-hot of i. The
    # axis may be computed at run time.
    x, axis = ctx.inputs
    i64 = TensorProto.INT64
    ones = ctx.op("Expand", ctx.const(1), ctx.g.shape_of(x))
    position = ctx.g.cast(ctx.op("CumSum", ones, axis, exclusive=1), i64)
    rank = ctx.op("Size", ctx.g.shape_of(x))
    shifted = ctx.op("Add", ctx.op("Mod", ctx.op("Add", ctx.g.cast(axis, i64),
                                                 rank), rank), ctx.const(1, i64))
    n = ctx.op("Gather", ctx.g.shape_of(x), ctx.op("Sub", shifted,
                                                   ctx.const(1, i64)))
    k = ctx.op("Range", ctx.const(0, i64), n, ctx.const(1, i64))
    k = ctx.op("Reshape", k, ctx.op("Concat", ctx.g.int64s([-1]), ctx.op(
        "Expand", ctx.g.int64s([1]), ctx.op("Reshape", rank, ctx.g.int64s([1]))),
        axis=0))
    hot = ctx.op("Equal", k, ctx.g.unsqueeze(position, [0]))
    attrs = dict(exclusive=ctx.attr("exclusive", 0), reverse=ctx.attr("reverse", 0))
    others = ctx.op("CumProd", ctx.op("Where", hot, ctx.const(1),
                                      ctx.g.unsqueeze(x, [0])), shifted, **attrs)
    member = ctx.op("CumSum", ctx.g.cast(hot, ctx.dtype), shifted, **attrs)
    terms = ctx.op("Mul", ctx.op("Mul", others, member), ctx.g.unsqueeze(gy, [0]))
    per_i = ctx.op("ReduceSum", terms, ctx.op("Reshape", shifted,
                                               ctx.g.int64s([1])), keepdims=1)
    picked = ctx.op("Mul", per_i, ctx.g.cast(hot, ctx.dtype))
    return ctx.g.reduce_sum(picked, [0], keepdims=0), None
