"""What the forward/backward estimators share: parameters, the preparation
of a fit (validation, resolution, the trainer), state and pickling. The
epochs run in :class:`~onnxtrain.training.loop.EpochLoop`."""
from __future__ import annotations

import numbers
import os
import threading
import warnings

import numpy as np
from onnx import ModelProto
from sklearn.base import BaseEstimator
from sklearn.exceptions import NotFittedError
from sklearn.model_selection import train_test_split
from sklearn.utils import check_random_state, gen_batches
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import _check_feature_names, check_is_fitted

from .._files import load_checked_model
from .._gc import gc_frozen
from ..exceptions import ConvergenceError, ConvergenceWarning
from .._small import full_repr
from ..graph import (elem_type_to_numpy, infer_value_types, opset_of,
                     without_initializer_values)
from ..graph.identities import remove_identity_dropouts
from ..initializers import bias_weights, glorot_uniform_weights
from ..losses import resolve_learning_loss
from ..models import load_model, replace_initializers
from ..optim import resolve_learning_rate
from ..penalties import resolve_learning_penalty
from ..runtime.engine import check_weight_names
from ..runtime.threads import session_threads, with_session_threads
from ..training.callbacks import check_callbacks
from ..training.loop import EpochLoop
from ..training_mode import inference_mode
from ..weight_roles import choose_weights
from ..training_graphs import LossGraphs, small_graph_opset
from ._trainer import StepRunner
from ._inputs import (GraphInputs, check_batch_dimension, check_features,
                      data_inputs)
from ._validation import check_sample_weight, validation_period

