"""MLPRegressor and MLPClassifier: scikit-learn's multi-layer perceptrons,
trained on onnxruntime.

The constructor parameters, their order and defaults, the fitted attributes
and the training arithmetic are scikit-learn 1.9's
(``sklearn/neural_network/_multilayer_perceptron.py``): with the same
settings and ``random_state`` the initial weights, the batches, the updates
and so ``loss_curve_`` are the same. The network is an ONNX graph built from
the layer sizes at the first fit;
a :class:`~onnxtrain.neural_network._loop.MLPEpochLoop` (a
:class:`~onnxtrain.training.run.TrainingRun`) owns each fit and trains it
with onnxtrain's forward/backward engine; ``to_onnx()`` returns the trained
inference graph.
"""
from __future__ import annotations

import functools
import numbers
import threading
import warnings

import numpy as np
import scipy.optimize
import scipy.sparse
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin, is_classifier
from sklearn.preprocessing import LabelBinarizer
from sklearn.utils import check_random_state, column_or_1d
from sklearn.utils._param_validation import Interval, Options, StrOptions
from sklearn.utils.metaestimators import available_if
from sklearn.utils.multiclass import type_of_target, unique_labels
from sklearn.utils.validation import (_check_sample_weight, check_is_fitted,
                                      validate_data)

from ..estimators import _base
from ..estimators._validation import check_sample_weight, check_target_rank
from ..exceptions import ConvergenceWarning
from ..graph import infer_value_types
from ..losses.learning_losses import (CrossEntropyLearningLoss, NegLogLearningLoss,
                                      PoissonLearningLoss, SquareLearningLoss)
from ..losses.penalties import ElasticLearningPenalty, NoLearningPenalty
from ..optim.learning_rates import LearningRateAdam, LearningRateSGD, LearningRateSGDNesterov
from ..runtime.threads import session_threads, with_session_threads
from ..training.callbacks import check_callbacks
from ..training.run import FitHooks, FitSettings
from ._graph import (OUTPUT_FUNCTIONS, classifier_graph, init_layers,
                     regressor_graph, training_graph, weight_names)
from ._loop import (early_stopping_split, mlp_runner, new_mlp_run, same_objects,
                    validation_scorer)

__all__ = ["MLPRegressor", "MLPClassifier"]

_STOCHASTIC_SOLVERS = ("sgd", "adam")
_FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
#: scikit-learn's sparse formats (the graph takes X densified).
_SPARSE = ["csr", "csc"]
#: Held while an unpickled estimator rebuilds its runner.
_RUNNER_LOCK = threading.Lock()
_NON_FINITE = ("Solver produced non-finite parameter weights. The input data may"
               " contain large values and need to be preprocessed.")


class SolverDivergedError(ValueError):
    """scikit-learn's error for a diverged fit, raised when the estimator
    keeps usable weights (not put back as it was before the call)."""


