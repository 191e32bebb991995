"""onnxtrain.neural_network against scikit-learn's MLPs: the API, the initial
weights, the loss curves, the scores, the meta-estimators, the exported
graph."""
import copy
import inspect
import io
import pickle
import warnings

import joblib
import numpy as np
import onnx
import onnxruntime
import pandas
import pytest
from numpy.testing import assert_allclose
from sklearn import neural_network as skl_nn
from sklearn.base import clone
from sklearn.calibration import CalibratedClassifierCV
from sklearn.compose import TransformedTargetRegressor
from sklearn.datasets import load_diabetes, load_digits, make_classification
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import GridSearchCV, cross_val_score, train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from onnxtrain.initializers import glorot_uniform_weights
from onnxtrain.neural_network import MLPClassifier, MLPRegressor
from onnxtrain.neural_network._graph import init_layers, training_graph, weight_names

OURS = {"regressor": MLPRegressor, "classifier": MLPClassifier}
THEIRS = {"regressor": skl_nn.MLPRegressor, "classifier": skl_nn.MLPClassifier}


# ----------------------------------------------------------------- data
def _regression(n=105, k=1, dtype=np.float64):
    rng = np.random.RandomState(0)
    X = rng.randn(n, 5)
    y = np.tanh(X @ rng.randn(5, k)) + 0.1 * rng.randn(n, k)
    return X.astype(dtype), (y.ravel() if k == 1 else y).astype(dtype)


def _classification(n_classes, n=105, labels=None):
    X, y = make_classification(n_samples=n, n_features=5, n_informative=4,
                               n_redundant=0, n_classes=n_classes, random_state=0)
    return X, (y if labels is None else np.asarray(labels)[y])


def _multilabel(n=105):
    X, y = _classification(3, n)
    return X, np.stack([y == 0, y == 1], axis=1).astype(np.int64)


def _poisson(n=105):
    rng = np.random.RandomState(0)
    X = rng.randn(n, 5)
    return X, rng.poisson(np.exp(0.4 * X[:, 0] - 0.2 * X[:, 1])).astype(np.float64)


DATA = {"regression": ("regressor", _regression),
        "regression-3-outputs": ("regressor", lambda: _regression(k=3)),
        "regression-float32": ("regressor", lambda: _regression(dtype=np.float32)),
        "poisson": ("regressor", _poisson),
        "binary": ("classifier", lambda: _classification(2)),
        "binary-float-labels": ("classifier",
                                lambda: _classification(2, labels=[-1.0, 2.0])),
        "multiclass-str": ("classifier",
                           lambda: _classification(3, labels=["a", "b", "c"])),
        "multilabel": ("classifier", _multilabel)}

#: Settings under which both libraries take the same steps: rows in order
#: (unless a row asks for shuffling), no stopping unless a row asks for it.
BASE = dict(hidden_layer_sizes=(8,), solver="sgd", learning_rate="constant",
            learning_rate_init=0.01, momentum=0.0, alpha=0.0, batch_size=10,
            max_iter=20, shuffle=False, tol=0.0, n_iter_no_change=np.inf,
            random_state=0)


def _fit(estimator, X, y, **fit_params):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return estimator.fit(X, y, **fit_params)


def _both(data, **settings):
    kind, make = DATA[data]
    X, y = make()
    params = {**BASE, **settings}
    if data == "poisson":
        params["loss"] = "poisson"
    return (_fit(THEIRS[kind](**params), X, y), _fit(OURS[kind](**params), X, y),
            X, y)


def _assert_same_training(theirs, ours, rtol=1e-9):
    assert ours.n_iter_ == theirs.n_iter_
    assert ours.t_ == theirs.t_
    assert len(ours.loss_curve_) == len(theirs.loss_curve_)
    assert_allclose(ours.loss_curve_, theirs.loss_curve_, rtol=rtol)
    assert ours.loss_ == pytest.approx(theirs.loss_, rel=rtol)
    for a, b in zip(ours.coefs_ + ours.intercepts_,
                    theirs.coefs_ + theirs.intercepts_):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert_allclose(a, b, rtol=max(rtol, 1e-7) * 100, atol=max(rtol, 1e-7))


