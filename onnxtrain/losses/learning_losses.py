"""Training losses: each builds a small graph computing the loss value of a
batch and its gradient dE/dY with respect to the prediction.

Conventions follow scikit-learn's MLP so that the per-epoch losses overlay
``MLPRegressor.loss_curve_``: the batch loss is a (sample-weighted) mean over
rows, and dE/dY is the gradient scikit-learn back-propagates
(``sklearn/neural_network/_multilayer_perceptron.py``, ``_backprop``).

Every loss follows one layout. With ``l_ij`` the loss of output ``j`` of row
``i``, ``w_i`` the sample weights (1 without weights), ``W = sum_i w_i`` and
``k`` the number of outputs:

* losses that average over the outputs (absolute, elastic):
  ``Y = sum_i w_i sum_j l_ij / (W k)`` and
  ``Y_grad_ij = w_i dl_ij / (W k)``, the exact derivative of ``Y``;
* losses that sum over the outputs, as scikit-learn's ``log_loss`` and
  ``binary_log_loss`` and ``poisson_loss`` do (binary log, cross entropy,
  Poisson):
  ``Y = sum_i w_i sum_j l_ij / W`` and ``Y_grad_ij = w_i dl_ij / W``.

:class:`SquareLearningLoss` alone keeps scikit-learn's scale for its
gradient (``k`` times the derivative of its value, see its docstring).
The gradients are closed forms; ``tests/losses/test_losses.py`` compares each with
central finite differences of the value.
"""
from __future__ import annotations

import numbers

import numpy as np
from onnx import TensorProto
from sklearn.base import BaseEstimator

from ..graph import elem_type_to_numpy
from ..graph._saving import GraphSaverMixin
from ..graph._small import (check_float_type, finish, new_builder, resolve_named,
                            select_named, tensor_input)
from .emitters import (absolute_error, log_softmax, logistic_loss_on_logits,
                       squared_error)

__all__ = ["BaseLearningLoss", "SquareLearningLoss", "AbsoluteLearningLoss",
           "ElasticLearningLoss", "NegLogLearningLoss",
           "CrossEntropyLearningLoss", "PoissonLearningLoss",
           "resolve_learning_loss"]


