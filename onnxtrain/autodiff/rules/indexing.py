"""VJP rules of ops that copy input elements to the output: Gather family,
Slice, Pad, Tile, DepthToSpace, Resize (nearest)...

Most of them share :func:`copy_adjoint`: the op is run a second time on the
positions of its data input (0, 1, 2... in the data's element type, or in
float32 for float16 and bfloat16 data; exact below 2**24 elements in
float32 and 2**53 in float64), which tells, for
every output element, which input element it copies; the output gradient is
then scatter-added back to those positions. The rule is thus exactly the
forward op's own indexing, whatever its attributes.
"""
import numpy as np
from onnx import TensorProto

from ..registry import register_vjp
from .sampling import resize_interpolation_vjp

_EXACT_BELOW = {TensorProto.FLOAT: 2 ** 24, TensorProto.DOUBLE: 2 ** 53}


def _positions(ctx, x):
    """One plus the flat position of every element of ``x`` (0 is left for
    elements copied from nowhere, such as padding), in ``x``'s shape and
    the element type of :func:`_position_type`."""
    dtype = _position_type(ctx)
    if ctx.opset < 11:  # no Range: static shapes only
        return ctx.const(_static_arange(ctx, x).reshape(ctx.shape(x)), dtype)
    size = ctx.g.cast(ctx.op("Size", x), dtype)
    one = ctx.const(1, dtype)
    flat = ctx.op("Range", one, ctx.op("Add", size, one), one)
    return ctx.g.reshape_like(flat, x)


def _position_type(ctx):
    """Element type of the positions: the node's, or float32 for float16 and
    bfloat16 data (exact only below 2**11 and 2**8 elements); every op
    :func:`copy_adjoint` runs a second time accepts float32."""
    return ctx.dtype if ctx.dtype in _EXACT_BELOW else TensorProto.FLOAT


def _static_arange(ctx, x):
    """1, 2, ... Size(x) as a numpy vector (static shape of ``x`` needed)."""
    shape = ctx.shape(x)
    if shape is None or not all(isinstance(d, int) for d in shape):
        ctx.fail(f"opset {ctx.opset} (no Range) with a symbolic shape of {x!r}")
    return np.arange(1, int(np.prod(shape)) + 1)


def _dense_scatter_add(ctx, x, positions, gy):
    """Sum of ``gy`` at 1-based flat ``positions`` without a scatter-add
    (opset < 16): ``gy`` times the one-hot matrix [positions == p], which
    holds Size(x) * Size(gy) elements (static shapes, at most 2**26)."""
    out = ctx.shape(ctx.outputs[0])
    sizes = [_static_arange(ctx, x).size,
             None if out is None or not all(isinstance(d, int) for d in out)
             else int(np.prod(out))]
    if sizes[1] is None or sizes[0] * sizes[1] > 2 ** 26:
        ctx.fail("elements copied several times need ScatterElements with "
                 f"reduction='add' (opset >= 16, model opset {ctx.opset}) or "
                 "small static shapes")
    p = ctx.g.int64s(_static_arange(ctx, x))
    index = ctx.g.cast(ctx.op("Reshape", positions, ctx.g.int64s([-1, 1])),
                       TensorProto.INT64)
    hot = ctx.op("Equal", index, ctx.op("Reshape", p, ctx.g.int64s([1, -1])))
    flat = ctx.op("MatMul", ctx.op("Reshape", gy, ctx.g.int64s([1, -1])),
                  ctx.g.cast(hot, ctx.dtype))
    return ctx.g.reshape_like(flat, x)


def _scatter_add(ctx, x, positions, gy, unique):
    """Sum ``gy`` into a zero tensor shaped like ``x`` at the 1-based flat
    ``positions`` (position 0 copies nothing and is dropped)."""
    if ctx.opset < 16:
        return (_scatter_distinct(ctx, x, positions, gy) if unique
                else _dense_scatter_add(ctx, x, positions, gy))
    zero, one = (ctx.const(v, _position_type(ctx)) for v in (0, 1))
    keep = ctx.op("Greater", positions, zero)
    gy = ctx.op("Where", keep, gy, ctx.const(0))
    index = ctx.g.cast(ctx.op("Max", ctx.op("Sub", positions, one), zero),
                       TensorProto.INT64)
    minus_one = ctx.g.int64s([-1])
    flat_zeros = ctx.op("Reshape", ctx.zeros_like(x), minus_one)
    args = (flat_zeros, ctx.op("Reshape", index, minus_one),
            ctx.op("Reshape", gy, minus_one))
    flat = ctx.g.scatter_add("ScatterElements", *args, ctx.dtype, axis=0)
    return ctx.g.reshape_like(flat, x)


