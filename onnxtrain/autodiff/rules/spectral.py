"""VJP rules of the spectral ops DFT and STFT.

Both ops are linear in their float input, so their VJP is the adjoint
(conjugate transpose) of the transform, for the real inner product
``<a, b> = sum(a * b)`` of the (real, imaginary) pairs the ops exchange.
For a complex-linear map ``y = A x``, ``Re(conj(g) . A x) = Re(conj(A^H g) . x)``,
so the gradient of ``x`` is ``A^H g`` (and its real part when ``x`` is real).
With ``F[k, t] = exp(-2i pi k t / n)`` (the DFT matrix, symmetric),
``F^H = conj(F) = n * IDFT`` and ``(conj(F) / n)^H = F / n``: the adjoint of
a DFT is ``n`` times an inverse DFT, that of an inverse DFT is a DFT divided
by ``n`` (see e.g. Strang, *Introduction to Linear Algebra*, 5th ed., 9.3).
"""
from onnx import TensorProto

from ..registry import register_vjp

_I64 = TensorProto.INT64


def _dft_node(ctx, x, length, inverse, onesided, axis):
    """``DFT(x, length)`` along ``axis``: an int attribute before opset 20,
    an int64 input name (None: the default -2) from opset 20 on."""
    if ctx.opset >= 20:
        return ctx.op("DFT", x, length, axis, inverse=int(inverse),
                      onesided=int(onesided))
    return ctx.op("DFT", x, length, axis=int(axis), inverse=int(inverse),
                  onesided=int(onesided))


def _dim(ctx, x, index):
    """Shape(x)[index] as an int64 tensor of shape (1,) (index: a name)."""
    return ctx.op("Gather", ctx.g.shape_of(x), index)


def _scalar(ctx, x):
    """A tensor of shape (1,) as a scalar."""
    return ctx.op("Reshape", x, ctx.g.int64s([]))


def _as_1d_int64(ctx, name):
    return ctx.op("Reshape", ctx.g.cast(name, _I64), ctx.g.int64s([1]))


def _dft_axis(ctx, rank):
    """``(axis for the gradient DFT node, axis as an int64 (1,) tensor,
    static non-negative axis or None when it is only known at run time)``."""
    if ctx.opset < 20:
        axis = int(ctx.attr("axis", 1))
        axis = axis + rank if axis < 0 else axis
        return axis, ctx.g.int64s([axis]), axis
    name = ctx.input(2)
    if name is None:
        return None, ctx.g.int64s([rank - 2]), rank - 2
    value = ctx.constant_value(name)
    static = None
    if value is not None:
        static = int(value.reshape(-1)[0])
        static = static + rank if static < 0 else static
    return name, _as_1d_int64(ctx, name), static


def _along_axis(ctx, vector, axis_1d, static_axis, rank):
    """Reshape a 1-D tensor so that it broadcasts along ``axis`` of a
    tensor of ``rank``."""
    if static_axis is not None:
        shape = [1] * rank
        shape[static_axis] = -1
        return ctx.op("Reshape", vector, ctx.g.int64s(shape))
    axis = ctx.op("Where", ctx.op("Less", axis_1d, ctx.g.int64s([0])),
                  ctx.op("Add", axis_1d, ctx.g.int64s([rank])), axis_1d)
    positions = ctx.g.int64s(list(range(rank)))
    shape = ctx.op("Where", ctx.op("Equal", positions, axis),
                   ctx.g.int64s([-1]), ctx.g.int64s([1]))
    return ctx.op("Reshape", vector, shape)


def _pad_end(ctx, x, amount, axis_1d, static_axis, rank):
    """Append ``amount`` (int64, shape (1,)) zeros along ``axis``."""
    if ctx.opset >= 18:
        pads = ctx.op("Concat", ctx.g.int64s([0]), amount, axis=0)
        return ctx.op("Pad", x, pads, None, axis_1d)
    pads = ctx.op("Concat", ctx.g.int64s([0] * (rank + static_axis)), amount,
                  ctx.g.int64s([0] * (rank - static_axis - 1)), axis=0)
    return ctx.op("Pad", x, pads)


