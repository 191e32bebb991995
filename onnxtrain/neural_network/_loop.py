"""The training loop of :class:`~onnxtrain.estimators._base.BaseOrtGradientEstimator`
under scikit-learn MLP's conventions.

The MLP estimators hold one :class:`MLPTrainingLoop` (built at the first
fit from the layer sizes and the data) and train it with the base's loop:
epochs, batches, shuffling, early stopping, the stopping rule, the
'adaptive' schedule, partial_fit and pickling. This class only states where
scikit-learn's MLP differs from the base's defaults
(``sklearn/neural_network/_multilayer_perceptron.py``, ``_fit_stochastic``):

- the schedule's time step is the number of samples seen, ``t_``
  (``self._optimizer.iteration_ends(self.t_)``), and every fit starts at
  the initial rate (a fit builds a new optimizer);
- the epoch loss averages the batch losses weighted by their numbers of
  rows, even with sample weights;
- early stopping stratifies only single-output classification, refuses a
  validation set of fewer than 2 rows, and scores the validation rows with
  their sample weights: R² for regression, accuracy for classification;
- a warm-start fit zeroes the optimizer state and reseeds the generator,
  a partial_fit reseeds it (scikit-learn calls ``check_random_state`` at
  each call);
- a non-finite loss raises nothing here: the epoch where it happens ends
  training and is recorded as scikit-learn records it (its loss in the
  loss curve, a NaN validation score); the estimator then restores the best
  validation weights (early stopping) or raises scikit-learn's ValueError.
  onnxruntime's steps never commit non-finite weights, so training stops
  there rather than running on with NaN weights as scikit-learn does.
"""
from __future__ import annotations

import numpy as np
from onnx import helper
from sklearn.metrics import accuracy_score, r2_score
from sklearn.model_selection import train_test_split

from ..estimators._base import BaseOrtGradientEstimator
from ..estimators._validation import check_targets
from ..runtime.threads import with_session_threads
from ..training.loop import EpochLoop
from ._graph import OUTPUT_FUNCTIONS

__all__ = ["MLPTrainingLoop", "MLPEpochLoop", "decode_outputs"]


def decode_outputs(values, out_activation):
    """Class indices from probabilities or one-hot targets, as
    ``LabelBinarizer.inverse_transform`` reads them: argmax for 'softmax',
    ``values > 0.5`` otherwise ((n,) for one column, (n, k) indicators for
    multilabel)."""
    if out_activation == "softmax":
        return values.argmax(axis=1)
    indicator = (values > 0.5).astype(np.int64)
    return indicator.ravel() if indicator.shape[1] == 1 else indicator


def _same(objects, others):
    """Whether two lists of learning-rate / penalty objects (or None) have
    the same types and parameters."""
    return all(type(a) is type(b) and (a is None or a.get_params() == b.get_params())
               for a, b in zip(objects, others))


