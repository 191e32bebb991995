"""partial_fit's schedule counts samples seen, and get_state /
set_state(include_optimizer=True) continue training exactly."""
import warnings

import numpy as np
import pytest
from numpy.testing import assert_allclose
from sklearn.base import clone
from sklearn.datasets import make_classification
from sklearn.exceptions import ConvergenceWarning
from sklearn.neural_network import MLPClassifier as SkMLPClassifier

from onnxtrain import (OrtGradientForwardBackwardClassifier,
                       OrtGradientForwardBackwardOptimizer, OrtGradientOptimizer,
                       to_onnx)
from onnxtrain.models import add_loss_output
from onnxtrain.neural_network import MLPClassifier, MLPRegressor
from onnxtrain.optim import LearningRateAdam, LearningRateSGD, LearningRateSGDNesterov


def _assert_same_weights(a, b, rtol=1e-6):
    for wa, wb in zip(a, b):
        assert_allclose(wa, wb, rtol=rtol, atol=1e-7)


# ------------------------------------------------- partial_fit's schedule
@pytest.mark.parametrize("path", ["split", "fused"])
def test_partial_fit_chunks_equal_one_epoch_of_fit(mlp_onnx, regression_data, path):
    """Constant rate, momentum: chunks made of whole batches give the steps
    of one epoch of fit (the velocities and the step carry over)."""
    X, y = regression_data
    rate = LearningRateSGDNesterov(0.01, learning_rate="constant", momentum=0.9)
    fit = OrtGradientForwardBackwardOptimizer(
        mlp_onnx(), learning_rate=rate, max_iter=1, batch_size=10,
        training_path=path, random_state=0).fit(X, y)
    inc = OrtGradientForwardBackwardOptimizer(
        mlp_onnx(), learning_rate=rate, batch_size=10, training_path=path,
        random_state=0)
    for part in (slice(0, 30), slice(30, 60), slice(60, 105)):
        inc.partial_fit(X[part], y[part])
    assert inc.t_ == fit.t_ == 105 and inc._trainer.step_count == 11
    _assert_same_weights(inc.get_state(), fit.get_state())


def test_partial_fit_schedule_counts_samples_not_calls(mlp_onnx, regression_data):
    """invscaling: the rate of each batch is eta0 / (samples seen + 1) **
    power_t, so the weights do not depend on how the rows are cut into
    partial_fit calls."""
    X, y = regression_data
    rate = LearningRateSGD(0.05, learning_rate="invscaling", power_t=0.25)

    def chunked(bounds):
        est = OrtGradientForwardBackwardOptimizer(
            mlp_onnx(), learning_rate=rate, batch_size=10, random_state=0)
        for start, stop in zip(bounds, bounds[1:]):
            est.partial_fit(X[start:stop], y[start:stop])
        return est

    whole, two, three = chunked([0, 105]), chunked([0, 50, 105]), \
        chunked([0, 20, 70, 105])
    _assert_same_weights(two.get_state(), whole.get_state())
    _assert_same_weights(three.get_state(), whole.get_state())
    assert whole.learning_rate_.value == pytest.approx(0.05 / 106 ** 0.25, rel=1e-12)
    # the same 105 rows in one epoch of fit run at the epoch's rate, 0.05
    fit = OrtGradientForwardBackwardOptimizer(
        mlp_onnx(), learning_rate=rate, batch_size=10, max_iter=1,
        random_state=0).fit(X, y)
    assert not np.allclose(fit.get_state()[0], whole.get_state()[0])
    assert whole.training_path_ == "fused"  # the rate changes between batches
    with pytest.raises(ValueError, match="'loop' is not available: partial_fit "
                                         "changes the schedule's learning rate"):
        OrtGradientForwardBackwardOptimizer(
            mlp_onnx(), learning_rate=rate, training_path="loop").partial_fit(X, y)


# --------------------------------------------------------- state round trip
def _regressor(model):
    return OrtGradientForwardBackwardOptimizer(
        model, learning_rate=LearningRateAdam(0.01), batch_size=16, shuffle=True,
        random_state=0)


def _classification():
    X, y = make_classification(n_samples=90, n_features=5, n_informative=3,
                               n_redundant=0, n_classes=3, random_state=0)
    return X.astype(np.float32), y