class BaseLearningLoss(GraphSaverMixin, BaseEstimator):
    """A loss E(y, y_hat[, sample_weight]) and its gradient dE/dy_hat.

    ``build_onnx`` sets ``loss_grad_onnx_``: inputs ``X1`` (expected, shape
    of the prediction), ``X2`` (prediction), optionally the sample weights
    (shape (n_samples,)); outputs ``Y`` (rank-0 loss) and ``Y_grad`` (shape
    of ``X2``).
    """

    #: Prediction ranks the loss accepts.
    _ranks = (1, 2)

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
        self._check_build(elem_type, rank)
        g = new_builder(opset)
        shape = ["N", "K"][:rank]
        inputs = [tensor_input("X1", elem_type, shape),
                  tensor_input("X2", elem_type, shape)]
        if weight_name:
            inputs.append(tensor_input(weight_name, elem_type, ["N"]))
        g.reserve("Y"), g.reserve("Y_grad")
        for vi in inputs:
            g.reserve(vi.name)
        self._build(g, "X1", "X2", weight_name, elem_type, rank, ["Y", "Y_grad"])
        outputs = [tensor_input("Y", elem_type, []),
                   tensor_input("Y_grad", elem_type, shape)]
        self.loss_grad_onnx_ = finish(g, type(self).__name__, inputs, outputs)
        return self.loss_grad_onnx_

    def emit(self, g, expected, predicted, weight, outputs, elem_type, rank=2):
        """Write the loss and its gradient into the builder ``g``.

        Parameters
        ----------
        g : GraphBuilder
            The graph the nodes join (a training step's).
        expected, predicted : str
            Values of the targets and of the prediction.
        weight : str or None
            Value of the sample weights (shape (n_samples,)); None: none.
        outputs : list of str
            Names, reserved in ``g``, of the rank-0 loss and of its
            gradient (the prediction's shape).
        elem_type : int
        rank : {1, 2}, default=2

        Returns
        -------
        list of str
            ``outputs``.
        """
        self._check_build(elem_type, rank)
        self._build(g, expected, predicted, weight, elem_type, rank, list(outputs))
        return list(outputs)

    def _check_build(self, elem_type, rank):
        check_float_type(elem_type)
        if rank not in (1, 2):
            raise ValueError(f"rank must be 1 or 2, got {rank!r}.")
        if rank not in self._ranks:
            raise ValueError(
                f"{type(self).__name__} needs predictions of rank "
                f"{' or '.join(map(str, self._ranks))}, got rank {rank!r}.")
        self._check_params()

    def _check_params(self):
        """Raise ValueError on invalid hyperparameters (checked at build time,
        as scikit-learn checks them at fit time)."""

    @staticmethod
    def select(class_name, **kwargs):
        """A loss object from a name or a loss (onnxcustom's ``select``).

        Parameters
        ----------
        class_name : str or BaseLearningLoss
            A loss object (returned as is, as onnxcustom did) or a name of
            :func:`resolve_learning_loss` (aliases and class names).
        **kwargs
            The new loss's parameters (``l1_weight``, ``eps``...).

        Returns
        -------
        BaseLearningLoss

        Raises
        ------
        ValueError, TypeError
            As :func:`~onnxtrain.graph._small.select_named`.
        """
        return select_named(class_name, kwargs, BaseLearningLoss,
                            resolve_learning_loss, "a loss object")

    def _build(self, g, expected, predicted, weight, elem_type, rank, outputs):
        raise NotImplementedError

    def loss_per_row(self, y, y_pred):
        """Loss of each row, as a numpy array of shape (n_samples,)."""
        raise NotImplementedError


def _row_weights(g, weight, rank):
    """Sample weights of shape (n,) reshaped to broadcast over the rows of a
    prediction of rank ``rank``: (n, 1) for a 2-D one (never (n,) against
    (n, 1), which would broadcast to n x n)."""
    return g.op("Reshape", weight, g.int64s([-1] + [1] * (rank - 1)))


def _dim(g, x, axis, elem_type):
    """Dimension ``axis`` of ``x`` as a rank-0 tensor of ``elem_type``."""
    return g.cast(g.op("Gather", g.shape_of(x), g.const(axis, TensorProto.INT64)),
                  elem_type)


def _reduce_rows(g, per_element, derivative, predicted, weight, elem_type, rank,
                 outputs, mean_over_outputs):
    """Emit ``outputs`` (the loss ``Y`` and its gradient ``Y_grad``) from
    the loss of every element and its derivative, both of the prediction's
    shape.

    ``Y = sum_i w_i sum_j l_ij / D`` and ``Y_grad = w_i dl_ij / D`` with
    ``D = W k`` when ``mean_over_outputs`` else ``D = W`` (``W`` = sum of the
    weights, or the number of rows without weights; ``k`` = number of
    outputs).
    """
    if weight is None:
        if mean_over_outputs:
            denominator = g.cast(g.op("Size", predicted), elem_type)
        else:
            denominator = _dim(g, predicted, 0, elem_type)
        g.op("Div", g.reduce_sum(per_element, None, keepdims=0), denominator,
             outputs=outputs[:1])
        g.op("Div", derivative, denominator, outputs=outputs[1:])
        return
    w = _row_weights(g, weight, rank)
    denominator = g.reduce_sum(weight, None, keepdims=0)
    if mean_over_outputs and rank == 2:
        denominator = g.op("Mul", denominator, _dim(g, predicted, 1, elem_type))
    weighted = g.reduce_sum(g.op("Mul", per_element, w), None, keepdims=0)
    g.op("Div", weighted, denominator, outputs=outputs[:1])
    g.op("Mul", derivative, g.op("Div", w, denominator), outputs=outputs[1:])