# --------------------------------------------------------------- the API
@pytest.mark.parametrize("kind", ["regressor", "classifier"])
def test_constructor_is_scikit_learns_plus_device_and_dtype(kind):
    ours = inspect.signature(OURS[kind]).parameters
    theirs = inspect.signature(THEIRS[kind]).parameters
    assert list(ours)[:-4] == list(theirs)
    assert list(ours)[-4:] == ["device", "dtype", "callbacks", "n_threads"]
    for name, parameter in theirs.items():
        assert ours[name].default == parameter.default, name
        assert ours[name].kind == parameter.kind, name
    assert ours["device"].default == "cpu" and ours["dtype"].default is None
    assert ours["callbacks"].default is None and ours["n_threads"].default is None


@pytest.mark.parametrize("activation,hidden", [("logistic", (7, 4)),
                                               ("logistic", ()), ("relu", (7,)),
                                               ("tanh", (3, 3))])
def test_initial_weights_are_scikit_learns(activation, hidden):
    """``init_layers`` draws as ``_init_coef`` (factor 2 for 'logistic', even
    without hidden layer), and so do the estimators: after one epoch at a
    negligible learning rate both keep their initial weights."""
    units = [5, *hidden, 2]
    skl = skl_nn.MLPRegressor(activation=activation)
    skl._random_state = np.random.RandomState(3)
    expected = [a for i, o in zip(units[:-1], units[1:])
                for a in skl._init_coef(i, o, np.float64)]
    coefs, intercepts = init_layers(units, activation, np.random.RandomState(3),
                                    np.float64)
    drawn = [a for pair in zip(coefs, intercepts) for a in pair]
    assert all(np.array_equal(a, b) for a, b in zip(drawn, expected))
    if hidden:  # the graph-based initializer agrees when the graph shows it
        graph = training_graph(coefs, intercepts, activation)
        by_graph = glorot_uniform_weights(graph, weight_names(len(coefs)), 3)
        assert all(np.array_equal(by_graph[n], a)
                   for n, a in zip(weight_names(len(coefs)), drawn))
    X, y = _regression(k=2)
    settings = dict(hidden_layer_sizes=hidden, activation=activation, max_iter=1,
                    learning_rate_init=1e-300, random_state=3)
    ours = _fit(MLPRegressor(**settings), X, y)
    assert all(np.array_equal(a, b) for a, b in zip(
        ours.coefs_ + ours.intercepts_, coefs + intercepts))


# ------------------------------------------------- loss curves, parity
PARITY = [
    ("sgd-constant", {}),
    ("sgd-invscaling", dict(learning_rate="invscaling", learning_rate_init=0.2,
                            power_t=0.3)),
    ("sgd-adaptive", dict(learning_rate="adaptive", learning_rate_init=0.5,
                          tol=0.02, n_iter_no_change=2, max_iter=20)),
    ("momentum", dict(momentum=0.9, nesterovs_momentum=False)),
    ("nesterov-shuffle", dict(momentum=0.9, shuffle=True)),
    ("adam", dict(solver="adam", learning_rate_init=0.01)),
    ("adam-alpha-shuffle", dict(solver="adam", alpha=0.05, shuffle=True,
                                learning_rate_init=0.01)),
    ("sgd-alpha-two-layers", dict(alpha=0.1, hidden_layer_sizes=(6, 4),
                                  activation="tanh")),
    ("early-stopping", dict(early_stopping=True, validation_fraction=0.2,
                            learning_rate_init=0.05, n_iter_no_change=3,
                            tol=1e-2, max_iter=60)),
]
PARITY_DATA = ["regression", "binary", "multiclass-str"]


