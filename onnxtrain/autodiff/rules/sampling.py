"""VJP rules of interpolating ops that are linear in their data input:
Resize (linear, cubic), GridSample, AffineGrid.

They share :func:`dense_adjoint`: the op is run a second time on one-hot
inputs (channel p of the second run holds the image whose only 1 is at
spatial position p), which gives its Jacobian J (P inputs x Q outputs,
shared by every channel) whatever its attributes (coordinate transform,
antialias, cubic coefficient, padding mode...); the input gradient is then
``dY @ J^T``. The Jacobian is dense: the rules refuse sizes where it would
hold more than :data:`MAX_JACOBIAN` elements.
"""
import numpy as np
from onnx import TensorProto

from ..registry import register_vjp

#: Largest dense Jacobian (elements) a rule builds.
MAX_JACOBIAN = 2 ** 26


def _static_size(ctx, name, start):
    shape = ctx.shape(name)
    dims = None if shape is None else shape[start:]
    if dims is None or not all(isinstance(d, int) for d in dims):
        return None
    return int(np.prod(dims))


def _check_size(ctx, *factors):
    if all(f is not None for f in factors) and np.prod(factors) > MAX_JACOBIAN:
        ctx.fail(f"its dense Jacobian would hold {int(np.prod(factors))} "
                 f"elements (more than {MAX_JACOBIAN})")


def one_hot_images(ctx, x, batch):
    """``(batch, P, S...)``: channel p is 1 at flat spatial position p of
    ``x`` (shape (N, C, S...)) and 0 elsewhere; ``batch`` is a 1-D int64."""
    rank = ctx.rank(x, ctx.node.op_type)
    spatial = ctx.op("Slice", ctx.g.shape_of(x), ctx.g.int64s([2]),
                     ctx.g.int64s([rank]))
    count = ctx.op("ReduceProd", spatial, keepdims=1)
    k = ctx.op("Range", ctx.const(0, TensorProto.INT64),
               ctx.op("Squeeze", count), ctx.const(1, TensorProto.INT64))
    eye = ctx.g.cast(ctx.op("Equal", ctx.g.unsqueeze(k, [1]),
                            ctx.g.unsqueeze(k, [0])), ctx.dtype)
    eye = ctx.op("Reshape", eye, ctx.op("Concat", ctx.g.int64s([1]), count,
                                        spatial, axis=0))
    return ctx.op("Expand", eye, ctx.op("Concat", batch, count, spatial,
                                        axis=0))


def dense_adjoint(ctx, gy, x, jacobian):
    """``dX (N, C, S) = dY (N, C, Q) @ J^T`` with J of shape (B, P, Q...)."""
    two = ctx.op("Slice", ctx.g.shape_of(x), ctx.g.int64s([0]),
                 ctx.g.int64s([2]))
    g3 = ctx.op("Reshape", gy, ctx.op("Concat", two, ctx.g.int64s([-1]),
                                      axis=0))
    j3 = ctx.op("Reshape", jacobian, ctx.op(
        "Concat", ctx.op("Slice", ctx.g.shape_of(jacobian), ctx.g.int64s([0]),
                         ctx.g.int64s([2])), ctx.g.int64s([-1]), axis=0))
    gx = ctx.op("MatMul", g3, ctx.op("Transpose", j3, perm=[0, 2, 1]))
    return ctx.g.reshape_like(gx, x)


def _resize_channel_free(ctx, x):
    """Check that Resize leaves axes 0 and 1 alone (scale 1, whole roi)."""
    rank = ctx.rank(x, "Resize")
    axes = ctx.attr("axes")
    if axes is not None:
        if {0, 1} & set(ctx.normalize_axes(axes, rank)):
            ctx.fail(f"axes={list(axes)} resizes the batch or channel axis")
        return False
    if ctx.attr("keep_aspect_ratio_policy", "stretch") != "stretch":
        ctx.fail("keep_aspect_ratio_policy other than 'stretch' without axes")
    scales = ctx.constant_value(ctx.input(2 if ctx.opset >= 11 else 1))
    if scales is not None and np.asarray(scales).size:
        if not np.all(np.asarray(scales).reshape(-1)[:2] == 1):
            ctx.fail("scales other than 1 on the batch or channel axis")
    elif ctx.input(3) is None:
        ctx.fail("scales computed at run time (the batch and channel scales "
                 "must be known to be 1)")
    if ctx.attr("coordinate_transformation_mode") == "tf_crop_and_resize":
        roi = ctx.constant_value(ctx.input(1))
        if roi is None or not np.allclose(
                np.asarray(roi).reshape(2, -1)[:, :2], [[0, 0], [1, 1]]):
            ctx.fail("tf_crop_and_resize with a roi on the batch or channel "
                     "axis (or computed at run time)")
    return True


