"""Penalties on the weights (regularization).

A penalty emits, inside the update graph, its gradient (added to the
weight's gradient, so the learning rate scales it) and its value (added to
the reported loss). Both are multiplied by ``penalty_scale``, 1 / (sum of the
batch's sample weights), as scikit-learn's MLP divides its ``alpha`` term by
the batch size: ``ElasticLearningPenalty(l1=0, l2=alpha / 2)`` on the
coefficients (biases excluded) reproduces ``MLPRegressor(alpha=alpha)``
exactly (``sklearn/neural_network/_multilayer_perceptron.py``, ``_backprop``
and ``_compute_loss_grad``).
"""
from __future__ import annotations

from sklearn.base import BaseEstimator

from ..graph._small import resolve_named, select_named

__all__ = ["BaseLearningPenalty", "NoLearningPenalty", "ElasticLearningPenalty",
           "resolve_learning_penalty"]


class BaseLearningPenalty(BaseEstimator):
    """A penalty added to the loss; its gradient joins the weights' gradient."""

    #: Whether biases (weights not multiplied by an input) are penalized.
    exclude_bias = True

    @staticmethod
    def select(class_name, **kwargs):
        """A penalty object from None, a name (see
        :func:`resolve_learning_penalty`) or an object, as
        :meth:`BaseLearningLoss.select <onnxtrain.losses.BaseLearningLoss.select>`
        makes a loss (same arguments and errors)."""
        return select_named(class_name, kwargs, BaseLearningPenalty,
                            resolve_learning_penalty, "a penalty object")

    def penalize(self, g, weight, grad, scale):
        """Emit nodes; return (new gradient name, penalty value name or None)."""
        return grad, None


class NoLearningPenalty(BaseLearningPenalty):
    """No penalty."""


class ElasticLearningPenalty(BaseLearningPenalty):
    """L1 + L2 penalty: ``scale * (l1 * sum|W| + l2 * sum W**2)``.

    Parameters
    ----------
    l1 : float, default=0.5
    l2 : float, default=0.5
    exclude_bias : bool, default=True
        Leave biases (weights not consumed by MatMul/Gemm as an operand)
        unpenalized, as scikit-learn's MLP does.

    Notes
    -----
    Gradient added to G: ``scale * (l1 * sign(W) + 2 * l2 * W)``, with
    ``scale`` = 1 / (sum of the batch's sample weights).
    """

    def __init__(self, l1=0.5, l2=0.5, exclude_bias=True):
        self.l1 = l1
        self.l2 = l2
        self.exclude_bias = exclude_bias

    def penalize(self, g, weight, grad, scale):
        elem_type = g.elem_type(weight)
        values, extras = [], []
        # a term whose coefficient is 0 is left out (the same values: it
        # adds 0): scikit-learn's MLP alpha is an L2 term alone, and the
        # update then reads the weight only element-wise, in place
        if self.l1 or not self.l2:
            l1 = g.const(self.l1, elem_type)
            abs_sum = g.reduce_sum(g.op("Abs", weight), None, keepdims=0)
            values.append(g.op("Mul", abs_sum, l1))
            extras.append(g.op("Mul", g.op("Sign", weight), l1))
        if self.l2:
            l2, two_l2 = g.const(self.l2, elem_type), g.const(2 * self.l2, elem_type)
            square_sum = g.reduce_sum(g.op("Mul", weight, weight), None, keepdims=0)
            values.append(g.op("Mul", square_sum, l2))
            extras.append(g.op("Mul", weight, two_l2))
        value = values[0] if len(values) == 1 else g.op("Add", *values)
        extra = extras[0] if len(extras) == 1 else g.op("Add", *extras)
        new_grad = g.op("Add", grad, g.op("Mul", extra, scale))
        return new_grad, g.op("Mul", value, scale)


_PENALTIES = {"": NoLearningPenalty, "none": NoLearningPenalty,
              "NoLearningPenalty": NoLearningPenalty,
              "elastic": ElasticLearningPenalty, "l1l2": ElasticLearningPenalty,
              "ElasticLearningPenalty": ElasticLearningPenalty}


def resolve_learning_penalty(value):
    """A new penalty object from None, a name or a penalty object.

    Raises
    ------
    ValueError
        Unknown name (the message lists the accepted ones).
    TypeError
        Any other type.
    """
    if value is None:
        return NoLearningPenalty()
    return resolve_named(value, _PENALTIES, BaseLearningPenalty,
                         "learning_penalty")
