"""VJP rule of DeformConv (deformable convolution, opset 19), 2-D.

Forward, as the ONNX specification defines it
(https://onnx.ai/onnx/operators/onnx__DeformConv.html; onnx.reference's
implementation samples with GridSample, bilinear, ``align_corners=1``,
zero padding; onnxruntime's kernel computes the same, checked in
tests/autodiff/test_deform_conv.py). For output position (i, j), kernel tap
k = (a, b) and input channel c of offset group q = c // (C / offset_group),
X[n, c] is sampled at::

    p_h = i s_h - pad_top  + a d_h + offset[n, q, a, b, 0, i, j]
    p_w = j s_w - pad_left + b d_w + offset[n, q, a, b, 1, i, j]

(``offset`` seen as (N, offset_group, kH, kW, 2, oH, oW)) by bilinear
interpolation between the four pixels around it, a pixel outside the image
reading 0::

    S[n, c, k, i, j] = sum over u, v in {0, 1} of
                       w_u(l_h) w_v(l_w) X[n, c, h0 + u, w0 + v]

with ``h0 = floor(p_h)``, ``l_h = p_h - h0``, ``w_0(l) = 1 - l``,
``w_1(l) = l`` (likewise for w). The columns ``cols = S * mask`` (``mask``
seen as (N, offset_group, kH kW, oH, oW), 1 when absent) are then
convolved with W as an im2col convolution, one MatMul per group::

    Y[n, m, i, j] = sum over c in the group of m, k of
                    W[m, c mod (C / group), k] cols[n, c, k, i, j] + B[m]

The rule recomputes S from the node's inputs (corner indices into the image
padded by a one-pixel zero border, flattened; clamped to that border, a
corner farther out reads 0 too) and returns the adjoint of each step:

- ``dB = sum over n, i, j of dY``;
- ``dcols = W^T dY`` and ``dW = sum over n of dY cols^T``, per group;
- ``dmask = sum over the channels of the offset group of dcols * S``;
- ``dS = dcols * mask``; ``dX`` is ``dS w_u(l_h) w_v(l_w)`` scatter-added
  at the four corners (what lands in the border is dropped);
- ``doffset_h = sum over the channels of the offset group and the four
  corners of dS X[corner] d(w_u(l_h) w_v(l_w))/dp_h``, with
  ``dw_0(l)/dp = -1`` and ``dw_1(l)/dp = 1``; likewise ``doffset_w``.

The interpolation is piecewise linear in p, with kinks at integer
positions. There ``h0 = floor(p_h) = p_h`` and the derivative above is the
right derivative (the slope of the cell [p, p + 1)); central finite
differences agree with it everywhere else and lie between the left and
right derivatives at a kink.

Batch size and spatial sizes may be symbolic. Not supported (a clear
error): X of a rank other than 4 (onnxruntime implements only the 2-D op);
``kernel_shape`` absent with a W whose spatial dims are not static.
"""
from collections import namedtuple

import numpy as np
from onnx import TensorProto

from ..registry import register_vjp

_I64 = TensorProto.INT64

#: Attributes of the node, defaults filled in (lists of two spatial values).
Geometry = namedtuple("Geometry", "kernel strides dilations pads group "
                                  "offset_group")

#: What the forward computes and the adjoint reads. ``index`` (N, C, F)
#: and ``x_flat`` (N, C, P) feed GatherElements (axis 2) on the padded
#: image; ``values`` (N, G, C/G, 4, K, oH, oW) are the four corners of
#: every sample (G = offset_group); ``weights`` (N, G, 4, K, oH, oW) their
#: bilinear weights and ``slopes`` (N, G, 4, K, 2, oH, oW) the weights'
#: derivatives with respect to p_h and p_w; ``samples`` is S
#: (N, G, C/G, K, oH, oW).
Sampling = namedtuple("Sampling", "index x_flat x_padded values weights "
                                  "slopes samples")


def _dims(ctx, name, start, end):
    """``Shape(name)[start:end]`` (1-D int64)."""
    return ctx.op("Slice", ctx.g.shape_of(name), ctx.g.int64s([start]),
                  ctx.g.int64s([end]))


