"""Learning rates and weight updates.

A learning-rate object holds a schedule evaluated on the host (number of
samples seen -> float) and builds the small ONNX graph applying the update
to one weight. The learning rate is an input of that graph, never baked in.
"""
from __future__ import annotations

import numbers

import numpy as np
from onnx import TensorProto
from sklearn.base import BaseEstimator, clone

from ._small import check_float_type, finish, new_builder, tensor_input

__all__ = ["BaseLearningRate", "LearningRateSGD", "resolve_learning_rate"]


class BaseLearningRate(BaseEstimator):
    """Schedule + update graph. Subclasses define :meth:`schedule` and
    :meth:`_update`.

    Attributes
    ----------
    value : float
        Current learning rate (set by :meth:`init_learning_rate` and
        :meth:`update_learning_rate`).
    axpy_onnx_ : onnx.ModelProto
        The update graph (after :meth:`build_onnx`).
    """

    def init_learning_rate(self):
        """Reset the schedule: ``value`` becomes the initial learning rate."""
        self.value = self.schedule(0)
        return self

    def update_learning_rate(self, t):
        """Set ``value`` for time step ``t`` (called at each epoch's end; the
        caller defines ``t``, see the schedule's documentation)."""
        self.value = self.schedule(t)
        return self

    def schedule(self, t):
        """Learning rate at time step ``t`` (float)."""
        raise NotImplementedError

    def build_onnx(self, weights, elem_type=TensorProto.FLOAT, opset=None):
        """Build and return ``axpy_onnx_``, the update of every weight.

        Parameters
        ----------
        weights : list of (str, tuple of int)
            Name and shape of each weight.
        elem_type : int, default=TensorProto.FLOAT
        opset : int, default=None (17)

        Returns
        -------
        onnx.ModelProto
            Inputs: ``alpha`` (rank 0), then for each weight ``w``: ``w``
            and ``w_grad`` (plus the optimizer state the rule keeps);
            outputs: ``w_new`` for each weight (plus the new state).
        """
        check_float_type(elem_type)
        g = new_builder(opset)
        inputs = [tensor_input("alpha", elem_type, [])]
        outputs = []
        g.reserve("alpha")
        for name, shape in weights:
            names = (name, f"{name}_grad", f"{name}_new")
            for n in names:
                g.reserve(n)
            inputs += [tensor_input(n, elem_type, shape) for n in names[:2]]
            outputs.append(tensor_input(names[2], elem_type, shape))
            self._update(g, *names, "alpha")
        self.axpy_onnx_ = finish(g, f"{type(self).__name__}_update", inputs,
                                 outputs)
        return self.axpy_onnx_

    def _update(self, g, weight, grad, new_weight, alpha):
        raise NotImplementedError


class LearningRateSGD(BaseLearningRate):
    """Stochastic gradient descent: W <- W - eta * G.

    Parameters
    ----------
    eta0 : float, default=0.01
        Initial learning rate.
    alpha : float, default=0.0001
        Regularization constant of the 'optimal' schedule.
    power_t : float, default=0.25
        Exponent of the 'invscaling' schedule.
    learning_rate : {'invscaling', 'constant', 'optimal'}, default='invscaling'
        Schedule, updated at the end of each epoch with t the number of
        epochs completed (onnxcustom's convention, which
        ``OrtGradientForwardBackwardOptimizer`` follows; scikit-learn's MLP
        counts samples seen instead):
        'constant': eta0; 'invscaling': eta0 / (t + 1) ** power_t;
        'optimal': eta0 * t0 / (t0 + t) with typw = sqrt(1 / sqrt(alpha)),
        eta_h = typw / max(1, 2 * (1 + typw)), t0 = 1 / (eta_h * alpha)
        (onnxcustom's definition, after Bottou's SGD heuristic).

    Notes
    -----
    ``axpy_onnx_`` computes ``w_new = alpha * w_grad + w`` (axpy) for each
    weight, with ``alpha = -eta`` fed as a rank-0 input.
    """

    def __init__(self, eta0=0.01, alpha=0.0001, power_t=0.25,
                 learning_rate="invscaling"):
        self.eta0 = eta0
        self.alpha = alpha
        self.power_t = power_t
        self.learning_rate = learning_rate

    def schedule(self, t):
        kind = self.learning_rate
        if kind == "constant":
            return float(self.eta0)
        if kind == "invscaling":
            return float(self.eta0) / (t + 1) ** float(self.power_t)
        if kind == "optimal":
            typw = np.sqrt(1.0 / np.sqrt(self.alpha))
            eta_h = typw / max(1.0, 2 * (1.0 + typw))
            t0 = 1.0 / (eta_h * self.alpha)
            return float(self.eta0 * t0 / (t0 + t))
        raise ValueError(f"Unknown learning_rate schedule {kind!r}; expected "
                         "'constant', 'invscaling' or 'optimal'.")

    def _update(self, g, weight, grad, new_weight, alpha):
        g.op("Add", g.op("Mul", grad, alpha), weight, outputs=[new_weight])


def resolve_learning_rate(value):
    """A new learning-rate object from a float, 'SGD' or an object.

    A float ``x`` means ``LearningRateSGD(eta0=x)``; 'SGD' (or
    'LearningRateSGD') means ``LearningRateSGD()``.

    Raises
    ------
    ValueError
        Unknown name or non-positive float.
    TypeError
        Any other type.
    """
    if isinstance(value, BaseLearningRate):
        return clone(value)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        if not np.isfinite(value) or value <= 0:
            raise ValueError(f"learning_rate must be > 0, got {value!r}.")
        return LearningRateSGD(eta0=float(value))
    if isinstance(value, str):
        if value in ("SGD", "LearningRateSGD"):
            return LearningRateSGD()
        raise ValueError(f"Unknown learning_rate {value!r}; accepted: a float, "
                         "'SGD' or a learning-rate object.")
    raise TypeError(f"learning_rate must be a float, a str or a learning-rate "
                    f"object, not {type(value).__name__}.")
