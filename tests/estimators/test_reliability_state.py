"""Reliability: a failing call leaves the estimator as it was, a diverged
fit leaves usable predictions, and parameters set between calls take
effect (issue 32, classes 3, 4 and 9)."""
import warnings

import numpy as np
import pytest
from numpy.testing import assert_array_equal
from sklearn.datasets import make_regression
from sklearn.exceptions import NotFittedError

from linear_models import linear_model
from onnxtrain.estimators import (OrtGradientForwardBackwardClassifier,
                                  OrtGradientForwardBackwardOptimizer)
from onnxtrain.exceptions import ConvergenceError, DeviceError
from onnxtrain.neural_network import MLPClassifier, MLPRegressor
from onnxtrain.optim import LearningRateAdam, LearningRateSGD, LearningRateSGDNesterov

RNG = np.random.RandomState(0)
X = RNG.randn(40, 3).astype(np.float32)
Y = (X @ np.array([1.0, -2.0, 0.5]) + 0.3).astype(np.float32)
LABELS = np.digitize(Y, [-1.0, 1.0])


def _linear(n_out=1, softmax=False):
    return linear_model(3, n_out, softmax=softmax, seed=1)


ESTIMATORS = {
    "regressor": (lambda: OrtGradientForwardBackwardOptimizer(
        _linear(), max_iter=3, learning_rate=LearningRateSGD(0.01)), Y),
    "classifier": (lambda: OrtGradientForwardBackwardClassifier(
        _linear(3, softmax=True), max_iter=3), LABELS),
    "mlp_regressor": (lambda: MLPRegressor(hidden_layer_sizes=(4,), max_iter=3,
                                           random_state=0), Y),
    "mlp_classifier": (lambda: MLPClassifier(hidden_layer_sizes=(4,), max_iter=3,
                                             random_state=0), LABELS),
}


def _fitted(kind):
    make, y = ESTIMATORS[kind]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make().fit(X, y), y


def _snapshot(est):
    state = est.get_state(include_optimizer=True)
    return ([np.array(w) for w in state["weights"]],
            [[np.array(s) for s in states] for states in state["optimizer"]],
            state["step"], float(state["learning_rate"]), est.predict(X))


def _assert_same(a, b):
    for left, right in zip(a[0], b[0]):
        assert_array_equal(left, right)
    for left, right in zip(a[1], b[1]):
        for u, v in zip(left, right):
            assert_array_equal(u, v)
    assert a[2:4] == b[2:4]
    assert_array_equal(a[4], b[4])


def _nan_rows(values):
    values = np.array(values, dtype=np.float64)
    values[0] = np.nan
    return values


FAILURES = {
    "device": (lambda est, y: est.set_params(device="tpu").fit(X, y), DeviceError),
    "nan_x_partial_fit": (lambda est, y: est.partial_fit(_nan_rows(X), y), ValueError),
    "nan_sample_weight": (lambda est, y: est.fit(X, y, sample_weight=_nan_rows(np.ones(len(y)))),
                          ValueError),
    "wrong_state": (lambda est, y: est.set_state([np.zeros(1)]), ValueError),
}


@pytest.mark.parametrize("failure", sorted(FAILURES))
@pytest.mark.parametrize("kind", sorted(ESTIMATORS))
def test_a_failing_call_keeps_the_fitted_state(kind, failure):
    est, y = _fitted(kind)
    est.partial_fit(X, y)  # an optimizer state that a restart would zero
    before = _snapshot(est)
    call, error = FAILURES[failure]
    with pytest.raises(error):
        call(est, y)
    est.set_params(device="cpu")
    _assert_same(_snapshot(est), before)


@pytest.mark.parametrize("kind", ["regressor", "mlp_regressor"])
def test_a_failing_state_dict_changes_nothing(kind):
    est, _ = _fitted(kind)
    before = _snapshot(est)
    state = est.get_state(include_optimizer=True)
    state["weights"] = [np.asarray(w) + 1 for w in state["weights"]]
    state["learning_rate"] = "fast"
    with pytest.raises(ValueError, match="'learning_rate'"):
        est.set_state(state)
    _assert_same(_snapshot(est), before)


@pytest.mark.parametrize("kind", sorted(ESTIMATORS))
def test_a_failing_first_fit_leaves_an_unfitted_estimator(kind):
    make, y = ESTIMATORS[kind]
    est = make()
    with pytest.raises(ValueError):
        est.fit(X, y, sample_weight=_nan_rows(np.ones(len(y))))
    with pytest.raises(NotFittedError):
        est.predict(X)
    assert not [k for k in vars(est) if k.endswith("_") and not k.startswith("_")]