def _keeps_state_on_error(method):
    """``method`` (fit, partial_fit, set_state) leaves the estimator as it
    was when it raises: its attributes and its run's (a fit that
    diverged keeps its last finite weights instead, as scikit-learn's).
    An error after training began cannot give back weights trained in
    place: only the attributes are restored then."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        saved = self.__dict__.copy()
        run = saved.get("_run")
        saved_run = None if run is None else run.__dict__.copy()
        try:
            return method(self, *args, **kwargs)
        except SolverDivergedError:
            raise
        except Exception:
            self.__dict__.clear()
            self.__dict__.update(saved)
            if run is not None:
                run.__dict__.clear()
                run.__dict__.update(saved_run)
            raise
    return wrapper


def _dense(X):
    """X as a dense ndarray: onnxruntime's MatMul takes dense tensors, so a
    sparse matrix is expanded (n_samples x n_features floats in memory)."""
    return X.toarray() if scipy.sparse.issparse(X) else X


def _validated_data(estimator, X, y, reset, dtype, y_numeric=False):
    """scikit-learn's checks of (X, y) for either estimator: X dense, a
    one-column y raveled (with scikit-learn's warning)."""
    check_target_rank(y)
    X, y = validate_data(estimator, X, y, multi_output=True, y_numeric=y_numeric,
                         dtype=dtype, reset=reset, accept_sparse=_SPARSE)
    if y.ndim == 2 and y.shape[1] == 1:
        y = column_or_1d(y, warn=True)
    return _dense(X), y


def _check_solver(estimator):
    """partial_fit exists only for the stochastic solvers (scikit-learn's
    rule)."""
    if estimator.solver not in _STOCHASTIC_SOLVERS:
        raise AttributeError("partial_fit is only available for stochastic "
                             f"optimizers. {estimator.solver} is not stochastic.")
    return True


def _requested_dtype(dtype):
    """None (follow X) or the float dtype asked for.

    Raises
    ------
    ValueError
        Anything but None, float32 or float64.
    """
    if dtype is None:
        return None
    try:
        value = np.dtype(dtype)
    except TypeError:
        value = None
    if value not in _FLOAT_DTYPES:
        raise ValueError(f"dtype must be None, np.float32 or np.float64, got "
                         f"{dtype!r}.")
    return value


def _checked_sample_weight(sample_weight, X):
    """scikit-learn's check of the sample weights, then what training
    refuses: negative weights, or weights summing to zero."""
    sample_weight = _check_sample_weight(sample_weight, X, dtype=X.dtype)
    sample_weight = check_sample_weight(sample_weight, X.shape[0], X.dtype)
    if (sample_weight < 0).any():
        raise ValueError("sample_weight has negative values.")
    if not sample_weight.sum() > 0:
        raise ValueError("sample_weight sums to zero: nothing to train on.")
    return sample_weight


def _assigned_layers(assigned, X, y):
    """The weights assigned before the first fit, checked against the data
    and cast to X's dtype.

    Raises
    ------
    ValueError
        Lists of different lengths, or shapes that do not chain from
        n_features to n_outputs.
    """
    coefs = [np.asarray(c, dtype=X.dtype) for c in assigned[0]]
    intercepts = [np.asarray(b, dtype=X.dtype).reshape(-1) for b in assigned[1]]
    fans = [X.shape[1]] + [c.shape[1] if c.ndim == 2 else -1 for c in coefs]
    if not coefs or len(coefs) != len(intercepts) or fans[-1] != y.shape[1] \
            or any(c.shape != (i, o) for c, i, o in zip(coefs, fans, fans[1:])) \
            or any(b.shape != (o,) for b, o in zip(intercepts, fans[1:])):
        raise ValueError(
            "The coefs_ and intercepts_ assigned before fit do not fit the "
            f"data: coefs_ shapes {[c.shape for c in coefs]}, intercepts_ "
            f"shapes {[b.shape for b in intercepts]}, X has {X.shape[1]} "
            f"features and y {y.shape[1]} outputs.")
    return coefs, intercepts


def _update_rule(estimator):
    """scikit-learn's ``AdamOptimizer`` or ``SGDOptimizer`` as an onnxtrain
    update rule (same formulas, see :mod:`onnxtrain.optim`)."""
    est = estimator
    if est.solver == "adam":
        return LearningRateAdam(eta0=est.learning_rate_init, beta_1=est.beta_1,
                                beta_2=est.beta_2, epsilon=est.epsilon)
    if est.momentum == 0:
        return LearningRateSGD(eta0=est.learning_rate_init, power_t=est.power_t,
                               learning_rate=est.learning_rate)
    return LearningRateSGDNesterov(
        eta0=est.learning_rate_init, power_t=est.power_t,
        learning_rate=est.learning_rate, momentum=est.momentum,
        nesterov=est.nesterovs_momentum)


def _penalty(estimator):
    """``alpha`` as scikit-learn applies it: ``alpha / 2 * sum(coef**2)``
    divided by the batch's sample-weight sum, intercepts excluded."""
    if estimator.alpha == 0:
        return NoLearningPenalty()
    return ElasticLearningPenalty(l1=0.0, l2=estimator.alpha / 2)


def _warn_batch_size(estimator, n_samples):
    if estimator.batch_size == "auto":
        return
    if estimator.early_stopping:
        n_samples -= int(np.ceil(estimator.validation_fraction * n_samples))
    if estimator.batch_size > n_samples:
        warnings.warn("Got `batch_size` less than 1 or larger than sample "
                      "size. It is going to be clipped")


def _collect(estimator, run, seen, incremental):
    """Copy the run's results into scikit-learn's attributes."""
    est = estimator
    est.__dict__.setdefault("loss_curve_", []).extend(run.train_losses[seen:])
    est.loss_ = est.loss_curve_[-1] if est.loss_curve_ else None
    est.n_iter_ = min(run.n_iter, 1) if incremental else run.n_iter
    est.t_ = run.t
    est.history_ = [dict(record) for record in run.history or ()]
    est.best_loss_ = None if est.early_stopping else run.best_loss
    est.validation_scores_ = (None if run.validation_scores is None
                              else list(run.validation_scores))
    est.best_validation_score_ = run.best_validation_score


class _BaseMLP(BaseEstimator):
    """What both estimators share: validation, the first-fit construction
    of the graphs, the one code path of fit and partial_fit, results."""

    # scikit-learn 1.9's BaseMultilayerPerceptron._parameter_constraints,
    # plus device and dtype.
    _parameter_constraints: dict = {
        "hidden_layer_sizes": ["array-like", Interval(numbers.Integral, 1, None,
                                                      closed="left")],
        "activation": [StrOptions({"identity", "logistic", "tanh", "relu"})],
        "solver": [StrOptions({"lbfgs", "sgd", "adam"})],
        "alpha": [Interval(numbers.Real, 0, None, closed="left")],
        "batch_size": [StrOptions({"auto"}),
                       Interval(numbers.Integral, 1, None, closed="left")],
        "learning_rate": [StrOptions({"constant", "invscaling", "adaptive"})],
        "learning_rate_init": [Interval(numbers.Real, 0, None, closed="neither")],
        "power_t": [Interval(numbers.Real, 0, None, closed="left")],
        "max_iter": [Interval(numbers.Integral, 1, None, closed="left")],
        "shuffle": ["boolean"],
        "random_state": ["random_state"],
        "tol": [Interval(numbers.Real, 0, None, closed="left")],
        "verbose": ["verbose"],
        "warm_start": ["boolean"],
        "momentum": [Interval(numbers.Real, 0, 1, closed="both")],
        "nesterovs_momentum": ["boolean"],
        "early_stopping": ["boolean"],
        "validation_fraction": [Interval(numbers.Real, 0, 1, closed="left")],
        "beta_1": [Interval(numbers.Real, 0, 1, closed="left")],
        "beta_2": [Interval(numbers.Real, 0, 1, closed="left")],
        "epsilon": [Interval(numbers.Real, 0, None, closed="neither")],
        "n_iter_no_change": [Interval(numbers.Integral, 1, None, closed="left"),
                             Options(numbers.Real, {np.inf})],
        "max_fun": [Interval(numbers.Integral, 1, None, closed="left")],
        "device": [str],
        "dtype": "no_validation",  # checked in fit: None, float32 or float64
        "callbacks": [list, tuple, None],
        "n_threads": [Interval(numbers.Integral, 1, None, closed="left"), None],
    }

    # ------------------------------------------------------------ checks
    def _check_fit_params(self, incremental):
        self._validate_params()
        check_callbacks(self.callbacks)
        if incremental and self.early_stopping:
            raise ValueError("partial_fit does not support early_stopping=True")
        hidden = self.hidden_layer_sizes
        hidden = list(hidden) if hasattr(hidden, "__iter__") else [hidden]
        if np.any(np.array(hidden) <= 0):
            raise ValueError(f"hidden_layer_sizes must be > 0, got {hidden}.")
        return [int(h) for h in hidden]

    # ---------------------------------------------------------------- fit
    @with_session_threads
    def _fit(self, X, y, sample_weight=None, incremental=False):
        """The one code path of fit and partial_fit."""
        hidden = self._check_fit_params(incremental)
        first = "_run" not in self.__dict__ or (not self.warm_start and not incremental)
        # weights assigned before the first fit start a warm start or a
        # partial_fit, as scikit-learn's (its first pass tests coefs_)
        assigned = self.__dict__.get("_layers") if (
            "_run" not in self.__dict__ and (self.warm_start or incremental)) else None
        if not first:
            dtype = self._dtype
        else:  # the graph's dtype after the first fit
            dtype = _requested_dtype(self.dtype) or (np.float64, np.float32)
        X, y = self._validate_input(X, y, incremental, reset=first, dtype=dtype)
        if sample_weight is not None:
            sample_weight = _checked_sample_weight(sample_weight, X)
        random_state = check_random_state(self.random_state)
        if first:
            self._initialize(X, y, hidden, random_state, assigned)
        elif y.shape[1] != self.n_outputs_:
            raise ValueError(f"y has {y.shape[1]} outputs but the network was "
                             f"built for {self.n_outputs_}.")
        else:
            self._push_layers()
        y = y.astype(self._dtype)
        if self.solver == "lbfgs":
            self._fit_lbfgs(X, y, sample_weight)
            return self._check_finite(False, X, first)
        if not first:
            # partial_fit keeps the optimizer, unless set_params changed it
            self._restart(random_state, incremental)
        self._fit_stochastic(X, y, sample_weight, incremental)
        return self._check_finite(
            self._run.diverged is not None and not self.early_stopping, X, first)

    def _check_finite(self, diverged, X, built):
        """scikit-learn's last check of a fit: a diverged network (a
        non-finite loss without early stopping, whose best weights replace
        the last ones, or non-finite weights) raises its ValueError. The
        weights kept must predict finite values on the training rows ``X``:
        otherwise the estimator goes back to its state before the call when
        this call ``built`` a new network, or forgets the fit."""
        self._layers = None
        run = self._network()
        if not diverged and all(np.isfinite(w).all() for w in run.get_state()):
            return self
        if (diverged and run.diverged_to_start) or \
                np.isfinite(run.runner.predict(X)).all():
            raise SolverDivergedError(_NON_FINITE)
        if built:  # restored by _keeps_state_on_error
            raise ValueError(f"{_NON_FINITE} The weights kept predict non-finite "
                             "values: the estimator is back to its state before "
                             "this call.")
        for key in list(self.__dict__):
            if key not in self.get_params(deep=False):
                del self.__dict__[key]
        raise SolverDivergedError(f"{_NON_FINITE} The weights kept predict non-finite values: "
                                  "the estimator is no longer fitted (fit it again).")

    @_keeps_state_on_error
    def fit(self, X, y, sample_weight=None):
        """Train the network on (X, y).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Numeric data; a CSR or CSC sparse matrix is densified.
        y : array-like of shape (n_samples,) or (n_samples, n_outputs)
            The regressor's numeric targets; the classifier's class labels
            (ints, strings...) or multilabel indicator matrix.
        sample_weight : array-like of shape (n_samples,), default=None
            Non-negative weights of the rows in the loss and its gradient.

        Returns
        -------
        self : object
            The trained network.

        Raises
        ------
        ValueError
            Bad parameters or data (NaN, shapes, negative y with the
            'poisson' loss, continuous y for the classifier). A non-finite
            loss without early stopping (see the class).
        """
        return self._fit(X, y, sample_weight, incremental=False)

    def __sklearn_is_fitted__(self):
        return "_run" in self.__dict__

    def _fit_stochastic(self, X, y, sample_weight, incremental):
        """scikit-learn's ``_fit_stochastic``: the run's epochs (one for
        partial_fit), then its results as scikit-learn's attributes."""
        _warn_batch_size(self, X.shape[0])
        run = self._network()
        seen = len(run.train_losses) if incremental else 0
        run.configure(self._settings(), incremental)
        X_val = y_val = weight = None
        try:
            if self.early_stopping and not incremental:
                single = y.ndim == 1 or y.shape[1] == 1
                # scikit-learn stratifies binary targets on its binarized y,
                # a bool column (its error messages name 'True' / 'False')
                stratify = y.reshape(-1, 1).astype(bool) \
                    if is_classifier(self) and single else None
                X, X_val, y, y_val, sample_weight, weight = early_stopping_split(
                    X, y, sample_weight, run.rng, self.validation_fraction, stratify)
            path = run.choose_path(sample_weight, int(np.clip(
                run.settings.batch_size, 1, len(X))))
            run.runner.prepare(path, sample_weight is not None)
            hooks = FitHooks(self, validation_scorer(
                run, "classification" if is_classifier(self) else "regression",
                self.out_activation_, weight), self._dtype, self._forget_layer_lists)
            run.fit_loop(X, y, sample_weight, X_val, y_val,
                         1 if incremental else self.max_iter, hooks)
        except ValueError as exc:
            if "least populated class" in str(exc) and is_classifier(self):
                negative, positive = self.classes_[[0, -1]].tolist()
                raise ValueError(f"{exc} (scikit-learn's split stratifies the "
                                 f"binarized y: 'True' stands for {positive!r}, "
                                 f"'False' for {negative!r})") from exc
            raise
        finally:
            _collect(self, run, seen, incremental)  # also after an error
        if not incremental and run.n_iter == self.max_iter and not run.stopped:
            warnings.warn(f"Stochastic Optimizer: Maximum iterations "
                          f"({self.max_iter}) reached and the optimization "
                          "hasn't converged yet.", ConvergenceWarning)
        return self

    def _fit_lbfgs(self, X, y, sample_weight):
        """scikit-learn's ``_fit_lbfgs``: scipy's L-BFGS-B on the loss of all
        the rows and its gradient (onnxruntime's forward and backward
        passes) plus the ``alpha`` term, the weights packed as scikit-learn
        packs them (every coefficient, then every intercept)."""
        run = self._network()
        runner = run.runner
        shapes = [w.shape for w in run.get_state()]
        order = list(range(0, len(shapes), 2)) + list(range(1, len(shapes), 2))
        ends = np.cumsum([int(np.prod(shapes[i])) for i in order])[:-1]
        total = X.shape[0] if sample_weight is None else float(sample_weight.sum())

        def pack(arrays):
            return np.hstack([arrays[i].ravel() for i in order])

        def unpack(packed):
            weights = [None] * len(shapes)
            for i, part in zip(order, np.split(packed, ends)):
                weights[i] = part.reshape(shapes[i]).astype(self._dtype)
            return weights

        def loss_and_gradient(packed):
            # one forward and one backward pass on every row (no penalty):
            # scikit-learn's loss and its coef_grads / intercept_grads
            weights = unpack(packed)
            run.set_state(weights)
            value, grad = runner.loss_and_gradient(X, y, sample_weight)
            gradients = [g.numpy().copy() for g in runner.engine.backward([grad])]
            loss = float(value.numpy())
            for i in range(0, len(weights), 2):  # coefficients only
                coef = weights[i].ravel()
                loss += 0.5 * self.alpha * float(np.dot(coef, coef)) / total
                gradients[i] = gradients[i] + self.alpha * weights[i] / total
            return loss, pack(gradients)

        result = scipy.optimize.minimize(
            loss_and_gradient, pack(run.get_state()), method="L-BFGS-B", jac=True,
            options={"maxfun": self.max_fun, "maxiter": self.max_iter,
                     "gtol": self.tol})
        self.n_iter_ = min(result.nit, self.max_iter)
        if result.status != 0:
            warnings.warn(f"lbfgs failed to converge after {self.n_iter_} "
                          f"iteration(s) (status={result.status}):\n"
                          f"{result.message}", ConvergenceWarning)
        self.loss_ = float(result.fun)
        run.set_state(unpack(result.x))
        return self

    def _initialize(self, X, y, hidden, random_state, assigned=None):
        """First fit: the layers, the initial weights (drawn from
        ``random_state``, which then shuffles and splits, or ``assigned``,
        the lists given to ``coefs_`` and ``intercepts_`` before), the
        graphs and the run."""
        self._dtype = X.dtype
        self._layers = None  # the lists assigned before are read once, here
        self.n_outputs_ = y.shape[1]
        if assigned is not None:
            coefs, intercepts = _assigned_layers(assigned, X, y)
            hidden = [c.shape[1] for c in coefs[:-1]]
        layer_units = [X.shape[1]] + hidden + [self.n_outputs_]
        self.n_layers_ = len(layer_units)
        self.out_activation_ = self._output_activation()
        if assigned is None:
            coefs, intercepts = init_layers(layer_units, self.activation,
                                            random_state, X.dtype)
        self._inference_onnx = self._inference_graph(coefs, intercepts)
        self._training_onnx = training_graph(coefs, intercepts, self.activation,
                                             exp_output=self.out_activation_ == "exp")
        self._training_types = infer_value_types(self._training_onnx)
        self._run = new_mlp_run(
            self._training_onnx, self._training_types, weight_names(len(coefs)),
            self._learning_loss(),
            _update_rule(self), _penalty(self), self.device, random_state,
            self.early_stopping)
        self.t_ = self.n_iter_ = 0
        if self.solver in _STOCHASTIC_SOLVERS:
            self.loss_curve_ = []

    def _restart(self, random_state, incremental):
        """Prepare a later fit or partial_fit of the same network.

        scikit-learn's MLP calls ``check_random_state`` at each call, starts
        each call's epoch order from ``arange``, reads its parameters again
        and, for a fit (not a partial_fit), builds a new optimizer: zero
        velocities and moments, step 0, initial learning rate. An update
        rule or penalty with new parameters gives a new run on the current
        weights (a partial_fit keeps the optimizer state when the rule
        keeps the same one); unchanged ones go on as they are.
        """
        run = self._network()
        rule, penalty = _update_rule(self), _penalty(self)
        if not same_objects((run.update_rule, run.penalty), (rule, penalty)):
            run = self._run = new_mlp_run(
                self._training_onnx, self._training_types,
                run.runner.engine.weights_to_train, run.loss,
                rule, penalty, self.device, random_state, self.early_stopping,
                previous=run, keep_optimizer=incremental)
        elif not incremental:
            run.runner.reset_state()
            run.update_rule.init_learning_rate()
        run.rng, run.order = random_state, None
        if self.early_stopping and run.validation_scores is None:
            run.validation_scores, run.best_validation_score = [], -np.inf

    def _network(self):
        """The run, its runner rebuilt from numpy copies after unpickling."""
        run = self._run
        if run.runner is None:
            with _RUNNER_LOCK, session_threads(self.n_threads):
                if run.runner is None:
                    run.attach(mlp_runner(
                        self._training_onnx, weight_names(self.n_layers_ - 1),
                        run, self.device, self._training_types))
        return run

    def _settings(self):
        """The :class:`~onnxtrain.training.run.FitSettings` of this call."""
        return FitSettings(
            batch_size=200 if self.batch_size == "auto" else self.batch_size,
            shuffle=self.shuffle, early_stopping=self.early_stopping,
            n_iter_no_change=self.n_iter_no_change, tol=float(self.tol),
            print_progress=bool(self.verbose), callbacks=list(self.callbacks or ()),
            name=type(self).__name__, loop_max_bytes=_base.LOOP_MAX_PARAMETER_BYTES)

    # ------------------------------------------------------------ results
    @with_session_threads
    def _output(self, X):
        """The network's output (after the output activation), as
        scikit-learn's ``_forward_pass_fast``: ndarray of shape
        (n_samples, n_outputs) in the graph's dtype."""
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, dtype=self._dtype,
                          accept_sparse=_SPARSE)
        self._push_layers()
        output = self._network().runner.predict(_dense(X))
        return OUTPUT_FUNCTIONS[self.out_activation_](output)

    # ------------------------------------------------------------ weights
    # ``coefs_`` and ``intercepts_`` are lists kept on the estimator, as
    # scikit-learn's: an item replaced or an array changed in place reaches
    # the network at its next use (predict, fit, to_onnx), which copies the
    # lists into the network (``_push_layers``). Training copies the
    # network's weights into new lists (the old ones are left alone).
    def _layer_lists(self):
        layers = self.__dict__.get("_layers")
        if layers is None:
            if "_run" not in self.__dict__:
                raise AttributeError(f"This {type(self).__name__} instance is "
                                     "not fitted yet.")
            weights = self._network().get_state()
            layers = self._layers = (weights[0::2], weights[1::2])
        return layers

    def _assign_layers(self, values, part):
        if "_run" in self.__dict__ or self.__dict__.get("_layers") is not None:
            layers = list(self._layer_lists())
        else:  # before the first fit
            layers = [[], []]
        layers[part] = values if isinstance(values, list) else list(values)
        self._layers = tuple(layers)

    def _push_layers(self):
        """Copy ``coefs_`` and ``intercepts_`` into the network if they were
        read or assigned since training.

        Raises
        ------
        ValueError
            Lists or arrays that do not have the network's lengths and shapes.
        """
        layers = self.__dict__.get("_layers")
        if layers is None or "_run" not in self.__dict__:
            return
        coefs, intercepts = layers
        if len(coefs) != self.n_layers_ - 1 or len(intercepts) != self.n_layers_ - 1:
            raise ValueError(f"coefs_ and intercepts_ must hold {self.n_layers_ - 1} "
                             f"arrays each, got {len(coefs)} and {len(intercepts)}.")
        weights = [np.asarray(w, dtype=self._dtype)
                   for pair in zip(coefs, intercepts) for w in pair]
        self._network().set_state(weights)

    @property
    def coefs_(self):
        """list of ndarray of shape (fan_in, fan_out): the coefficients of
        each layer. Assignable (also before the first fit, which then starts
        from them with ``warm_start=True`` or ``partial_fit``); edits of the
        list or its arrays are used by the next predict, fit or to_onnx."""
        return self._layer_lists()[0]

    @coefs_.setter
    def coefs_(self, coefs):
        self._assign_layers(coefs, 0)

    @property
    def intercepts_(self):
        """list of ndarray of shape (fan_out,): the intercepts of each layer
        (assignable and editable as ``coefs_``)."""
        return self._layer_lists()[1]

    @intercepts_.setter
    def intercepts_(self, intercepts):
        self._assign_layers(intercepts, 1)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True  # CSR / CSC, densified
        return tags

    # ---------------------------------------------------------- state
    def get_state(self, include_optimizer=False):
        """The weights (coefficient, intercept of each layer in turn), and
        with ``include_optimizer=True`` the optimizer state, step, learning
        rate and counters: see
        :meth:`onnxtrain.OrtGradientForwardBackwardOptimizer.get_state`.
        A ``partial_fit`` after :meth:`set_state` continues as if
        uninterrupted (a ``fit`` starts a new optimizer, as scikit-learn's).

        Raises
        ------
        sklearn.exceptions.NotFittedError
            Before the first fit.
        """
        check_is_fitted(self)
        self._push_layers()
        return self._network().get_state(include_optimizer)

    @_keeps_state_on_error
    def set_state(self, state):
        """Restore :meth:`get_state`'s weights or dict; returns self.

        Raises
        ------
        sklearn.exceptions.NotFittedError
            Before the first fit.
        ValueError
            Shapes or an optimizer state that do not fit the network.
        """
        check_is_fitted(self)
        run = self._network().set_state(state)
        self._layers = None
        if isinstance(state, dict) and "optimizer" in state:
            self.t_ = run.t
        return self

    def _forget_layer_lists(self):
        """During training the network holds the weights: drop the lists
        ``coefs_`` / ``intercepts_`` a callback may have read."""
        self._layers = None

    def to_onnx(self):
        """The trained inference graph.

        Returns
        -------
        onnx.ModelProto
            Input ``X`` of shape (n_samples, n_features) in the training
            dtype (float32 or float64). The regressor outputs ``variable``
            (n_samples, n_outputs); the classifier ``label`` (n_samples,)
            and ``probabilities`` (n_samples, n_classes), as skl2onnx's
            converters with ``options={'zipmap': False}``. Run by
            ``onnxruntime.InferenceSession`` it gives ``predict`` /
            ``predict_proba``.
        """
        check_is_fitted(self)
        self._push_layers()
        return self._network().trained_model(self._inference_onnx)