def resize_interpolation_vjp(ctx, gy):
    """Gradient of X of Resize in mode 'linear' or 'cubic'."""
    x = ctx.inputs[0]
    if ctx.rank(x, "Resize") < 3:
        ctx.fail(f"mode={ctx.attr('mode')!r} on a tensor of rank < 3")
    _check_size(ctx, _static_size(ctx, x, 2), _static_size(ctx, gy, 2)
                if ctx.shape(gy) else _static_size(ctx, ctx.outputs[0], 2))
    inputs = [one_hot_images(ctx, x, ctx.g.int64s([1]))] + ctx.inputs[1:]
    if _resize_channel_free(ctx, x) and ctx.input(3) is not None:
        # sizes of the second run: (1, P) on the batch and channel axes
        lead = ctx.op("Slice", ctx.g.shape_of(inputs[0]), ctx.g.int64s([0]),
                      ctx.g.int64s([2]))
        inputs[3] = ctx.op("Concat", lead, ctx.op(
            "Slice", ctx.inputs[3], ctx.g.int64s([2]), ctx.g.int64s([2 ** 31])),
            axis=0)
    attrs = dict(ctx.attributes)
    if "extrapolation_value" in attrs:
        attrs["extrapolation_value"] = 0.0  # outside the roi: no input
    jacobian = ctx.op("Resize", *inputs, **attrs)
    return dense_adjoint(ctx, gy, x, jacobian)


@register_vjp("GridSample")
def _grid_sample(ctx, gy):
    # linear in X for a given grid (every mode and padding mode)
    x, grid = ctx.inputs
    if ctx.needs_grad[1]:
        ctx.fail("the gradient of grid (only X is differentiated)")
    _check_size(ctx, _static_size(ctx, x, 2), _static_size(ctx, grid, 0))
    batch = ctx.op("Slice", ctx.g.shape_of(x), ctx.g.int64s([0]),
                   ctx.g.int64s([1]))
    jacobian = ctx.op("GridSample", one_hot_images(ctx, x, batch), grid,
                      **ctx.attributes)
    return dense_adjoint(ctx, gy, x, jacobian), None


@register_vjp("AffineGrid")
def _affine_grid(ctx, g_grid):
    # linear in theta (N, r, r + 1): the grids of the r (r + 1) basis
    # matrices form the Jacobian
    theta, size = ctx.inputs
    shape = ctx.shape(theta)
    if shape is None or not all(isinstance(d, int) for d in shape[1:]):
        ctx.fail("theta needs static trailing dimensions")
    k = shape[1] * shape[2]
    basis = ctx.const(np.eye(k).reshape(k, shape[1], shape[2]))
    rest = ctx.op("Slice", size, ctx.g.int64s([1]), ctx.g.int64s([2 ** 31]))
    grids = ctx.op("AffineGrid", basis, ctx.op(
        "Concat", ctx.g.int64s([k]), rest, axis=0), **ctx.attributes)
    flat = ctx.op("Reshape", g_grid, ctx.op("Concat", ctx.op(
        "Slice", ctx.g.shape_of(theta), ctx.g.int64s([0]), ctx.g.int64s([1])),
        ctx.g.int64s([-1]), axis=0))
    jac = ctx.op("Reshape", grids, ctx.g.int64s([k, -1]))
    g_theta = ctx.op("MatMul", flat, ctx.op("Transpose", jac, perm=[1, 0]))
    return ctx.g.reshape_like(g_theta, theta), None