def _clip_bounds(eps, dtype):
    """``(lo, hi)``: ``[eps, 1 - eps]`` in ``dtype``, kept inside (0, 1).

    ``eps`` below the smallest normal number of ``dtype`` becomes that
    number; ``1 - eps`` rounding to 1 becomes the largest number below 1
    (float16 cannot hold 1 - 1e-5).
    """
    dtype = np.dtype(dtype)
    finfo = np.finfo(dtype)
    lo = dtype.type(eps)
    if not lo >= finfo.tiny:
        lo = dtype.type(finfo.tiny)
    hi = dtype.type(1.0 - float(eps))
    if not hi < 1:
        hi = np.nextafter(dtype.type(1), dtype.type(0))
    return lo, hi


def _clipped(g, probabilities, eps, elem_type):
    """``(p, inside)``: ``p = clip(probabilities, eps, 1 - eps)`` and the
    mask (1 or 0, ``elem_type``) of the elements the clipping left as they
    were, where the derivative of ``p`` is 1 (0 elsewhere)."""
    lo, hi = _clip_bounds(eps, elem_type_to_numpy(elem_type))
    p = g.op("Clip", probabilities, g.const(lo, elem_type), g.const(hi, elem_type))
    return p, g.cast(g.op("Equal", p, probabilities), elem_type)


def _binary_log_loss(g, expected, p, elem_type):
    """``-[y log p + (1 - y) log(1 - p)]`` per element (``p`` clipped)."""
    one = g.const(1.0, elem_type)
    return g.op("Neg", g.op("Add", g.op("Mul", expected, g.op("Log", p)),
                            g.op("Mul", g.op("Sub", one, expected),
                                 g.op("Log", g.op("Sub", one, p)))))


def _float_dtype(array):
    """The dtype the bounds of a numpy ``loss_per_row`` follow."""
    dtype = np.asarray(array).dtype
    return dtype if dtype.kind == "f" else np.dtype(np.float64)


def _rows_2d(y, y_pred):
    """``y`` and ``y_pred`` as float64 arrays of shape (n, k)."""
    y_pred = np.asarray(y_pred, dtype=np.float64)
    n = y_pred.shape[0]
    return (np.asarray(y, dtype=np.float64).reshape(n, -1),
            y_pred.reshape(n, -1))


def _check_eps(name, value, upper):
    if (not isinstance(value, numbers.Real) or isinstance(value, bool)
            or not 0 < value < upper):
        raise ValueError(f"{name} must be a float in (0, {upper}), got {value!r}.")


class SquareLearningLoss(BaseLearningLoss):
    """Half squared error, as scikit-learn's MLPRegressor defines it.

    With d = y_hat - y of shape (n, k) and weights w (default 1):
    ``Y = 0.5 * sum_i w_i sum_j d_ij**2 / (sum(w) * k)`` (scikit-learn's
    ``squared_loss``), ``Y_grad = w_i d_ij / sum(w)`` (the gradient
    scikit-learn back-propagates; for k = 1 it is exactly dY/dy_hat).
    """

    def _build(self, g, expected, predicted, weight, elem_type, rank, outputs):
        d, square = squared_error(g, predicted, expected)
        half = g.const(0.5, elem_type)
        if weight is None:
            rows = g.cast(g.op("Gather", g.shape_of(predicted),
                               g.const(0, TensorProto.INT64)), elem_type)
            g.op("Mul", g.reduce("ReduceMean", square, None, keepdims=0), half,
                 outputs=outputs[:1])
            g.op("Div", d, rows, outputs=outputs[1:])
            return
        w = _row_weights(g, weight, rank)
        total_w = g.reduce_sum(weight, None, keepdims=0)
        rows = g.cast(g.op("Gather", g.shape_of(predicted),
                           g.const(0, TensorProto.INT64)), elem_type)
        columns = g.op("Div", g.cast(g.op("Size", predicted), elem_type), rows)
        weighted = g.reduce_sum(g.op("Mul", square, w), None, keepdims=0)
        denominator = g.op("Mul", total_w, columns)
        g.op("Mul", g.op("Div", weighted, denominator), half, outputs=outputs[:1])
        g.op("Div", g.op("Mul", d, w), total_w, outputs=outputs[1:])

    def loss_per_row(self, y, y_pred):
        """0.5 * mean over outputs of (y_pred - y)**2, one value per row."""
        d = np.asarray(y_pred, dtype=np.float64) - np.asarray(y, dtype=np.float64)
        d = d.reshape(d.shape[0], -1)
        return 0.5 * (d ** 2).mean(axis=1)