def _shape(ctx, *parts):
    """Concat of int lists and 1-D int64 tensors (a target shape)."""
    return ctx.op("Concat", *[ctx.g.int64s(p) if isinstance(p, list) else p
                              for p in parts], axis=0)


def _stack(ctx, tensors, axis):
    return ctx.op("Concat", *[ctx.g.unsqueeze(t, [axis]) for t in tensors],
                  axis=axis)


def geometry(ctx):
    """The node's :data:`Geometry`, or ``ctx.fail`` if not supported."""
    x, w = ctx.inputs[:2]
    rank = ctx.rank(x, "DeformConv")
    if rank != 4:
        ctx.fail(f"X of rank {rank}: only the 2-D DeformConv (X of rank 4, "
                 "the one onnxruntime implements) is supported")
    w_shape = ctx.shape(w)
    kernel = list(ctx.attr("kernel_shape") or
                  (w_shape[2:] if w_shape and len(w_shape) == 4 else []))
    if len(kernel) != 2 or not all(isinstance(k, int) for k in kernel):
        ctx.fail("kernel_shape: absent, and the spatial dims of W are not "
                 "static")
    return Geometry(kernel, list(ctx.attr("strides") or [1, 1]),
                    list(ctx.attr("dilations") or [1, 1]),
                    list(ctx.attr("pads") or [0, 0, 0, 0]),
                    int(ctx.attr("group", 1)),
                    int(ctx.attr("offset_group", 1)))


def _positions(ctx, geo, offset):
    """``(p_h, p_w)``, each of shape (N, G, K, oH, oW)."""
    kh, kw = geo.kernel
    taps = np.stack(np.meshgrid(np.arange(kh), np.arange(kw), indexing="ij"))
    out = _dims(ctx, offset, 2, 4)
    off = ctx.op("Reshape", offset, _shape(
        ctx, [0, geo.offset_group, kh * kw, 2], out))
    result = []
    for axis in (0, 1):
        # a d + (output index) s - pad_begin, broadcast over (K, oH, oW)
        tap = taps[axis].reshape(-1, 1, 1) * geo.dilations[axis]
        size = ctx.g.squeeze(_dims(ctx, offset, 2 + axis, 3 + axis), [0])
        grid = ctx.g.cast(ctx.op("Range", ctx.const(0, _I64), size,
                                 ctx.const(1, _I64)), ctx.dtype)
        grid = ctx.op("Mul", grid, ctx.const(float(geo.strides[axis])))
        if axis == 0:
            grid = ctx.g.unsqueeze(grid, [1])
        base = ctx.op("Add", ctx.const(tap - geo.pads[axis]), grid)
        along = ctx.op("Gather", off, ctx.const(axis, _I64), axis=3)
        result.append(ctx.op("Add", along, base))
    return result


def _neighbours(ctx, p, size):
    """Rows (or columns) of the two neighbours of ``p`` in the image padded
    by one pixel, clamped to that border, and ``(1 - l, l)``."""
    low = ctx.op("Floor", p)
    frac = ctx.op("Sub", p, low)
    first = ctx.op("Add", ctx.g.cast(low, _I64), ctx.const(1, _I64))
    last = ctx.op("Add", size, ctx.g.int64s([1]))  # index of the far border
    rows = [ctx.op("Min", ctx.op("Max", r, ctx.const(0, _I64)), last)
            for r in (first, ctx.op("Add", first, ctx.const(1, _I64)))]
    return rows, (ctx.op("Sub", ctx.const(1.0), frac), frac)


def _weights(ctx, h, w):
    """Bilinear weights (N, G, 4, K, oH, oW) of the corners (0, 0), (0, 1),
    (1, 0), (1, 1) from ``h = (1 - l_h, l_h)``, ``w = (1 - l_w, l_w)``, and
    their slopes (N, G, 4, K, 2, oH, oW) along p_h and p_w."""
    (gh, fh), (gw, fw) = h, w
    weights = _stack(ctx, [ctx.op("Mul", a, b) for a in h for b in w], 2)
    neg = {v: ctx.op("Neg", v) for v in (gh, fh, gw, fw)}
    along_h = _stack(ctx, [neg[gw], neg[fw], gw, fw], 2)
    along_w = _stack(ctx, [neg[gh], gh, neg[fh], fh], 2)
    return weights, _stack(ctx, [along_h, along_w], 4)