@pytest.mark.parametrize("name,settings", PARITY, ids=[p[0] for p in PARITY])
@pytest.mark.parametrize("data", PARITY_DATA)
def test_loss_curve_overlays_scikit_learns(data, name, settings):
    theirs, ours, X, _ = _both(data, **settings)
    _assert_same_training(theirs, ours)
    if name == "early-stopping":
        assert ours.n_iter_ < 60
        assert_allclose(ours.validation_scores_, theirs.validation_scores_,
                        rtol=1e-12)
        assert ours.best_validation_score_ == theirs.best_validation_score_
        assert ours.best_loss_ is None is theirs.best_loss_
    else:
        assert ours.validation_scores_ is None is theirs.validation_scores_
        assert ours.best_loss_ == pytest.approx(theirs.best_loss_, rel=1e-9)
    if name == "sgd-adaptive":  # the rule divided the rate, as scikit-learn's
        assert ours._run.update_rule.value == pytest.approx(
            theirs._optimizer.learning_rate, rel=1e-12)
        assert ours._run.update_rule.value < 0.5
    method = "predict_proba" if hasattr(ours, "predict_proba") else "predict"
    assert_allclose(getattr(ours, method)(X), getattr(theirs, method)(X),
                    rtol=1e-9, atol=1e-12)


OTHER_TARGETS = [("multilabel", dict(solver="adam", learning_rate_init=0.01)),
                 ("multilabel", dict(early_stopping=True, momentum=0.9,
                                     learning_rate_init=0.05, max_iter=40,
                                     n_iter_no_change=3, tol=1e-2)),
                 ("poisson", dict(momentum=0.9)),
                 ("poisson", dict(solver="adam", alpha=0.01, shuffle=True)),
                 ("regression-3-outputs", dict(solver="adam")),
                 ("regression-3-outputs", dict(momentum=0.5, shuffle=True))]


@pytest.mark.parametrize("data,settings", OTHER_TARGETS,
                         ids=[f"{d}-{i}" for i, (d, _) in enumerate(OTHER_TARGETS)])