__all__ = ["BaseOrtGradientEstimator"]

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

    #: scikit-learn's parameter constraints (``_validate_params``), checked
    #: by ``fit`` after the checks whose messages onnxcustom users know.
    #: The learning rate, loss and penalty accept several kinds of objects
    #: and are validated by their ``resolve_*`` functions.
    _parameter_constraints: dict = {
        "model_onnx": [ModelProto, bytes, str, os.PathLike],
        "weights_to_train": "no_validation",  # check_weight_names: str, list...
        "loss_output_name": [str],
        "max_iter": [Interval(numbers.Integral, 1, None, closed="left")],
        "training_optimizer_name": [StrOptions({"SGDOptimizer"})],
        "batch_size": [Interval(numbers.Integral, 1, None, closed="left")],
        "learning_rate": "no_validation",
        "device": [str],
        "warm_start": ["boolean"],
        "init": [StrOptions({"model", "random"})],
        "verbose": ["verbose"],
        "validation_every": [Interval(numbers.Integral, 1, None, closed="left"),
                             Interval(numbers.Real, 0, 1, closed="neither")],
        "learning_loss": "no_validation",
        "enable_logging": ["boolean"],
        "weight_name": [str, None],
        "learning_penalty": "no_validation",
        "exc": ["boolean"],
        "random_state": ["random_state"],
        "shuffle": ["boolean"],
        "early_stopping": ["boolean"],
        "validation_fraction": [Interval(numbers.Real, 0, 1, closed="neither")],
        "n_iter_no_change": [Interval(numbers.Integral, 1, None, closed="left")],
        "tol": [Interval(numbers.Real, 0, None, closed="left"), None],
        "training_path": [StrOptions({"auto", "split", "fused", "loop"})],
        "callbacks": [list, tuple, None],
        "n_threads": [Interval(numbers.Integral, 1, None, closed="left"), None],
    }

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
        self._validate_params()
        check_callbacks(getattr(self, "callbacks", None))

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
    def _training_model(self, values=False):
        """The graph trained, cached while ``model_onnx`` stays the same.

        Once a trainer holds the trained weights on the device, the cache
        keeps the graph without their values (43 MB less for resnet18; the
        rewritten full model is not kept either: :meth:`get_trained_onnx`
        rebuilds it). ``values=True`` gives the graph with them, rebuilt
        from ``model_onnx`` when they were dropped (a new trainer starting
        from the graph's weights, 0.15 s for resnet18)."""
        cached = getattr(self, "_model_cache", None)
        same = cached is not None and cached[0] is self.model_onnx
        if not same or (values and cached[3]):
            _, training = self._make_training_model(
                load_checked_model(self.model_onnx, "model_onnx"))
            ours = training is not self.model_onnx  # else the caller's, not edited
            # Dropouts that copy their input (probability 0, as exporters
            # write them) leave the graph trained, as they leave the
            # artifacts' training model (graph/identities.py)
            training = remove_identity_dropouts(training, opset_of(training) or 1,
                                                in_place=ours)
            # no compact_model copy: the graph is a new message holding only
            # what it keeps (rewrite._keep_output), the Dropouts removed in
            # place aside (resnet18: a 45 MB serialization and a 43 MB parse
            # less at the peak of the fit's build)
            # (model_onnx, graph, its inferred types, weight values dropped)
            cached = self._model_cache = (self.model_onnx, training,
                                          cached[2] if same else {}, False)
        return cached[1]

    def _drop_weight_values(self):
        """Keep the cached graph without the values of the weights a trainer
        now holds (when the graph is a rewritten copy, not the caller's)."""
        cached = self._model_cache
        if not cached[3] and cached[1] is not cached[0]:
            self._model_cache = (cached[0], without_initializer_values(
                cached[1], self.weights_to_train_), cached[2], True)

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
        types = self._model_cache[2]
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
        types = self._training_types()
        self.weights_to_train_, self.frozen_weights_ = choose_weights(
            model, self.weights_to_train, types)
        learning_rate = resolve_learning_rate(self.learning_rate)
        penalty = resolve_learning_penalty(self.learning_penalty)
        out_type, out_shape = types[model.graph.output[0].name]
        self._elem_type = out_type
        self._output_rank = 2 if out_shape is None else len(out_shape)
        penalized = set(self.weights_to_train_)
        if getattr(penalty, "exclude_bias", True):
            penalized -= set(bias_weights(model, self.weights_to_train_))
        learning_rate.build_onnx([(w, types[w][1]) for w in self.weights_to_train_],
                                 out_type, small_graph_opset(model, _OPSET), penalty,
                                 penalized)
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
        """(unweighted, weighted) loss graphs, each built at its first use
        (:class:`~onnxtrain.training_graphs.LossGraphs`); the unweighted one
        now, as ``loss.loss_grad_onnx_``, which the seed reads after fit."""
        opset = small_graph_opset(self._training_model(), _OPSET)
        graphs = LossGraphs(loss, elem_type, opset, self._output_rank,
                            self._weight_input())
        graphs[False]
        return graphs

    @gc_frozen
    def _new_trainer(self):
        """A trainer on the graph's weights (see :meth:`_training_model`)."""
        trainer = StepRunner(self._training_model(values=True), self.weights_to_train_,
                             self.device, self._loss_models,
                             self.learning_rate_.axpy_onnx_, self.learning_rate_,
                             self._weight_input(), self._fused_spec,
                             types=self._training_types())
        self._drop_weight_values()
        return trainer

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
            with _TRAINER_LOCK, session_threads(getattr(self, "n_threads", None)):
                if getattr(self, "_trainer", None) is None:
                    trainer = self._new_trainer()
                    trainer.set_weights(self._pickled["weights"])
                    trainer.set_state(self._pickled["state"],
                                      self._pickled["steps"])
                    trainer.set_buffers(self._pickled.get("buffers"))
                    self._trainer = trainer
        return self._trainer

    # --------------------------------------------------------------- fit
    @with_session_threads
    def _fit(self, X, y, sample_weight=None, X_val=None, y_val=None,
             classes=None, incremental=False):
        """The one code path of fit and partial_fit. An error raised before
        the first step (parameters, data, a loss that does not fit the
        graph) leaves the estimator as it was: its parameters, its fitted
        state or the absence of one."""
        before = self.__dict__.copy()
        X, y, sample_weight, X_val, y_val = self._prepare_or_restore(
            X, y, sample_weight, X_val, y_val, classes, incremental)
        self._diverged = self._diverged_to_start = None
        try:
            self._epochs(X, y, sample_weight, X_val, y_val,
                         1 if incremental else self.max_iter, incremental)
        except ConvergenceError as exc:
            unusable = self._unusable_after_divergence(X, before)
            if unusable:
                raise ConvergenceError(f"{exc} {unusable}") from None
            raise
        if self._diverged is not None:  # exc=False: the loop warned
            unusable = self._unusable_after_divergence(X, before)
            if unusable:
                warnings.warn(unusable, ConvergenceWarning)
        return self

    def _unusable_after_divergence(self, X, before):
        """After a non-finite loss, the weights kept must predict finite
        values on the training rows ``X``. When they do not, the estimator
        is put back as it was before this call when the call built its own
        trainer (the earlier one is untouched), else it forgets the fit
        (its weights were trained in place); returns what happened (None
        when the kept weights are usable, or are those the call started
        from: non-finite values then come from the data)."""
        if self._diverged_to_start or np.isfinite(self._trainer.predict(X)).all():
            return None
        if self._trainer is not before.get("_trainer"):
            self.__dict__.clear()
            self.__dict__.update(before)
            return ("However, those weights predict non-finite values on the "
                    "training rows: the estimator is back to its state before "
                    "this call.")
        self._forget_fit()
        return ("However, those weights predict non-finite values on the "
                "training rows: the estimator is no longer fitted (fit it again).")

    def _forget_fit(self):
        """Drop every fitted attribute: only the parameters remain, as
        after ``__init__``."""
        params = self.get_params(deep=False)
        for key in list(self.__dict__):
            if key not in params:
                del self.__dict__[key]

    @with_session_threads
    def _initialize(self, X, y, classes=None):
        """Prepare training on (X, y) as a first partial_fit does (validate,
        build the graphs and sessions, draw or read the initial weights)
        without any step; used by :mod:`onnxtrain.distributed` to give
        every worker the same starting state. Returns self."""
        self._prepare_or_restore(X, y, None, None, None, classes, True)
        return self

    def _prepare_or_restore(self, *args):
        """:meth:`_prepare_fit`, or on any error the estimator put back as
        it was."""
        before = self.__dict__.copy()
        try:
            return self._prepare_fit(*args)
        except BaseException:
            self.__dict__.clear()
            self.__dict__.update(before)
            raise

    def _prepare_fit(self, X, y, sample_weight, X_val, y_val, classes,
                     incremental):
        """Everything before the first step: validation, resolution, the
        trainer, :meth:`_check_start`, the early-stopping split, then the
        published parameters. Returns the data to train on."""
        self._check_params()
        if incremental and self.early_stopping:
            # scikit-learn's MLP message: no held-out split in partial_fit
            raise ValueError("partial_fit does not support early_stopping=True")
        model = self._training_model()
        first = not hasattr(self, "weights_to_train_") or (
            not incremental and not self.warm_start) or self._model_changed()
        X, y, sample_weight = self._validate_data_for_fit(
            model, X, y, sample_weight, classes, first)
        X_val, y_val = self._validate_validation(model, X_val, y_val)
        self._check_batch_dimension(model, X.shape[0])
        # objects replaced by set_params take effect now, partial_fit included
        restart = not first and self._objects_changed()
        if first:
            self._start(model)
        else:
            self._ensure_trainer()
            if restart:
                self._restart_keeping_weights(model, keep_optimizer=incremental)
        if first or restart:
            self._check_start(X[:int(np.clip(self.batch_size, 1, len(X)))])
        if self.early_stopping and not incremental:
            X, X_val, y, y_val, sample_weight = self._early_stopping_split(
                X, y, sample_weight)
        # a path that cannot run raises here, not after the weights changed;
        # its graphs are built now (and only its graphs)
        path = self._choose_path(sample_weight,
                                 int(np.clip(self.batch_size, 1, len(X))),
                                 self._epoch_loop(incremental))
        self._trainer.prepare(path, sample_weight is not None)
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
        """First fit (or a fit without warm start): resolve everything, read
        the graph's weights or draw them (``init``)."""
        self._rng = check_random_state(self.random_state)
        self._resolve(model)
        self._fitted_model_onnx = self.model_onnx
        self._trainer = self._new_trainer()
        if self.init == "random":
            self._trainer.set_weights(glorot_uniform_weights(
                model, self.weights_to_train_, self._rng))
        self.t_ = 0
        self.train_losses_ = []
        self.history_ = []
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

    def _restart_keeping_weights(self, model, keep_optimizer=False):
        """Resolve the new objects and rebuild the trainer on the current
        weights (a warm start or a partial_fit after set_params). With
        ``keep_optimizer`` (partial_fit), the optimizer state and step go on
        when the new update rule keeps the same state (same rule, other
        hyperparameters); another rule starts from a new state."""
        weights = self._trainer.engine.get_weights()
        buffers = self._trainer.get_buffers()
        state, steps = self._trainer.get_state(), self._trainer.step_count
        names = tuple(self.learning_rate_.state_names)
        self._resolve(model)
        self._trainer = self._new_trainer()
        self._trainer.set_weights(weights)
        self._trainer.set_buffers(buffers)
        if keep_optimizer and tuple(self.learning_rate_.state_names) == names:
            self._trainer.set_state(state, steps)
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
    #: The epoch loop's class (:class:`~onnxtrain.training.loop.EpochLoop`).
    _loop_class = EpochLoop

    def _epoch_loop(self, incremental=False):
        """The :class:`~onnxtrain.training.loop.EpochLoop` running this fit's
        epochs, with the ``callbacks`` parameter."""
        return self._loop_class(self, getattr(self, "callbacks", None) or (),
                                incremental)

    def _epochs(self, X, y, sample_weight, X_val, y_val, n_epochs, incremental):
        self._epoch_loop(incremental).fit_loop(X, y, sample_weight, X_val, y_val,
                                              n_epochs)

    # ----------------------------------------------------- execution paths
    _PATHS = ("auto", "split", "fused", "loop")

    def _choose_path(self, sample_weight, batch_size, loop=None):
        """'split' (the seed's: four graphs per step), 'fused' (one graph
        per step) or 'loop' (an ONNX Loop over the batches): the requested
        one, or with 'auto' the fastest available: the loop, unless the
        parameters exceed :data:`LOOP_MAX_PARAMETER_BYTES` (its extra copies
        of them), a batch has zero weight or the host acts between batches
        (``loop``'s :meth:`~onnxtrain.training.loop.EpochLoop.per_batch_host_work`);
        the split path when the model cannot be fused."""
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
        host = None if loop is None else loop.per_batch_host_work()
        reason = self._trainer.fused_graph("flat step", weighted)
        if isinstance(reason, str) or (path == "loop" and (zero_batch or host)):
            if path == "auto":
                return "split"
            why = reason if isinstance(reason, str) else (
                "a batch has zero weight" if zero_batch else host)
            raise ValueError(f"training_path={path!r} is not available: {why}.")
        if path == "auto":
            heavy = self._trainer.parameter_bytes() > LOOP_MAX_PARAMETER_BYTES
            return "fused" if (zero_batch or heavy or host) else "loop"
        return path

    def _validation_score(self, X_val, y_val):
        raise NotImplementedError

    # ------------------------------------------------------------ results
    @property
    def train_session_(self):
        """The :class:`~onnxtrain.OrtGradientForwardBackward` engine."""
        return self._ensure_trainer().engine

    @with_session_threads
    def _raw_predict(self, X):
        trainer = self._ensure_trainer()
        _check_feature_names(self, X, reset=False)  # other names: an error
        model = self._training_model()
        X = check_features(model, X, "X", self._training_types(),
                           self._feature_inputs(model))
        return trainer.predict(X)

    def get_state(self, include_optimizer=False):
        """The trained weights, and optionally what continues training.

        Parameters
        ----------
        include_optimizer : bool, default=False
            Also return the optimizer state (velocities, moments), its step
            count, the learning rate and its schedule's time, the epoch and
            sample counters, the running statistics and the shuffling
            generator: what :meth:`set_state` needs for a later
            ``partial_fit`` to continue exactly as if uninterrupted.

        Returns
        -------
        list of ndarray
            Without the optimizer: the weights in ``weights_to_train_``
            order (copies).
        dict
            With it: ``weights`` (that list), ``optimizer`` (one list of
            arrays per weight, in ``learning_rate_.state_names`` order),
            ``step`` (int), ``learning_rate`` (float), ``n_iter``, ``t``
            (int), ``buffers`` (dict), ``rng`` (the generator's state) and
            ``order`` (the last epoch's row order or None).
        """
        trainer = self._ensure_trainer()
        weights = trainer.engine.get_weights()
        if not include_optimizer:
            return weights
        order = getattr(self, "_order", None)
        return {"weights": weights, "optimizer": trainer.get_state(),
                "step": int(trainer.step_count),
                "learning_rate": float(self.learning_rate_.value),
                "n_iter": int(self.n_iter_), "t": int(self.t_),
                "buffers": trainer.get_buffers(),
                "rng": self._rng.get_state() if hasattr(self, "_rng") else None,
                "order": None if order is None else order.copy()}

    def set_state(self, state):
        """Replace the trained weights, or restore a :meth:`get_state`
        ``include_optimizer=True`` dict (weights, optimizer state and step,
        learning rate, counters, running statistics, generator).

        Parameters
        ----------
        state : list of ndarray, dict name -> ndarray, or dict
            Weights (list in ``weights_to_train_`` order, or by name), or
            the dict of ``get_state(include_optimizer=True)``.

        Returns
        -------
        self

        Raises
        ------
        sklearn.exceptions.NotFittedError
            Before the first fit (the graphs do not exist yet).
        ValueError
            Wrong number of tensors, unknown names or shapes, an optimizer
            state of another update rule; nothing is changed then.
        """
        trainer = self._ensure_trainer()
        if not (isinstance(state, dict) and "optimizer" in state):
            trainer.set_weights(state)  # checks everything before it writes
            return self
        backup = self.get_state(include_optimizer=True)
        try:
            return self._set_full_state(trainer, state)
        except Exception:
            self._set_full_state(trainer, backup)
            raise

    def _set_full_state(self, trainer, state):
        optimizer = state["optimizer"]
        expected = [[tuple(w.shape()) for _ in self.learning_rate_.state_names]
                    for w in trainer.engine.weights]
        given = [[np.shape(s) for s in states] for states in optimizer]
        if given != expected:
            raise ValueError(
                f"The optimizer state has shapes {given}; this estimator's update "
                f"rule {type(self.learning_rate_).__name__} keeps "
                f"{list(self.learning_rate_.state_names)} per weight: {expected}.")
        step, n_iter, t = (_state_number(state, key, int) for key in ("step", "n_iter", "t"))
        rate = _state_number(state, "learning_rate", float)
        trainer.set_weights(state["weights"])  # checks (first)
        trainer.set_state(optimizer, step)
        trainer.set_buffers(state.get("buffers"))
        self.learning_rate_.value = rate
        self.n_iter_, self.t_ = n_iter, t
        if state.get("rng") is not None:
            self._rng = np.random.RandomState()
            self._rng.set_state(state["rng"])
        order = state.get("order")
        self._order = None if order is None else np.array(order, copy=True)
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
        """``model_onnx`` after the estimator's rewrites: a new model, or the
        loaded ``model_onnx`` itself when nothing is rewritten (not to be
        modified)."""
        return self._make_training_model(load_model(self.model_onnx))[0]

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


def _state_number(state, key, kind):
    """``kind(state[key])`` for :meth:`BaseOrtGradientEstimator.set_state`,
    or a ValueError naming the key (a finite number >= 0 is expected)."""
    if key not in state:
        raise ValueError(f"The state has no {key!r} (a get_state("
                         "include_optimizer=True) dict has one).")
    try:
        value = kind(state[key])
    except (TypeError, ValueError, OverflowError):
        value = None
    if value is None or not np.isfinite(value) or value < 0:
        raise ValueError(f"The state's {key!r} must be a finite number >= 0, got "
                         f"{state[key]!r}.")
    return value


def prediction_dtype(model, types=None):
    """numpy dtype of the model's first output (``types``: the model's
    :func:`~onnxtrain.graph.infer_value_types`, computed if None)."""
    types = infer_value_types(model) if types is None else types
    return elem_type_to_numpy(types[model.graph.output[0].name][0])