def _gather(ctx, geo, corners):
    """``(index, x_flat, x_padded, values)`` of :data:`Sampling` from the
    flat corner indices (N, G, 4, K, oH, oW) into the padded image."""
    x, offset = ctx.inputs[0], ctx.inputs[2]
    per_group = ctx.op("Div", _dims(ctx, x, 1, 2),
                       ctx.g.int64s([geo.offset_group]))
    index = ctx.op("Expand", ctx.op("Reshape", corners, ctx.g.int64s(
        [0, geo.offset_group, 1, -1])), _shape(
        ctx, _dims(ctx, corners, 0, 2), per_group, [1]))
    index = ctx.op("Reshape", index, _shape(ctx, _dims(ctx, x, 0, 2), [-1]))
    padded = ctx.op("Pad", x, ctx.g.int64s([0, 0, 1, 1, 0, 0, 1, 1]))
    x_flat = ctx.op("Reshape", padded, _shape(ctx, _dims(ctx, x, 0, 2), [-1]))
    values = ctx.op("Reshape", ctx.op("GatherElements", x_flat, index, axis=2),
                    _shape(ctx, [0, geo.offset_group, -1, 4, _taps(geo)],
                           _dims(ctx, offset, 2, 4)))
    return index, x_flat, padded, values


def sample(ctx, geo):
    """Emit the bilinear sampling of the node (see :data:`Sampling`)."""
    x = ctx.inputs[0]
    p_h, p_w = _positions(ctx, geo, ctx.inputs[2])
    rows, h = _neighbours(ctx, p_h, _dims(ctx, x, 2, 3))
    cols, w = _neighbours(ctx, p_w, _dims(ctx, x, 3, 4))
    width = ctx.op("Add", _dims(ctx, x, 3, 4), ctx.g.int64s([2]))
    corners = _stack(ctx, [ctx.op("Add", ctx.op("Mul", r, width), c)
                           for r in rows for c in cols], 2)
    weights, slopes = _weights(ctx, h, w)
    index, x_flat, padded, values = _gather(ctx, geo, corners)
    samples = ctx.g.reduce_sum(ctx.op("Mul", values, ctx.g.unsqueeze(
        weights, [2])), [3], keepdims=0)
    return Sampling(index, x_flat, padded, values, weights, slopes, samples)


def _taps(geo):
    return geo.kernel[0] * geo.kernel[1]


def _mask(ctx, geo):
    """The mask as (N, G, 1, K, oH, oW), or None when absent."""
    mask = ctx.input(4)
    if mask is None:
        return None
    return ctx.op("Reshape", mask, _shape(
        ctx, [0, geo.offset_group, 1, _taps(geo)],
        _dims(ctx, ctx.inputs[2], 2, 4)))


def _columns(ctx, geo, s, mask):
    """W as (group, M/group, C/group K) and the columns ``S * mask`` as
    (N, group, C/group K, oH oW)."""
    cols = s.samples if mask is None else ctx.op("Mul", s.samples, mask)
    w = ctx.op("Reshape", ctx.inputs[1], ctx.g.int64s([0, -1]))
    w = ctx.op("Reshape", w, _shape(ctx, [geo.group, -1], _dims(ctx, w, 1, 2)))
    return w, ctx.op("Reshape", cols, _per_group(ctx, geo))


def _per_group(ctx, geo):
    """Target shape (N, group, -1, oH oW)."""
    area = ctx.op("ReduceProd", _dims(ctx, ctx.inputs[2], 2, 4), keepdims=1)
    return _shape(ctx, [0, geo.group, -1], area)


