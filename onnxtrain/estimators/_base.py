"""What the forward/backward estimators share: their scikit-learn
parameters, the preparation of a fit (validation, resolution, the step
runner) and their results. Each fit belongs to a
:class:`~onnxtrain.training.run.TrainingRun`, which holds what the fit
resolved and learned and runs its epochs; the estimator publishes its
fitted attributes from it."""
from __future__ import annotations

import functools
import numbers
import os
import threading
import warnings

import numpy as np
from onnx import ModelProto
from sklearn.base import BaseEstimator
from sklearn.exceptions import NotFittedError
from sklearn.model_selection import train_test_split
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import _check_feature_names, check_is_fitted

from .._utils.gc import gc_frozen
from .._utils.memory import release_freed_memory
from ..assembly.models import load_model
from ..assembly.weight_roles import choose_weights
from ..exceptions import ConvergenceError, ConvergenceWarning
from ..graph import (elem_type_to_numpy, infer_value_types, opset_of,
                     without_initializer_values)
from ..graph._small import full_repr
from ..graph.builder import LIGHT_MIN_ELEMENTS, FLOAT_TYPES, split_weight_values
from ..graph.identities import remove_identity_dropouts
from ..losses.learning_losses import resolve_learning_loss
from ..losses.penalties import resolve_learning_penalty
from ..optim.initializers import glorot_uniform_weights
from ..optim.learning_rates import resolve_learning_rate
from ..runtime.checks import load_checked_model_deferred
from ..runtime.engine import check_weight_names
from ..runtime.threads import session_threads, with_session_threads
from ..training.callbacks import check_callbacks
from ..training.run import (FitHooks, FitSettings, TrainingRun,
                            resolve_training_path)
from ._inputs import (GraphInputs, check_batch_dimension, check_batchnorm_batches,
                      check_features, data_inputs)
from ..training.step_runner import StepRunner, step_graphs
from ._validation import Count, check_sample_weight, validation_period

__all__ = ["BaseOrtGradientEstimator"]

#: 'auto' trains with the fused step rather than the in-graph loop when the
#: weights and optimizer state take more than this many bytes: a run of the
#: Loop holds three to four copies of them (its input, the carried values of
#: the step before and of the step running, the copy it outputs), where the
#: fused step writes one in place, and its gain in speed, the host's work
#: between steps, is a few percent of a step at this size and less above.
LOOP_MAX_PARAMETER_BYTES = 8 * 2 ** 20
#: Held while an unpickled estimator rebuilds its runner, so that threads
#: predicting at once build it once (estimators hold no lock: they pickle).
_TRAINER_LOCK = threading.Lock()


class _Short:
    """Placeholder whose repr summarizes a model in ``__repr__``."""

    def __init__(self, text):
        self.text = text

    def __repr__(self):
        return self.text


class _Published:
    """A fitted attribute read from (and written to) the estimator's
    :class:`~onnxtrain.training.run.TrainingRun`: absent before the first
    fit, as scikit-learn's fitted attributes are."""

    def __init__(self, name):
        self.name = name

    def __set_name__(self, owner, attribute):
        self.attribute = attribute

    def _run(self, estimator):
        run = estimator.__dict__.get("_run")
        if run is None:
            raise AttributeError(f"{type(estimator).__name__!r} object has no "
                                 f"attribute {self.attribute!r}")
        return run

    def __get__(self, estimator, owner=None):
        if estimator is None:
            return self
        return getattr(self._run(estimator), self.name)

    def __set__(self, estimator, value):
        setattr(self._run(estimator), self.name, value)