def _scatter_distinct(ctx, x, positions, gy):
    """``gy`` written at distinct 1-based flat ``positions`` with a plain
    scatter (opset < 16). The zeros of elements copied from nowhere (Pad's
    border) all go to an extra slot 0, dropped afterwards: written to
    element 0 instead, the last of them would overwrite its gradient."""
    minus_one = ctx.g.int64s([-1])
    size = ctx.op("Add", ctx.op("Reshape", ctx.op("Size", x), minus_one),
                  ctx.g.int64s([1]))
    index = ctx.g.cast(ctx.op("Reshape", positions, minus_one), TensorProto.INT64)
    flat = ctx.op("ScatterElements" if ctx.opset >= 11 else "Scatter",
                  ctx.op("Expand", ctx.const(0), size), index,
                  ctx.op("Reshape", gy, minus_one), axis=0)
    if ctx.opset >= 10:
        flat = ctx.op("Slice", flat, ctx.g.int64s([1]),
                      ctx.g.int64s([2 ** 62]), ctx.g.int64s([0]))
    else:
        flat = ctx.op("Slice", flat, starts=[1], ends=[2 ** 62], axes=[0])
    return ctx.g.reshape_like(flat, x)


def copy_adjoint(ctx, gy, unique=False, replace=None):
    """Gradient of input 0 of an op whose outputs copy its elements.

    ``replace`` maps input positions to names used instead in the second run
    (Pad's constant value becomes 0: padded elements copy nothing).
    """
    x = ctx.inputs[0]
    inputs = [_positions(ctx, x)] + list(ctx.inputs[1:])
    for i, name in (replace or {}).items():
        inputs[i] = name
    positions = ctx.op(ctx.node.op_type, *inputs, **ctx.attributes)
    return _scatter_add(ctx, x, positions, gy, unique)


def _data_only(unique):
    def rule(ctx, gy):
        return copy_adjoint(ctx, gy, unique)
    return rule


def _slice_pads(ctx, x):
    """Pads putting the gradient of a unit-step Slice back in place (begins
    then ends, every axis), or None when the slice is not static: constant
    starts, ends, axes and steps of 1, the sliced dims of ``x`` known."""
    if ctx.opset < 11 or len(ctx.inputs) < 3:
        return None
    values = [ctx.constant_value(ctx.input(i)) for i in range(1, 5)]
    if any(v is None for v, i in zip(values, range(1, 5)) if ctx.input(i)):
        return None
    shape, rank = ctx.shape(x), ctx.g.rank(x)
    if shape is None:
        return None
    starts, ends = (np.asarray(v).reshape(-1) for v in values[:2])
    axes = (ctx.normalize_axes(np.asarray(values[2]).reshape(-1), rank)
            if ctx.input(3) else list(range(len(starts))))
    if ctx.input(4) and not (np.asarray(values[3]) == 1).all():
        return None
    pads = [0] * (2 * rank)
    for axis, start, end in zip(axes, starts, ends):
        n = shape[axis]
        if not isinstance(n, int):
            return None
        start, end = (int(np.clip(v + n if v < 0 else v, 0, n)) for v in (start, end))
        pads[axis], pads[rank + axis] = start, n - max(end, start)
    return pads


@register_vjp("Slice")
def _slice(ctx, gy):
    # a unit-step static slice: its adjoint is a zero Pad of the gradient
    # (one kernel), else the positions' scatter of copy_adjoint
    pads = _slice_pads(ctx, ctx.inputs[0])
    if pads is None:
        return copy_adjoint(ctx, gy, unique=True)
    return ctx.op("Pad", gy, ctx.g.int64s(pads)) if any(pads) else gy


for _op in ("DepthToSpace", "SpaceToDepth", "Compress", "CenterCropPad"):
    register_vjp(_op)(_data_only(unique=True))


