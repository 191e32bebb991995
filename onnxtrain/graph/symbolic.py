"""Dims onnx shape inference leaves unknown, found by symbolic arithmetic.

:func:`onnx.shape_inference.infer_shapes` gives a fresh symbol
(``unk__7``) to the dim a Reshape computes from ``-1`` whenever the input
has a symbolic dim, even when the symbolic factors cancel: a transformer's
``x.view(batch, seq, -1, head_size)`` of an input ``(batch, seq, hidden)``
has ``hidden / head_size`` heads, a static number. Every value downstream
inherits the unknown dim, and each broadcast over it costs the reverse pass
a run-time reduction (the reverse pass's ``sum_to``: 10 nodes; four per
attention layer, 960 in a 24-layer encoder).

:func:`refine_symbolic_dims` walks the nodes once, in order, keeping:

- the contents of small integer tensors that hold shapes (``Shape``,
  ``Gather``, ``Unsqueeze``, ``Squeeze``, ``Concat``, ``Cast``, constants),
  as dims, and the integer ``Add``, ``Sub``, ``Mul`` and ``Div`` of their
  static dims (an exporter's ``H // window``);
- for each ``Reshape`` whose target is known, the dims it produces: ``0``
  copies the input's dim, ``-1`` is the input's size divided by the other
  target dims, computed as a product of an integer and symbols, which
  cancel (``N * 64 * 128 / (N * 64 * 64) = 2``);
- for broadcasting ops and MatMul, the output dims numpy's broadcasting
  gives when the inputs' dims say (a dim broadcast against 1s, or equal
  symbols).

A symbol of onnx's (``unk__*``) found to equal a dim is replaced by it in
every value's shape. Only equalities that hold for every input of the
model are used, so the shapes stay exact.
"""
from __future__ import annotations

import collections

from onnx import numpy_helper

from .builder import constant_node_value

__all__ = ["refine_symbolic_dims", "broadcast_dims", "broadcast_shapes"]

#: Ops whose output has the numpy broadcast of their inputs' shapes.
BROADCAST_OPS = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Sum", "Mean",
    "Where", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual",
    "And", "Or", "Xor", "BitShift", "PRelu"})
#: Largest integer tensor whose contents are tracked.
_MAX_TRACKED = 64


def _is_unknown(dim):
    """An unknown dim: None or a symbol onnx invented."""
    return dim is None or (isinstance(dim, str) and dim.startswith("unk__"))


def broadcast_dims(dims):
    """The numpy broadcast of one axis's ``dims`` (ints, symbols or None).

    Sizes 1 drop out; what remains must be one size: equal symbols, or one
    integer above 1 (a symbol broadcast against it is 1 or that integer).
    None when the dims do not say (two different symbols, an unknown dim
    without an integer beside it).
    """
    rest = [d for d in dims if d != 1]
    if not rest:
        return 1
    ints = {d for d in rest if isinstance(d, int)}
    if len(ints) > 1:
        return None
    if ints:
        return ints.pop()
    return rest[0] if all(d == rest[0] for d in rest) and rest[0] is not None \
        else None


def broadcast_shapes(shapes):
    """The numpy broadcast of ``shapes`` (tuples of dims: int, symbol or
    None), each output dim by :func:`broadcast_dims`."""
    rank = max(len(s) for s in shapes)
    padded = [(1,) * (rank - len(s)) + tuple(s) for s in shapes]
    return tuple(broadcast_dims(axis) for axis in zip(*padded))