def test_a_failing_first_partial_fit_keeps_no_classes():
    est = MLPClassifier(hidden_layer_sizes=(4,))
    with pytest.raises(ValueError):
        est.partial_fit(_nan_rows(X), LABELS, classes=[0, 1, 2])
    est.partial_fit(X, LABELS % 2, classes=[0, 1])  # other classes: a new start
    assert_array_equal(est.classes_, [0, 1])


# ------------------------------------------------------------- divergence

def _diverging_mlp(**kwargs):
    return MLPRegressor(solver="sgd", learning_rate_init=1e5, max_iter=5,
                        random_state=0, dtype=np.float32, **kwargs)


def _finite_or_not_fitted(est, X):
    try:
        predictions = est.predict(X)
    except NotFittedError:
        return "not fitted"
    return "finite" if np.isfinite(predictions).all() else "non-finite"


def test_a_diverged_mlp_is_not_left_predicting_non_finite_values():
    Xr, yr = make_regression(n_samples=100, n_features=5, noise=1, random_state=0)
    est = _diverging_mlp()
    with pytest.raises(ValueError, match="non-finite"):
        est.fit(Xr, yr)
    assert _finite_or_not_fitted(est, Xr) == "not fitted"


def test_a_diverged_refit_gives_back_the_previous_model():
    Xr, yr = make_regression(n_samples=100, n_features=5, noise=1, random_state=0)
    est = MLPRegressor(solver="sgd", learning_rate_init=1e-4, max_iter=3,
                       random_state=0, dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(Xr, yr)
    before = est.predict(Xr)
    with pytest.raises(ValueError, match="back to its state before"):
        est.set_params(learning_rate_init=1e5).fit(Xr, yr)
    assert_array_equal(est.predict(Xr), before)


@pytest.mark.parametrize("exc", [True, False])
def test_a_diverged_estimator_predicts_finite_values_or_is_not_fitted(exc):
    Xr, yr = make_regression(n_samples=100, n_features=3, noise=1, random_state=0)
    Xr, yr = Xr.astype(np.float32), yr.astype(np.float32)
    # one batch per epoch: the weights the second epoch starts from are
    # finite (~1e38) but overflow its forward pass
    est = OrtGradientForwardBackwardOptimizer(
        _linear(), max_iter=3, batch_size=100, exc=exc,
        learning_rate=LearningRateSGD(2e36, learning_rate="constant"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if exc:
            with pytest.raises(ConvergenceError, match="back to its state before"):
                est.fit(Xr, yr)
        else:
            est.fit(Xr, yr)
    if not exc:
        assert any("back to its state before" in str(w.message) for w in caught)
    assert _finite_or_not_fitted(est, Xr) == "not fitted"


# ------------------------------------------- parameters between partial_fits

@pytest.mark.parametrize("kind", ["regressor", "mlp_regressor"])
def test_a_new_learning_rate_takes_effect_at_the_next_partial_fit(kind):
    est, y = _fitted(kind)
    before = [np.array(w) for w in est.get_state()]
    if kind == "regressor":
        est.set_params(learning_rate=LearningRateSGD(1e-30, learning_rate="constant"))
    else:
        est.set_params(solver="sgd", momentum=0.0, learning_rate_init=1e-30)
    est.partial_fit(X, y)
    for old, new in zip(before, est.get_state()):
        np.testing.assert_allclose(new, old, rtol=0, atol=1e-20)
    if kind == "regressor":
        assert est.get_params()["learning_rate"].eta0 == 1e-30


def test_a_new_update_rule_takes_effect_at_the_next_partial_fit():
    est, y = _fitted("regressor")
    est.set_params(learning_rate=LearningRateAdam(0.01))
    est.partial_fit(X, y)
    assert isinstance(est.learning_rate_, LearningRateAdam)
    assert len(est.get_state(include_optimizer=True)["optimizer"][0]) == 2


def test_same_update_rule_keeps_its_state_at_the_next_partial_fit():
    # momentum: a velocity kept moves the weights even at a negligible rate
    est = OrtGradientForwardBackwardOptimizer(
        _linear(), max_iter=2, learning_rate=LearningRateSGDNesterov(0.05, momentum=0.9))
    est.fit(X, Y)
    velocity = [np.array(s[0]) for s in est.get_state(include_optimizer=True)["optimizer"]]
    assert max(np.abs(v).max() for v in velocity) > 0
    est.set_params(learning_rate=LearningRateSGDNesterov(1e-30, momentum=0.9))
    before = [np.array(w) for w in est.get_state()]
    est.partial_fit(X, Y)
    moved = max(np.abs(np.asarray(a) - b).max() for a, b in zip(est.get_state(), before))
    assert moved > 1e-6