@register_vjp("ReverseSequence")
def _reverse_sequence(ctx, gy):
    # reversing the first sequence_lens[b] steps of every row is a
    # permutation that is its own inverse, so its adjoint (the transposed
    # permutation) is the same ReverseSequence of the gradient: one kernel,
    # no read of the input (whose positions copy_adjoint would scatter)
    return (ctx.op("ReverseSequence", gy, ctx.inputs[1],
                   batch_axis=ctx.attr("batch_axis", 1),
                   time_axis=ctx.attr("time_axis", 0)), None)
for _op in ("GatherND",):
    register_vjp(_op)(_data_only(unique=False))


@register_vjp("Upsample")
def _upsample(ctx, gy):
    # opsets 7 to 9 (Resize's predecessor)
    if len(ctx.needs_grad) > 1 and ctx.needs_grad[1]:
        ctx.fail("the gradient of scales (a non-differentiable input)")
    if ctx.attr("mode", "nearest") != "nearest":
        ctx.fail(f"mode={ctx.attr('mode')!r}: only mode 'nearest'")
    return (copy_adjoint(ctx, gy), None)[:len(ctx.inputs)]


def _one_hot(ctx, indices, x, axis, where):
    """1.0 where ``indices`` equals k along a new axis at ``where`` (k runs
    over the size of ``x`` along ``axis``; negative indices count from the
    end), 0.0 elsewhere."""
    # rank-0 depth and zero: a scalar index stays a scalar
    depth = ctx.op("Gather", ctx.g.shape_of(x), ctx.const(axis, TensorProto.INT64))
    indices = ctx.g.cast(indices, TensorProto.INT64)
    indices = ctx.op("Where", ctx.op("Less", indices, ctx.const(0, TensorProto.INT64)),
                     ctx.op("Add", indices, depth), indices)
    rank = ctx.rank(ctx.inputs[1], ctx.node.op_type) + 1
    where = where % rank
    k = ctx.op("Range", ctx.const(0, TensorProto.INT64), depth,
               ctx.const(1, TensorProto.INT64))
    k = ctx.op("Reshape", k, ctx.g.int64s([-1] + [1] * (rank - where - 1)))
    hot = ctx.op("Equal", ctx.g.unsqueeze(indices, [where]), k)
    return ctx.g.cast(hot, ctx.dtype)


def _one_hot_operands(ctx):
    """``(x, indices, rank of x, axis)`` of a Gather or GatherElements before
    opset 16, whose gradient is then summed back through a one-hot tensor
    (Einsum: opset >= 12)."""
    if ctx.opset < 12:
        ctx.fail(f"opset {ctx.opset} has neither ScatterND with reduction nor "
                 "Einsum to sum the gradient back; use opset >= 12")
    x, indices = ctx.inputs
    rank = ctx.rank(x, ctx.node.op_type)
    return x, indices, rank, ctx.normalize_axes([ctx.attr("axis", 0)], rank)[0]


def _constant_index_adjoint(ctx, gy):
    """dx of a Gather of one constant index along a static axis (the
    [CLS] row of an encoder): dy put back in its place and zeros around it,
    Unsqueeze then Pad; None for other Gathers."""
    x, indices = ctx.inputs[:2]
    index, shape = ctx.constant_value(indices), ctx.shape(x)
    if index is None or np.ndim(index) != 0 or shape is None or ctx.opset < 13:
        return None
    axis = ctx.normalize_axes([ctx.attr("axis", 0)], len(shape))[0]
    size, i = shape[axis], int(index)
    if not isinstance(size, int) or not -size <= i < size:
        return None
    i = i + size if i < 0 else i
    pads = [0] * (2 * len(shape))
    pads[axis], pads[len(shape) + axis] = i, size - 1 - i
    return ctx.op("Pad", ctx.g.unsqueeze(gy, [axis]), ctx.g.int64s(pads))


