"""What the forward/backward estimators share: parameters, the training loop
(epochs, batches, validation, stopping), state and pickling."""
from __future__ import annotations

import logging
import numbers
import threading
import warnings

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.exceptions import NotFittedError
from sklearn.model_selection import train_test_split
from sklearn.utils import check_random_state, gen_batches
from sklearn.utils.validation import _check_feature_names, check_is_fitted
from tqdm.auto import tqdm

from .._small import full_repr
from ..exceptions import ConvergenceError, ConvergenceWarning
from ..graph import elem_type_to_numpy, infer_value_types
from ..initializers import bias_weights, glorot_uniform_weights
from ..losses import resolve_learning_loss
from ..models import load_model, replace_initializers, select_weights
from ..optim import resolve_learning_rate
from ..penalties import resolve_learning_penalty
from ..runtime.engine import check_weight_names
from ..training_mode import inference_mode
from ._trainer import Trainer
from ._inputs import (GraphInputs, check_batch_dimension, check_features,
                      data_inputs)
from ._validation import check_sample_weight, validation_period

__all__ = ["BaseOrtGradientEstimator"]

logger = logging.getLogger("onnxtrain")
_OPSET = 17
#: 'auto' trains with the fused step rather than the in-graph loop when the
#: weights and optimizer state take more than this many bytes: the Loop holds
#: about three more copies of them (W3 of benchmarks/bench_training.py,
#: 5.4 MB of weights and velocities: the fits peak at 49-51 MB with the loop,
#: 34-39 MB with the fused step, over two runs), which its speed (1.1x-1.2x
#: the fused step on W3) does not pay for on big models.
LOOP_MAX_PARAMETER_BYTES = 64 * 2 ** 20
#: Held while an unpickled estimator rebuilds its trainer, so that threads
#: predicting at once build it once (estimators hold no lock: they pickle).
_TRAINER_LOCK = threading.Lock()


class _Short:
    """Placeholder whose repr summarizes a model in ``__repr__``."""

    def __init__(self, text):
        self.text = text

    def __repr__(self):
        return self.text