# The parameters, attributes and errors both estimators document, with
# what differs between them as format fields (literal braces doubled).
_SHARED_DOC = """\
    hidden_layer_sizes : array-like of shape (n_layers - 2,) or int, default=(100,)
        Number of units of each hidden layer.
    activation : {{'identity', 'logistic', 'tanh', 'relu'}}, default='relu'
        Activation of the hidden layers.
    solver : {{'adam', 'sgd', 'lbfgs'}}, default='adam'
        'sgd' (with momentum / Nesterov) and 'adam' train by mini-batches
        (the epochs, batches and updates run on onnxruntime); 'lbfgs' is
        scipy's L-BFGS-B on the loss of all the rows, whose value and
        gradient onnxruntime computes (no ``loss_curve_``, no partial_fit).
    alpha : float, default=0.0001
        L2 penalty: ``alpha / 2 * sum(coef ** 2)`` (intercepts excluded)
        divided by the batch's sample-weight sum, as scikit-learn adds it.
    batch_size : int or 'auto', default='auto'
        Rows per step; 'auto' is ``min(200, n_samples)``. Clipped to the
        number of rows (with a warning). The last batch of an epoch may be
        smaller.
    learning_rate : {{'constant', 'invscaling', 'adaptive'}}, default='constant'
        Schedule of the 'sgd' solver: 'constant'; 'invscaling':
        ``learning_rate_init / (t + 1) ** power_t`` with t the number of
        samples seen, updated after each epoch; 'adaptive': divided by 5
        whenever the loss (or validation score) stops improving by ``tol``
        for ``n_iter_no_change`` epochs, training stops below 1e-6.
    learning_rate_init : float, default=0.001
    power_t : float, default=0.5
        Exponent of 'invscaling'.
    max_iter : int, default=200
        Maximum number of epochs ('lbfgs': of iterations); a
        ConvergenceWarning when reached.
    shuffle : bool, default=True
        Shuffle the rows at each epoch, in scikit-learn's order.
    random_state : int, RandomState instance or None, default=None
        Initial weights, shuffling and the early-stopping split.
    tol : float, default=1e-4
        Improvement threshold of the stopping rule: training stops when
        the training loss (or the validation score with early stopping)
        has not improved by ``tol`` for ``n_iter_no_change`` epochs
        ('lbfgs': scipy's ``gtol``).
    verbose : bool or int, default=False
        Print the loss of each epoch.
    warm_start : bool, default=False
        Start fit from the current weights (the optimizer restarts, as in
        scikit-learn){warm_start}.
    momentum : float, default=0.9
        Momentum of 'sgd' (0 is plain SGD).
    nesterovs_momentum : bool, default=True
    early_stopping : bool, default=False
        Hold out ``validation_fraction`` of the rows{stratified}, stop
        when their {score} stops improving, keep the best weights.
    validation_fraction : float, default=0.1
    beta_1, beta_2 : float, default=0.9, 0.999
        Adam's decay rates.
    epsilon : float, default=1e-8
        Adam's numerical stability constant.
    n_iter_no_change : int or np.inf, default=10
    max_fun : int, default=15000
        Maximum number of loss evaluations of 'lbfgs'.
    device : str, default='cpu'
        'cpu', 'cuda' or 'cuda:N' (onnxruntime's CUDA provider).
    dtype : None, np.float32 or np.float64, default=None
        Floating type of the graph. None follows X as scikit-learn does
        (float32 stays float32, float64 and integers give float64).
    callbacks : list of Callback, default=None
        :mod:`onnxtrain.training.callbacks` objects called with this
        estimator at each epoch and batch of the stochastic solvers
        (scoring, checkpoints, per-batch learning rate, early stopping on
        any metric); ignored by 'lbfgs'.
    n_threads : int, default=None
        Threads of each onnxruntime session; None: joblib's budget inside a
        joblib worker process, onnxruntime's default elsewhere
        (:mod:`onnxtrain.runtime.threads`).

    Attributes
    ----------
{classes}    loss_ : float
        Loss of the last epoch (penalty included).
    best_loss_ : float or None
        Smallest epoch loss; None with early stopping.
    history_ : list of dict
        Stochastic solvers: one record per epoch (``epoch``, ``train_loss``,
        ``learning_rate``, ``dur`` in seconds, ``valid_score`` with early
        stopping, and what callbacks add), as skorch's History.
    loss_curve_ : list of float
        Loss of each epoch (of every fit since the weights were drawn).
    validation_scores_ : list of float or None
        Score ({score}) of the validation rows at each epoch (early
        stopping only).
    best_validation_score_ : float or None
    t_ : int
        Number of training samples seen since the weights were drawn.
    coefs_ : list of ndarray of shape (fan_in, fan_out)
    intercepts_ : list of ndarray of shape (fan_out,)
    n_features_in_ : int
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Set when X has string column names (a DataFrame).
    n_iter_ : int
        Epochs of the last fit (1 after partial_fit).
    n_layers_ : int
    n_outputs_ : int
{n_outputs}    out_activation_ : {out_activation}

    Raises
    ------
    sklearn.utils._param_validation.InvalidParameterError
        (a ValueError) Invalid parameter, at fit.
    ValueError
        "Solver produced non-finite parameter weights...", after a fit whose
        loss became NaN or infinite (scikit-learn's error). Training stops
        at that epoch (onnxruntime never commits non-finite weights; the
        last finite ones stay). With early stopping there is no error: the
        epoch's validation score is NaN and the best weights are restored.
"""


