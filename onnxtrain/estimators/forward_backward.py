"""``OrtGradientForwardBackwardOptimizer``: train the weights of a prediction
graph with gradients from :class:`~onnxtrain.OrtGradientForwardBackward`."""
from __future__ import annotations

import logging
import numbers
import warnings

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils import gen_batches
from sklearn.utils.validation import check_is_fitted
from tqdm.auto import tqdm

from ..exceptions import ConvergenceError, ConvergenceWarning
from ..graph import elem_type_to_numpy, infer_value_types
from ..initializers import glorot_uniform_weights
from ..losses import resolve_learning_loss
from ..models import load_model, replace_initializers, select_weights
from ..optim import resolve_learning_rate
from ..penalties import resolve_learning_penalty
from ..runtime import OrtGradientForwardBackward, SessionRunner, to_ortvalue
from ._validation import check_features, check_targets, validation_period

__all__ = ["OrtGradientForwardBackwardOptimizer"]

logger = logging.getLogger("onnxtrain")


class _Short:
    """Placeholder whose repr summarizes a model in ``__repr__``."""

    def __init__(self, text):
        self.text = text

    def __repr__(self):
        return self.text


class OrtGradientForwardBackwardOptimizer(RegressorMixin, BaseEstimator):
    """Train the initializers of an ONNX prediction graph by mini-batch SGD.

    The gradient graph is built by onnxtrain's own autodiff; the loss and its
    gradient dE/dY, and the weight update, are small ONNX graphs run by
    their own sessions; every tensor of the loop stays an OrtValue on
    ``device`` and only the loss value is copied to the host per batch.

    Parameters
    ----------
    model_onnx : onnx.ModelProto, bytes or str
        Prediction graph; its first output is the prediction. Never modified.
    weights_to_train : list of str, default=None
        Initializers to train. None: the float initializers that reach the
        output through differentiable ops (never integer tensors such as
        skl2onnx's ``shape_tensor`` nor rank-0 constants such as ``unity``).
    loss_output_name : str, default='loss'
        Kept for compatibility with onnxcustom (graphs whose loss is an
        output use ``OrtGradientOptimizer``); unused here.
    max_iter : int, default=100
        Number of epochs.
    training_optimizer_name : {'SGDOptimizer'}, default='SGDOptimizer'
    batch_size : int, default=10
        Rows per step, clipped to [1, n_samples]; the last batch of an epoch
        may be smaller and its gradient is the mean over its own rows.
    learning_rate : float, str or learning-rate object, default='SGD'
        A float x means ``LearningRateSGD(eta0=x)`` ('invscaling' schedule);
        'SGD' means ``LearningRateSGD()``.
    device : {'cpu', 'cuda', 'cuda:N'}, default='cpu'
    warm_start : bool, default=False
        False: every fit starts from weights drawn Glorot-uniform as
        scikit-learn's MLP draws them (``random_state``). True: from the
        weights of the previous fit, or the graph's initializers at first.
    verbose : int, default=0
        > 0: a tqdm progress bar over epochs; > 1: with loss and learning rate.
    validation_every : int or float, default=0.1
        With ``X_val``: validation loss every this many epochs (an int), or
        every ``max(1, int(validation_every * max_iter))`` epochs (a float < 1).
    learning_loss : str or loss object, default='square_error'
        'square_error' (alias 'square', 'squared_error') or a loss object.
    enable_logging : bool, default=False
        Log the loss of each epoch at INFO level on logger "onnxtrain".
    weight_name : str, default=None
        Name of the loss graph's sample-weight input (default 'weight').
    learning_penalty : None, str or penalty object, default=None
    exc : bool, default=True
        On a non-finite loss: raise ConvergenceError (True) or warn with a
        ConvergenceWarning and stop (False). The last finite weights are kept.
    random_state : int, RandomState instance or None, default=None
        Seeds the initial weights.

    Attributes
    ----------
    weights_to_train_ : list of str
    train_losses_ : list of float
        One loss per epoch: the mean of the batch losses weighted by their
        rows (or sample weights), comparable to ``MLPRegressor.loss_curve_``.
    validation_losses_ : list of float or None
        Loss on every row of ``X_val``, in order, every ``validation_every``
        epochs; None without ``X_val``.
    n_iter_ : int
        Epochs run by the last fit.
    t_ : int
        Samples seen since the weights were initialized.
    n_features_in_ : int
    train_session_ : OrtGradientForwardBackward
        The engine (rebuilt lazily after unpickling).
    learning_rate, learning_loss, learning_penalty
        After fit, the resolved objects (copies: objects you passed are not
        modified), holding ``axpy_onnx_`` and ``loss_grad_onnx_`` as the
        original onnxcustom estimator exposed them.

    Raises
    ------
    ValueError, TypeError
        Invalid parameters or data, raised by ``fit`` before any step.
    ConvergenceError
        A non-finite loss while ``exc=True``.
    """

    def __init__(self, model_onnx, weights_to_train=None, loss_output_name="loss",
                 max_iter=100, training_optimizer_name="SGDOptimizer",
                 batch_size=10, learning_rate="SGD", device="cpu",
                 warm_start=False, verbose=0, validation_every=0.1,
                 learning_loss="square_error", enable_logging=False,
                 weight_name=None, learning_penalty=None, exc=True,
                 random_state=None):
        self.model_onnx = model_onnx
        self.weights_to_train = weights_to_train
        self.loss_output_name = loss_output_name
        self.max_iter = max_iter
        self.training_optimizer_name = training_optimizer_name
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.device = device
        self.warm_start = warm_start
        self.verbose = verbose
        self.validation_every = validation_every
        self.learning_loss = learning_loss
        self.enable_logging = enable_logging
        self.weight_name = weight_name
        self.learning_penalty = learning_penalty
        self.exc = exc
        self.random_state = random_state

    # ------------------------------------------------------------------ repr
    def __repr__(self, N_CHAR_MAX=700):
        params = self.get_params(deep=False)
        model = params["model_onnx"]
        if hasattr(model, "graph"):
            params["model_onnx"] = _Short(
                f"<ModelProto {model.graph.name!r}: {len(model.graph.node)} nodes>")
        shown = ", ".join(f"{k}={v!r}" for k, v in params.items())
        return f"{type(self).__name__}({shown})"

    # ------------------------------------------------------------ validation
    def _check_params(self):
        def positive_int(name):
            value = getattr(self, name)
            if not isinstance(value, numbers.Integral) or isinstance(value, bool) \
                    or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}.")

        positive_int("max_iter")
        positive_int("batch_size")
        if self.training_optimizer_name != "SGDOptimizer":
            raise ValueError("training_optimizer_name must be 'SGDOptimizer', got "
                             f"{self.training_optimizer_name!r}.")
        validation_period(self.validation_every, self.max_iter)

    def _resolve(self, model, weighted):
        """Resolve weights, loss, learning rate, penalty; build small graphs
        (the loss graph takes sample weights when ``weighted``)."""
        self.weights_to_train_ = select_weights(model, self.weights_to_train)
        learning_rate = resolve_learning_rate(self.learning_rate)
        learning_loss = resolve_learning_loss(self.learning_loss)
        learning_penalty = resolve_learning_penalty(self.learning_penalty)
        types = infer_value_types(model)
        out_type, out_shape = types[model.graph.output[0].name]
        self._elem_type = out_type
        self._output_rank = 2 if out_shape is None else len(out_shape)
        opset = 17
        shapes = [(w, types[w][1]) for w in self.weights_to_train_]
        learning_rate.build_onnx(shapes, out_type, opset)
        learning_loss.build_onnx(
            out_type, opset, weight_name=self._weight_input() if weighted else None,
            rank=self._output_rank)
        self._weighted = weighted
        return learning_rate, learning_loss, learning_penalty

    def _weight_input(self):
        return self.weight_name or "weight"

    # -------------------------------------------------------------- sessions
    def _compile(self, model, learning_rate, learning_loss):
        engine = OrtGradientForwardBackward(model, self.weights_to_train_,
                                            device=self.device)
        self._engine = engine
        self._loss_runner = SessionRunner(learning_loss.loss_grad_onnx_, engine.device)
        self._update_runner = SessionRunner(learning_rate.axpy_onnx_, engine.device)
        return engine

    def _initial_weights(self, model, engine, first_fit):
        if self.warm_start and not first_fit:
            return  # continue from the previous fit's weights
        if self.warm_start:
            return  # the graph's own initializers, already in the engine
        drawn = glorot_uniform_weights(model, self.weights_to_train_,
                                       self.random_state)
        engine.set_weights(drawn)

    # ------------------------------------------------------------------- fit
    def fit(self, X, y, sample_weight=None, X_val=None, y_val=None):
        """Train the weights.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Numeric; cast to the graph input's element type.
        y : array-like of shape (n_samples,) or (n_samples, n_outputs)
            Numeric (integers accepted); cast to the prediction's type.
        sample_weight : array-like of shape (n_samples,), default=None
        X_val, y_val : array-like, default=None
            Validation data for ``validation_losses_``.

        Returns
        -------
        self

        Raises
        ------
        ValueError
            Bad parameter, data of the wrong shape, NaN/inf, negative weights.
        TypeError
            Non-numeric (e.g. object dtype) data.
        ConvergenceError
            A non-finite loss with ``exc=True``.
        """
        self._check_params()
        model = load_model(self.model_onnx)
        X, y, sample_weight, X_val, y_val = self._validate_fit_data(
            model, X, y, sample_weight, X_val, y_val)
        learning_rate, learning_loss, learning_penalty = self._resolve(
            model, sample_weight is not None)
        first_fit = not hasattr(self, "train_losses_")
        if first_fit or not self.warm_start:
            engine = self._compile(model, learning_rate, learning_loss)
            self.t_ = 0
        else:
            engine = self._ensure_engine()
            self._loss_runner = SessionRunner(learning_loss.loss_grad_onnx_,
                                              engine.device)
            self._update_runner = SessionRunner(learning_rate.axpy_onnx_,
                                                engine.device)
        self._initial_weights(model, engine, first_fit)
        self.learning_rate, self.learning_loss = learning_rate, learning_loss
        self.learning_penalty = learning_penalty
        self._train(X, y, sample_weight, X_val, y_val)
        return self

    def _validate_fit_data(self, model, X, y, sample_weight, X_val, y_val):
        X = check_features(model, X, "X")
        y = check_targets(y, X.shape[0], "y", self._prediction_dtype(model))
        if sample_weight is not None:
            sample_weight = check_targets(sample_weight, X.shape[0],
                                          "sample_weight", y.dtype, ndim=1)
            if (sample_weight < 0).any():
                raise ValueError("sample_weight has negative values.")
            if not sample_weight.sum() > 0:
                raise ValueError("sample_weight sums to zero: nothing to train on.")
        if (X_val is None) != (y_val is None):
            raise ValueError("X_val and y_val must be given together.")
        if X_val is not None:
            X_val = check_features(model, X_val, "X_val")
            y_val = check_targets(y_val, X_val.shape[0], "y_val", y.dtype)
        self.n_features_in_ = X.shape[1]
        self._y_ndim = y.ndim
        return X, y, sample_weight, X_val, y_val

    @staticmethod
    def _prediction_dtype(model):
        types = infer_value_types(model)
        return elem_type_to_numpy(types[model.graph.output[0].name][0])

    def _as_prediction_shape(self, y):
        """Targets shaped like the prediction: (n,) -> (n, 1) for a 2-D output."""
        if self._output_rank == 2 and y.ndim == 1:
            return y.reshape(-1, 1)
        if self._output_rank == 1 and y.ndim == 2 and y.shape[1] == 1:
            return y.reshape(-1)
        return y

    # ------------------------------------------------------------ the loop
    def _train(self, X, y, sample_weight, X_val, y_val):
        y = self._as_prediction_shape(y)
        y_val = None if y_val is None else self._as_prediction_shape(y_val)
        n_samples = X.shape[0]
        batch_size = int(np.clip(self.batch_size, 1, n_samples))
        period = validation_period(self.validation_every, self.max_iter)
        self.train_losses_, self.n_iter_ = [], 0
        self.learning_rate.init_learning_rate()
        self.validation_losses_ = [] if X_val is not None else None
        bar = tqdm(range(self.max_iter), disable=not self.verbose,
                   desc=type(self).__name__)
        for epoch in bar:
            loss = self._run_epoch(X, y, sample_weight, batch_size)
            if loss is None:
                break
            self.train_losses_.append(loss)
            self.n_iter_ += 1
            self.t_ += n_samples
            self.learning_rate.update_learning_rate(self.n_iter_)
            if X_val is not None and (epoch + 1) % period == 0:
                self.validation_losses_.append(self._dataset_loss(X_val, y_val))
            self._report(bar, epoch, loss)

    def _report(self, bar, epoch, loss):
        if self.verbose > 1:
            bar.set_postfix(loss=f"{loss:.6g}", lr=f"{self.learning_rate.value:.3g}")
        if self.enable_logging:
            logger.info("epoch %d loss=%r lr=%r", epoch + 1, loss,
                        self.learning_rate.value)

    def _run_epoch(self, X, y, sample_weight, batch_size):
        """One pass over the data in order; returns the epoch loss, or None
        when a non-finite loss stopped training (``exc=False``)."""
        alpha = to_ortvalue(np.array(-self.learning_rate.value, dtype=y.dtype),
                            self._engine.device)
        total, weight_total = 0.0, 0.0
        for batch in gen_batches(X.shape[0], batch_size):
            wb = None if sample_weight is None else sample_weight[batch]
            if wb is not None and not wb.any():
                continue  # no weight: no loss, no gradient (the mean is 0 / 0)
            loss = self._train_step(X[batch], y[batch], wb, alpha)
            if not np.isfinite(loss):
                self._non_finite(loss)
                return None
            rows = float(batch.stop - batch.start) if wb is None else float(wb.sum())
            total += loss * rows
            weight_total += rows
        return total / weight_total

    def _train_step(self, X_batch, y_batch, w_batch, alpha):
        """Forward, loss and dE/dY, backward, update; returns the batch loss."""
        engine = self._engine
        prediction = engine.forward([X_batch], training=True)[0]
        feeds = {"X1": y_batch, "X2": prediction}
        if w_batch is not None:
            feeds[self._weight_input()] = w_batch
        loss, grad = self._loss_runner(feeds)
        loss = float(loss.numpy())
        if not np.isfinite(loss):
            return loss
        grads = engine.backward([grad])
        feeds = {"alpha": alpha}
        feeds.update(zip(engine.weights_to_train, engine.weights))
        feeds.update((f"{w}_grad", g) for w, g in zip(engine.weights_to_train, grads))
        self._previous_weights = engine.weights
        engine.weights = self._update_runner(feeds)
        return loss

    def _non_finite(self, loss):
        """Keep the last finite weights, then raise or warn."""
        engine = self._engine
        if not all(np.isfinite(w).all() for w in engine.get_weights()):
            engine.weights = self._previous_weights
        message = (f"The loss became {loss} at epoch {self.n_iter_ + 1}; the "
                   "last finite weights are kept. Lower the learning rate.")
        if self.exc:
            raise ConvergenceError(message)
        warnings.warn(message, ConvergenceWarning)

    def _dataset_loss(self, X, y):
        """Loss on every row of (X, y), in one pass, in order."""
        prediction = self._engine.forward([X], training=False)[0]
        feeds = {"X1": y, "X2": prediction}
        if self._weighted:
            feeds[self._weight_input()] = np.ones(y.shape[0], dtype=y.dtype)
        loss, _ = self._loss_runner(feeds)
        return float(loss.numpy())

    # ------------------------------------------------------------ inference
    def _ensure_engine(self):
        check_is_fitted(self, "train_losses_")
        if getattr(self, "_engine", None) is None:
            model = load_model(self.model_onnx)
            engine = OrtGradientForwardBackward(model, self.weights_to_train_,
                                                device=self.device)
            engine.set_weights(self._pickled_weights)
            self._engine = engine
            self._loss_runner = SessionRunner(
                self.learning_loss.loss_grad_onnx_, engine.device)
            self._update_runner = SessionRunner(
                self.learning_rate.axpy_onnx_, engine.device)
        return self._engine

    @property
    def train_session_(self):
        """The :class:`OrtGradientForwardBackward` engine of the fitted model."""
        return self._ensure_engine()

    def predict(self, X):
        """Predictions of the trained graph.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,) or (n_samples, n_outputs)
            The shape of ``y`` seen in fit, in the prediction's dtype.
        """
        engine = self._ensure_engine()
        X = check_features(load_model(self.model_onnx), X, "X")
        prediction = engine.forward([X], training=False)[0].numpy()
        if self._y_ndim == 1 and prediction.ndim == 2 and prediction.shape[1] == 1:
            return prediction.reshape(-1)
        if self._y_ndim == 2 and prediction.ndim == 1:
            return prediction.reshape(-1, 1)
        return prediction

    def losses(self, X, y):
        """Loss of every row of (X, y), in order: ndarray of shape (n_samples,)."""
        prediction = self.predict(X)
        y = check_targets(y, prediction.shape[0], "y", prediction.dtype)
        return self.learning_loss.loss_per_row(y, prediction)

    # ----------------------------------------------------------------- state
    def get_state(self):
        """The trained weights: list of ndarray in ``weights_to_train_`` order."""
        return self._ensure_engine().get_weights()

    def set_state(self, state):
        """Replace the trained weights (list, or dict name -> array).

        Raises
        ------
        ValueError
            Wrong number of tensors, unknown names or shapes.
        """
        self._ensure_engine().set_weights(state)
        return self

    def get_trained_onnx(self, model=None):
        """The prediction graph with the trained weights as initializers.

        Parameters
        ----------
        model : onnx.ModelProto, default=None
            Graph to fill (default: ``model_onnx``); not modified.

        Returns
        -------
        onnx.ModelProto
        """
        engine = self._ensure_engine()
        base = load_model(self.model_onnx if model is None else model)
        return replace_initializers(
            base, dict(zip(engine.weights_to_train, engine.get_weights())))

    def __getstate__(self):
        state = self.__dict__.copy()
        engine = state.pop("_engine", None)
        for key in ("_loss_runner", "_update_runner", "_previous_weights"):
            state.pop(key, None)
        if engine is not None:
            state["_pickled_weights"] = engine.get_weights()
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._engine = None