class BaseOrtGradientEstimator(BaseEstimator):
    """Base of the estimators training a graph with the forward/backward
    engine. Subclasses define the training graph, the target encoding and
    the validation score."""

    _default_loss = "square_error"

    # ---------------------------------------------------------------- repr
    def __repr__(self, N_CHAR_MAX=700):
        params = self.get_params(deep=False)
        model = params["model_onnx"]
        if hasattr(model, "graph"):
            params["model_onnx"] = _Short(
                f"<ModelProto {model.graph.name!r}: {len(model.graph.node)} nodes>")
        return full_repr(self, params)

    # --------------------------------------------------------- parameters
    def _check_params(self):
        for name in ("max_iter", "batch_size", "n_iter_no_change"):
            value = getattr(self, name)
            if not isinstance(value, numbers.Integral) or isinstance(value, bool) \
                    or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}.")
        if self.training_optimizer_name != "SGDOptimizer":
            raise ValueError("training_optimizer_name must be 'SGDOptimizer', got "
                             f"{self.training_optimizer_name!r}.")
        validation_period(self.validation_every, self.max_iter)
        if not 0 < self.validation_fraction < 1:
            raise ValueError("validation_fraction must be in (0, 1), got "
                             f"{self.validation_fraction!r}.")
        if self.tol is not None and not (isinstance(self.tol, numbers.Real)
                                         and self.tol >= 0):
            raise ValueError(f"tol must be None or a float >= 0, got {self.tol!r}.")
        self._check_run_params()

    def _check_run_params(self):
        """What ``fit`` would otherwise find only after drawing the weights:
        the learning rate (the object a warm refit reuses too), the training
        path and the type of ``weights_to_train``."""
        resolve_learning_rate(self.learning_rate)
        path = getattr(self, "training_path", "auto")
        if path not in self._PATHS:
            raise ValueError(f"training_path must be one of {self._PATHS}, got "
                             f"{path!r}.")
        check_weight_names(self.weights_to_train)

    def _stopping_tol(self):
        """tol=None: no stopping, except early stopping and the 'adaptive'
        schedule, which use scikit-learn's default 1e-4."""
        if self.tol is not None:
            return float(self.tol)
        adaptive = getattr(self.learning_rate_, "learning_rate", None) == "adaptive"
        return 1e-4 if (self.early_stopping or adaptive) else None

    def _weight_input(self):
        return self.weight_name or "weight"

    # ------------------------------------------------------ training graph
    def _training_model(self):
        """The graph trained (cached while ``model_onnx`` stays the same)."""
        cached = getattr(self, "_model_cache", None)
        if cached is None or cached[0] is not self.model_onnx:
            full, training = self._make_training_model(load_model(self.model_onnx))
            cached = self._model_cache = (self.model_onnx, training, full, {})
        return cached[1]

    def _float_dtype(self):
        """numpy dtype of the training's floats (learning rate, sample
        weights): the graph's first output's, the prediction or the loss of a
        graph computing its own (whose targets may be integer labels)."""
        return prediction_dtype(self._training_model(), self._training_types())

    def _training_types(self):
        """:func:`~onnxtrain.graph.infer_value_types` of the graph trained,
        cached with it: shape inference would otherwise run at every
        ``fit``, ``predict`` and ``score`` call."""
        model = self._training_model()
        types = self._model_cache[3]
        if not types:
            types.update(infer_value_types(model))
        return types

    def _feature_inputs(self, model):
        """The graph inputs ``X`` feeds: every input that is not an
        initializer (one array, or a dict of arrays for several)."""
        return data_inputs(model)

    def _make_training_model(self, model):
        """(model after rewrites, graph trained): subclasses choose."""
        raise NotImplementedError

    def _resolve(self, model):
        """Weights, learning rate, loss, penalty and the small graphs. The
        loss comes first: one that does not fit the graph raises before any
        graph is built."""
        resolved = resolve_learning_loss(self.learning_loss or self._default_loss)
        loss = self._adapt_loss(resolved)
        types = infer_value_types(model)
        self.weights_to_train_ = select_weights(model, self.weights_to_train)
        learning_rate = resolve_learning_rate(self.learning_rate)
        penalty = resolve_learning_penalty(self.learning_penalty)
        out_type, out_shape = types[model.graph.output[0].name]
        self._elem_type = out_type
        self._output_rank = 2 if out_shape is None else len(out_shape)
        penalized = set(self.weights_to_train_)
        if getattr(penalty, "exclude_bias", True):
            penalized -= set(bias_weights(model, self.weights_to_train_))
        learning_rate.build_onnx([(w, types[w][1]) for w in self.weights_to_train_],
                                 out_type, _OPSET, penalty, penalized)
        self._loss_models = self._build_loss_models(loss, out_type)
        self._fused_spec = None if self._loss_models is None else {
            "loss": loss, "penalty": penalty, "penalized": penalized,
            "shapes": {w: types[w][1] for w in self.weights_to_train_},
            "elem_type": out_type, "rank": self._output_rank}
        self.learning_rate_, self.learning_loss_ = learning_rate, loss
        self.learning_penalty_ = penalty
        self._resolved_loss = resolved  # what fit publishes as learning_loss

    def _adapt_loss(self, loss):
        """The loss trained on this graph, from the one resolved from
        ``learning_loss`` (never modified: a subclass adapting it returns a
        new object). Raises ValueError when they cannot go together."""
        return loss

    def _build_loss_models(self, loss, elem_type):
        """(unweighted, weighted) loss graphs; ``loss.loss_grad_onnx_`` ends
        as the unweighted one."""
        weighted = loss.build_onnx(elem_type, _OPSET, weight_name=self._weight_input(),
                                   rank=self._output_rank)
        return loss.build_onnx(elem_type, _OPSET, rank=self._output_rank), weighted

    def _new_trainer(self, model):
        return Trainer(model, self.weights_to_train_, self.device,
                       self._loss_models, self.learning_rate_.axpy_onnx_,
                       self.learning_rate_, self._weight_input(),
                       self._fused_spec)

    def _model_changed(self):
        """True when ``model_onnx`` is no longer the model of the last fit
        (replaced by set_params with another object of other content)."""
        fitted = getattr(self, "_fitted_model_onnx", None)
        if fitted is None or fitted is self.model_onnx:
            return False
        if type(fitted) is type(self.model_onnx) and fitted == self.model_onnx:
            self._fitted_model_onnx = self.model_onnx  # an equal copy
            return False
        return True

    def _ensure_trainer(self):
        """The trainer, rebuilt from numpy copies after unpickling.

        Raises
        ------
        sklearn.exceptions.NotFittedError
            Before fit, or when ``model_onnx`` changed since the last fit.
        """
        check_is_fitted(self, "weights_to_train_")
        if self._model_changed():
            raise NotFittedError(
                f"model_onnx changed since this {type(self).__name__} was "
                "fitted (set_params): its weights belong to the previous model. "
                "Call 'fit' again before using this estimator.")
        if getattr(self, "_trainer", None) is None:
            with _TRAINER_LOCK:
                if getattr(self, "_trainer", None) is None:
                    trainer = self._new_trainer(self._training_model())
                    trainer.engine.set_weights(self._pickled["weights"])
                    trainer.set_state(self._pickled["state"],
                                      self._pickled["steps"])
                    trainer.set_buffers(self._pickled.get("buffers"))
                    self._trainer = trainer
        return self._trainer

    # --------------------------------------------------------------- fit
    def _fit(self, X, y, sample_weight=None, X_val=None, y_val=None,
             classes=None, incremental=False):
        """The one code path of fit and partial_fit. An error raised before
        the first step (parameters, data, a loss that does not fit the
        graph) leaves the estimator as it was: its parameters, its fitted
        state or the absence of one."""
        before = self.__dict__.copy()
        try:
            X, y, sample_weight, X_val, y_val = self._prepare_fit(
                X, y, sample_weight, X_val, y_val, classes, incremental)
        except BaseException:
            self.__dict__.clear()
            self.__dict__.update(before)
            raise
        self._epochs(X, y, sample_weight, X_val, y_val,
                     1 if incremental else self.max_iter, incremental)
        return self

    def _prepare_fit(self, X, y, sample_weight, X_val, y_val, classes,
                     incremental):
        """Everything before the first step: validation, resolution, the
        trainer, :meth:`_check_start`, the early-stopping split, then the
        published parameters. Returns the data to train on."""
        self._check_params()
        model = self._training_model()
        first = not hasattr(self, "weights_to_train_") or (
            not incremental and not self.warm_start) or self._model_changed()
        X, y, sample_weight = self._validate_data_for_fit(
            model, X, y, sample_weight, classes, first)
        X_val, y_val = self._validate_validation(model, X_val, y_val)
        self._check_batch_dimension(model, X.shape[0])
        restart = not first and not incremental and self._objects_changed()
        if first:
            self._start(model)
        else:
            self._ensure_trainer()
            if restart:
                self._restart_keeping_weights(model)
        if first or restart:
            self._check_start(X[:int(np.clip(self.batch_size, 1, len(X)))])
        if self.early_stopping and not incremental:
            X, X_val, y, y_val, sample_weight = self._early_stopping_split(
                X, y, sample_weight)
        # a path that cannot run raises here, not after the weights changed
        self._choose_path(sample_weight, int(np.clip(self.batch_size, 1, len(X))))
        if not (first or restart or incremental):
            # a new fit starts a new optimizer, as scikit-learn's warm start
            self._trainer.reset_state()  # does (last: nothing fails after)
        self._publish_objects()
        return X, y, sample_weight, X_val, y_val

    def _check_batch_dimension(self, model, n_samples):
        """Refuse, before any step, a graph whose fixed batch dimension the
        batches of this fit do not have (an export without dynamic axes)."""
        size = int(np.clip(self.batch_size, 1, n_samples))
        sizes = {size} | ({n_samples % size} if n_samples % size else set())
        check_batch_dimension(model, sizes, self._feature_inputs(model),
                              self._training_types())

    def _check_start(self, X):
        """Called with the first rows of a fit once the loss is (re)resolved
        and the trainer holds the weights training starts from, before any
        step: subclasses raise to refuse the fit."""

    def _start(self, model):
        """First fit: resolve everything, draw or read the initial weights."""
        self._rng = check_random_state(self.random_state)
        self._resolve(model)
        self._fitted_model_onnx = self.model_onnx
        self._trainer = self._new_trainer(model)
        if not self.warm_start and from_scikit_learn(load_model(self.model_onnx)):
            self._trainer.engine.set_weights(glorot_uniform_weights(
                model, self.weights_to_train_, self._rng))
        self.t_ = 0
        self.train_losses_ = []
        self.n_iter_ = 0
        self.validation_losses_ = None
        self.validation_scores_ = [] if self.early_stopping else None
        self.best_validation_score_ = -np.inf if self.early_stopping else None
        self.best_loss_ = np.inf
        self._no_improvement = 0
        self._best_weights = None
        self._order = None
        self.learning_rate_.init_learning_rate()

    def _objects_changed(self):
        """True when set_params replaced the learning rate, loss or penalty
        since the last fit (fit publishes the resolved objects there; the
        loss published is the one resolved from the parameter, which
        ``learning_loss_`` may hold adapted to the graph)."""
        published = (self.learning_rate_,
                     # estimators pickled before _resolved_loss published learning_loss_
                     getattr(self, "_resolved_loss", self.learning_loss_),
                     self.learning_penalty_)
        current = (self.learning_rate, self.learning_loss, self.learning_penalty)
        return any(a is not b for a, b in zip(current, published))

    def _restart_keeping_weights(self, model):
        """Resolve the new objects and rebuild the trainer on the current
        weights (a warm start after set_params)."""
        weights = self._trainer.engine.get_weights()
        buffers = self._trainer.get_buffers()
        self._resolve(model)
        self._trainer = self._new_trainer(model)
        self._trainer.engine.set_weights(weights)
        self._trainer.set_buffers(buffers)
        self.learning_rate_.init_learning_rate()

    def _publish_objects(self):
        """The seed reads ``est.learning_rate.axpy_onnx_`` and
        ``est.learning_loss.loss_grad_onnx_``: after fit those parameters
        hold the resolved objects (copies; the caller's are not modified).
        ``learning_loss`` gets the loss resolved from the parameter, not its
        adaptation to the graph (``learning_loss_``), so that a later fit on
        another graph (``set_params(model_onnx=...)``) or a clone adapts it
        anew."""
        self.learning_rate = self.learning_rate_
        self.learning_loss = getattr(self, "_resolved_loss", self.learning_loss_)
        self.learning_penalty = self.learning_penalty_

    def _validate_data_for_fit(self, model, X, y, sample_weight, classes, first):
        _check_feature_names(self, X, reset=first)  # feature_names_in_
        X = check_features(model, X, "X", self._training_types(),
                           self._feature_inputs(model))
        y = self._encode_targets(y, X.shape[0], classes, first)
        if sample_weight is not None:
            sample_weight = check_sample_weight(sample_weight, X.shape[0],
                                                self._float_dtype())
            if (sample_weight < 0).any():
                raise ValueError("sample_weight has negative values.")
            if not sample_weight.sum() > 0:
                raise ValueError("sample_weight sums to zero: nothing to train on.")
        if not isinstance(X, GraphInputs):
            self.n_features_in_ = X.shape[1]
        return X, y, sample_weight

    def _validate_validation(self, model, X_val, y_val):
        if (X_val is None) != (y_val is None):
            raise ValueError("X_val and y_val must be given together.")
        if X_val is None:
            return None, None
        X_val = check_features(model, X_val, "X_val", self._training_types(),
                               self._feature_inputs(model))
        return X_val, self._encode_targets(y_val, X_val.shape[0], None, False,
                                           name="y_val")

    def _early_stopping_split(self, X, y, sample_weight):
        stratify = self._stratify(y)
        arrays = [X, y] + ([] if sample_weight is None else [sample_weight])
        parts = train_test_split(*arrays, random_state=self._rng,
                                 test_size=self.validation_fraction,
                                 stratify=stratify)
        X, X_val, y, y_val = parts[:4]
        return X, X_val, y, y_val, (parts[4] if sample_weight is not None else None)

    def _stratify(self, y):
        return None

    # ------------------------------------------------------------ the loop
    def _epochs(self, X, y, sample_weight, X_val, y_val, n_epochs, incremental):
        n_samples = X.shape[0]
        batch_size = int(np.clip(self.batch_size, 1, n_samples))
        period = 1 if self.early_stopping else validation_period(
            self.validation_every, self.max_iter)
        if not incremental:
            self.train_losses_, self.n_iter_ = [], 0
            self.learning_rate_.update_learning_rate(self._schedule_time())
        if X_val is not None and self.validation_losses_ is None:
            self.validation_losses_ = []
        path = self._choose_path(sample_weight, batch_size)
        self.training_path_ = path
        chunk = n_epochs if path == "loop" and self._one_run_allowed(
            X_val, incremental) else 1
        bar = tqdm(total=n_epochs, disable=not self.verbose,
                   desc=type(self).__name__)
        done = 0
        while done < n_epochs:
            losses = self._run_epochs(path, X, y, sample_weight, batch_size,
                                      min(chunk, n_epochs - done))
            stop = losses is None or len(losses) < min(chunk, n_epochs - done)
            for loss in losses or ():
                stop = self._end_of_epoch(loss, X_val, y_val, period, n_samples,
                                          bar) or stop
            done += chunk
            if stop:
                break
        bar.close()
        self._finite_weights = None  # a copy kept only during the epochs
        if self.early_stopping and self._best_weights is not None:
            self._trainer.engine.set_weights(self._best_weights)
            self._trainer.set_buffers(getattr(self, "_best_buffers", None))

    def _end_of_epoch(self, loss, X_val, y_val, period, n_samples, bar):
        """Record an epoch; returns True to stop."""
        self.train_losses_.append(loss)
        self.n_iter_ += 1
        self.t_ += n_samples
        if X_val is not None and self.n_iter_ % period == 0:
            self.validation_losses_.append(self._trainer.dataset_loss(X_val, y_val))
        bar.update(1)
        self._report(bar, loss)
        stop = self._update_no_improvement(loss, X_val, y_val)
        self.learning_rate_.update_learning_rate(self._schedule_time())
        return stop

    def _schedule_time(self, epochs_ahead=0, n_samples=0):
        """Time step of the learning-rate schedule ``epochs_ahead`` epochs
        from now: epochs completed (onnxcustom's convention)."""
        return self.n_iter_ + epochs_ahead

    # ----------------------------------------------------- execution paths
    _PATHS = ("auto", "split", "fused", "loop")

    def _choose_path(self, sample_weight, batch_size):
        """'split' (the seed's: four graphs per step), 'fused' (one graph
        per step) or 'loop' (an ONNX Loop over the batches): the requested
        one, or with 'auto' the fastest available: the loop, unless the
        parameters exceed :data:`LOOP_MAX_PARAMETER_BYTES` (its extra copies
        of them) or a batch has zero weight; the split path when the model
        cannot be fused."""
        path = getattr(self, "training_path", "auto")
        if path not in self._PATHS:
            raise ValueError(f"training_path must be one of {self._PATHS}, got "
                             f"{path!r}.")
        if path == "split":
            return path
        weighted = sample_weight is not None
        zero_batch = weighted and any(
            not sample_weight[b].sum() > 0
            for b in gen_batches(sample_weight.shape[0], batch_size))
        reason = self._trainer.fused_graph("step", weighted)
        if isinstance(reason, str) or (path == "loop" and zero_batch):
            if path == "auto":
                return "split"
            why = reason if isinstance(reason, str) else "a batch has zero weight"
            raise ValueError(f"training_path={path!r} is not available: {why}.")
        if path == "auto":
            heavy = self._trainer.parameter_bytes() > LOOP_MAX_PARAMETER_BYTES
            return "fused" if (zero_batch or heavy) else "loop"
        return path

    def _one_run_allowed(self, X_val, incremental):
        """Whether every epoch can run in one session run: nothing the host
        must do between epochs (validation, stopping rules, adaptive rate,
        shuffling, progress, logging)."""
        adaptive = getattr(self.learning_rate_, "learning_rate", None) == "adaptive"
        return not (X_val is not None or self.early_stopping or adaptive
                    or self._stopping_tol() is not None or self.shuffle
                    or self.verbose or self.enable_logging or incremental)

    def _run_epochs(self, path, X, y, sample_weight, batch_size, count):
        """``count`` epochs; returns their losses, shorter (or None) when a
        non-finite loss stopped training (``exc=False``)."""
        if path != "loop":
            loss = self._epoch(X, y, sample_weight, batch_size, path)
            return None if loss is None else [loss]
        if self.shuffle:
            order = self._shuffled_order(X.shape[0])
            X, y = X[order], y[order]
            sample_weight = None if sample_weight is None else sample_weight[order]
        rates = [self._scalars_ahead(j, X.shape[0]) for j in range(count)]
        losses = self._trainer.loop_epochs(X, y, sample_weight, batch_size, rates)
        if not np.isfinite(losses).all():  # replay step by step to stop exactly
            results = []
            for _ in range(count):
                loss = self._epoch(X, y, sample_weight, batch_size, "fused",
                                   reshuffle=False, ahead=len(results))
                if loss is None:
                    return results
                results.append(loss)
            return results
        sizes = np.array([
            self._batch_rows(b, None if sample_weight is None else sample_weight[b])
            for b in gen_batches(X.shape[0], batch_size)], dtype=np.float64)
        return (losses.astype(np.float64) @ sizes / sizes.sum()).tolist()

    def _scalars_ahead(self, epochs_ahead, n_samples):
        """The update rule's per-epoch scalars ``epochs_ahead`` epochs ahead."""
        rate = self.learning_rate_
        if epochs_ahead == 0:
            return rate.step_scalars(1)
        saved = rate.value
        rate.value = rate.schedule(self._schedule_time(epochs_ahead, n_samples))
        try:
            return rate.step_scalars(1)
        finally:
            rate.value = saved

    def _epoch(self, X, y, sample_weight, batch_size, path="split", reshuffle=True,
               ahead=0):
        """One pass over the data, one session run (fused) or four (split) per
        batch; returns the epoch loss, or None when a non-finite loss stopped
        training (``exc=False``). ``ahead``: epochs run but not yet recorded
        in ``n_iter_`` (a replay of the in-graph loop)."""
        self._keep_finite_weights(self.n_iter_ + ahead)
        order = self._shuffled_order(X.shape[0]) if self.shuffle and reshuffle \
            else None
        step = self._trainer.fused_step if path == "fused" else self._trainer.step
        dtype = self._float_dtype()
        total = weight_total = 0.0
        for batch in gen_batches(X.shape[0], batch_size):
            index = batch if order is None else order[batch]
            wb = None if sample_weight is None else sample_weight[index]
            if wb is not None and not wb.sum() > 0:
                continue  # a batch of zero weights carries no gradient
            loss = step(X[index], y[index], wb, dtype)
            if not np.isfinite(loss):
                self._non_finite(loss, self.n_iter_ + ahead + 1)
                return None
            rows = self._batch_rows(batch, wb)
            total += loss * rows
            weight_total += rows
        return total / weight_total

    def _batch_rows(self, batch, sample_weight):
        """Weight of a batch's loss in the epoch loss: the sum of its sample
        weights, or its number of rows without weights."""
        if sample_weight is None:
            return float(batch.stop - batch.start)
        return float(sample_weight.sum())

    def _shuffled_order(self, n_samples):
        """Row order of the next epoch: the previous order shuffled again,
        as scikit-learn's MLP does (``sample_idx = shuffle(sample_idx)``)."""
        order = getattr(self, "_order", None)
        if order is None or order.shape[0] != n_samples:
            order = np.arange(n_samples)
        self._order = order[self._rng.permutation(n_samples)]
        return self._order

    def _update_no_improvement(self, loss, X_val, y_val):
        """scikit-learn's ``_update_no_improvement_count``; True means stop."""
        tol = self._stopping_tol()
        if self.early_stopping:
            score = self._validation_score(X_val, y_val)
            self.validation_scores_.append(score)
            improved = score >= self.best_validation_score_ + tol
            if score > self.best_validation_score_:
                self.best_validation_score_ = score
                self._best_weights = self._trainer.engine.get_weights()
                self._best_buffers = self._trainer.get_buffers()
        else:
            improved = tol is None or loss <= self.best_loss_ - tol
            self.best_loss_ = min(self.best_loss_, loss)
        self._no_improvement = 0 if improved else self._no_improvement + 1
        if self._no_improvement > self.n_iter_no_change:
            if self.learning_rate_.trigger_stopping():
                return True
            self._no_improvement = 0
        return False

    def _validation_score(self, X_val, y_val):
        raise NotImplementedError

    def _report(self, bar, loss):
        if self.verbose > 1:
            bar.set_postfix(loss=f"{loss:.6g}",
                            lr=f"{self.learning_rate_.value:.3g}")
        if self.enable_logging:
            logger.info("epoch %d loss=%r lr=%r", self.n_iter_, loss,
                        self.learning_rate_.value)

    def _keep_finite_weights(self, epochs):
        """Copy the weights an epoch starts from, the weights after
        ``epochs`` epochs, when every value is finite: a divergence goes back
        to them (see :meth:`_non_finite`)."""
        weights = self._trainer.engine.get_weights()
        if all(np.isfinite(w).all() for w in weights):
            self._finite_weights = (weights, epochs)

    def _non_finite(self, loss, epoch):
        """A non-finite loss at ``epoch``: put back the best validation
        weights (early stopping) or the weights at the end of the last epoch
        whose loss was finite (the epoch before ``epoch``; the weights this
        fit started from when it is the first), never the exploding ones
        the last finite steps left, then raise or warn saying which."""
        kept = getattr(self, "_finite_weights", None)
        if self.early_stopping and self._best_weights is not None:
            self._trainer.engine.set_weights(self._best_weights)
            which = ("the weights of the best validation score "
                     f"({self.best_validation_score_:.6g}) are kept")
        elif kept is not None:
            self._trainer.engine.set_weights(kept[0])
            which = ("the last finite weights are kept: " + (
                f"those at the end of epoch {kept[1]}, the last whose loss "
                "was finite" if kept[1] else "those this fit started from"))
        else:
            which = "the last finite weights are kept"
        self._finite_weights = None
        message = (f"The loss became {loss} at epoch {epoch}; {which}. Lower "
                   "the learning rate.")
        if self.exc:
            raise ConvergenceError(message)
        warnings.warn(message, ConvergenceWarning)

    # ------------------------------------------------------------ results
    @property
    def train_session_(self):
        """The :class:`~onnxtrain.OrtGradientForwardBackward` engine."""
        return self._ensure_trainer().engine

    def _raw_predict(self, X):
        trainer = self._ensure_trainer()
        _check_feature_names(self, X, reset=False)  # other names: an error
        model = self._training_model()
        X = check_features(model, X, "X", self._training_types(),
                           self._feature_inputs(model))
        return trainer.predict(X)

    def get_state(self):
        """The trained weights: list of ndarray in ``weights_to_train_`` order."""
        return self._ensure_trainer().engine.get_weights()

    def set_state(self, state):
        """Replace the trained weights (list, or dict name -> array).

        Raises
        ------
        ValueError
            Wrong number of tensors, unknown names or shapes.
        """
        self._ensure_trainer().engine.set_weights(state)
        return self

    def get_trained_onnx(self, model=None):
        """The inference graph with the trained weights as initializers.

        BatchNormalization nodes run in inference mode on the running
        statistics training updated, Dropout is the identity (see
        :func:`onnxtrain.training_mode.inference_mode`).

        Parameters
        ----------
        model : onnx.ModelProto, default=None
            Graph to fill (default: ``model_onnx``, after the rewrites the
            estimator applies); not modified.

        Returns
        -------
        onnx.ModelProto
        """
        trainer = self._ensure_trainer()
        engine = trainer.engine
        base = self._full_model() if model is None else load_model(model)
        values = dict(zip(engine.weights_to_train, engine.get_weights()))
        values.update(trainer.get_buffers())
        return inference_mode(replace_initializers(base, values))

    def save_onnx_graph(self, folder, prefix=None, suffix=None):
        """Save every ONNX graph of the estimator (the model, the training
        and gradient graphs, the learning rate's and the loss's graphs):
        see :func:`onnxtrain._saving.save_onnx_graph`."""
        from .._saving import save_onnx_graph
        return save_onnx_graph(self, folder, prefix, suffix)

    def _full_model(self):
        self._training_model()
        return self._model_cache[2]

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("_model_cache", None)
        trainer = state.pop("_trainer", None)
        if trainer is not None:
            state["_pickled"] = {"weights": trainer.engine.get_weights(),
                                 "state": trainer.get_state(),
                                 "steps": trainer.step_count,
                                 "buffers": trainer.get_buffers()}
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._trainer = None


def from_scikit_learn(model):
    """Whether ``model`` was converted from scikit-learn by skl2onnx: its
    weights are then redrawn as scikit-learn's MLP draws them unless
    ``warm_start``; any other graph (PyTorch exports...) starts from its own
    initializers."""
    return model.producer_name == "skl2onnx"


def prediction_dtype(model, types=None):
    """numpy dtype of the model's first output (``types``: the model's
    :func:`~onnxtrain.graph.infer_value_types`, computed if None)."""
    types = infer_value_types(model) if types is None else types
    return elem_type_to_numpy(types[model.graph.output[0].name][0])
