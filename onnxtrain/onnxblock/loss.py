"""Loss blocks: MSELoss, L1Loss, BCEWithLogitsLoss, CrossEntropyLoss.

Each loss follows the PyTorch definition of the same name
(``torch.nn.MSELoss``...). ``build`` takes the name of a model output and
the name of the target; the target becomes a new graph input (with the
output's element type and shape) unless a value of that name already
exists (an input, or a value computed from inputs, as a LabelEncoder's
output). A target name that is a model output or a value computed from the
prediction raises ValueError: the loss would compare the model with itself.
``reduction`` is 'mean', 'sum' (both give a rank-0 tensor, whatever the
rank of the output) or 'none' (the per-element loss).
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from ..losses import emitters as loss_emitters
from ._block import Block

__all__ = ["MSELoss", "L1Loss", "BCEWithLogitsLoss", "CrossEntropyLoss"]

_REDUCTIONS = ("mean", "sum", "none")


class _Emitter:
    """The base model as a loss emitter
    (:mod:`onnxtrain.losses.emitters`): every output takes the element type
    of ``like``."""

    def __init__(self, state, like):
        self.state, self.like = state, like

    def op(self, op_type, *inputs, **attributes):
        return self.state.op(op_type, *inputs, like=self.like, **attributes)

    def const(self, value, elem_type):
        return self.state.const(value, elem_type)


class _Loss(Block):
    """Common parts: reduction, target inputs; the per-element losses come
    from :mod:`onnxtrain.losses.emitters`, shared with
    :mod:`onnxtrain.losses`."""

    def __init__(self, reduction="mean"):
        super().__init__()
        if reduction not in _REDUCTIONS:
            raise ValueError(f"reduction must be one of {_REDUCTIONS}, "
                             f"not {reduction!r}.")
        self._reduction = reduction

    def _target(self, state, target_name, elem_type, shape, prediction):
        """``target_name`` if it is a value already, else a new graph input.

        Raises
        ------
        ValueError
            If ``target_name`` is ``prediction``, a graph output of the base
            model, or a value computed from ``prediction``: the loss would
            compare the prediction with itself (a zero loss).
        """
        if not state.is_value(target_name):
            return state.add_input(target_name, elem_type, shape)
        graph = state.model.graph
        derived = {prediction}
        for node in graph.node:
            if derived.intersection(node.input):
                derived.update(o for o in node.output if o)
        if target_name in derived or any(o.name == target_name for o in graph.output):
            raise ValueError(
                f"{type(self).__name__}: the target name {target_name!r} is "
                "already a value of the model (a model output, or computed "
                f"from the prediction {prediction!r}); the loss would compare "
                "the model with itself. Pass a new name for the target (it "
                "becomes a graph input).")
        return target_name

    def _reduce(self, state, values):
        if self._reduction == "none":
            return values
        op_type = "ReduceMean" if self._reduction == "mean" else "ReduceSum"
        state.sync()
        out = state.builder.reduce(op_type, values, None, keepdims=0)
        state._flush()
        return out

    def _float_input(self, state, name):
        info = state.value_type(name)
        if info is None:
            raise ValueError(f"{type(self).__name__}: {name!r} is not a typed "
                             "value of the base model.")
        return info


class _ElementwiseLoss(_Loss):
    """A loss reducing an elementwise comparison of the output with its
    target: :attr:`emitter` is one of :mod:`onnxtrain.losses.emitters`."""

    emitter = None

    def build(self, loss_input_name, target_name="target"):
        """Loss of ``loss_input_name`` (float tensor of any shape) against
        ``target_name`` (same shape); returns the loss name."""
        state = self._state()
        elem, shape = self._float_input(state, loss_input_name)
        target = self._target(state, target_name, elem, shape, loss_input_name)
        _, values = type(self).emitter(_Emitter(state, loss_input_name),
                                       loss_input_name, target)
        return self._reduce(state, values)


class MSELoss(_ElementwiseLoss):
    """Mean squared error, ``(output - target)^2`` reduced.

    Calling the block, ``loss(output_name, target_name="target")``,
    compares ``output_name`` with the tensor ``target_name``: by default a
    new graph input named ``"target"`` with the output's element type and
    shape (an existing value of that name is used as it is).

    Parameters
    ----------
    reduction : {'mean', 'sum', 'none'}, default='mean'
    """

    emitter = staticmethod(loss_emitters.squared_error)


class L1Loss(_ElementwiseLoss):
    """Mean absolute error, ``|output - target|`` reduced; called as
    :class:`MSELoss` is.

    Parameters
    ----------
    reduction : {'mean', 'sum', 'none'}, default='mean'
    """

    emitter = staticmethod(loss_emitters.absolute_error)


class BCEWithLogitsLoss(_Loss):
    """Binary cross-entropy on logits (``torch.nn.BCEWithLogitsLoss``).

    With ``sp(x) = max(x, 0) + log(1 + exp(-|x|))`` (softplus, computed
    without overflow for large ``|x|``) the element loss is
    ``weight * ((1 - y) sp(x) + pos_weight * y (sp(x) - x))``, which is
    ``-weight [pos_weight y log sigmoid(x) + (1 - y) log(1 - sigmoid(x))]``.

    Calling the block, ``loss(output_name, target_name="target")``,
    compares the logits ``output_name`` with the targets ``target_name``:
    by default a new graph input named ``"target"`` with the output's
    element type and shape (an existing value of that name is used as it
    is).

    Parameters
    ----------
    weight : array-like, default=None
        Rescaling weight broadcast against the output.
    reduction : {'mean', 'sum', 'none'}, default='mean'
    pos_weight : array-like, default=None
        Weight of the positive examples, broadcast along the last axis.
    """

    def __init__(self, weight=None, reduction="mean", pos_weight=None):
        super().__init__(reduction)
        self._weight = None if weight is None else np.asarray(weight)
        self._pos_weight = None if pos_weight is None else np.asarray(pos_weight)

    def build(self, loss_input_name, target_name="target"):
        """Loss of logits ``loss_input_name`` against float targets in
        [0, 1] ``target_name`` (same shape); returns the loss name."""
        state = self._state()
        x = loss_input_name
        elem, shape = self._float_input(state, x)
        y = self._target(state, target_name, elem, shape, x)
        op = state.op
        emitter = _Emitter(state, x)
        softplus = loss_emitters.softplus(emitter, x, elem)
        if self._pos_weight is None:
            loss = loss_emitters.logistic_loss_on_logits(emitter, x, y, elem,
                                                         softplus)
        else:
            negative = op("Mul", op("Sub", state.const(1.0, elem), y), softplus,
                          like=x)
            positive = op("Mul", op("Mul", state.const(self._pos_weight, elem), y),
                          op("Sub", softplus, x, like=x), like=x)
            loss = op("Add", negative, positive, like=x)
        if self._weight is not None:
            loss = op("Mul", loss, state.const(self._weight, elem), like=x)
        return self._reduce(state, loss)


class CrossEntropyLoss(_Loss):
    """Cross-entropy of logits and class indices (``torch.nn.CrossEntropyLoss``).

    The element loss is ``-w[y_i] log_softmax(x_i)[y_i]``; 'mean' divides the
    sum by ``sum_i w[y_i]`` over the elements whose label is not
    ``ignore_index`` (ignored elements count zero in every reduction).

    Calling the block, ``loss(scores_name, labels_name="labels")``, reads
    the class indices from the tensor ``labels_name``: by default a new
    int64 graph input named ``"labels"`` of the scores' shape without the
    class axis (an existing value of that name is used as it is).

    Parameters
    ----------
    weight : array-like of shape (n_classes,), default=None
        Class weights (1 for every class when None).
    reduction : {'mean', 'sum', 'none'}, default='mean'
    ignore_index : int, default=None
        Label value that contributes no loss.
    """

    def __init__(self, weight=None, reduction="mean", ignore_index=None):
        super().__init__(reduction)
        self._weight = None if weight is None else np.asarray(weight).reshape(-1)
        self._ignore_index = None if ignore_index is None else int(ignore_index)

    def build(self, scores_input_name, labels_name="labels"):
        """Loss of logits ``scores_input_name`` of shape (N, C) or
        (N, C, d1, ...) against int64 labels ``labels_name`` of shape (N,) or
        (N, d1, ...); returns the loss name."""
        state = self._state()
        x = scores_input_name
        elem, shape = self._float_input(state, x)
        label_shape = None if shape is None else tuple(shape[:1]) + tuple(shape[2:])
        labels = self._target(state, labels_name, TensorProto.INT64, label_shape, x)
        op = state.op
        log_p = loss_emitters.log_softmax(_Emitter(state, x), x)
        if state.builder.opset < 13 and (shape is None or len(shape) != 2):
            raise ValueError("CrossEntropyLoss on logits of rank other than 2 "
                             "needs opset >= 13 (LogSoftmax along axis 1).")
        safe, keep = labels, None
        if self._ignore_index is not None:
            ignored = op("Equal", labels,
                         state.const(self._ignore_index, TensorProto.INT64))
            safe = op("Where", ignored, state.const(0, TensorProto.INT64), labels)
            keep = op("Cast", op("Not", ignored), to=int(elem), like=x)
        if state.builder.opset >= 13:
            # GatherElements fails on a label out of [-C, C) (torch fails on
            # any label out of [0, C), onnxruntime's SoftmaxCrossEntropyLoss
            # on those of GatherElements); a OneHot row of such a label
            # would be zeros: a silent loss of 0 for it
            axis = state.const(np.array([1]), TensorProto.INT64)
            picked = op("Squeeze", op("GatherElements", log_p,
                                      op("Unsqueeze", safe, axis), axis=1, like=x),
                        axis, like=x)
        else:  # CrossEntropyLoss refuses rank > 2 there: (N, C) scores
            depth = op("Gather", op("Shape", x), state.const(1, TensorProto.INT64))
            # int64 values: onnxruntime's CPU OneHot has no double output kernel
            values = state.const(np.array([0, 1]), TensorProto.INT64)
            one_hot = op("Cast", op("OneHot", safe, depth, values, axis=1),
                         to=int(elem), like=x)
            picked = state.builder.reduce_sum(
                op("Mul", one_hot, log_p, like=x), [1], keepdims=0)
            state._flush()
        nll = op("Neg", picked, like=x)
        weights = keep
        if self._weight is not None:
            class_weight = state.const(self._weight, elem)
            weights = op("Gather", class_weight, safe, like=x)
            if keep is not None:
                weights = op("Mul", weights, keep, like=x)
        if weights is not None:
            nll = op("Mul", nll, weights, like=x)
        if self._reduction != "mean" or weights is None:
            return self._reduce(state, nll)
        total = state.builder.reduce_sum(nll, None, keepdims=0)
        norm = state.builder.reduce_sum(weights, None, keepdims=0)
        state._flush()
        return op("Div", total, norm, like=x)

