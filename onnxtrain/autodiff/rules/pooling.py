"""VJP rules of pooling: MaxPool (through its indices), global pools."""
from ..registry import register_vjp


def _zeros_like(ctx, x):
    return ctx.op("Expand", ctx.const(0), ctx.g.shape_of(x))


@register_vjp("MaxPool")
def _max_pool(ctx, gy, g_indices=None):
    # the gradient goes to the element each window picked: the pool is run
    # again for its Indices (flat positions in X, padding not counted)
    x = ctx.inputs[0]
    if ctx.attr("storage_order", 0):
        ctx.fail("storage_order=1 (column-major indices)")
    indices = ctx.outputs[1] if len(ctx.outputs) > 1 and ctx.outputs[1] else None
    if indices is None:
        _, indices = ctx.op("MaxPool", x, n_outputs=2, **ctx.attributes)
    kernel = ctx.attr("kernel_shape")
    strides = ctx.attr("strides") or [1] * len(kernel)
    overlap = any(k > s for k, s in zip(kernel, strides))
    minus_one = ctx.g.int64s([-1])
    args = (ctx.op("Reshape", _zeros_like(ctx, x), minus_one),
            ctx.op("Reshape", indices, minus_one), ctx.op("Reshape", gy, minus_one))
    if ctx.opset >= 16:
        flat = ctx.op("ScatterElements", *args, axis=0, reduction="add")
    elif not overlap:
        flat = ctx.op("ScatterElements", *args, axis=0)
    else:
        ctx.fail("overlapping windows need ScatterElements with "
                 f"reduction='add' (opset >= 16, model opset {ctx.opset})")
    return ctx.g.reshape_like(flat, x)


@register_vjp("GlobalAveragePool")
def _global_average_pool(ctx, gy):
    x = ctx.inputs[0]
    count = ctx.op("Div", ctx.op("Size", x), ctx.op("Size", ctx.outputs[0]))
    spread = ctx.op("Expand", gy, ctx.g.shape_of(x))
    return ctx.op("Div", spread, ctx.g.cast(count, ctx.dtype))


@register_vjp("GlobalMaxPool")
def _global_max_pool(ctx, gy):
    # shared equally between ties, as ReduceMax
    x = ctx.inputs[0]
    rank = ctx.rank(x, "GlobalMaxPool")
    y = ctx.op("Expand", ctx.outputs[0], ctx.g.shape_of(x))
    hit = ctx.g.cast(ctx.op("Equal", x, y), ctx.dtype)
    ties = ctx.g.reduce_sum(hit, list(range(2, rank)), keepdims=1)
    spread = ctx.op("Expand", ctx.op("Div", gy, ties), ctx.g.shape_of(x))
    return ctx.op("Mul", spread, hit)