class AbsoluteLearningLoss(BaseLearningLoss):
    """Mean absolute error.

    With d = y_hat - y of shape (n, k) (or (n,), k = 1) and sample weights
    w (default 1)::

        Y      = sum_i w_i sum_j |d_ij| / (sum(w) k)
        Y_grad = w_i sign(d_ij) / (sum(w) k)

    ``Y`` is ``sklearn.metrics.mean_absolute_error(y, y_hat,
    sample_weight=w)`` (uniform average over outputs) and ``Y_grad`` its
    exact derivative (0 where d = 0). onnxcustom's graph had the opposite
    sign, so gradient descent climbed.
    """

    def _build(self, g, expected, predicted, weight, elem_type, rank, outputs):
        d, absolute = absolute_error(g, predicted, expected)
        _reduce_rows(g, absolute, g.op("Sign", d), predicted, weight,
                     elem_type, rank, outputs, mean_over_outputs=True)

    def loss_per_row(self, y, y_pred):
        """Mean over outputs of ``|y_pred - y|``, one value per row."""
        y, y_pred = _rows_2d(y, y_pred)
        return np.abs(y_pred - y).mean(axis=1)


class ElasticLearningLoss(BaseLearningLoss):
    """A weighted sum of the mean absolute and mean squared errors.

    Parameters
    ----------
    l1_weight : float, default=0.5
        Weight of the mean absolute error.
    l2_weight : float, default=0.5
        Weight of the mean squared error (not halved).

    Notes
    -----
    With d = y_hat - y (shape (n, k)), sample weights w (default 1), and
    ``a = l1_weight``, ``b = l2_weight``::

        Y      = sum_i w_i sum_j (a |d_ij| + b d_ij**2) / (sum(w) k)
               = a * mean_absolute_error(y, y_hat, sample_weight=w)
                 + b * mean_squared_error(y, y_hat, sample_weight=w)
        Y_grad = w_i (a sign(d_ij) + 2 b d_ij) / (sum(w) k)

    (scikit-learn metrics; ``Y_grad`` is the exact derivative of ``Y``).
    onnxcustom's ``ElasticLearningLoss`` had the sign of the L1 part wrong.
    """

    def __init__(self, l1_weight=0.5, l2_weight=0.5):
        self.l1_weight = l1_weight
        self.l2_weight = l2_weight

    def _check_params(self):
        for name in ("l1_weight", "l2_weight"):
            value = getattr(self, name)
            if (not isinstance(value, numbers.Real) or isinstance(value, bool)
                    or not np.isfinite(value) or value < 0):
                raise ValueError(f"{name} must be a finite float >= 0, got "
                                 f"{value!r}.")

    def _build(self, g, expected, predicted, weight, elem_type, rank, outputs):
        d, absolute = absolute_error(g, predicted, expected)
        l1 = g.const(self.l1_weight, elem_type)
        loss = g.op("Add", g.op("Mul", absolute, l1),
                    g.op("Mul", g.op("Mul", d, d), g.const(self.l2_weight, elem_type)))
        grad = g.op("Add", g.op("Mul", g.op("Sign", d), l1),
                    g.op("Mul", d, g.const(2.0 * self.l2_weight, elem_type)))
        _reduce_rows(g, loss, grad, predicted, weight, elem_type, rank,
                     outputs, mean_over_outputs=True)

    def loss_per_row(self, y, y_pred):
        """Mean over outputs of ``l1_weight * |d| + l2_weight * d**2``, per row."""
        y, y_pred = _rows_2d(y, y_pred)
        d = y_pred - y
        return (self.l1_weight * np.abs(d) + self.l2_weight * d ** 2).mean(axis=1)