class MLPEpochLoop(EpochLoop):
    """:class:`~onnxtrain.training.loop.EpochLoop` under scikit-learn MLP's
    conventions (see the module's notes); the callbacks receive
    ``callback_owner``, the MLP estimator, when the loop has one."""

    def __init__(self, estimator, callbacks=(), incremental=False):
        super().__init__(estimator, callbacks, incremental)
        self.owner = getattr(estimator, "callback_owner", None) or estimator

    def notify(self, hook, *args):
        stop = False
        for callback in self.callbacks:
            if hasattr(self.owner, "_forget_layer_lists"):
                self.owner._forget_layer_lists()
            stop = bool(getattr(callback, hook)(self.owner, *args)) or stop
        return stop

    def per_batch_host_work(self):
        """scikit-learn's partial_fit changes the rate only at the end of a
        call (``iteration_ends(t_)``): only batch callbacks act between
        batches."""
        return "a callback acts between batches" if self.has_batch_hooks() else None

    def schedule_varies(self):
        return False  # the rate changes between epochs only, as scikit-learn's

    def schedule_time(self, epochs_ahead=0, n_samples=0):
        """Samples seen, ``t_`` (scikit-learn's ``iteration_ends(t_)``); 0 at
        the start of a fit, which scikit-learn begins at
        ``learning_rate_init`` with a new optimizer."""
        if self.estimator.n_iter_ == 0 and epochs_ahead == 0:
            return 0
        return self.estimator.t_ + epochs_ahead * n_samples

    def batch_rows(self, batch, sample_weight):
        """scikit-learn weighs a batch loss by its rows, even with weights
        (``accumulated_loss += batch_loss * (batch_slice.stop -
        batch_slice.start)``)."""
        return float(batch.stop - batch.start)

    def update_no_improvement(self, loss, X_val, y_val):
        est = self.estimator
        est._stopped = self.count_no_improvement(loss, X_val, y_val)
        if est.print_progress and est.early_stopping:
            print(f"Validation score: {est.validation_scores_[-1]:f}")
        return est._stopped

    def count_no_improvement(self, loss, X_val, y_val):
        """scikit-learn's ``_update_no_improvement_count`` with its
        comparisons, so that a NaN score or loss resets the count; True
        means stop."""
        est = self.estimator
        if est.early_stopping:
            score = est._validation_score(X_val, y_val)
            est.validation_scores_.append(score)
            worse = score < est.best_validation_score_ + est.tol
            if score > est.best_validation_score_:
                est.best_validation_score_ = score
                est._best_weights = est._trainer.engine.get_weights(
                    out=est._best_weights)
        else:
            worse = loss > est.best_loss_ - est.tol
            if loss < est.best_loss_:
                est.best_loss_ = loss
        est._no_improvement = est._no_improvement + 1 if worse else 0
        if est._no_improvement > est.n_iter_no_change:
            if est.learning_rate_.trigger_stopping():
                return True
            est._no_improvement = 0
        return False

    def non_finite(self, loss, epoch):
        """Record the loss that ended training at ``epoch`` (see the
        module's notes) and put back the weights at the start of that epoch
        when they were finite (the last steps may have left exploding ones);
        the estimator raises scikit-learn's error after training, or early
        stopping restores its best weights."""
        est = self.estimator
        kept = getattr(est, "_finite_weights", None)
        if kept is not None:
            est._trainer.set_weights(kept[0])
        self.rolled_back(kept)
        est._finite_weights = None
        est._diverged = float(loss)

    def report(self, bar, loss):
        if self.estimator.print_progress:
            print(f"Iteration {self.estimator.n_iter_}, loss = {loss:.8f}")