def _fit_to_input(ctx, gx, x, n, axis_1d, static_axis, rank):
    """Adjoint of DFT's input handling: the signal of length L along
    ``axis`` was cut or zero-padded to ``n`` (dft_length) and a real signal
    (last dim 1) read as complex. The gradient of length ``n`` is cut back
    to L (or zero-padded to it) and to the last dim of ``x``."""
    axes = ctx.op("Concat", axis_1d, ctx.g.int64s([-1]), axis=0)
    ends = ctx.op("Gather", ctx.g.shape_of(x), axes)
    gx = ctx.op("Slice", gx, ctx.g.int64s([0, 0]), ends, axes)
    if ctx.input(1) is None:
        return gx
    length = _dim(ctx, x, axis_1d)
    missing = ctx.op("Max", ctx.op("Sub", length, n), ctx.g.int64s([0]))
    return _pad_end(ctx, gx, missing, axis_1d, static_axis, rank)


def _irfft_length_check(ctx, x, static_axis):
    """onnxruntime's inverse one-sided DFT agrees with numpy.fft.irfft only
    for its default length 2 (m - 1) or for n with n // 2 + 1 == m bins."""
    if ctx.input(1) is None:
        return
    n = ctx.constant_value(ctx.input(1))
    shape = ctx.shape(x)
    m = None if static_axis is None or shape is None else shape[static_axis]
    if n is None or not isinstance(m, int) or int(n) // 2 + 1 != m:
        ctx.fail("inverse=1 and onesided=1 with a dft_length other than a "
                 "constant n giving n // 2 + 1 == the number of input bins "
                 "(onnxruntime's inverse one-sided DFT is only consistent "
                 "with numpy.fft.irfft there)")


def _irfft_vjp(ctx, gy, x, axis, axis_1d, static_axis, rank):
    # y[t] = 1/n sum_k w_k Re(X_k exp(2i pi k t / n)), k < m = n // 2 + 1,
    # w_k = 2 except w_0 = 1 and, for an even n, w_{n/2} = 1 (numpy's irfft;
    # Im X_0 and Im X_{n/2} drop out). Hence dRe X_k = w_k/n sum_t g_t cos,
    # dIm X_k = -w_k/n sum_t g_t sin: dX = (w / n) * rfft(g).
    _irfft_length_check(ctx, x, static_axis)
    n = _dim(ctx, gy, axis_1d)
    spectrum = _dft_node(ctx, gy, None, 0, 1, axis)
    k = ctx.op("Range", ctx.const(0, _I64), _scalar(ctx, _dim(ctx, x, axis_1d)),
               ctx.const(1, _I64))
    single = ctx.op("Or", ctx.op("Equal", k, ctx.g.int64s([0])),
                    ctx.op("Equal", ctx.op("Mul", k, ctx.g.int64s([2])), n))
    weight = ctx.op("Div", ctx.op("Sub", ctx.const([2.0]),
                                  ctx.g.cast(single, ctx.dtype)),
                    ctx.g.cast(n, ctx.dtype))
    return ctx.op("Mul", spectrum, _along_axis(ctx, weight, axis_1d,
                                               static_axis, rank))


@register_vjp("DFT")
def _dft(ctx, gy):
    r"""VJP of DFT (opsets 17 and 20): ``y = F_n pad_n(x)`` (DFT),
    ``conj(F_n) pad_n(x) / n`` (inverse), cut to ``n // 2 + 1`` bins when
    onesided; ``x`` real (last dim 1) or complex (last dim 2).

    The gradient is the adjoint (module docstring): ``n IDFT_n(g)`` for a
    DFT, the bins a one-sided DFT dropped being zero-padded by the
    gradient DFT's own ``dft_length``; ``DFT_n(g) / n`` for an inverse DFT;
    then cut or padded back to the input's length and to its real part if
    it is real. An inverse one-sided DFT (``numpy.fft.irfft``) has its own
    adjoint, see :func:`_irfft_vjp`. dft_length and axis are integer inputs
    without gradient.

    Raises
    ------
    NotImplementedError
        For an inverse one-sided DFT with a dft_length that is not a
        constant n with ``n // 2 + 1`` equal to the static number of input
        bins (onnxruntime 1.32 departs from numpy.fft.irfft for other n).
    ValueError
        If the rank of the input is unknown.
    """
    x = ctx.inputs[0]
    rank = ctx.rank(x, "DFT")
    inverse, onesided = int(ctx.attr("inverse", 0)), int(ctx.attr("onesided", 0))
    axis, axis_1d, static_axis = _dft_axis(ctx, rank)
    if inverse and onesided:
        gx = _irfft_vjp(ctx, gy, x, axis, axis_1d, static_axis, rank)
        return (gx,) + (None,) * (len(ctx.inputs) - 1)
    length = ctx.input(1)
    if length is not None:
        n = _as_1d_int64(ctx, length)
    elif onesided:
        n = _dim(ctx, x, axis_1d)
    else:
        n = _dim(ctx, gy, axis_1d)
    # a one-sided DFT kept n // 2 + 1 bins: the gradient DFT pads to n
    pad_to = (length or _scalar(ctx, n)) if onesided else None
    gx = _dft_node(ctx, gy, pad_to, 1 - inverse, 0, axis)
    scale = ctx.g.cast(n, ctx.dtype)
    gx = ctx.op("Div" if inverse else "Mul", gx, scale)
    gx = _fit_to_input(ctx, gx, x, n, axis_1d, static_axis, rank)
    return (gx,) + (None,) * (len(ctx.inputs) - 1)


