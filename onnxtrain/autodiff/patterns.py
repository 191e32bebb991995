"""VJPs of node chains that exporters write for one function, given as one
formula instead of the chain rule through every node.

The exact GELU, ``y = 0.5 x (1 + erf(x / sqrt(2)))`` (Hendrycks and
Gimpel, 2016), is written by torch.onnx below opset 20 as five nodes: Div
(or Mul by 1/sqrt(2)), Erf, Add 1, Mul by x, Mul by 0.5. Their rules give
ten gradient nodes; its derivative,

    dy/dx = 0.5 (c + u (2 / sqrt(pi)) exp(-u^2)),  u = x / sqrt(2), c = 1 + erf(u),

reads u and c from the forward nodes and takes seven. The reverse pass
applies it at the chain's last node: y depends on x through the chain
alone, so the formula is the whole of y's contribution to x's gradient;
the nodes inside the chain get no gradient from y (one read elsewhere too
gets the gradient of its other readers, through its own rule).
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["erf_gelu", "erf_gelu_vjp"]

_SQRT2 = math.sqrt(2.0)
#: ln(2 / sqrt(pi)): (2 / sqrt(pi)) exp(-u^2) as one Exp of a difference
_LOG_ERF_SLOPE = math.log(2.0 / math.sqrt(math.pi))


def _constant(constants, name, value):
    """Whether ``name`` is a one-element float constant equal to ``value``
    (to float32 rounding). ``constants.scalar(name)`` gives its float when
    the mapping has that method (the reverse pass's, which then converts no
    weight to look at it)."""
    scalar = getattr(constants, "scalar", None)
    if scalar is not None:
        found = scalar(name) if name else None
    else:
        array = None if not name else constants.get(name)
        array = None if array is None else np.asarray(array)
        found = float(array.reshape(-1)[0]) if array is not None and array.size == 1 \
            and np.issubdtype(array.dtype, np.floating) else None
    return found is not None and abs(found - value) <= 1e-6 * abs(value)


def _other(node, name):
    """The input of a two-input node that is not ``name`` (None if both or
    neither are)."""
    a, b = (list(node.input) + ["", ""])[:2]
    if a == name and b != name:
        return b
    if b == name and a != name:
        return a
    return None


def _standard(node, op_type):
    return node is not None and node.op_type == op_type and \
        node.domain in ("", "ai.onnx") and len(node.input) == 2


def erf_gelu(node, producers, constants):
    """``(x, u, c)`` when ``node`` ends an exact GELU chain (see the
    module's docstring), else None. ``producers``: value name -> node;
    ``constants``: name -> numpy value."""
    if not _standard(node, "Mul"):
        return None
    for half_side in (0, 1):
        half, m = node.input[half_side], node.input[1 - half_side]
        if not _constant(constants, half, 0.5):
            continue
        times = producers.get(m)
        if not _standard(times, "Mul"):
            continue
        for x_side in (0, 1):
            x, c = times.input[x_side], times.input[1 - x_side]
            found = _chain(x, c, producers, constants)
            if found is not None:
                return x, found, c
    return None


def _chain(x, c, producers, constants):
    """u when ``c`` is ``Add(Erf(u), 1)`` and ``u`` is ``x / sqrt(2)``."""
    add = producers.get(c)
    if not _standard(add, "Add"):
        return None
    for e in add.input:
        erf = producers.get(e)
        one = _other(add, e)
        if erf is None or erf.op_type != "Erf" or erf.domain not in ("", "ai.onnx") \
                or one is None or not _constant(constants, one, 1.0):
            continue
        u = erf.input[0]
        scale = producers.get(u)
        if _standard(scale, "Div") and scale.input[0] == x and \
                _constant(constants, scale.input[1], _SQRT2):
            return u
        if _standard(scale, "Mul") and _other(scale, x) is not None and \
                _constant(constants, _other(scale, x), 1 / _SQRT2):
            return u
    return None


def erf_gelu_vjp(g, gy, u, c, elem_type):
    """Gradient with respect to x of the GELU chain, ``gy`` its output's:
    ``(gy 0.5) (c + u exp(ln(2 / sqrt(pi)) - u^2))``."""
    slope = g.op("Exp", g.op("Sub", g.const(_LOG_ERF_SLOPE, elem_type),
                             g.op("Mul", u, u)))
    total = g.op("Add", c, g.op("Mul", u, slope))
    return g.op("Mul", g.op("Mul", gy, g.const(0.5, elem_type)), total)