@register_vjp("Gather")
def _gather(ctx, gy):
    # one constant index: dy padded with zeros; an embedding lookup (axis
    # 0): one row-wise ScatterND add of dy's rows; other axes: the
    # positions' scatter of copy_adjoint; before opset 16 (no scatter-add):
    # dx = contraction of dy with one-hot
    padded = _constant_index_adjoint(ctx, gy)
    if padded is not None:
        return padded, None
    if ctx.opset >= 16 and ctx.attr("axis", 0) == 0:
        return _gather_rows_adjoint(ctx, gy), None
    if ctx.opset >= 16:
        return copy_adjoint(ctx, gy)
    x, indices, rank, axis = _one_hot_operands(ctx)
    k = ctx.rank(indices, "Gather")
    letters = "abcdefghijklmnopqrstuvwxyz"
    pre, idx, post = letters[:axis], letters[axis:axis + k], letters[
        axis + k:rank + k - 1]
    hot = _one_hot(ctx, indices, x, axis, -1)
    return ctx.op("Einsum", gy, hot,
                  equation=f"{pre}{idx}{post},{idx}Z->{pre}Z{post}")


@register_vjp("ArrayFeatureExtractor", domain="ai.onnx.ml")
def _array_feature_extractor(ctx, gy):
    # a Gather of columns (last axis) in the ai.onnx.ml domain, whose
    # indices may repeat: the op itself run on the positions of X tells
    # where each output element comes from
    x, indices = ctx.inputs[:2]
    positions = ctx.g.op("ArrayFeatureExtractor", _positions(ctx, x), indices,
                         domain="ai.onnx.ml")
    return _scatter_add(ctx, x, positions, gy, unique=False), None


def _gather_rows_adjoint(ctx, gy):
    """dx of ``Gather(x, indices, axis=0)``: ``dy`` (indices.shape + the
    rows' shape) summed into zero rows of ``x`` by one ScatterND with
    ``reduction='add'``, each index a whole row (onnxruntime adds a row
    per index instead of one element per scattered value: a word
    embedding's gradient).
    Negative indices count from the end, as Gather reads them."""
    x, indices = ctx.inputs[:2]
    i64 = TensorProto.INT64
    if (ctx.g.types.get(indices) or (None,))[0] != i64:
        indices = ctx.g.cast(indices, i64)
    rows = ctx.op("Gather", ctx.g.shape_of(x), ctx.g.int64s([0]))
    index = ctx.op("Where", ctx.op("Less", indices, ctx.const(0, i64)),
                   ctx.op("Add", indices, rows), indices)
    # dy as indices.shape + rows (a gradient may reach a Loop body's Gather
    # with its unit axes dropped)
    row_shape = ctx.op("Slice", ctx.g.shape_of(x), ctx.g.int64s([1]),
                       ctx.g.int64s([2 ** 62]))
    gy = ctx.op("Reshape", gy, ctx.op("Concat", ctx.g.shape_of(index), row_shape,
                                      axis=0))
    index = ctx.g.unsqueeze(index, [-1])
    return ctx.g.scatter_add("ScatterND", ctx.zeros_like(x), index, gy, ctx.dtype)


@register_vjp("GatherElements")
def _gather_elements(ctx, gy):
    # before opset 16: dx = sum over the indexed axis of one-hot(indices) dy,
    # padded with zeros where indices is smaller than x
    if ctx.opset >= 16:
        return copy_adjoint(ctx, gy)
    x, indices, rank, axis = _one_hot_operands(ctx)
    hot = _one_hot(ctx, indices, x, axis, axis + 1)
    spread = ctx.op("Mul", hot, ctx.g.unsqueeze(gy, [axis + 1]))
    gx = ctx.g.reduce_sum(spread, [axis], keepdims=0)
    missing = ctx.op("Sub", ctx.g.shape_of(x), ctx.g.shape_of(gx))
    pads = ctx.op("Concat", ctx.g.int64s([0] * rank), missing, axis=0)
    return ctx.op("Pad", gx, pads), None


def _pad_crop(ctx, gy):
    """The adjoint of a constant Pad with constant non-negative pads on
    every axis (no ``axes`` input): one Slice cropping the border, or None
    when the pads are not of that kind."""
    pads = ctx.constant_value(ctx.input(1)) if ctx.opset >= 11 else None
    rank = ctx.g.rank(ctx.inputs[0])
    if pads is None or ctx.input(3) is not None or rank is None:
        return None
    pads = [int(v) for v in np.asarray(pads).reshape(-1)]
    if len(pads) != 2 * rank or min(pads) < 0:
        return None
    ends = [-e if e else 2 ** 62 for e in pads[rank:]]
    return ctx.op("Slice", gy, ctx.g.int64s(pads[:rank]), ctx.g.int64s(ends),
                  ctx.g.int64s(list(range(rank))))