_PROBABILITY_FUNCTIONS = ("sigmoid", None, "none")


class NegLogLearningLoss(BaseLearningLoss):
    """Binary log loss (logistic loss) on a raw score or on a probability.

    Parameters
    ----------
    eps : float, default=1e-5
        With ``probability_function=None``, probabilities are clipped to
        ``[eps, 1 - eps]`` (to the smallest normal number and the largest
        number below 1 of the element type when those are tighter).
        Unused with the sigmoid: the value is then computed exactly.
    probability_function : {'sigmoid', None, 'none'}, default='sigmoid'
        'sigmoid': the prediction is a raw score s and p = sigmoid(s).
        None or 'none': the prediction is already the probability p of the
        positive class.

    Notes
    -----
    The expected values y are 0/1 (or soft labels in [0, 1]) of the
    prediction's shape, (n,) or (n, k) (k > 1: independent binary outputs,
    summed over outputs as scikit-learn MLP's ``binary_log_loss`` does).
    Per element::

        l = -[y log p + (1 - y) log(1 - p)]

    and ``Y = sum_i w_i sum_j l_ij / sum(w)``, which is
    ``sklearn.metrics.log_loss(y, p, sample_weight=w)`` for k = 1, and
    scikit-learn MLP's ``binary_log_loss`` (``-np.average(xlogy(y, p) +
    xlogy(1 - y, 1 - p), weights=w, axis=0).sum()``,
    ``sklearn/neural_network/_base.py``) for any k.

    * sigmoid: ``l = softplus(s) - y s`` with
      ``softplus(s) = max(s, 0) + log(1 + exp(-|s|))`` (finite for any
      score, no clipping) and ``Y_grad = w (sigmoid(s) - y) / sum(w)``,
      the exact derivative, never computed through 1/p (the delta
      scikit-learn's MLP back-propagates for a logistic output).
    * probabilities: ``p = clip(y_hat, eps, 1 - eps)`` and
      ``Y_grad = w ((1 - y)/(1 - p) - y/p) / sum(w)`` where y_hat lies
      inside the clipping bounds, 0 outside (the exact derivative of the
      clipped value).
    """

    def __init__(self, eps=1e-5, probability_function="sigmoid"):
        self.eps = eps
        self.probability_function = probability_function

    def _sigmoid(self):
        return self.probability_function == "sigmoid"

    def _check_params(self):
        if self.probability_function not in _PROBABILITY_FUNCTIONS:
            raise ValueError(
                f"probability_function must be one of {_PROBABILITY_FUNCTIONS}, "
                f"got {self.probability_function!r}.")
        _check_eps("eps", self.eps, 0.5)

    def _build(self, g, expected, predicted, weight, elem_type, rank, outputs):
        if self._sigmoid():
            s = predicted
            loss = logistic_loss_on_logits(g, s, expected, elem_type)
            grad = g.op("Sub", g.op("Sigmoid", s), expected)
        else:
            p, inside = _clipped(g, predicted, self.eps, elem_type)
            one = g.const(1.0, elem_type)
            loss = _binary_log_loss(g, expected, p, elem_type)
            grad = g.op("Mul", g.op("Sub", g.op("Div", g.op("Sub", one, expected),
                                                g.op("Sub", one, p)),
                                    g.op("Div", expected, p)), inside)
        _reduce_rows(g, loss, grad, predicted, weight, elem_type, rank,
                     outputs, mean_over_outputs=False)

    def loss_per_row(self, y, y_pred):
        """Sum over outputs of the log loss, one value per row."""
        self._check_params()
        dtype = _float_dtype(y_pred)
        y, y_pred = _rows_2d(y, y_pred)
        if self._sigmoid():
            loss = np.logaddexp(0.0, y_pred) - y * y_pred
        else:
            lo, hi = _clip_bounds(self.eps, dtype)
            p = np.clip(y_pred, float(lo), float(hi))
            loss = -(y * np.log(p) + (1 - y) * np.log1p(-p))
        return loss.sum(axis=1)