def _restoring(method):
    """``method`` leaves the estimator and its run as they were when it
    raises."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        saved = _snapshot(self)
        try:
            return method(self, *args, **kwargs)
        except BaseException:
            _restore(self, saved)
            raise
    return wrapper


def _snapshot(estimator):
    run = estimator.__dict__.get("_run")
    return estimator.__dict__.copy(), run, None if run is None else vars(run).copy()


def _restore(estimator, saved):
    attributes, run, run_attributes = saved
    estimator.__dict__.clear()
    estimator.__dict__.update(attributes)
    if run is not None:
        vars(run).clear()
        vars(run).update(run_attributes)


def _weight_input(estimator):
    """Name of the sample-weight input of the loss (or of the graph)."""
    return getattr(estimator, "sample_weight_name", None) or \
        estimator.weight_name or "weight"


def _objects_changed(estimator, run):
    """True when set_params replaced the learning rate, loss or penalty
    since the last fit (fit publishes the resolved objects there; the loss
    published is the one resolved from the parameter, which the run may
    train adapted to the graph)."""
    published = (run.update_rule, run.resolved_loss, run.penalty)
    current = (estimator.learning_rate, estimator.learning_loss,
               estimator.learning_penalty)
    return any(a is not b for a, b in zip(current, published))


def _forget_fit(estimator):
    """Drop every fitted attribute: only the parameters remain, as after
    ``__init__``."""
    params = estimator.get_params(deep=False)
    for key in list(estimator.__dict__):
        if key not in params:
            del estimator.__dict__[key]


class BaseOrtGradientEstimator(BaseEstimator):
    """Base of the estimators training a graph with the forward/backward
    engine. Subclasses define the graph trained
    (``_make_training_model(model) -> (model after rewrites, graph)``), the
    target encoding (``_encode_targets``) and the validation score
    (``_validation_score``)."""

    _default_loss = "square_error"
    #: Whether the graph computes its own loss (no loss graph).
    _loss_in_graph = False
    #: The class owning each fit, whose methods are the epoch loop.
    _loop_class = TrainingRun
    #: Labels stratifying the early-stopping split (None: not stratified).
    _stratify = staticmethod(lambda y: None)

    #: scikit-learn's parameter constraints (``_validate_params``), the one
    #: check of the parameters. The learning rate, loss, penalty, training
    #: path and weight names are validated by resolving them (they accept
    #: several kinds of objects or name what is available).
    _parameter_constraints: dict = {
        "model_onnx": [ModelProto, bytes, str, os.PathLike],
        "weights_to_train": "no_validation",  # check_weight_names: str, list...
        "loss_output_name": [str],
        "max_iter": [Count()],
        "training_optimizer_name": [StrOptions({"SGDOptimizer"})],
        "batch_size": [Count()],
        "learning_rate": "no_validation",
        "device": [str],
        "warm_start": ["boolean"],
        "init": [StrOptions({"model", "random"})],
        "verbose": ["verbose"],
        "validation_every": [Count(),
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
        "n_iter_no_change": [Count()],
        "tol": [Interval(numbers.Real, 0, None, closed="left"), None],
        "training_path": "no_validation",  # resolve_training_path
        "callbacks": [list, tuple, None],
        "n_threads": [Interval(numbers.Integral, 1, None, closed="left"), None],
    }

    # fitted attributes, held by the fit's run
    train_losses_ = _Published("train_losses")
    validation_losses_ = _Published("validation_losses")
    validation_scores_ = _Published("validation_scores")
    best_validation_score_ = _Published("best_validation_score")
    best_loss_ = _Published("best_loss")
    n_iter_ = _Published("n_iter")
    t_ = _Published("t")
    history_ = _Published("history")
    training_path_ = _Published("path")
    learning_rate_ = _Published("update_rule")
    learning_loss_ = _Published("loss")
    learning_penalty_ = _Published("penalty")

    def __repr__(self, N_CHAR_MAX=700):
        params = self.get_params(deep=False)
        model = params["model_onnx"]
        if hasattr(model, "graph"):
            params["model_onnx"] = _Short(
                f"<ModelProto {model.graph.name!r}: {len(model.graph.node)} nodes>")
        return full_repr(self, params)

    # ------------------------------------------------------ training graph
    def _training_model(self, values=False):
        """The graph trained, cached while ``model_onnx`` stays the same.

        The graph is built from ``model_onnx`` without the values of its
        float weights (:func:`~onnxtrain.graph.builder.split_weight_values`):
        the rewrites copy value-less protos, and the values stay those of
        the loaded model (the caller's own ModelProto, or the one read from
        the path), which the cache references until a runner holds the
        trained weights on the device; it then keeps the graph without the
        values of those (the rewritten full model is not kept either:
        :meth:`get_trained_onnx` rebuilds it). ``values=True`` gives
        ``(graph, name -> TensorProto or ExternalTensor)``, rebuilt from ``model_onnx`` when
        the values were dropped (a new runner starting from the graph's
        weights)."""
        cached = getattr(self, "_model_cache", None)
        same = cached is not None and cached[0] is self.model_onnx
        if not same or (values and cached[3] is None):
            source, external = load_checked_model_deferred(
                self.model_onnx, "model_onnx", _light_weight)
            light, held = split_weight_values(source)
            held.update(external)
            _, training = self._make_training_model(light)
            ours = training is not self.model_onnx  # else the caller's, not edited
            # Dropouts that copy their input (probability 0, as exporters
            # write them) leave the graph trained, as they leave the
            # artifacts' training model (graph/identities.py)
            training = remove_identity_dropouts(training, opset_of(training) or 1,
                                                in_place=ours)
            # no compact_model copy: the graph is a new message holding only
            # what it keeps (rewrite._keep_output), the Dropouts removed in
            # place aside (a serialization and a parse less at the peak of
            # the fit's build)
            # (model_onnx, graph, its inferred types, values: None once dropped)
            cached = self._model_cache = (self.model_onnx, training,
                                          cached[2] if same else {}, held)
        return (cached[1], cached[3]) if values else cached[1]

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

    def _adapt_loss(self, loss):
        """The loss trained on this graph, from the one resolved from
        ``learning_loss`` (never modified: a subclass adapting it returns a
        new object). Raises ValueError when they cannot go together."""
        return loss

    # ------------------------------------------------------------ the run
    def _new_run(self, model, rng, previous=None, keep_optimizer=False):
        """A :class:`~onnxtrain.training.run.TrainingRun` on the resolved
        weights, learning rate, loss and penalty, with its runner on the
        graph's weights, or going on with ``previous``'s (see
        :meth:`~onnxtrain.training.run.FitState.go_on_with`). The loss
        comes first: one that does not fit the graph raises before any
        graph is built."""
        resolved = resolve_learning_loss(self.learning_loss or self._default_loss)
        loss = self._adapt_loss(resolved)
        types = self._training_types()
        self.weights_to_train_, self.frozen_weights_ = choose_weights(
            model, self.weights_to_train, types)
        rate = resolve_learning_rate(self.learning_rate)
        penalty = resolve_learning_penalty(self.learning_penalty)
        loss_models, spec = step_graphs(
            model, self.weights_to_train_, types,
            None if self._loss_in_graph else loss, rate, penalty, _weight_input(self))
        run = self._loop_class(rate, loss, penalty, rng, resolved, loss_models, spec,
                               early_stopping=self.early_stopping)
        run.attach(self._new_runner(run))
        if previous is not None:
            run.go_on_with(previous, keep_optimizer)
        rate.init_learning_rate()
        return run

    @gc_frozen
    def _new_runner(self, run):
        """A step runner for ``run`` on the graph's weights (see
        :meth:`_training_model`), which then keeps the graph without their
        values."""
        model, values = self._training_model(values=True)
        runner = StepRunner(model, self.weights_to_train_,
                            self.device, run.loss_models, run.update_rule.axpy_onnx_,
                            run.update_rule, _weight_input(self), run.fused_spec,
                            types=self._training_types(), values=values)
        cached = self._model_cache
        if cached[3] is not None and cached[1] is not cached[0]:
            self._model_cache = (cached[0], without_initializer_values(
                cached[1], self.weights_to_train_), cached[2], None)
        return runner

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
        """The step runner, rebuilt from numpy copies after unpickling.

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
        run = self._run
        if run.runner is None:
            with _TRAINER_LOCK, session_threads(getattr(self, "n_threads", None)):
                if run.runner is None:
                    run.attach(self._new_runner(run))
        return run.runner

    @property
    def _trainer(self):
        """The run's step runner (None before the first fit or until an
        unpickled estimator rebuilds it)."""
        run = self.__dict__.get("_run")
        return None if run is None else run.runner

    # --------------------------------------------------------------- fit
    @with_session_threads
    def _fit(self, X, y, sample_weight=None, X_val=None, y_val=None,
             classes=None, incremental=False):
        """The one code path of fit and partial_fit. An error raised before
        the first step (parameters, data, a loss that does not fit the
        graph) leaves the estimator as it was: its parameters, its fitted
        state or the absence of one."""
        before = _snapshot(self)
        X, y, sample_weight, X_val, y_val = self._prepare_fit(
            X, y, sample_weight, X_val, y_val, classes, incremental)
        if self._run is not before[1] or self._run.runner is not (
                before[2] or {}).get("runner"):
            # a new runner: the temporaries of its build are all freed now
            release_freed_memory()
        hooks = FitHooks(self, getattr(self, "_validation_score", None),
                         prediction_dtype(self._training_model(), self._training_types()))
        try:
            self._run.fit_loop(X, y, sample_weight, X_val, y_val,
                               1 if incremental else self.max_iter, hooks)
        except ConvergenceError as exc:
            unusable = self._unusable_after_divergence(X, before)
            if unusable:
                raise ConvergenceError(f"{exc} {unusable}") from None
            raise
        if self._run.diverged is not None:  # exc=False: the loop warned
            unusable = self._unusable_after_divergence(X, before)
            if unusable:
                warnings.warn(unusable, ConvergenceWarning)
        return self

    def _unusable_after_divergence(self, X, before):
        """After a non-finite loss, the weights kept must predict finite
        values on the training rows ``X``. When they do not, the estimator
        is put back as it was before this call when the call built its own
        runner (the earlier one is untouched), else it forgets the fit
        (its weights were trained in place); returns what happened (None
        when the kept weights are usable, or are those the call started
        from: non-finite values then come from the data)."""
        run = self._run
        if run.diverged_to_start or np.isfinite(run.runner.predict(X)).all():
            return None
        if run is not before[1] or run.runner is not before[2].get("runner"):
            _restore(self, before)
            return ("However, those weights predict non-finite values on the "
                    "training rows: the estimator is back to its state before "
                    "this call.")
        _forget_fit(self)
        return ("However, those weights predict non-finite values on the "
                "training rows: the estimator is no longer fitted (fit it again).")

    @with_session_threads
    def _initialize(self, X, y, classes=None):
        """Prepare training on (X, y) as a first partial_fit does (validate,
        build the graphs and sessions, draw or read the initial weights)
        without any step; used by :mod:`onnxtrain.integrations.distributed` to give
        every worker the same starting state. Returns self."""
        self._prepare_fit(X, y, None, None, None, classes, True)
        return self

    @_restoring
    def _prepare_fit(self, X, y, sample_weight, X_val, y_val, classes,
                     incremental):
        """Everything before the first step: validation, resolution, the
        run and its runner, :meth:`_check_start`, the early-stopping split,
        then the published parameters. Returns the data to train on; on an
        error the estimator is as it was."""
        self._validate_params()
        check_callbacks(self.callbacks)
        resolve_learning_rate(self.learning_rate)  # before drawing weights
        resolve_training_path(getattr(self, "training_path", "auto"))
        check_weight_names(self.weights_to_train)
        if incremental and self.early_stopping:
            # scikit-learn's MLP message: no held-out split in partial_fit
            raise ValueError("partial_fit does not support early_stopping=True")
        model = self._training_model()
        first = not hasattr(self, "weights_to_train_") or (
            not incremental and not self.warm_start) or self._model_changed()
        X, y, sample_weight, X_val, y_val = self._validate_data(
            model, X, y, sample_weight, X_val, y_val, classes, first)
        previous = None if first else self._run
        # objects replaced by set_params take effect now, partial_fit included
        restart = not first and _objects_changed(self, previous)
        if first:
            rng = check_random_state(self.random_state)
            self._run = self._new_run(model, rng)
            self._fitted_model_onnx = self.model_onnx
            if self.init == "random":
                self._run.runner.set_weights(glorot_uniform_weights(
                    model, self.weights_to_train_, rng))
        else:
            self._ensure_trainer()
            if restart:
                self._run = self._new_run(model, previous.rng, previous,
                                          keep_optimizer=incremental)
        run = self._run
        size = int(np.clip(self.batch_size, 1, len(X)))
        if first or restart:
            self._check_start(X[:size])
        run.configure(self._settings(run), incremental)
        if self.early_stopping and not incremental:
            arrays = [X, y] + ([] if sample_weight is None else [sample_weight])
            parts = train_test_split(*arrays, random_state=run.rng,
                                     test_size=self.validation_fraction,
                                     stratify=self._stratify(y))
            X, X_val, y, y_val = parts[:4]
            sample_weight = None if sample_weight is None else parts[4]
        # a path that cannot run raises here, not after the weights changed;
        # its graphs are built now (and only its graphs)
        path = run.choose_path(sample_weight, int(np.clip(self.batch_size, 1, len(X))))
        run.runner.prepare(path, sample_weight is not None)
        if not (first or restart or incremental):
            # a new fit starts a new optimizer, as scikit-learn's warm start
            run.runner.reset_state()  # does (last: nothing fails after)
        # The seed reads ``est.learning_rate.axpy_onnx_`` and
        # ``est.learning_loss.loss_grad_onnx_``: the parameters hold the
        # resolved objects (copies), the loss as resolved from the parameter
        # so that a fit on another graph or a clone adapts it anew.
        self.learning_rate, self.learning_penalty = run.update_rule, run.penalty
        self.learning_loss = run.resolved_loss
        return X, y, sample_weight, X_val, y_val

    def _settings(self, run):
        """The :class:`~onnxtrain.training.run.FitSettings` of this call.
        ``tol=None`` stops on nothing, except early stopping and the
        'adaptive' schedule, which use scikit-learn's default 1e-4."""
        tol = self.tol
        if tol is None and (self.early_stopping or getattr(
                run.update_rule, "learning_rate", None) == "adaptive"):
            tol = 1e-4
        return FitSettings(
            batch_size=self.batch_size,
            training_path=getattr(self, "training_path", "auto"),
            shuffle=self.shuffle, early_stopping=self.early_stopping,
            validation_period=validation_period(self.validation_every, self.max_iter),
            n_iter_no_change=self.n_iter_no_change,
            tol=None if tol is None else float(tol), exc=self.exc,
            verbose=self.verbose, enable_logging=self.enable_logging,
            callbacks=list(self.callbacks or ()), name=type(self).__name__,
            loop_max_bytes=LOOP_MAX_PARAMETER_BYTES)

    def _validate_data(self, model, X, y, sample_weight, X_val, y_val, classes,
                       first):
        """The training and validation data, checked against the graph
        (types, widths, a fixed batch dimension) and encoded."""
        _check_feature_names(self, X, reset=first)  # feature_names_in_
        types, inputs = self._training_types(), self._feature_inputs(model)
        X = check_features(model, X, "X", types, inputs)
        y = self._encode_targets(y, X.shape[0], classes, first)
        if sample_weight is not None:
            sample_weight = check_sample_weight(
                sample_weight, X.shape[0], prediction_dtype(model, types))
            if (sample_weight < 0).any():
                raise ValueError("sample_weight has negative values.")
            if not sample_weight.sum() > 0:
                raise ValueError("sample_weight sums to zero: nothing to train on.")
        if not isinstance(X, GraphInputs):
            self.n_features_in_ = X.shape[1]
        if (X_val is None) != (y_val is None):
            raise ValueError("X_val and y_val must be given together.")
        if X_val is not None:
            X_val = check_features(model, X_val, "X_val", types, inputs)
            y_val = self._encode_targets(y_val, X_val.shape[0], None, False,
                                         name="y_val")
        # a graph whose fixed batch dimension the batches of this fit do
        # not have (an export without dynamic axes) is refused before any step
        n_samples = X.shape[0]
        size = int(np.clip(self.batch_size, 1, n_samples))
        sizes = {size} | ({n_samples % size} if n_samples % size else set())
        check_batch_dimension(model, sizes, inputs, types)
        if self.early_stopping:  # the rows left by _prepare_fit's split
            n_samples -= int(np.ceil(self.validation_fraction * n_samples))
            size = int(np.clip(self.batch_size, 1, max(n_samples, 1)))
            sizes = {size} | ({n_samples % size} if n_samples % size else set())
        check_batchnorm_batches(model, sizes, types, inputs)
        return X, y, sample_weight, X_val, y_val

    def _check_start(self, X):
        """Called with the first rows of a fit once the loss is (re)resolved
        and the runner holds the weights training starts from, before any
        step: subclasses raise to refuse the fit."""

    # ------------------------------------------------------------ results
    @property
    def train_session_(self):
        """The :class:`~onnxtrain.runtime.ForwardBackwardEngine`."""
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
        self._ensure_trainer()
        return self._run.get_state(include_optimizer)

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
        self._ensure_trainer()
        self._run.set_state(state)
        return self

    def get_trained_onnx(self, model=None):
        """The inference graph with the trained weights as initializers.

        BatchNormalization nodes run in inference mode on the running
        statistics training updated, Dropout is the identity (see
        :func:`onnxtrain.graph.training_mode.inference_mode`).

        Parameters
        ----------
        model : onnx.ModelProto, default=None
            Graph to fill (default: ``model_onnx``, after the rewrites the
            estimator applies); not modified.

        Returns
        -------
        onnx.ModelProto
        """
        self._ensure_trainer()
        base = self._full_model() if model is None else load_model(model)
        return self._run.trained_model(base)

    def _full_model(self):
        """``model_onnx`` after the estimator's rewrites: a new model, or the
        loaded ``model_onnx`` itself when nothing is rewritten (not to be
        modified)."""
        return self._make_training_model(load_model(self.model_onnx))[0]

    def save_onnx_graph(self, folder, prefix=None, suffix=None):
        """Save every ONNX graph of the estimator (the model, the training
        and gradient graphs, the learning rate's and the loss's graphs):
        see :func:`onnxtrain.graph._saving.save_onnx_graph`."""
        from ..graph._saving import save_onnx_graph
        return save_onnx_graph(self, folder, prefix, suffix)

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("_model_cache", None)  # rebuilt from model_onnx
        return state


def _light_weight(tensor):
    """Whether the build takes ``tensor`` without its values, as
    :func:`~onnxtrain.graph.builder.split_weight_values` selects them."""
    return tensor.data_type in FLOAT_TYPES and \
        int(np.prod(tensor.dims)) > LIGHT_MIN_ELEMENTS


def prediction_dtype(model, types=None):
    """numpy dtype of the model's first output (``types``: the model's
    :func:`~onnxtrain.graph.infer_value_types`, computed if None)."""
    types = infer_value_types(model) if types is None else types
    return elem_type_to_numpy(types[model.graph.output[0].name][0])