@register_vjp("Pad")
def _pad(ctx, gy):
    # the padded border copies the constant value (mode "constant")
    mode = ctx.attr("mode", "constant")
    replace = {}
    if mode == "constant" and ctx.opset >= 11:
        if ctx.input(2) is not None:  # when omitted, the value is 0
            replace = {2: ctx.const(0, _position_type(ctx))}
    elif mode == "constant" and ctx.attr("value", 0.0) != 0.0:
        ctx.fail("a non-zero constant 'value' attribute (opset < 11)")
    gx = _pad_crop(ctx, gy) if mode == "constant" else None
    if gx is None:
        gx = copy_adjoint(ctx, gy, unique=mode == "constant", replace=replace)
    g_value = None
    if len(ctx.needs_grad) > 2 and ctx.needs_grad[2]:
        inside = ctx.g.reduce_sum(gx, keepdims=0)
        g_value = ctx.op("Sub", ctx.g.reduce_sum(gy, keepdims=0), inside)
        g_value = ctx.g.reshape_like(g_value, ctx.inputs[2])
    return (gx, None, g_value)[:len(ctx.inputs)]


@register_vjp("Resize")
def _resize(ctx, gy):
    if any(ctx.needs_grad[1:]):
        ctx.fail("the gradient of roi or scales (non-differentiable inputs)")
    if ctx.attr("mode", "nearest") != "nearest":
        return resize_interpolation_vjp(ctx, gy)
    return copy_adjoint(ctx, gy)


@register_vjp("Tile")
def _tile(ctx, gy):
    # view dy as (r0, d0, r1, d1, ...) and sum over the repeats r_k
    x, repeats = ctx.inputs
    rank = ctx.rank(x, "Tile")
    pairs = ctx.op("Concat", ctx.g.unsqueeze(repeats, [1]),
                   ctx.g.unsqueeze(ctx.g.shape_of(x), [1]), axis=1)
    blocks = ctx.op("Reshape", gy, ctx.op("Reshape", pairs, ctx.g.int64s([-1])))
    return ctx.g.reduce_sum(blocks, list(range(0, 2 * rank, 2)), keepdims=0), None


@register_vjp("Expand", unbroadcast=True)
def _expand(ctx, gy):
    return gy


@register_vjp("Split")
def _split(ctx, *grad_outputs):
    rank = ctx.rank(ctx.inputs[0], "Split")
    axis = ctx.normalize_axes([ctx.attr("axis", 0)], rank)[0]
    parts = [gy if gy is not None else ctx.zeros_like(out)
             for gy, out in zip(grad_outputs, ctx.outputs)]
    return ctx.op("Concat", *parts, axis=axis)


@register_vjp("TopK")
def _topk(ctx, g_values, g_indices=None):
    # the values are GatherElements(x, indices, axis)
    x, indices = ctx.inputs[0], ctx.outputs[1]
    zeros = ctx.zeros_like(x)
    axis = ctx.attr("axis", -1)
    return ctx.op("ScatterElements", zeros, indices, g_values, axis=axis), None


@register_vjp("MaxUnpool")
def _max_unpool(ctx, gy):
    """VJP of MaxUnpool: ``Y.flat[I] = X`` (I: flat indices into the whole
    output, as MaxPool's second output), zeros elsewhere, so
    ``dX = dY.flat[I]``. Where indices repeat, one write wins: MaxUnpool run
    on the positions of X (see :func:`_positions`) tells which, and the
    others get zero. I and output_shape are integer inputs without
    gradient."""
    x, indices = ctx.inputs[:2]
    positions = _positions(ctx, x)
    written = ctx.op("MaxUnpool", positions, *ctx.inputs[1:], **ctx.attributes)
    minus_one = ctx.g.int64s([-1])

    def read(value):  # value.flat[I], shaped like X
        return ctx.op("Gather", ctx.op("Reshape", value, minus_one), indices)

    won = ctx.op("Equal", read(written), positions)
    gx = ctx.op("Where", won, read(gy), ctx.const(0))
    return (gx,) + (None,) * (len(ctx.inputs) - 1)