class CrossEntropyLearningLoss(BaseLearningLoss):
    """Multiclass cross entropy on probabilities or on logits.

    Parameters
    ----------
    eps : float, default=1e-7
        Probabilities are clipped to ``[eps, 1 - eps]`` (to the smallest
        normal number and the largest number below 1 of the element type
        when those are tighter). Unused with ``from_logits=True``.
    from_logits : bool, default=False
        False: the prediction holds probabilities (n, C). True: it holds
        logits z (n, C) and p = softmax(z) per row.

    Notes
    -----
    The expected values are the one-hot targets y (n, C) (rows of soft
    labels work too); weights w (default 1)::

        Y = -sum_i w_i sum_j y_ij log p_ij / sum(w)

    which is ``sklearn.metrics.log_loss(labels, p, sample_weight=w)`` and
    scikit-learn MLP's ``log_loss`` (``-np.average(xlogy(y, p), weights=w,
    axis=0).sum()``: a sum over classes, not a mean).

    * probabilities: ``p = clip(y_hat, eps, 1 - eps)``,
      ``Y_grad_ij = -w_i y_ij / (p_ij sum(w))`` inside the bounds, 0
      outside (exact derivative of the clipped value). A binary classifier
      whose output is ``Concat(1 - p, p)`` (skl2onnx's MLPClassifier,
      LogisticRegression) with targets ``(1 - y, y)`` gets the binary log
      loss, and its gradient flows back through the Concat to p.
    * logits: ``log p = LogSoftmax(z)`` (stable) and
      ``Y_grad_ij = w_i (softmax(z)_ij sum_c y_ic - y_ij) / sum(w)``, that is
      ``w_i (softmax(z_i) - y_i) / sum(w)`` for one-hot targets (the delta
      scikit-learn's MLP back-propagates for a softmax output).

    Predictions must have rank 2 (n, C).
    """

    _ranks = (2,)

    def __init__(self, eps=1e-7, from_logits=False):
        self.eps = eps
        self.from_logits = from_logits

    def _check_params(self):
        if not isinstance(self.from_logits, (bool, np.bool_)):
            raise ValueError(f"from_logits must be a bool, got {self.from_logits!r}.")
        _check_eps("eps", self.eps, 0.5)

    def _build(self, g, expected, predicted, weight, elem_type, rank, outputs):
        if self.from_logits:
            log_p = log_softmax(g, predicted)
            # exp(log_softmax) is softmax to an ulp; onnxruntime's Exp costs
            # less than a second Softmax
            softmax = g.op("Exp", log_p)
            mass = g.reduce_sum(expected, [1], keepdims=1)
            grad = g.op("Sub", g.op("Mul", softmax, mass), expected)
        else:
            p, inside = _clipped(g, predicted, self.eps, elem_type)
            log_p = g.op("Log", p)
            grad = g.op("Mul", g.op("Neg", g.op("Div", expected, p)), inside)
        loss = g.op("Neg", g.op("Mul", expected, log_p))
        _reduce_rows(g, loss, grad, predicted, weight, elem_type, rank,
                     outputs, mean_over_outputs=False)

    def loss_per_row(self, y, y_pred):
        """``-sum_j y_ij log p_ij`` per row.

        ``y`` is the one-hot (n, C) target, or a vector of class indices
        in ``range(C)``.
        """
        self._check_params()
        dtype = _float_dtype(y_pred)
        y_pred = np.asarray(y_pred, dtype=np.float64)
        if y_pred.ndim != 2:
            raise ValueError(f"y_pred must have shape (n_samples, n_classes), got "
                             f"{y_pred.shape}.")
        y = np.asarray(y)
        if y.ndim == 1:
            y = np.eye(y_pred.shape[1])[y.astype(np.int64)]
        y = y.astype(np.float64).reshape(y_pred.shape)
        if self.from_logits:
            shifted = y_pred - y_pred.max(axis=1, keepdims=True)
            log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        else:
            lo, hi = _clip_bounds(self.eps, dtype)
            log_p = np.log(np.clip(y_pred, float(lo), float(hi)))
        return -(y * log_p).sum(axis=1)