class MLPRegressor(RegressorMixin, _BaseMLP):
    __doc__ = ("""Multi-layer perceptron regressor trained on onnxruntime.

    scikit-learn's :class:`sklearn.neural_network.MLPRegressor` (1.9), with
    the same parameters, attributes and results: with the same settings and
    ``random_state``, the initial weights, the batches, every update and so
    ``loss_curve_`` are scikit-learn's (up to float rounding). The network
    is an ONNX graph (MatMul, Add and the activation per layer) trained by
    onnxtrain's forward/backward engine on ``device``.

    Parameters
    ----------
    loss : {'squared_error', 'poisson'}, default='squared_error'
        'squared_error': half the mean squared error, identity output.
        'poisson': half the Poisson deviance, exponential output (y >= 0).
""" + _SHARED_DOC.format(
        warm_start="", stratified="", score="R²", classes="", n_outputs="",
        out_activation="{'identity', 'exp'}") + """
    Examples
    --------
    >>> from sklearn.datasets import load_diabetes
    >>> from onnxtrain.neural_network import MLPRegressor
    >>> X, y = load_diabetes(return_X_y=True)
    >>> reg = MLPRegressor(hidden_layer_sizes=(20,), max_iter=5, random_state=0)
    >>> reg = reg.fit(X, y)
    >>> onx = reg.to_onnx()  # input 'X' (float64), output 'variable'
    """)

    _parameter_constraints: dict = {
        **_BaseMLP._parameter_constraints,
        "loss": [StrOptions({"squared_error", "poisson"})],
    }

    def __init__(self, loss="squared_error", hidden_layer_sizes=(100,),
                 activation="relu", *, solver="adam", alpha=0.0001,
                 batch_size="auto", learning_rate="constant",
                 learning_rate_init=0.001, power_t=0.5, max_iter=200,
                 shuffle=True, random_state=None, tol=1e-4, verbose=False,
                 warm_start=False, momentum=0.9, nesterovs_momentum=True,
                 early_stopping=False, validation_fraction=0.1, beta_1=0.9,
                 beta_2=0.999, epsilon=1e-8, n_iter_no_change=10, max_fun=15000,
                 device="cpu", dtype=None, callbacks=None, n_threads=None):
        self.loss = loss
        self.hidden_layer_sizes = hidden_layer_sizes
        self.activation = activation
        self.solver = solver
        self.alpha = alpha
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.learning_rate_init = learning_rate_init
        self.power_t = power_t
        self.max_iter = max_iter
        self.shuffle = shuffle
        self.random_state = random_state
        self.tol = tol
        self.verbose = verbose
        self.warm_start = warm_start
        self.momentum = momentum
        self.nesterovs_momentum = nesterovs_momentum
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon
        self.n_iter_no_change = n_iter_no_change
        self.max_fun = max_fun
        self.device = device
        self.dtype = dtype
        self.callbacks = callbacks
        self.n_threads = n_threads

    def _output_activation(self):
        return "exp" if self.loss == "poisson" else "identity"

    def _learning_loss(self):
        """scikit-learn's ``squared_loss`` or ``poisson_loss`` (on the
        exponential output)."""
        return PoissonLearningLoss() if self.loss == "poisson" else \
            SquareLearningLoss()

    def _inference_graph(self, coefs, intercepts):
        return regressor_graph(coefs, intercepts, self.activation,
                               self.out_activation_)

    def _validate_input(self, X, y, incremental, reset, dtype):
        """X and y validated as scikit-learn does; y as (n, n_outputs)."""
        X, y = _validated_data(self, X, y, reset, dtype, y_numeric=True)
        if self.loss == "poisson" and (y < 0).any():
            raise ValueError("Some value(s) of y are negative which is not "
                             "allowed for the 'poisson' loss.")
        return X, (y.reshape(-1, 1) if y.ndim == 1 else y)

    @available_if(_check_solver)
    @_keeps_state_on_error
    def partial_fit(self, X, y, sample_weight=None):
        """One epoch over (X, y) from the current weights (the first call
        draws them). Same arguments and errors as :meth:`fit`; early
        stopping is refused (ValueError)."""
        return self._fit(X, y, sample_weight, incremental=True)

    def predict(self, X):
        """Predictions.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,) or (n_samples, n_outputs)
            (n_samples,) for one output, in the graph's dtype.
        """
        output = self._output(X)
        return output.ravel() if output.shape[1] == 1 else output