class _Refiner:
    """One forward walk over a graph's nodes (see the module docstring)."""

    def __init__(self, graph, types):
        self.types = types
        self.subst = {}
        self.values = {}  # name -> (rank-0?, tuple of dims)
        for init in graph.initializer:
            self._track_tensor(init.name, init)

    # dims ------------------------------------------------------------
    def resolve(self, dim):
        while isinstance(dim, str) and dim in self.subst:
            dim = self.subst[dim]
        return dim

    def shape(self, name):
        info = self.types.get(name)
        if info is None or info[1] is None:
            return None
        return tuple(self.resolve(d) for d in info[1])

    def _learn(self, name, derived):
        """Record that value ``name`` has shape ``derived`` where its own
        shape has unknown dims."""
        current = self.shape(name)
        if current is None or derived is None or len(current) != len(derived):
            return
        for old, new in zip(current, derived):
            # a symbol of onnx's equals a known dim, or another symbol
            if isinstance(old, str) and old.startswith("unk__") and new is not None \
                    and new != old:
                self.subst[old] = new
        if any(d is None for d in current):
            elem = self.types[name][0]
            self.types[name] = (elem, tuple(
                n if o is None and not _is_unknown(n) else o
                for o, n in zip(current, derived)))

    # contents of shape tensors ---------------------------------------------
    def _track_tensor(self, name, tensor):
        if tensor.data_type not in (6, 7) or len(tensor.dims) > 1:  # int32, int64
            return
        self._track_array(name, numpy_helper.to_array(tensor))

    def _track_array(self, name, array):
        """Track an integer scalar or vector of at most :data:`_MAX_TRACKED`
        values."""
        if array.dtype.kind in "iu" and array.ndim <= 1 and array.size <= _MAX_TRACKED:
            self.values[name] = (array.ndim == 0,
                                 tuple(int(v) for v in array.reshape(-1)))

    def _value(self, name):
        value = self.values.get(name)
        if value is None:
            return None
        return value[0], tuple(self.resolve(d) for d in value[1])

    def _ints(self, name):
        value = self._value(name)
        if value is None or not all(isinstance(d, int) for d in value[1]):
            return None
        return list(value[1])

    # nodes -----------------------------------------------------------------
    def visit(self, node):
        if node.domain not in ("", "ai.onnx"):
            return
        method = getattr(self, f"_op_{node.op_type}", None)
        if method is not None:
            method(node)
        elif node.op_type in BROADCAST_OPS:
            shapes = [self.shape(i) for i in node.input if i]
            if shapes and all(s is not None for s in shapes):
                self._learn(node.output[0], broadcast_shapes(shapes))

    def _op_Constant(self, node):
        # a tensor ``value`` (its type read before its values: most of an
        # export's Constants are float) or ``value_int(s)`` (shapes
        # written as ints)
        for att in node.attribute:
            if att.name == "value":
                self._track_tensor(node.output[0], att.t)
            elif att.name in ("value_int", "value_ints"):
                self._track_array(node.output[0], constant_node_value(node))

    def _op_Shape(self, node):
        shape = self.shape(node.input[0])
        if shape is None:
            return
        attrs = {a.name: a.i for a in node.attribute}
        rank = len(shape)
        start, end = attrs.get("start", 0), attrs.get("end", rank)
        start, end = (min(max(v + rank if v < 0 else v, 0), rank)
                      for v in (start, end))
        self.values[node.output[0]] = (False, shape[start:end])

    def _op_Gather(self, node):
        data, idx = self._value(node.input[0]), self._value(node.input[1])
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        if data is None or idx is None or data[0] or axis != 0 or \
                not all(isinstance(i, int) for i in idx[1]):
            return
        n = len(data[1])
        if not all(-n <= i < n for i in idx[1]):
            return
        self.values[node.output[0]] = (idx[0], tuple(data[1][i] for i in idx[1]))

    def _op_Unsqueeze(self, node):
        value = self._value(node.input[0])
        if value is not None and value[0]:  # a scalar becomes a 1-D tensor
            self.values[node.output[0]] = (False, value[1])

    def _op_Squeeze(self, node):
        value = self._value(node.input[0])
        if value is not None and not value[0] and len(value[1]) == 1:
            self.values[node.output[0]] = (True, value[1])

    def _op_Concat(self, node):
        parts = [self._value(i) for i in node.input]
        if all(p is not None and not p[0] for p in parts):
            self.values[node.output[0]] = (False, sum((p[1] for p in parts), ()))

    def _op_Identity(self, node):
        if node.input[0] in self.values:
            self.values[node.output[0]] = self.values[node.input[0]]

    def _op_Cast(self, node):
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        if to in (6, 7):
            self._op_Identity(node)

    def _arithmetic(self, node, apply):
        """A broadcasting op's shape, and its values where both inputs are
        tracked integers: ``apply`` on static dims, None elsewhere."""
        shapes = [self.shape(i) for i in node.input if i]
        if shapes and all(sh is not None for sh in shapes):
            self._learn(node.output[0], broadcast_shapes(shapes))
        if len(node.input) != 2:
            return
        a, b = self._value(node.input[0]), self._value(node.input[1])
        if a is None or b is None:
            return
        (a_scalar, a), (b_scalar, b) = a, b
        if len(a) != len(b) and 1 not in (len(a), len(b)):
            return
        n = max(len(a), len(b))
        a, b = (a * n if len(a) == 1 else a), (b * n if len(b) == 1 else b)
        self.values[node.output[0]] = (a_scalar and b_scalar, tuple(
            apply(x, y) if isinstance(x, int) and isinstance(y, int) else None
            for x, y in zip(a, b)))

    def _op_Add(self, node):
        self._arithmetic(node, lambda x, y: x + y)

    def _op_Sub(self, node):
        self._arithmetic(node, lambda x, y: x - y)

    def _op_Mul(self, node):
        self._arithmetic(node, lambda x, y: x * y)

    def _op_Div(self, node):
        # onnx's integer Div truncates: the floor for dims (non-negative)
        self._arithmetic(node, lambda x, y: x // y if x >= 0 and y > 0 else None)

    def _op_MatMul(self, node):
        a, b = self.shape(node.input[0]), self.shape(node.input[1])
        if a is None or b is None or len(a) < 2 or len(b) < 2:
            return
        batch = broadcast_shapes([a[:-2], b[:-2]]) if len(a) > 2 or len(b) > 2 else ()
        self._learn(node.output[0], batch + (a[-2], b[-1]))

    def _op_Reshape(self, node):
        x, target = self.shape(node.input[0]), self._value(node.input[1])
        if x is None or target is None or target[0]:
            return
        allowzero = next((a.i for a in node.attribute if a.name == "allowzero"), 0)
        dims = [x[i] if d == 0 and not allowzero and i < len(x) else d
                for i, d in enumerate(target[1])]
        if dims.count(-1) == 1:
            dims[dims.index(-1)] = _quotient(x, [d for d in dims if d != -1])
        if all(d is None or isinstance(d, str) or d >= 0 for d in dims):
            self._learn(node.output[0], tuple(dims))


def _factors(dims):
    """(integer, Counter of symbols) of a product of dims; None when a dim
    is unknown."""
    coef, symbols = 1, collections.Counter()
    for d in dims:
        if d is None:
            return None
        if isinstance(d, str):
            symbols[d] += 1
        else:
            coef *= int(d)
    return coef, symbols


def _quotient(numerator, denominator):
    """prod(numerator) / prod(denominator) as a dim (an int, or one symbol
    left after cancelling), None when it is neither."""
    top, bottom = _factors(numerator), _factors(denominator)
    if top is None or bottom is None or bottom[0] == 0 or top[0] % bottom[0]:
        return None
    left = top[1] - bottom[1]
    if bottom[1] - top[1]:  # a symbol of the divisor that does not cancel
        return None
    coef = top[0] // bottom[0]
    symbols = list(left.elements())
    if not symbols:
        return coef
    return symbols[0] if len(symbols) == 1 and coef == 1 else None


def refine_symbolic_dims(graph, types):
    """``types`` with the dims onnx left unknown that arithmetic on the
    graph determines (see the module docstring).

    Parameters
    ----------
    graph : onnx.GraphProto
        The graph ``types`` describes (nodes in topological order).
    types : dict
        ``name -> (elem_type, shape)`` as
        :func:`~onnxtrain.graph.infer_value_types` builds it (not modified).

    Returns
    -------
    dict
        A new mapping; the same shapes where nothing was found.
    """
    refiner = _Refiner(graph, dict(types))
    for node in graph.node:
        refiner.visit(node)
    if not refiner.subst:
        return refiner.types
    return {name: (elem, None if shape is None else
                   tuple(refiner.resolve(d) for d in shape))
            for name, (elem, shape) in refiner.types.items()}