class MLPTrainingLoop(BaseOrtGradientEstimator):
    """Train an MLP's training graph as scikit-learn's MLP trains it.

    Not public: :class:`~onnxtrain.neural_network.MLPRegressor` and
    :class:`~onnxtrain.neural_network.MLPClassifier` build it, validate its
    parameters and data, and read its results.

    Parameters
    ----------
    model_onnx : onnx.ModelProto
        The training graph (:func:`~onnxtrain.neural_network._graph.training_graph`)
        whose initializers hold the initial weights.
    weights_to_train : list of str
        The coefficients and intercepts, in scikit-learn's draw order.
    learning_rate, learning_loss, learning_penalty : objects
        From :mod:`onnxtrain.optim`, :mod:`onnxtrain.losses`,
        :mod:`onnxtrain.penalties`.
    task : {'regression', 'classification'}
    out_activation : {'identity', 'exp', 'logistic', 'softmax'}
        scikit-learn's ``out_activation_``: how the validation score reads
        the graph's output.
    max_iter, batch_size, device, random_state, shuffle, early_stopping,
    validation_fraction, n_iter_no_change, tol
        As the base's; ``batch_size`` is an int (200 for 'auto', clipped to
        the number of rows), ``random_state`` the RandomState instance that
        drew the initial weights, ``tol`` a float.
    print_progress : bool, default=False
        Print scikit-learn's verbose lines ("Iteration %d, loss = %.8f").
    callbacks : list of Callback, default=None
        Called with ``callback_owner`` (the MLP estimator) or this loop.
    n_threads : int, default=None
        Threads of each session (:mod:`onnxtrain.runtime.threads`).
    """

    # What the base reads and the MLP fixes: the weights are the graph's
    # initializers (drawn by the estimator), every epoch is checked.
    _loop_class = MLPEpochLoop
    callback_owner = None  # the MLP estimator, given to the callbacks
    warm_start = True
    init = "model"
    training_optimizer_name = "SGDOptimizer"
    validation_every = 1
    verbose = 0
    enable_logging = False
    weight_name = None
    exc = True

    def __init__(self, model_onnx, weights_to_train, learning_rate=None,
                 learning_loss=None, learning_penalty=None, task="regression",
                 out_activation="identity", max_iter=200, batch_size=200,
                 device="cpu", random_state=None, shuffle=True,
                 early_stopping=False, validation_fraction=0.1,
                 n_iter_no_change=10, tol=1e-4, print_progress=False,
                 callbacks=None, n_threads=None):
        self.model_onnx = model_onnx
        self.weights_to_train = weights_to_train
        self.learning_rate = learning_rate
        self.learning_loss = learning_loss
        self.learning_penalty = learning_penalty
        self.task = task
        self.out_activation = out_activation
        self.max_iter = max_iter
        self.batch_size = batch_size
        self.device = device
        self.random_state = random_state
        self.shuffle = shuffle
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.tol = tol
        self.print_progress = print_progress
        self.callbacks = callbacks
        self.n_threads = n_threads

    # ------------------------------------------------------ base's hooks
    def _check_params(self):
        """The estimator validated everything (scikit-learn's constraints,
        which allow ``n_iter_no_change=np.inf``)."""

    def _stopping_tol(self):
        return float(self.tol)

    def _make_training_model(self, model):
        return model, model

    def _encode_targets(self, y, n_samples, classes, first, name="y"):
        """Targets arrive encoded (floats of shape (n, n_outputs))."""
        y = check_targets(y, n_samples, name, self._output_dtype())
        return y.reshape(-1, 1) if y.ndim == 1 else y

    def _output_dtype(self):
        """The graph's float type (that of its first weight)."""
        init = self.model_onnx.graph.initializer[0]
        return helper.tensor_dtype_to_np_dtype(init.data_type)

    def _stratify(self, y):
        """scikit-learn stratifies binary targets on its binarized y, a bool
        column (so its error messages name the classes 'True' / 'False')."""
        single = y.ndim == 1 or y.shape[1] == 1
        if self.task != "classification" or not single:
            return None
        return y.reshape(-1, 1).astype(bool)

    def _early_stopping_split(self, X, y, sample_weight):
        """scikit-learn's split: ``train_test_split`` on the same generator;
        the validation weights are kept for the validation score.

        Raises
        ------
        ValueError
            Fewer than 2 validation rows.
        """
        arrays = [X, y] + ([] if sample_weight is None else [sample_weight])
        parts = train_test_split(*arrays, random_state=self._rng,
                                 test_size=self.validation_fraction,
                                 stratify=self._stratify(y))
        if parts[1].shape[0] < 2:
            raise ValueError("The validation set is too small. Increase "
                             "'validation_fraction' or the size of your dataset.")
        weighted = sample_weight is not None
        self._validation_weight = parts[5] if weighted else None
        return parts[0], parts[1], parts[2], parts[3], (parts[4] if weighted else None)

    def _validation_score(self, X_val, y_val):
        """R² or accuracy of the validation rows (NaN when the predictions
        are not finite), as scikit-learn's ``_score``."""
        output = self._trainer.predict(X_val)
        if not np.isfinite(output).all():
            return np.nan
        weight = getattr(self, "_validation_weight", None)
        if self.task == "regression":
            return r2_score(y_val, output, sample_weight=weight)
        proba = OUTPUT_FUNCTIONS[self.out_activation](output)
        return accuracy_score(decode_outputs(y_val, self.out_activation),
                              decode_outputs(proba, self.out_activation),
                              sample_weight=weight)

    def _epochs(self, X, y, sample_weight, X_val, y_val, n_epochs, incremental):
        self._diverged = None
        if self.early_stopping and self._best_weights is None:
            # scikit-learn's best weights start as the initial ones
            self._best_weights = self._trainer.engine.get_weights()
        super()._epochs(X, y, sample_weight, X_val, y_val, n_epochs, incremental)
        if self._diverged is not None:  # the last epoch, as scikit-learn's
            self.train_losses_.append(self._diverged)
            self.n_iter_ += 1
            self.t_ += X.shape[0]
            if self.early_stopping:
                self.validation_scores_.append(np.nan)

    def _unusable_after_divergence(self, X, before):
        """Nothing here: the MLP estimator checks its predictions after a
        divergence (``_BaseMLP._check_finite``)."""
        return None

    @property
    def diverged(self):
        """Whether the last fit or partial_fit met a non-finite loss."""
        return getattr(self, "_diverged", None) is not None

    # ------------------------------------------------ for the estimators
    def fit(self, X, y, sample_weight=None):
        """Train on validated X and encoded y (n_samples, n_outputs)."""
        return self._fit(X, y, sample_weight)

    def partial_fit(self, X, y, sample_weight=None):
        """One epoch on validated X and encoded y."""
        return self._fit(X, y, sample_weight, incremental=True)

    @with_session_threads
    def restart(self, random_state, incremental=False, **params):
        """Prepare a later fit or partial_fit of the same network.

        scikit-learn's MLP calls ``check_random_state`` at each call, starts
        each call's epoch order from ``arange``, reads its parameters again
        and, for a fit (not a partial_fit), builds a new optimizer: zero
        velocities and moments, step 0, initial learning rate.

        Parameters
        ----------
        random_state : numpy.random.RandomState
        incremental : bool, default=False
            For a partial_fit: an update rule or penalty with new
            parameters takes effect at its first step, keeping the
            optimizer state when the rule keeps the same one; unchanged
            ones go on as they are.
        **params
            New values of this loop's parameters. With ``learning_rate``
            (a fit), the optimizer restarts; its update graph is rebuilt
            when the update rule or the penalty changed.
        """
        previous = (self.learning_rate, self.learning_penalty)
        if incremental and "learning_rate" in params and _same(
                previous, (params["learning_rate"], params["learning_penalty"])):
            params = {k: v for k, v in params.items()
                      if k not in ("learning_rate", "learning_penalty")}
        self.set_params(**params)
        self._rng = random_state
        self._order = None
        if self.early_stopping and self.validation_scores_ is None:
            self.validation_scores_, self.best_validation_score_ = [], -np.inf
        if "learning_rate" not in params or incremental:
            return  # a partial_fit's changed objects: BaseOrtGradientEstimator._prepare_fit
        if _same(previous, (self.learning_rate, self.learning_penalty)):
            self._ensure_trainer().reset_state()
        else:
            weights = self.get_state()
            model = self._training_model()
            self._resolve(model)
            self._trainer = self._new_trainer()
            self._trainer.set_weights(weights)
        self.learning_rate_.init_learning_rate()

    @with_session_threads
    def prepare(self):
        """Compile the graphs without training, for a full-batch solver
        (:meth:`loss_and_gradients`); nothing happens once compiled."""
        if not hasattr(self, "weights_to_train_"):
            self._start(self._training_model())
        return self

    @with_session_threads
    def loss_and_gradients(self, X, y, sample_weight=None):
        """Loss and weight gradients on every row of (X, y), in one forward
        and one backward pass (no penalty).

        Parameters
        ----------
        X : ndarray of shape (n_samples, n_features)
        y : ndarray of shape (n_samples, n_outputs)
            Validated and encoded, in the graph's dtype (as ``sample_weight``).
        sample_weight : ndarray of shape (n_samples,), default=None

        Returns
        -------
        loss : float
            scikit-learn's loss of the rows (``LOSS_FUNCTIONS``).
        gradients : list of ndarray
            One per weight (``weights_to_train_`` order): the gradient of
            that loss, scikit-learn's ``coef_grads`` and ``intercept_grads``
            with ``alpha=0``.
        """
        trainer = self._ensure_trainer()
        loss, grad = trainer.loss_and_gradient(X, y, sample_weight)
        gradients = trainer.engine.backward([grad])
        return float(loss.numpy()), [g.numpy().copy() for g in gradients]

    @with_session_threads
    def output(self, X):
        """The training graph's output for validated ``X``: ndarray of shape
        (n_samples, n_outputs)."""
        return self._ensure_trainer().predict(X)

    @property
    def stopped(self):
        """Whether the last epoch ended training by the stopping rule."""
        return getattr(self, "_stopped", False)
