"""Training losses: each builds a small graph computing the loss value of a
batch and its gradient dE/dY with respect to the prediction.

Conventions follow scikit-learn's MLP so that the per-epoch losses overlay
``MLPRegressor.loss_curve_``: the batch loss is a (sample-weighted) mean over
rows, and dE/dY is the gradient scikit-learn back-propagates
(``sklearn/neural_network/_multilayer_perceptron.py``, ``_backprop``).
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto
from sklearn.base import BaseEstimator

from ._small import check_float_type, finish, new_builder, tensor_input

__all__ = ["BaseLearningLoss", "SquareLearningLoss", "resolve_learning_loss"]


class BaseLearningLoss(BaseEstimator):
    """A loss E(y, y_hat[, sample_weight]) and its gradient dE/dy_hat.

    ``build_onnx`` sets ``loss_grad_onnx_``: inputs ``X1`` (expected, shape
    of the prediction), ``X2`` (prediction), optionally the sample weights
    (shape (n_samples,)); outputs ``Y`` (rank-0 loss) and ``Y_grad`` (shape
    of ``X2``).
    """

    def build_onnx(self, elem_type=TensorProto.FLOAT, opset=None,
                   weight_name=None, rank=2):
        """Build ``loss_grad_onnx_`` for predictions of ``elem_type``.

        Parameters
        ----------
        elem_type : int, default=TensorProto.FLOAT
        opset : int, default=None (17)
        weight_name : str, default=None
            Name of the sample-weight input; None: no weights.
        rank : {1, 2}, default=2
            Rank of the prediction: (n_samples,) or (n_samples, n_outputs).

        Returns
        -------
        onnx.ModelProto
        """
        check_float_type(elem_type)
        g = new_builder(opset)
        if rank not in (1, 2):
            raise ValueError(f"rank must be 1 or 2, got {rank!r}.")
        shape = ["N", "K"][:rank]
        inputs = [tensor_input("X1", elem_type, shape),
                  tensor_input("X2", elem_type, shape)]
        if weight_name:
            inputs.append(tensor_input(weight_name, elem_type, ["N"]))
        g.reserve("Y"), g.reserve("Y_grad")
        for vi in inputs:
            g.reserve(vi.name)
        self._build(g, "X1", "X2", weight_name, elem_type, rank)
        outputs = [tensor_input("Y", elem_type, []),
                   tensor_input("Y_grad", elem_type, shape)]
        self.loss_grad_onnx_ = finish(g, type(self).__name__, inputs, outputs)
        return self.loss_grad_onnx_

    def _build(self, g, expected, predicted, weight, elem_type, rank):
        raise NotImplementedError

    def loss_per_row(self, y, y_pred):
        """Loss of each row, as a numpy array of shape (n_samples,)."""
        raise NotImplementedError


def _row_weights(g, weight, rank):
    """Sample weights of shape (n,) reshaped to broadcast over the rows of a
    prediction of rank ``rank``: (n, 1) for a 2-D one (never (n,) against
    (n, 1), which would broadcast to n x n)."""
    return g.op("Reshape", weight, g.int64s([-1] + [1] * (rank - 1)))


class SquareLearningLoss(BaseLearningLoss):
    """Half squared error, as scikit-learn's MLPRegressor defines it.

    With d = y_hat - y of shape (n, k) and weights w (default 1):
    ``Y = 0.5 * sum_i w_i sum_j d_ij**2 / (sum(w) * k)`` (scikit-learn's
    ``squared_loss``), ``Y_grad = w_i d_ij / sum(w)`` (the gradient
    scikit-learn back-propagates; for k = 1 it is exactly dY/dy_hat).
    """

    def _build(self, g, expected, predicted, weight, elem_type, rank):
        d = g.op("Sub", predicted, expected)
        square = g.op("Mul", d, d)
        half = g.const(0.5, elem_type)
        if weight is None:
            rows = g.cast(g.op("Gather", g.shape_of(predicted),
                               g.const(0, TensorProto.INT64)), elem_type)
            g.op("Mul", g.reduce("ReduceMean", square, None, keepdims=0), half,
                 outputs=["Y"])
            g.op("Div", d, rows, outputs=["Y_grad"])
            return
        w = _row_weights(g, weight, rank)
        total_w = g.reduce_sum(weight, None, keepdims=0)
        rows = g.cast(g.op("Gather", g.shape_of(predicted),
                           g.const(0, TensorProto.INT64)), elem_type)
        columns = g.op("Div", g.cast(g.op("Size", predicted), elem_type), rows)
        weighted = g.reduce_sum(g.op("Mul", square, w), None, keepdims=0)
        denominator = g.op("Mul", total_w, columns)
        g.op("Mul", g.op("Div", weighted, denominator), half, outputs=["Y"])
        g.op("Div", g.op("Mul", d, w), total_w, outputs=["Y_grad"])

    def loss_per_row(self, y, y_pred):
        """0.5 * mean over outputs of (y_pred - y)**2, one value per row."""
        d = np.asarray(y_pred, dtype=np.float64) - np.asarray(y, dtype=np.float64)
        d = d.reshape(d.shape[0], -1)
        return 0.5 * (d ** 2).mean(axis=1)


_LOSSES = {
    "square_error": SquareLearningLoss, "square": SquareLearningLoss,
    "squared_error": SquareLearningLoss,
    "SquareLearningLoss": SquareLearningLoss,
}


def resolve_learning_loss(value):
    """A new loss object from an alias, a class name or a loss object.

    Raises
    ------
    ValueError
        Unknown name (the message lists the accepted ones).
    TypeError
        Neither a str nor a :class:`BaseLearningLoss`.
    """
    if isinstance(value, BaseLearningLoss):
        from sklearn.base import clone
        return clone(value)
    if isinstance(value, str):
        if value not in _LOSSES:
            raise ValueError(f"Unknown learning_loss {value!r}; accepted: "
                             f"{sorted(_LOSSES)}.")
        return _LOSSES[value]()
    raise TypeError(f"learning_loss must be a str or a BaseLearningLoss, not "
                    f"{type(value).__name__}.")
