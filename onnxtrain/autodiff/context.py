"""What a VJP rule sees of the node it differentiates, and ``sum_to``."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from ..graph import FLOAT_TYPES

__all__ = ["VJPContext", "sum_to"]


def _same_dim(a, b):
    return a is not None and a == b


def sum_to(g, grad, grad_shape, target):
    """Reduce a broadcast gradient to the shape of ``target``.

    This is the one place where broadcasting is undone (numpy semantics,
    https://numpy.org/doc/stable/user/basics.broadcasting.html): leading
    axes that ``target`` lacks are summed away, then every axis where
    ``target`` has size 1 and the gradient does not is summed with
    ``keepdims=1``. Axes whose sizes are symbolic are resolved at run time
    (ReduceSum with an axes input computed from the two shapes, opset >= 13).

    Parameters
    ----------
    g : GraphBuilder
        Builder receiving the nodes.
    grad : str
        Name of the gradient, of shape ``grad_shape``.
    grad_shape : tuple of dims or None
        Shape of ``grad`` (ints, symbolic names or None).
    target : str
        Value whose shape the result takes.

    Returns
    -------
    str
        Name of the reduced gradient (``grad`` itself when nothing to do).

    Raises
    ------
    ValueError
        If a rank is unknown, or symbolic dimensions need a run-time
        reduction in a model whose opset is below 13.
    """
    to_shape = g.shape(target)
    if grad_shape is None or to_shape is None:
        raise ValueError(
            f"sum_to: the rank of {grad!r} or of {target!r} is unknown; "
            "run onnx shape inference or give the model input shapes.")
    lead = len(grad_shape) - len(to_shape)
    if lead < 0:
        raise ValueError(f"sum_to: gradient {grad!r} of shape {grad_shape} has "
                         f"a lower rank than {target!r} of shape {to_shape}.")
    if lead:
        grad = g.reduce_sum(grad, list(range(lead)), keepdims=0)
    static_axes, runtime_axes = [], []
    for axis, (f, t) in enumerate(zip(grad_shape[lead:], to_shape)):
        if _same_dim(f, t) or (isinstance(t, int) and t != 1):
            continue
        if t == 1:
            static_axes.append(axis)
        else:
            runtime_axes.append(axis)
    if (static_axes == [0] and len(to_shape) == 2 and target in g.types
            and g.opset >= 9):  # ConstantOfShape is born at opset 9
        grad = _sum_rows(g, grad, g.elem_type(target))
    elif static_axes:
        grad = g.reduce_sum(grad, static_axes, keepdims=1)
    if runtime_axes:
        grad = _sum_to_runtime_axes(g, grad, target, runtime_axes)
    return grad


def _sum_rows(g, grad, elem_type):
    """Column sums of a 2-D gradient, shape (1, n), as ones(1, rows) @ grad.

    This is what a bias added to every row receives; onnxruntime runs the
    MatMul faster than ReduceSum over axis 0."""
    if g.opset >= 15:  # Shape's start/end: one kernel fewer than Gather
        rows = g.op("Shape", grad, start=0, end=1)
    else:
        rows = g.op("Gather", g.shape_of(grad), g.int64s([0]))
    one = helper.make_tensor("value", elem_type, [1], [1])
    ones = g.op("ConstantOfShape", rows, value=one)
    return g.op("MatMul", g.unsqueeze(ones, [0]), grad)


def _sum_to_runtime_axes(g, grad, target, axes):
    """ReduceSum over the axes among ``axes`` where target has size 1."""
    if g.opset < 13:
        raise ValueError(
            f"sum_to: {target!r} has symbolic dimensions {axes} that may "
            "broadcast; reducing them at run time needs opset >= 13 "
            f"(model opset {g.opset}). Give static shapes or upgrade the opset.")
    idx = g.int64s(axes)
    target_dims = g.op("Gather", g.shape_of(target), idx)
    grad_dims = g.op("Gather", g.shape_of(grad), idx)
    one = g.int64s([1])
    mask = g.op("And", g.op("Equal", target_dims, one),
                g.op("Not", g.op("Equal", grad_dims, one)))
    dynamic_axes = g.op("Compress", idx, mask, axis=0)
    return g.op("ReduceSum", grad, dynamic_axes, keepdims=1,
                noop_with_empty_axes=1)


class VJPContext:
    """The node a rule differentiates, with helpers bound to its builder.

    Attributes
    ----------
    node : onnx.NodeProto
    g : GraphBuilder
        Builder receiving the gradient nodes (``g.op(...)``).
    inputs, outputs : list of str
        Names of the node's inputs and outputs ('' for omitted optionals).
    needs_grad : list of bool
        Whether a gradient is needed for each input.
    implicit_inputs : list of str
        Outer-scope values the node's subgraphs read (control flow), sorted;
        a rule returns their gradients after those of ``inputs``.
    implicit_needs_grad : list of bool
        Whether a gradient is needed for each implicit input.
    opset : int
        Default-domain opset of the model.
    dtype : int
        ONNX element type of the node's first float output (constants a
        rule creates with :meth:`const` take this type).
    """

    def __init__(self, node, g, needs_grad, constants, implicit_inputs=(),
                 implicit_needs_grad=()):
        self.node = node
        self.g = g
        self.inputs = list(node.input)
        self.outputs = list(node.output)
        self.needs_grad = list(needs_grad) + [False] * (
            len(node.input) - len(needs_grad))
        self.implicit_inputs = list(implicit_inputs)
        self.implicit_needs_grad = list(implicit_needs_grad) + [False] * (
            len(self.implicit_inputs) - len(implicit_needs_grad))
        self.opset = g.opset
        self.attributes = {a.name: helper.get_attribute_value(a)
                           for a in node.attribute}
        self._constants = constants
        self.dtype = self._float_type()

    def _float_type(self):
        for name in list(self.node.output) + list(self.node.input):
            info = self.g.types.get(name)
            if info is not None and info[0] in FLOAT_TYPES:
                return info[0]
        return TensorProto.FLOAT

    # attributes and inputs --------------------------------------------------
    def attr(self, name, default=None):
        """Attribute value (ints, floats, strings decoded) or ``default``."""
        value = self.attributes.get(name, default)
        return value.decode() if isinstance(value, bytes) else value

    def input(self, i):
        """Name of input ``i`` or None when omitted."""
        return self.inputs[i] if i < len(self.inputs) and self.inputs[i] else None

    def constant_value(self, name):
        """numpy value of an initializer or Constant output, None otherwise."""
        return None if not name else self._constants.get(name)

    @property
    def constants(self):
        """``name -> numpy value`` of the initializers and Constant outputs."""
        return self._constants

    def shape(self, name):
        """Known shape of a forward value (tuple of dims) or None."""
        return self.g.shape(name)

    def rank(self, name, what="this rule"):
        """Static rank of ``name``.

        Raises
        ------
        ValueError
            If the rank is unknown: the message names the node.
        """
        rank = self.g.rank(name)
        if rank is None:
            rule = "" if what in ("this rule", self.node.op_type) else f" ({what})"
            raise ValueError(
                f"The gradient of {self.node.op_type} node {self.node.name!r}"
                f"{rule} needs the rank of its input {name!r}, which shape "
                f"inference could not tell: {self._unknown_rank_origin(name)}")
        return rank

    def _unknown_rank_origin(self, name):
        """Where a rank went missing: the node whose output shape onnx's
        inference lost although it knew an input's (an op of a custom
        domain, an op off the weights' path with no inference), or the
        graph input declaring no shape."""
        seen = set()
        node = self.g.producer(name)
        while node is not None and name not in seen:
            seen.add(name)
            inputs = [i for i in node.input if i]
            if not inputs or any(self.g.rank(i) is not None for i in inputs):
                op = f"{node.domain}.{node.op_type}" if node.domain not in (
                    "", "ai.onnx") else node.op_type
                return (f"{name!r} is an output of {op} node {node.name!r}, "
                        "whose output shape onnx's shape inference does not "
                        f"give; declare the shape of {name!r} in the model's "
                        "graph.value_info.")
            name = inputs[0]
            node = self.g.producer(name)
        return (f"the graph input {name!r} declares no shape; give it one "
                "(its rank at least, dims may be symbolic).")

    def fail(self, message):
        """Raise NotImplementedError naming the node and ``message``."""
        raise NotImplementedError(
            f"VJP of {self.node.op_type} (node {self.node.name!r}): {message}")

    # emission shortcuts ------------------------------------------------------
    def op(self, op_type, *inputs, **attrs):
        """Emit a node through the builder (see GraphBuilder.op)."""
        return self.g.op(op_type, *inputs, **attrs)

    def const(self, value, elem_type=None):
        """A constant in the element type of the node (or ``elem_type``)."""
        return self.g.const(value, self.dtype if elem_type is None else elem_type)

    def zeros_like(self, x):
        """Zeros of the run-time shape of ``x`` in the node's element type."""
        return self.g.zeros_like(x, self.dtype)

    def masked(self, value, mask):
        """``value`` where the bool ``mask`` is true, zero elsewhere, as
        ``Mul(value, Cast(mask))``: what ``Where(mask, value, 0)`` gives
        for finite values, much faster on onnxruntime's CPU than its Where
        kernel. An inf or NaN
        of ``value`` where ``mask`` is false gives NaN, not 0, and a
        negative value gives -0. An inf gradient is legitimate where an op
        that sanitizes its input chose the other value (``sqrt(clamp(d,
        min=0))`` at a slightly negative ``d``: Sqrt's gradient at 0):
        rules use this for activations only (Relu, a Clip with both
        bounds, Dropout, ThresholdedRelu, HardSigmoid, Shrink), and
        Where, Max, Min and a Clip with one bound keep Where."""
        return self.op("Mul", value, self.g.cast(mask, self.dtype))

    def select(self, condition, a, b):
        """``Where(condition, a, b)`` for finite ``a`` and ``b`` (slopes,
        not gradients: a rule multiplies the gradient by the result, once,
        so that its inf stays where Where would have put it), as
        ``masked(a, condition) + masked(b, Not(condition))`` (exact: one
        of the two products is a zero; NaN where either is not finite)."""
        return self.op("Add", self.masked(a, condition),
                       self.masked(b, self.op("Not", condition)))

    def sum_to(self, grad, grad_shape, target):
        """See :func:`sum_to`."""
        return sum_to(self.g, grad, grad_shape, target)

    def normalize_axes(self, axes, rank):
        """Non-negative axes for a tensor of ``rank``."""
        return [int(a) + rank if int(a) < 0 else int(a) for a in axes]

    def axes(self, attr_name="axes", input_index=1):
        """Axes given as attribute (older opsets) or constant input.

        Returns None when absent (meaning "all axes" for reductions).

        Raises
        ------
        NotImplementedError
            If the axes input is computed at run time.
        """
        if attr_name in self.attributes:
            return list(self.attributes[attr_name])
        name = self.input(input_index)
        if name is None:
            return None
        value = self.constant_value(name)
        if value is None:
            self.fail(f"axes input {name!r} is not a constant")
        return [int(a) for a in np.asarray(value).reshape(-1)]