@register_vjp("TensorScatter")
def _tensor_scatter(ctx, gy):
    """VJP of TensorScatter (opset 24): the present cache copies the past
    cache except where the update is written (at ``write_indices[b] + s``
    along ``axis``, modulo its size in mode 'circular'). TensorScatter run
    on a zero cache and the positions of the update (see
    :func:`_positions`) tells which update element each cache element
    holds: the past gets ``dY`` elsewhere, the update gets ``dY`` where its
    elements were written (an element overwritten by a later one in
    circular mode gets zero). write_indices carries no gradient."""
    past, update = ctx.inputs[:2]
    positions = _positions(ctx, update)
    zeros = ctx.op("Expand", ctx.const(0, _position_type(ctx)),
                   ctx.g.shape_of(past))
    written = ctx.op("TensorScatter", zeros, positions, *ctx.inputs[2:],
                     **ctx.attributes)
    free = ctx.op("Equal", written, ctx.const(0, _position_type(ctx)))
    g_past = ctx.op("Where", free, gy, ctx.const(0)) if ctx.needs_grad[0] else None
    g_update = (_scatter_add(ctx, update, written, gy, unique=True)
                if ctx.needs_grad[1] else None)
    return (g_past, g_update, None)[:len(ctx.inputs)]


def _scatter_extremum(ctx, gy, gather, scatter_add):
    """reduction='max' or 'min': dy goes to the data element and the updates
    equal to the output, shared equally between ties (as ReduceMax)."""
    data, _, updates = ctx.inputs
    y = ctx.outputs[0]
    hit_data = ctx.g.cast(ctx.op("Equal", data, y), ctx.dtype)
    hit_updates = ctx.g.cast(ctx.op("Equal", updates, gather(y)), ctx.dtype)
    ties = ctx.op("Add", hit_data, scatter_add(ctx.zeros_like(data), hit_updates))
    share = ctx.op("Div", gy, ctx.op("Max", ties, ctx.const(1)))
    return (ctx.op("Mul", share, hit_data), None,
            ctx.op("Mul", gather(share), hit_updates))


def _scatter_product(ctx, gy, gather, scatter):
    """reduction='mul': ``y[p] = data[p] * prod_{j -> p} u[j]``, the updates
    ``u[j]`` written to ``p`` (duplicate indices all multiply). Then
    ``d data[p] = dy[p] prod_{j -> p} u[j]`` and ``d u[j] = dy[p] data[p]
    prod_{j' -> p, j' != j} u[j']``. The product of the others is computed
    without dividing by a zero: with Z[p] the number of zero updates at p
    and Q[p] the product of the non-zero ones, it is ``Q[p] / u[j]`` when
    Z[p] = 0, ``Q[p]`` when u[j] is the only zero, and 0 otherwise.

    ``gather(v)`` reads ``v`` at the indices, ``scatter(base, v, reduction)``
    writes ``v`` into ``base``."""
    data, _, updates = ctx.inputs
    zero = ctx.op("Equal", updates, ctx.const(0))
    safe = ctx.op("Where", zero, ctx.const(1), updates)
    # the zero counts are summed in float32 whatever the data type (exact
    # small integers; onnxruntime's CPU scatter has no float16 'add')
    f32 = TensorProto.FLOAT
    zeros = scatter(ctx.g.cast(ctx.zeros_like(data), f32), ctx.g.cast(zero, f32), "add")
    product = scatter(ctx.op("Expand", ctx.const(1), ctx.g.shape_of(data)),
                      safe, "mul")
    none_zero = ctx.op("Equal", zeros, ctx.const(0, f32))
    g_data = ctx.op("Mul", gy, ctx.op("Where", none_zero, product, ctx.const(0)))
    if not ctx.needs_grad[2]:
        return g_data, None, None
    zeros_j, product_j = gather(zeros), gather(product)
    others = ctx.op("Where", zero, ctx.op(
        "Where", ctx.op("Equal", zeros_j, ctx.const(1, f32)), product_j, ctx.const(0)),
        ctx.op("Where", ctx.op("Equal", zeros_j, ctx.const(0, f32)),
               ctx.op("Div", product_j, safe), ctx.const(0)))
    g_updates = ctx.op("Mul", ctx.op("Mul", gather(gy), gather(data)), others)
    return g_data, None, g_updates


