"""Loss graph emitters shared by the two loss families: the estimators'
losses (:mod:`onnxtrain.losses`, a loss and its closed-form gradient dE/dY,
scikit-learn's conventions) and the onnxblock loss blocks
(:mod:`onnxtrain.onnxblock.loss`, PyTorch's definitions, differentiated by
the autodiff). Each function emits the per-element loss of one formula into
an emitter with ``op(op_type, *inputs, **attributes)`` and
``const(value, elem_type)`` (:class:`onnxtrain.graph.GraphBuilder`, or the
onnxblock base model); the families differ only in how they reduce it.
"""
from __future__ import annotations

__all__ = ["squared_error", "absolute_error", "softplus",
           "logistic_loss_on_logits", "log_softmax"]


def squared_error(g, prediction, target):
    """``(d, d * d)`` with ``d = prediction - target``."""
    d = g.op("Sub", prediction, target)
    return d, g.op("Mul", d, d)


def absolute_error(g, prediction, target):
    """``(d, |d|)`` with ``d = prediction - target``."""
    d = g.op("Sub", prediction, target)
    return d, g.op("Abs", d)


def softplus(g, x, elem_type):
    """``log(1 + exp(x))`` as ``max(x, 0) + log(1 + exp(-|x|))``: finite for
    any ``x`` (no overflow of exp)."""
    one = g.const(1.0, elem_type)
    return g.op("Add", g.op("Relu", x), g.op(
        "Log", g.op("Add", one, g.op("Exp", g.op("Neg", g.op("Abs", x))))))


def logistic_loss_on_logits(g, logits, target, elem_type, softplus_value=None):
    """``-[y log sigmoid(s) + (1 - y) log(1 - sigmoid(s))]`` per element, as
    ``softplus(s) - y s`` (exact for any score ``s``, targets in [0, 1])."""
    sp = softplus(g, logits, elem_type) if softplus_value is None else softplus_value
    return g.op("Sub", sp, g.op("Mul", target, logits))


def log_softmax(g, logits):
    """``log softmax`` over the class axis 1 (LogSoftmax: stable)."""
    return g.op("LogSoftmax", logits, axis=1)