def _classifier_graph(X, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        skl = SkMLPClassifier(hidden_layer_sizes=(6,), max_iter=1,
                              random_state=0).fit(X, y)
    return to_onnx(skl, X[:1], options={"zipmap": False})


def _continue(make, X, y, **kwargs):
    """(uninterrupted, restored on itself, restored on another estimator)."""
    reference = make()
    for _ in range(4):
        reference.partial_fit(X, y, **kwargs)
    interrupted = make()
    for _ in range(2):
        interrupted.partial_fit(X, y, **kwargs)
    state = interrupted.get_state(include_optimizer=True)
    interrupted.partial_fit(X, y, **kwargs)  # an epoch to forget
    interrupted.set_state(state)
    other = make()
    other.partial_fit(X[:20], y[:20], **kwargs)
    other.set_state(state)
    for est in (interrupted, other):
        for _ in range(2):
            est.partial_fit(X, y, **kwargs)
    return reference, interrupted, other


@pytest.mark.parametrize("kind", ["regressor", "classifier", "loss_graph"])
def test_set_state_continues_as_uninterrupted(mlp_onnx, regression_data, kind):
    if kind == "regressor":
        X, y = regression_data
        make = lambda: _regressor(mlp_onnx())  # noqa: E731
        kwargs = {}
    elif kind == "classifier":
        X, y = _classification()
        model = _classifier_graph(X, y)
        make = lambda: OrtGradientForwardBackwardClassifier(  # noqa: E731
            model, learning_rate=LearningRateAdam(0.01), batch_size=16,
            shuffle=True, random_state=0)
        kwargs = {"classes": [0, 1, 2]}
    else:
        X, y = regression_data
        model = add_loss_output(mlp_onnx())
        make = lambda: OrtGradientOptimizer(  # noqa: E731
            model, learning_rate=LearningRateSGDNesterov(
                0.01, learning_rate="invscaling", momentum=0.9),
            batch_size=16, shuffle=True, random_state=0)
        kwargs = {}
    reference, interrupted, other = _continue(make, X, y, **kwargs)
    for est in (interrupted, other):
        _assert_same_weights(est.get_state(), reference.get_state())
        assert est.train_losses_[-2:] == pytest.approx(reference.train_losses_[-2:],
                                                       rel=1e-6)
        assert (est.n_iter_, est.t_) == (reference.n_iter_, reference.t_)
        assert est._trainer.step_count == reference._trainer.step_count
    state = reference.get_state(include_optimizer=True)
    assert state["step"] == reference._trainer.step_count > 0
    assert any(np.abs(s).sum() > 0 for states in state["optimizer"] for s in states)


def test_set_state_refuses_another_update_rule(mlp_onnx, regression_data):
    X, y = regression_data
    adam = _regressor(mlp_onnx()).partial_fit(X, y)
    sgd = OrtGradientForwardBackwardOptimizer(mlp_onnx()).partial_fit(X, y)
    before = sgd.get_state(include_optimizer=True)
    with pytest.raises(ValueError, match="update rule LearningRateSGD keeps"):
        sgd.set_state(adam.get_state(include_optimizer=True))
    _assert_same_weights(sgd.get_state(), before["weights"], rtol=0)
    assert sgd.n_iter_ == before["n_iter"]


@pytest.mark.parametrize("cls", [MLPRegressor, MLPClassifier])
def test_mlp_set_state_continues_as_uninterrupted(cls, regression_data):
    X, y = regression_data
    if cls is MLPClassifier:
        y = (y > np.median(y)).astype(int)

    def make():
        return cls(hidden_layer_sizes=(5,), solver="adam", batch_size=20,
                   learning_rate_init=0.01, random_state=0)

    kwargs = {"classes": [0, 1]} if cls is MLPClassifier else {}
    reference, interrupted, other = _continue(make, X, y, **kwargs)
    for est in (interrupted, other):
        _assert_same_weights(est.coefs_ + est.intercepts_,
                             reference.coefs_ + reference.intercepts_)
        assert est.t_ == reference.t_
    assert clone(reference).get_params() == reference.get_params()