@register_vjp("ScatterElements")
def _scatter_elements(ctx, gy):
    # none: data loses the overwritten positions, updates read them back;
    # add: data passes gy through
    data, indices, updates = ctx.inputs
    reduction = ctx.attr("reduction", "none")
    axis = ctx.attr("axis", 0)
    if reduction in ("max", "min"):
        return _scatter_extremum(ctx, gy, lambda v: ctx.op(
            "GatherElements", v, indices, axis=axis), lambda z, v: ctx.g.scatter_add(
            "ScatterElements", z, indices, v, ctx.dtype, axis=axis))
    if reduction == "mul":
        return _scatter_product(ctx, gy, lambda v: ctx.op(
            "GatherElements", v, indices, axis=axis), lambda b, v, r: ctx.op(
            "ScatterElements", b, indices, v, axis=axis, reduction=r))
    if reduction not in ("none", "add"):
        ctx.fail(f"reduction={reduction!r} (only 'none', 'add', 'mul', "
                 "'max', 'min')")
    g_data = gy
    if reduction == "none" and ctx.needs_grad[0]:
        g_data = ctx.op("ScatterElements", gy, indices,
                        ctx.zeros_like(updates), axis=axis)
    g_updates = ctx.op("GatherElements", gy, indices, axis=axis)
    return g_data, None, g_updates


@register_vjp("ScatterND")
def _scatter_nd(ctx, gy):
    data, indices, updates = ctx.inputs
    reduction = ctx.attr("reduction", "none")
    if reduction in ("max", "min"):
        return _scatter_extremum(ctx, gy, lambda v: ctx.op(
            "GatherND", v, indices), lambda z, v: ctx.g.scatter_add(
            "ScatterND", z, indices, v, ctx.dtype))
    if reduction == "mul":
        return _scatter_product(ctx, gy, lambda v: ctx.op(
            "GatherND", v, indices), lambda b, v, r: ctx.op(
            "ScatterND", b, indices, v, reduction=r))
    if reduction not in ("none", "add"):
        ctx.fail(f"reduction={reduction!r} (only 'none', 'add', 'mul', "
                 "'max', 'min')")
    g_data = gy
    if reduction == "none" and ctx.needs_grad[0]:
        g_data = ctx.op("ScatterND", gy, indices, ctx.zeros_like(updates))
    return g_data, None, ctx.op("GatherND", gy, indices)


@register_vjp("Scatter")
def _scatter(ctx, gy):
    # opsets 9 and 10 (ScatterElements without reduction); no GatherElements
    # there: updates read dy at flat positions computed from static shapes
    data, indices, updates = ctx.inputs
    dshape, ishape = ctx.shape(data), ctx.shape(indices)
    if not all(s is not None and all(isinstance(d, int) for d in s)
               for s in (dshape, ishape)):
        ctx.fail("symbolic shapes of data or indices (opset < 11)")
    axis = ctx.normalize_axes([ctx.attr("axis", 0)], len(dshape))[0]
    g_data = ctx.op("Scatter", gy, indices, ctx.zeros_like(updates), axis=axis)
    strides = np.cumprod([1] + list(dshape[::-1]))[:-1][::-1]
    coords = np.indices(ishape)
    base = sum(c * s for i, (c, s) in enumerate(zip(coords, strides)) if i != axis)
    index = ctx.g.cast(indices, TensorProto.INT64)
    index = ctx.op("Where", ctx.op("Less", index, ctx.g.int64s(0)), ctx.op(
        "Add", index, ctx.g.int64s(dshape[axis])), index)
    flat = ctx.op("Add", ctx.const(np.asarray(base, np.int64), TensorProto.INT64),
                  ctx.op("Mul", index, ctx.g.int64s(int(strides[axis]))))
    g_updates = ctx.op("Gather", ctx.op("Reshape", gy, ctx.g.int64s([-1])), flat)
    return g_data, None, g_updates