def expand(ctx):
    """Emit DeformConv of the node of ``ctx`` computed by standard ops.

    Parameters
    ----------
    ctx : VJPContext
        Context of a DeformConv node.

    Returns
    -------
    str
        Name of Y (N, M, oH, oW), computed from the node's inputs as the
        rule's adjoint reads them (the tests compare it with onnxruntime).
    """
    geo = geometry(ctx)
    w, c = _columns(ctx, geo, sample(ctx, geo), _mask(ctx, geo))
    y = ctx.op("Reshape", ctx.op("MatMul", w, c), _shape(
        ctx, [0, -1], _dims(ctx, ctx.inputs[2], 2, 4)))
    if ctx.input(3) is not None:
        y = ctx.op("Add", y, ctx.op("Reshape", ctx.inputs[3],
                                    ctx.g.int64s([-1, 1, 1])))
    return y


def _image_grad(ctx, s, d_samples):
    """dX: ``dS`` times the corner weights, scatter-added at the corners of
    the padded image, border dropped."""
    updates = ctx.op("Mul", ctx.g.unsqueeze(d_samples, [3]),
                     ctx.g.unsqueeze(s.weights, [2]))
    updates = ctx.op("Reshape", updates, ctx.g.shape_of(s.index))
    zeros = ctx.op("Expand", ctx.const(0.0), ctx.g.shape_of(s.x_flat))
    flat = ctx.g.scatter_add("ScatterElements", zeros, s.index, updates,
                             ctx.dtype, axis=2)
    padded = ctx.g.reshape_like(flat, s.x_padded)
    return ctx.op("Slice", padded, ctx.g.int64s([1, 1]),
                  ctx.g.int64s([-1, -1]), ctx.g.int64s([2, 3]))


def _offset_grad(ctx, s, d_samples):
    """doffset: ``dS X[corner]`` summed over the channels of the offset
    group, times the weights' slopes summed over the corners."""
    per_corner = ctx.g.reduce_sum(ctx.op("Mul", ctx.g.unsqueeze(
        d_samples, [3]), s.values), [2], keepdims=0)  # (N, G, 4, K, oH, oW)
    grad = ctx.g.reduce_sum(ctx.op("Mul", ctx.g.unsqueeze(per_corner, [4]),
                                   s.slopes), [2], keepdims=0)
    return ctx.g.reshape_like(grad, ctx.inputs[2])


def _sampled_grads(ctx, geo, gy, need, grads):
    """Fill ``grads`` of X, W, offset and mask (those in ``need``)."""
    s, mask = sample(ctx, geo), _mask(ctx, geo)
    w, cols = _columns(ctx, geo, s, mask)
    dy = ctx.op("Reshape", gy, _per_group(ctx, geo))
    if need[1]:
        dw = ctx.op("MatMul", dy, ctx.op("Transpose", cols, perm=[0, 1, 3, 2]))
        grads[1] = ctx.g.reshape_like(ctx.g.reduce_sum(dw, [0], keepdims=0),
                                      ctx.inputs[1])
    d_cols = ctx.op("Reshape", ctx.op("MatMul", ctx.op(
        "Transpose", w, perm=[0, 2, 1]), dy), ctx.g.shape_of(s.samples))
    if need[4]:
        grads[4] = ctx.g.reshape_like(ctx.g.reduce_sum(ctx.op(
            "Mul", d_cols, s.samples), [2], keepdims=0), ctx.inputs[4])
    d_samples = d_cols if mask is None else ctx.op("Mul", d_cols, mask)
    if need[0]:
        grads[0] = _image_grad(ctx, s, d_samples)
    if need[2]:
        grads[2] = _offset_grad(ctx, s, d_samples)


@register_vjp("DeformConv")
def _deform_conv(ctx, gy):
    # the adjoint of each step of the forward (module docstring)
    geo = geometry(ctx)
    need = ctx.needs_grad + [False] * (5 - len(ctx.needs_grad))
    grads = [None] * 5
    if need[3]:
        grads[3] = ctx.g.reduce_sum(gy, [0, 2, 3], keepdims=0)
    if any(need[i] for i in (0, 1, 2, 4)):
        _sampled_grads(ctx, geo, gy, need, grads)
    return tuple(grads[:len(ctx.inputs)])