class _LogLossOfSigmoid(NegLogLearningLoss):
    """``NegLogLearningLoss(probability_function=None)`` of ``sigmoid(s)``,
    computed from the score ``s``: the loss of a graph ending with a
    Sigmoid, clipping included, for the training steps that stop the
    graph at the score (``training_graphs.loss_on_logits``).

    The value is that of the clipped probabilities; the gradient w.r.t.
    ``s`` is ``w (sigmoid(s) - y) / sum(w)`` where the probability lies
    inside the clipping bounds, 0 outside: the chain rule through the
    clipped log loss and the Sigmoid, without the Sigmoid's VJP.
    """

    def _build(self, g, expected, predicted, weight, elem_type, rank, outputs):
        probabilities = g.op("Sigmoid", predicted)
        p, inside = _clipped(g, probabilities, self.eps, elem_type)
        loss = _binary_log_loss(g, expected, p, elem_type)
        grad = g.op("Mul", g.op("Sub", probabilities, expected), inside)
        _reduce_rows(g, loss, grad, predicted, weight, elem_type, rank,
                     outputs, mean_over_outputs=False)

    def loss_per_row(self, y, y_pred):
        """The log loss of ``sigmoid(y_pred)``, one value per row."""
        y_pred = np.asarray(y_pred)
        return super().loss_per_row(y, (1 / (1 + np.exp(-y_pred))).astype(y_pred.dtype))


class _CrossEntropyOfSoftmax(CrossEntropyLearningLoss):
    """``CrossEntropyLearningLoss(from_logits=False)`` of ``softmax(z)``,
    computed from the logits ``z``: the loss of a graph ending with a
    Softmax, clipping included, for the training steps that stop the graph
    at the logits (``training_graphs.loss_on_logits``).

    The value is that of the clipped probabilities. With ``m_ij`` = 1 where
    ``p_ij`` lies inside the clipping bounds, 0 outside, the chain rule
    through the clipped log and the softmax's Jacobian gives, w.r.t. ``z``::

        Y_grad_ij = w_i (p_ij sum_c y_ic m_ic - y_ij m_ij) / sum(w)

    which is ``w_i (p_i - y_i) / sum(w)`` for one-hot targets when nothing
    is clipped; no Softmax VJP runs.
    """

    def _build(self, g, expected, predicted, weight, elem_type, rank, outputs):
        probabilities = g.op("Softmax", predicted, axis=1)
        p, inside = _clipped(g, probabilities, self.eps, elem_type)
        loss = g.op("Neg", g.op("Mul", expected, g.op("Log", p)))
        kept = g.op("Mul", expected, inside)
        mass = g.reduce_sum(kept, [1], keepdims=1)
        grad = g.op("Sub", g.op("Mul", probabilities, mass), kept)
        _reduce_rows(g, loss, grad, predicted, weight, elem_type, rank,
                     outputs, mean_over_outputs=False)

    def loss_per_row(self, y, y_pred):
        """The cross entropy of ``softmax(y_pred)``, one value per row."""
        y_pred = np.asarray(y_pred)
        shifted = y_pred - y_pred.max(axis=1, keepdims=True)
        p = np.exp(shifted)
        return super().loss_per_row(y, (p / p.sum(axis=1, keepdims=True)).astype(y_pred.dtype))