def _stft_frames(ctx, gy, step, n):
    """int64 indices ``f * frame_step + t`` of shape (frames, n)."""
    frames = ctx.op("Gather", ctx.g.shape_of(gy), ctx.const(1, _I64))
    starts = ctx.op("Mul", ctx.op("Range", ctx.const(0, _I64), frames,
                                  ctx.const(1, _I64)),
                    ctx.op("Reshape", ctx.g.cast(step, _I64), ctx.g.int64s([])))
    offsets = ctx.op("Range", ctx.const(0, _I64), _scalar(ctx, n),
                     ctx.const(1, _I64))
    return ctx.op("Add", ctx.g.unsqueeze(starts, [1]),
                  ctx.g.unsqueeze(offsets, [0]))


@register_vjp("STFT")
def _stft(ctx, gy):
    r"""VJP of STFT: ``Y[b, f, k] = sum_t w[t] x[b, f s + t] e^{-2i pi k t / n}``
    for ``k`` below ``n // 2 + 1`` (onesided) or ``n``, ``n`` the frame
    length, ``s`` the frame step (ONNX STFT, opset 17).

    With ``u = n IDFT_n(g)`` per frame (the adjoint of the DFT, the dropped
    one-sided bins zero-padded), ``dx[b, f s + t] += w[t] u[b, f, t]``
    (overlap-add, a ScatterElements with reduction 'add'; the real part of
    ``u`` for a real signal) and ``dw[t] = sum_{b, f} Re(conj(u) x)[b, f, t]``.
    frame_step and frame_length are integer inputs without gradient.

    Raises
    ------
    NotImplementedError
        If the signal is not of rank 3 or the frame length is given by
        neither frame_length nor window.
    """
    signal, step = ctx.inputs[0], ctx.inputs[1]
    window, length = ctx.input(2), ctx.input(3)
    if ctx.rank(signal, "STFT") != 3:
        ctx.fail("a signal whose rank is not 3 ([batch, length, 1 or 2])")
    if length is not None:
        n = _as_1d_int64(ctx, length)
    elif window is not None:
        n = ctx.g.shape_of(window)
    else:
        ctx.fail("neither frame_length nor window gives the frame length")
    axis = ctx.const(2, _I64) if ctx.opset >= 20 else 2
    u = _dft_node(ctx, gy, _scalar(ctx, n), 1, 0, axis)
    u = ctx.op("Mul", u, ctx.g.cast(n, ctx.dtype))
    channels = ctx.op("Gather", ctx.g.shape_of(signal), ctx.g.int64s([2]))
    u = ctx.op("Slice", u, ctx.g.int64s([0]), channels,
               ctx.g.int64s([3]))  # [batch, frames, n, 1 or 2]
    index = _stft_frames(ctx, gy, step, n)
    grads = [None] * len(ctx.inputs)
    if ctx.needs_grad[0]:
        frames = u if window is None else ctx.op(
            "Mul", u, ctx.g.unsqueeze(window, [1]))
        frames = ctx.op("Reshape", frames, ctx.op(
            "Concat", ctx.g.int64s([0, -1]), channels, axis=0))
        flat = ctx.op("Expand", ctx.op("Reshape", index, ctx.g.int64s([1, -1, 1])),
                      ctx.g.shape_of(frames))
        zeros = ctx.op("Expand", ctx.const(0), ctx.g.shape_of(signal))
        grads[0] = ctx.g.scatter_add("ScatterElements", zeros, flat, frames,
                                     ctx.dtype, axis=1)
    if window is not None and ctx.needs_grad[2]:
        x = ctx.op("Gather", signal, index, axis=1)
        grads[2] = ctx.g.reduce_sum(ctx.op("Mul", u, x), [0, 1, 3], keepdims=0)
    return tuple(grads)