def test_other_targets_overlay(data, settings):
    theirs, ours, X, _ = _both(data, **settings)
    _assert_same_training(theirs, ours)
    if theirs.validation_scores_ is not None:
        assert_allclose(ours.validation_scores_, theirs.validation_scores_)
    assert ours.out_activation_ == theirs.out_activation_
    assert ours.n_outputs_ == theirs.n_outputs_
    assert ours.n_layers_ == theirs.n_layers_
    assert_allclose(ours.predict(X), theirs.predict(X), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("solver", ["sgd", "adam"])
def test_float32_follows_x_and_overlays(solver):
    theirs, ours, X, _ = _both("regression-float32", solver=solver, momentum=0.9,
                               shuffle=True)
    assert ours.coefs_[0].dtype == np.float32 and ours.predict(X).dtype == np.float32
    _assert_same_training(theirs, ours, rtol=1e-4)


def test_sample_weights_overlay_with_early_stopping():
    """Weighted batches; the epoch loss averages batches by rows (as
    scikit-learn does) and the validation score uses the held-out weights."""
    X, y = _regression(n=150)
    weights = np.random.RandomState(1).uniform(0.1, 2.0, X.shape[0])
    settings = {**BASE, "solver": "adam", "shuffle": True, "early_stopping": True,
                "n_iter_no_change": 3, "tol": 1e-3, "max_iter": 40}
    theirs = _fit(skl_nn.MLPRegressor(**settings), X, y, sample_weight=weights)
    ours = _fit(MLPRegressor(**settings), X, y, sample_weight=weights)
    _assert_same_training(theirs, ours)
    assert_allclose(ours.validation_scores_, theirs.validation_scores_)


@pytest.mark.parametrize("solver", ["sgd", "adam"])
def test_warm_start_and_partial_fit_overlay(solver):
    """A warm-start fit restarts the optimizer (and the invscaling rate) but
    not t_; partial_fit continues it; loss_curve_ accumulates."""
    X, y = _regression()
    settings = {**BASE, "solver": solver, "learning_rate": "invscaling",
                "learning_rate_init": 0.1, "momentum": 0.9, "shuffle": True,
                "max_iter": 4}
    theirs = skl_nn.MLPRegressor(warm_start=True, **settings)
    ours = MLPRegressor(warm_start=True, **settings)
    for _ in range(3):
        _fit(theirs, X, y), _fit(ours, X, y)
    _assert_same_training(theirs, ours)
    theirs, ours = skl_nn.MLPRegressor(**settings), MLPRegressor(**settings)
    for _ in range(3):
        theirs.partial_fit(X, y), ours.partial_fit(X, y)
    assert ours.n_iter_ == 1 and len(ours.loss_curve_) == 3
    _assert_same_training(theirs, ours)


def test_warm_start_reads_changed_parameters():
    """Each warm-start fit reads the parameters again (scikit-learn builds a
    new optimizer): changed solver, rates, penalty, batches, stopping rule."""
    X, y = _regression()
    settings = {**BASE, "learning_rate": "invscaling", "learning_rate_init": 0.1,
                "momentum": 0.9, "shuffle": True, "max_iter": 5,
                "warm_start": True}
    theirs, ours = skl_nn.MLPRegressor(**settings), MLPRegressor(**settings)
    changes = [{}, dict(learning_rate_init=0.05, alpha=0.1, max_iter=3),
               dict(solver="adam", batch_size=7), dict(momentum=0.0, alpha=0.0,
                                                      shuffle=False),
               dict(tol=1e-2, n_iter_no_change=1, max_iter=50)]
    for change in changes:
        theirs.set_params(**change), ours.set_params(**change)
        _fit(theirs, X, y), _fit(ours, X, y)
        _assert_same_training(theirs, ours)
    assert ours.n_iter_ < 50


def test_partial_fit_with_classes_absent_from_the_first_batch():
    X, y = _classification(3)
    settings = {**BASE, "solver": "adam", "shuffle": True}
    theirs, ours = skl_nn.MLPClassifier(**settings), MLPClassifier(**settings)
    first = y != 2
    for est in (theirs, ours):
        est.partial_fit(X[first], y[first], classes=[0, 1, 2])
        est.partial_fit(X, y)
    _assert_same_training(theirs, ours)
    assert list(ours.classes_) == [0, 1, 2]
    with pytest.raises(ValueError, match="classes must be passed"):
        MLPClassifier().partial_fit(X, y)
    with pytest.raises(ValueError, match="not the same as on last call"):
        ours.partial_fit(X, y, classes=[0, 1, 2, 3])
    with pytest.raises(ValueError, match="classes not in"):
        ours.partial_fit(X, np.where(y == 2, 5, y))


LBFGS = ["regression", "regression-3-outputs", "poisson", "binary",
         "multiclass-str"]


@pytest.mark.parametrize("data", LBFGS)
def test_lbfgs_reaches_scikit_learns_weights(data):
    """The same L-BFGS-B run: loss and gradient of all the rows agree, so
    the iterates do."""
    theirs, ours, X, _ = _both(data, solver="lbfgs", hidden_layer_sizes=(6, 4),
                               activation="tanh", alpha=0.1, max_iter=30)
    assert ours.n_iter_ == theirs.n_iter_ == 30
    assert ours.loss_ == pytest.approx(theirs.loss_, rel=1e-9)
    for a, b in zip(ours.coefs_ + ours.intercepts_,
                    theirs.coefs_ + theirs.intercepts_):
        assert_allclose(a, b, rtol=1e-7, atol=1e-10)
    assert not hasattr(ours, "loss_curve_") and ours.t_ == 0
    with pytest.raises(AttributeError, match="no attribute 'partial_fit'"):
        ours.partial_fit


# ------------------------------------------------------ bundled datasets
def test_digits_accuracy_equals_scikit_learns():
    X, y = load_digits(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X / 16, y, random_state=0)
    settings = dict(hidden_layer_sizes=(32,), max_iter=40, random_state=0)
    theirs = _fit(skl_nn.MLPClassifier(**settings), X_train, y_train)
    ours = _fit(MLPClassifier(**settings), X_train, y_train)
    assert ours.score(X_test, y_test) > 0.9
    assert ours.score(X_test, y_test) == pytest.approx(
        theirs.score(X_test, y_test), abs=0.01)


def test_diabetes_r2_equals_scikit_learns():
    X, y = load_diabetes(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    X_train, X_test, y_train, y_test = train_test_split(X, y, random_state=0)
    settings = dict(hidden_layer_sizes=(16,), solver="sgd", max_iter=50,
                    learning_rate_init=0.001, random_state=0)
    theirs = _fit(skl_nn.MLPRegressor(**settings), X_train, y_train)
    ours = _fit(MLPRegressor(**settings), X_train, y_train)
    assert ours.score(X_test, y_test) > 0.25
    assert ours.score(X_test, y_test) == pytest.approx(
        theirs.score(X_test, y_test), abs=0.01)


# ---------------------------------------------------------- the exported graph
def _run(model, X):
    session = onnxruntime.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    return session.run(None, {"X": X})


EXPORTS = ["regression", "regression-3-outputs", "regression-float32", "poisson",
           "binary", "binary-float-labels", "multiclass-str", "multilabel"]


@pytest.mark.parametrize("data", EXPORTS)
def test_to_onnx_runs_as_predict(data):
    kind, make = DATA[data]
    X, y = make()
    params = {**BASE, "max_iter": 5, "hidden_layer_sizes": (6, 5),
              "activation": "logistic"}
    if data == "poisson":
        params["loss"] = "poisson"
    est = _fit(OURS[kind](**params), X, y)
    model = est.to_onnx()
    onnx.checker.check_model(model, full_check=True)
    outputs = _run(model, X)
    if kind == "regressor":
        assert [o.name for o in model.graph.output] == ["variable"]
        assert outputs[0].shape == (X.shape[0], est.n_outputs_)
        assert_allclose(outputs[0].reshape(est.predict(X).shape), est.predict(X),
                        rtol=1e-5 if X.dtype == np.float32 else 1e-12)
        return
    assert [o.name for o in model.graph.output] == ["label", "probabilities"]
    label, proba = outputs
    assert_allclose(proba, est.predict_proba(X), rtol=1e-12, atol=1e-15)
    assert np.array_equal(label, est.predict(X))
    if data == "multiclass-str":
        assert label.dtype == object and set(label) <= {"a", "b", "c"}


def test_to_onnx_holds_the_trained_weights():
    X, y = _classification(2)
    est = _fit(MLPClassifier(**BASE), X, y)
    before = est.to_onnx()
    est.partial_fit(X, y)
    after = est.to_onnx()
    assert not np.allclose(_run(before, X)[1], _run(after, X)[1])
    assert_allclose(_run(after, X)[1], est.predict_proba(X), rtol=1e-12)


# -------------------------------------------------------- meta-estimators
#: Settings for the meta-estimator tests: both libraries give the same model.
SMALL = dict(hidden_layer_sizes=(8,), max_iter=30, learning_rate_init=0.01,
             random_state=0)


def test_pipeline_cross_val_score_and_grid_search():
    X, y = _classification(3, n=150)
    scores = {}
    for kind, estimator in (("ours", MLPClassifier), ("theirs", skl_nn.MLPClassifier)):
        pipe = make_pipeline(StandardScaler(), estimator(**SMALL))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            scores[kind] = cross_val_score(pipe, X, y, cv=3)
    assert_allclose(scores["ours"], scores["theirs"])
    assert scores["ours"].mean() > 0.6
    pipe = make_pipeline(StandardScaler(), MLPClassifier(**SMALL))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        search = GridSearchCV(pipe, {"mlpclassifier__alpha": [1e-4, 0.5]}, cv=2,
                              n_jobs=2).fit(X, y)
    best = search.best_estimator_[-1]
    assert isinstance(best, MLPClassifier) and best.n_iter_ == 30
    assert best.alpha == search.best_params_["mlpclassifier__alpha"]
    assert search.cv_results_["mean_test_score"].min() > 0.5
    refit = _fit(clone(pipe).set_params(**search.best_params_), X, y)
    assert_allclose(search.predict_proba(X), refit.predict_proba(X))


def test_transformed_target_regressor():
    X, y = _regression()
    y = 100 + 50 * y
    models = [_fit(TransformedTargetRegressor(regressor=estimator(**SMALL),
                                              transformer=StandardScaler()), X, y)
              for estimator in (MLPRegressor, skl_nn.MLPRegressor)]
    assert models[0].predict(X).shape == y.shape
    assert_allclose(models[0].predict(X), models[1].predict(X), rtol=1e-9)
    assert models[0].score(X, y) > 0.5


def test_calibrated_classifier():
    X, y = _classification(2, n=200)
    models = [_fit(CalibratedClassifierCV(estimator(**SMALL), cv=3), X, y)
              for estimator in (MLPClassifier, skl_nn.MLPClassifier)]
    proba = models[0].predict_proba(X)
    assert_allclose(proba.sum(axis=1), 1.0)
    assert_allclose(proba, models[1].predict_proba(X), rtol=1e-7, atol=1e-9)


# ------------------------------------------------------------- persistence
def _fitted(kind="classifier"):
    X, y = _classification(3) if kind == "classifier" else _regression()
    return _fit(OURS[kind](**{**BASE, "solver": "adam", "max_iter": 5}), X, y), X, y


@pytest.mark.parametrize("kind", ["regressor", "classifier"])
def test_pickle_joblib_and_clone(kind):
    est, X, y = _fitted(kind)
    method = "predict_proba" if kind == "classifier" else "predict"
    expected = getattr(est, method)(X)
    restored = pickle.loads(pickle.dumps(est))
    buffer = io.BytesIO()
    joblib.dump(est, buffer)
    buffer.seek(0)
    for copy_ in (restored, joblib.load(buffer)):
        assert_allclose(getattr(copy_, method)(X), expected)
        assert copy_.loss_curve_ == est.loss_curve_
    # a restored estimator goes on training as the original does
    restored.partial_fit(X, y)
    est.partial_fit(X, y)
    assert_allclose(restored.loss_curve_, est.loss_curve_, rtol=1e-12)
    fresh = clone(est)
    assert fresh.get_params() == est.get_params()
    assert not hasattr(fresh, "coefs_") and not hasattr(fresh, "loss_curve_")


def test_deepcopy_trains_on_its_own_weights():
    est, X, y = _fitted()
    twin = copy.deepcopy(est)
    before = est.coefs_[0].copy()
    twin.partial_fit(X, y)
    assert np.array_equal(est.coefs_[0], before)
    assert not np.array_equal(twin.coefs_[0], before)
    assert len(twin.loss_curve_) == len(est.loss_curve_) + 1


# ------------------------------------------------ attributes and errors
def test_dataframe_feature_names():
    X, y = _regression()
    frame = pandas.DataFrame(X, columns=[f"f{i}" for i in range(X.shape[1])])
    est = _fit(MLPRegressor(**BASE), frame, y)
    assert list(est.feature_names_in_) == list(frame.columns)
    with pytest.warns(UserWarning, match="does not have valid feature names"):
        assert_allclose(est.predict(frame), est.predict(frame.to_numpy()))
    with pytest.raises(ValueError, match="feature names should match"):
        est.predict(frame.rename(columns={"f0": "g0"}))
    assert not hasattr(_fit(MLPRegressor(**BASE), X, y), "feature_names_in_")


def test_convergence_warning_only_when_max_iter_is_reached():
    X, y = _regression()
    with pytest.warns(ConvergenceWarning, match=r"Maximum iterations \(3\)"):
        MLPRegressor(max_iter=3, random_state=0).fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        est = MLPRegressor(max_iter=200, tol=0.5, n_iter_no_change=1,
                           random_state=0).fit(X, y)
    assert est.n_iter_ == skl_nn.MLPRegressor(
        max_iter=200, tol=0.5, n_iter_no_change=1, random_state=0).fit(X, y).n_iter_


def test_non_finite_loss_keeps_the_last_finite_weights():
    X, y = _regression(n=50)
    est = MLPRegressor(**{**BASE, "learning_rate_init": 0.1}, activation="identity")
    with pytest.raises(ValueError, match="Solver produced non-finite parameter"):
        est.fit(X, 100 * y)  # scikit-learn's error, after training
    assert 0 < est.n_iter_ == len(est.loss_curve_) < BASE["max_iter"]
    assert np.isfinite(est.loss_curve_[:-1]).all()
    assert not np.isfinite(est.loss_curve_[-1])  # the epoch that diverged
    assert all(np.isfinite(c).all() for c in est.coefs_ + est.intercepts_)
    assert np.isfinite(est.predict(X)).all()


def test_coefs_setter_changes_the_predictions():
    est, X, _ = _fitted("regressor")
    coefs = est.coefs_
    coefs[-1] = np.zeros_like(coefs[-1])
    est.coefs_ = coefs
    intercept = est.intercepts_[-1]
    assert_allclose(est.predict(X), np.full(X.shape[0], intercept[0]))


def test_dtype_parameter():
    X, y = _regression()
    est = _fit(MLPRegressor(**{**BASE, "max_iter": 2}, dtype=np.float32), X, y)
    assert est.coefs_[0].dtype == np.float32
    assert est.to_onnx().graph.input[0].type.tensor_type.elem_type == \
        onnx.TensorProto.FLOAT
    assert est.predict(X).dtype == np.float32
    with pytest.raises(ValueError, match="dtype must be None"):
        MLPRegressor(dtype=np.int64).fit(X, y)


def test_errors_before_training():
    X, y = _regression()
    with pytest.raises(AttributeError, match="partial_fit"):
        MLPRegressor(solver="lbfgs").partial_fit
    with pytest.raises(ValueError, match="partial_fit does not support"):
        MLPRegressor(early_stopping=True).partial_fit(X, y)
    with pytest.raises(ValueError, match="negative"):
        MLPRegressor(loss="poisson").fit(X, y)
    with pytest.raises(ValueError, match="hidden_layer_sizes must be > 0"):
        MLPRegressor(hidden_layer_sizes=(3, 0)).fit(X, y)
    with pytest.raises(ValueError, match="validation set is too small"):
        MLPRegressor(early_stopping=True).fit(X[:10], y[:10])
    est = _fit(MLPRegressor(**{**BASE, "max_iter": 1}), X, y)
    with pytest.raises(ValueError, match="outputs but the network"):
        est.partial_fit(X, np.stack([y, y], axis=1))
    classifier = _fit(MLPClassifier(**{**BASE, "max_iter": 1}, warm_start=True),
                      *_classification(3))
    with pytest.raises(ValueError, match="warm_start can only be used"):
        classifier.fit(*_classification(2))


def test_verbose_prints_scikit_learns_lines(capsys):
    X, y = _regression()
    _fit(MLPRegressor(**{**BASE, "max_iter": 2, "early_stopping": True},
                      verbose=True), X, y)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Iteration 1, loss = ")
    assert lines[1].startswith("Validation score: ")
    assert len(lines) == 4