class PoissonLearningLoss(BaseLearningLoss):
    """Half Poisson deviance, as scikit-learn's MLPRegressor(loss='poisson').

    Parameters
    ----------
    eps : float, default=1e-12
        Predictions are floored at ``eps`` (at the smallest normal number of
        the element type when ``eps`` is below it).

    Notes
    -----
    With mu = max(y_hat, eps), counts y >= 0, weights w (default 1)::

        l      = y log(y / mu) - y + mu          (y log(y / mu) = 0 for y = 0)
        Y      = sum_i w_i sum_j l_ij / sum(w)
        Y_grad = w_i (1 - y_ij / mu_ij) / sum(w)  where y_hat >= eps, else 0

    ``Y`` is scikit-learn MLP's ``poisson_loss``
    (``np.average(xlogy(y, y / y_pred) - y + y_pred, weights=w,
    axis=0).sum()``, ``sklearn/neural_network/_base.py``: a sum over
    outputs), which is half ``sklearn.metrics.mean_poisson_deviance`` for
    one output. ``Y_grad`` is its exact derivative.
    """

    def __init__(self, eps=1e-12):
        self.eps = eps

    def _check_params(self):
        _check_eps("eps", self.eps, 1.0)

    def _build(self, g, expected, predicted, weight, elem_type, rank, outputs):
        lo, _ = _clip_bounds(self.eps, elem_type_to_numpy(elem_type))
        one = g.const(1.0, elem_type)
        mu = g.op("Max", predicted, g.const(lo, elem_type))
        inside = g.cast(g.op("Equal", mu, predicted), elem_type)
        ratio = g.op("Div", expected, mu)
        positive = g.op("Greater", expected, g.const(0.0, elem_type))
        xlogy = g.op("Mul", expected, g.op("Log", g.op("Where", positive, ratio, one)))
        loss = g.op("Add", g.op("Sub", xlogy, expected), mu)
        grad = g.op("Mul", g.op("Sub", one, ratio), inside)
        _reduce_rows(g, loss, grad, predicted, weight, elem_type, rank,
                     outputs, mean_over_outputs=False)

    def loss_per_row(self, y, y_pred):
        """Sum over outputs of ``y log(y / mu) - y + mu``, one value per row."""
        self._check_params()
        lo, _ = _clip_bounds(self.eps, _float_dtype(y_pred))
        y, y_pred = _rows_2d(y, y_pred)
        mu = np.maximum(y_pred, float(lo))
        xlogy = np.where(y > 0, y * np.log(np.where(y > 0, y, 1.0) / mu), 0.0)
        return (xlogy - y + mu).sum(axis=1)


_LOSSES = {
    "square_error": SquareLearningLoss, "square": SquareLearningLoss,
    "squared_error": SquareLearningLoss,
    "absolute_error": AbsoluteLearningLoss, "absolute": AbsoluteLearningLoss,
    "elastic_error": ElasticLearningLoss, "elastic": ElasticLearningLoss,
    "log": NegLogLearningLoss, "neglog": NegLogLearningLoss,
    "logloss": NegLogLearningLoss, "log_loss": NegLogLearningLoss,
    "cross_entropy": CrossEntropyLearningLoss,
    "poisson": PoissonLearningLoss,
}
_LOSSES.update({cls.__name__: cls for cls in set(_LOSSES.values())})


def resolve_learning_loss(value):
    """A new loss object from an alias, a class name or a loss object.

    Parameters
    ----------
    value : str or BaseLearningLoss
        'square_error' / 'square' / 'squared_error',
        'absolute_error' / 'absolute', 'elastic_error' / 'elastic',
        'log' / 'neglog' / 'logloss' / 'log_loss', 'cross_entropy',
        'poisson', a class name ('SquareLearningLoss'...), or a loss object
        (cloned).

    Raises
    ------
    ValueError
        Unknown name (the message lists the accepted ones).
    TypeError
        Neither a str nor a :class:`BaseLearningLoss`.
    """
    return resolve_named(value, _LOSSES, BaseLearningLoss, "learning_loss")