class MLPClassifier(ClassifierMixin, _BaseMLP):
    __doc__ = ("""Multi-layer perceptron classifier trained on onnxruntime.

    scikit-learn's :class:`sklearn.neural_network.MLPClassifier` (1.9), with
    the same parameters, attributes and results: binary (one logistic
    output), multiclass (softmax) and multilabel (one logistic output per
    label) targets; with the same settings and ``random_state`` the initial
    weights, batches, updates and ``loss_curve_`` are scikit-learn's. The
    network trains on its logits with the log loss computed from them
    (:class:`~onnxtrain.losses.CrossEntropyLearningLoss` with
    ``from_logits=True``, :class:`~onnxtrain.losses.NegLogLearningLoss` on
    the raw score), whose gradient is scikit-learn's ``probability - y``.

    Parameters
    ----------
""" + _SHARED_DOC.format(
        warm_start="; y must have the same classes",
        stratified=" (stratified\n        for binary and multiclass targets)",
        score="accuracy",
        classes="    classes_ : ndarray of shape (n_classes,)\n"
                "        The labels (0 .. n_labels - 1 for multilabel targets).\n",
        n_outputs="        1 for binary targets, else the number of classes or labels.\n",
        out_activation="{'logistic', 'softmax'}") + """
    Examples
    --------
    >>> from sklearn.datasets import load_digits
    >>> from onnxtrain.neural_network import MLPClassifier
    >>> X, y = load_digits(return_X_y=True)
    >>> clf = MLPClassifier((30,), max_iter=5, random_state=0).fit(X / 16, y)
    >>> onx = clf.to_onnx()  # outputs 'label' (int64), 'probabilities'
    """)

    def __init__(self, hidden_layer_sizes=(100,), activation="relu", *,
                 solver="adam", alpha=0.0001, batch_size="auto",
                 learning_rate="constant", learning_rate_init=0.001,
                 power_t=0.5, max_iter=200, shuffle=True, random_state=None,
                 tol=1e-4, verbose=False, warm_start=False, momentum=0.9,
                 nesterovs_momentum=True, early_stopping=False,
                 validation_fraction=0.1, beta_1=0.9, beta_2=0.999,
                 epsilon=1e-8, n_iter_no_change=10, max_fun=15000,
                 device="cpu", dtype=None, callbacks=None, n_threads=None):
        self.hidden_layer_sizes = hidden_layer_sizes
        self.activation = activation
        self.solver = solver
        self.alpha = alpha
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.learning_rate_init = learning_rate_init
        self.power_t = power_t
        self.max_iter = max_iter
        self.shuffle = shuffle
        self.random_state = random_state
        self.tol = tol
        self.verbose = verbose
        self.warm_start = warm_start
        self.momentum = momentum
        self.nesterovs_momentum = nesterovs_momentum
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon
        self.n_iter_no_change = n_iter_no_change
        self.max_fun = max_fun
        self.device = device
        self.dtype = dtype
        self.callbacks = callbacks
        self.n_threads = n_threads

    def _output_activation(self):
        return "softmax" if self._label_binarizer.y_type_ == "multiclass" \
            else "logistic"

    def _learning_loss(self):
        """scikit-learn's ``log_loss`` (softmax) or ``binary_log_loss``
        (logistic), computed from the logits."""
        if self.out_activation_ == "softmax":
            return CrossEntropyLearningLoss(from_logits=True)
        return NegLogLearningLoss(probability_function="sigmoid")

    def _inference_graph(self, coefs, intercepts):
        multilabel = self._label_binarizer.y_type_.startswith("multilabel")
        return classifier_graph(coefs, intercepts, self.activation,
                                self.out_activation_, self.classes_, multilabel)

    def _validate_input(self, X, y, incremental, reset, dtype):
        """scikit-learn's ``MLPClassifier._validate_input``: X, and y
        binarized (n, n_outputs); defines or checks ``classes_``.

        Raises
        ------
        ValueError
            Classes that differ from the previous fit (warm start) or that
            were not declared (partial_fit).
        """
        X, y = _validated_data(self, X, y, reset, dtype)
        if not hasattr(self, "classes_") or (not self.warm_start
                                             and not incremental):
            self._label_binarizer = LabelBinarizer().fit(y)
            self.classes_ = self._label_binarizer.classes_
        else:
            classes = unique_labels(y)
            if self.warm_start:
                if set(classes) != set(self.classes_):
                    raise ValueError(
                        "warm_start can only be used where `y` has the same "
                        "classes as in the previous call to fit. Previously "
                        f"got {self.classes_}, `y` has {classes}")
            elif len(np.setdiff1d(classes, self.classes_, assume_unique=True)):
                raise ValueError("`y` has classes not in `self.classes_`. "
                                 f"`self.classes_` has {self.classes_}. 'y' "
                                 f"has {classes}.")
        return X, self._label_binarizer.transform(y).astype(bool)

    @available_if(_check_solver)
    @_keeps_state_on_error
    def partial_fit(self, X, y, sample_weight=None, classes=None):
        """One epoch over (X, y) from the current weights.

        Parameters
        ----------
        X, y, sample_weight
            As :meth:`fit`.
        classes : array-like of shape (n_classes,), default=None
            Every class; required on the first call (y may lack some),
            ignored for multilabel y.

        Returns
        -------
        self : object
            The network after this epoch.

        Raises
        ------
        ValueError
            No ``classes`` on the first call, ``classes`` that changed,
            labels outside them, or ``early_stopping=True``.
        """
        if getattr(self, "classes_", None) is None:
            if classes is None:
                raise ValueError("classes must be passed on the first call to "
                                 "partial_fit.")
            self._label_binarizer = LabelBinarizer()
            multilabel = type_of_target(y).startswith("multilabel")
            self._label_binarizer.fit(y if multilabel else classes)
            self.classes_ = self._label_binarizer.classes_
        elif classes is not None and not np.array_equal(
                self.classes_, unique_labels(classes)):
            raise ValueError(f"`classes={classes!r}` is not the same as on last "
                             f"call to partial_fit, was: {self.classes_!r}")
        return self._fit(X, y, sample_weight, incremental=True)

    def predict(self, X):
        """Class labels.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,) or (n_samples, n_labels)
            Labels of ``classes_``' type; a 0/1 indicator for multilabel.
        """
        output = self._output(X)
        if self.n_outputs_ == 1:
            output = output.ravel()
        return self._label_binarizer.inverse_transform(output)

    def predict_proba(self, X):
        """Probability of each class.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, n_classes)
            Columns in ``classes_`` order ((1 - p, p) for binary targets;
            independent label probabilities for multilabel).
        """
        output = self._output(X)
        if self.n_outputs_ == 1:
            output = output.ravel()
            return np.vstack([1 - output, output]).T
        return output

    def predict_log_proba(self, X):
        """``log(predict_proba(X))``: ndarray of shape (n_samples, n_classes)."""
        return np.log(self.predict_proba(X))

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_label = True
        return tags
