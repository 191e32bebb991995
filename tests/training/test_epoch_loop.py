"""The epoch loop out of the estimators (onnxtrain.training.loop), the
estimators' parameter constraints, ``history_`` and the callbacks."""
import warnings

import numpy as np
import onnxruntime
import pytest
from numpy.testing import assert_allclose
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import r2_score

from onnxtrain import OrtGradientForwardBackwardOptimizer, OrtGradientOptimizer
from onnxtrain.neural_network import MLPRegressor
from onnxtrain.optim import LearningRateSGD
from onnxtrain.training import (Callback, Checkpoint, EarlyStopping, EpochLoop,
                                EpochScoring, LRScheduler)


def _constant(eta0=0.01):
    return LearningRateSGD(eta0, learning_rate="constant")


def _split(regression_data):
    X, y = regression_data
    return X[:80], y[:80], X[80:], y[80:]


# ------------------------------------------------------------------ the loop
def test_estimators_run_their_epochs_in_an_epoch_loop(mlp_onnx, regression_data):
    """Every epoch goes through EpochLoop.run_single_epoch, the MLPs' too:
    a subclass counting the batches sees every step."""
    X, y = regression_data

    class Counting(EpochLoop):
        steps = 0

        def train_step(self, *args):
            Counting.steps += 1
            return super().train_step(*args)

    est = OrtGradientForwardBackwardOptimizer(mlp_onnx(), max_iter=2, batch_size=10,
                                              training_path="fused")
    est._loop_class = Counting
    est.fit(X, y)
    assert Counting.steps == 2 * 11  # 105 rows: 11 batches of at most 10

    from onnxtrain.neural_network._loop import MLPEpochLoop
    mlp = MLPRegressor(hidden_layer_sizes=(4,), solver="sgd", max_iter=3,
                       batch_size=50, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        mlp.fit(X, y)
    assert isinstance(mlp._run, MLPEpochLoop)
    assert mlp.t_ == 3 * 105


def test_history_records_every_epoch(mlp_onnx, regression_data):
    X, y, X_val, y_val = _split(regression_data)
    rate = LearningRateSGD(0.01, learning_rate="invscaling", power_t=0.5)
    est = OrtGradientForwardBackwardOptimizer(
        mlp_onnx(), learning_rate=rate, max_iter=4, validation_every=2,
        random_state=0).fit(X, y, X_val=X_val, y_val=y_val)
    history = est.history_
    assert [r["epoch"] for r in history] == [1, 2, 3, 4]
    assert [r["train_loss"] for r in history] == est.train_losses_
    # the rate each epoch trained with: eta0 / (epochs completed + 1) ** power_t
    assert_allclose([r["learning_rate"] for r in history],
                    [0.01 / (k + 1) ** 0.5 for k in (0, 1, 2, 3)], rtol=1e-12)
    assert [r["valid_loss"] for r in history if "valid_loss" in r] == \
        est.validation_losses_
    assert ["valid_loss" in r for r in history] == [False, True, False, True]
    assert all(r["dur"] > 0 for r in history)
    est.partial_fit(X, y)  # partial_fit adds up
    assert [r["epoch"] for r in est.history_] == [1, 2, 3, 4, 5]
    est.fit(X, y)  # a fit starts a new history
    assert len(est.history_) == 4


# ----------------------------------------------------------- constraints
@pytest.mark.parametrize("params,name", [
    (dict(shuffle="yes"), "shuffle"), (dict(warm_start=2), "warm_start"),
    (dict(n_threads=0), "n_threads"), (dict(callbacks=Callback()), "callbacks"),
    (dict(callbacks=[object()]), r"callbacks\[0\]"),
    (dict(validation_fraction=1.0), "validation_fraction"),
    (dict(device=3), "device"), (dict(training_path="gpu"), "training_path")])
def test_parameter_constraints(mlp_onnx, regression_data, params, name):
    X, y = regression_data
    for cls in (OrtGradientForwardBackwardOptimizer, OrtGradientOptimizer):
        if not set(params) <= set(cls._get_param_names()):
            continue
        est = cls(mlp_onnx(), **params)
        with pytest.raises((ValueError, TypeError), match=name):
            est.fit(X, y)
        assert not hasattr(est, "weights_to_train_")


@pytest.mark.parametrize("params,name", [
    (dict(n_threads=1.5), "n_threads"), (dict(callbacks=[1]), r"callbacks\[0\]")])
def test_mlp_parameter_constraints(regression_data, params, name):
    X, y = regression_data
    est = MLPRegressor(hidden_layer_sizes=(3,), max_iter=1, **params)
    with pytest.raises((ValueError, TypeError), match=name):
        est.fit(X, y)
    assert not hasattr(est, "n_iter_")


# -------------------------------------------------------------- callbacks
def test_epoch_scoring_scores_the_weights_of_each_epoch(mlp_onnx, regression_data):
    X, y, X_val, y_val = _split(regression_data)
    scoring = EpochScoring("r2", X_val, y_val)
    est = OrtGradientForwardBackwardOptimizer(
        mlp_onnx(), learning_rate=_constant(), max_iter=3, callbacks=[scoring],
        random_state=0).fit(X, y)
    scores = [r["valid_r2"] for r in est.history_]
    assert len(scores) == 3 and len(set(scores)) == 3
    assert scores[-1] == pytest.approx(r2_score(y_val, est.predict(X_val)), abs=1e-12)
    assert est.callbacks[0] is scoring and scoring.scores_ == scores
    est.set_params(max_iter=1).fit(X, y)  # a refit starts the scores again
    assert scoring.scores_[0] == pytest.approx(scores[0], abs=1e-12)
    copy = clone(est)
    assert copy.callbacks[0] is not scoring and copy.callbacks[0].scoring == "r2"


class _Metric(Callback):
    """Records a given metric per epoch and keeps each epoch's weights."""

    def __init__(self, values=(3.0, 1.0, 2.0, 0.5, 4.0, 5.0)):
        self.values = values

    def on_train_begin(self, estimator, X=None, y=None):
        self.weights_ = []

    def on_epoch_end(self, estimator, record):
        record["metric"] = self.values[record["epoch"] - 1]
        self.weights_.append(estimator.get_state())


def test_checkpoint_writes_the_best_epoch(mlp_onnx, regression_data, tmp_path):
    X, y = regression_data
    path = tmp_path / "best.onnx"
    every = tmp_path / "weights.npz"
    metric = _Metric()
    callbacks = [metric, Checkpoint(path, monitor="metric"), Checkpoint(every)]
    est = OrtGradientForwardBackwardOptimizer(
        mlp_onnx(), learning_rate=_constant(0.05), max_iter=6, callbacks=callbacks,
        random_state=0).fit(X, y)
    assert callbacks[1].epochs_ == [1, 2, 4] and callbacks[1].best_ == 0.5
    assert [r.get("checkpoint", False) for r in est.history_] == [True] * 6
    # the file holds epoch 4's weights: it predicts as they do
    best = est.get_state()
    est.set_state(metric.weights_[3])
    expected = est.predict(X)
    est.set_state(best)
    assert not np.allclose(expected, est.predict(X))
    session = onnxruntime.InferenceSession(str(path),
                                           providers=["CPUExecutionProvider"])
    assert_allclose(session.run(None, {"X": X})[0].ravel(), expected.ravel(),
                    rtol=1e-6, atol=1e-6)
    saved = np.load(every)  # every epoch: the last one's weights
    for i, weight in enumerate(est.get_state()):
        assert_allclose(saved[f"weight_{i}"], weight)
    with pytest.raises(KeyError, match="'nope', not in the epoch's record"):
        est.set_params(callbacks=[Checkpoint(path, monitor="nope")]).fit(X, y)


def test_lr_scheduler_sets_the_rate_of_every_batch(mlp_onnx, regression_data):
    X, y = regression_data
    halved = OrtGradientForwardBackwardOptimizer(
        mlp_onnx(), learning_rate=_constant(0.02), max_iter=2, batch_size=10,
        callbacks=[LRScheduler(policy=lambda step: 0.5)], random_state=0).fit(X, y)
    plain = OrtGradientForwardBackwardOptimizer(
        mlp_onnx(), learning_rate=_constant(0.01), max_iter=2, batch_size=10,
        random_state=0).fit(X, y)
    assert halved.training_path_ == "fused"  # batch hooks: no in-graph loop
    for a, b in zip(halved.get_state(), plain.get_state()):
        assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    warm = LRScheduler(policy=lambda step: 0.9 ** step, warmup_steps=4)
    est = OrtGradientForwardBackwardOptimizer(
        mlp_onnx(), learning_rate=_constant(0.02), max_iter=2, batch_size=10,
        callbacks=[warm], random_state=0).fit(X, y)
    expected = [0.02 * s / 4 for s in (1, 2, 3, 4)] + [0.02 * 0.9 ** k for k in range(18)]
    assert_allclose(warm.rates_, expected, rtol=1e-12)
    assert est.train_losses_ != plain.train_losses_
    # partial_fit continues the step count: no second warmup
    inc = OrtGradientForwardBackwardOptimizer(
        mlp_onnx(), learning_rate=_constant(0.02), batch_size=10,
        callbacks=[warm], random_state=0)
    inc.partial_fit(X[:50], y[:50])
    assert_allclose(warm.rates_, expected[:5], rtol=1e-12)
    inc.partial_fit(X[50:], y[50:])
    assert_allclose(warm.rates_, expected[5:11], rtol=1e-12)
    with pytest.raises(ValueError, match="training_path='loop' is not available: "
                                         "a callback acts between batches"):
        OrtGradientForwardBackwardOptimizer(
            mlp_onnx(), training_path="loop", callbacks=[LRScheduler()]).fit(X, y)


def test_early_stopping_callback_restores_the_best_epoch(mlp_onnx, regression_data):
    X, y, X_val, y_val = _split(regression_data)
    stopper = EarlyStopping(monitor="valid_loss", patience=2, threshold=1e9)
    est = OrtGradientForwardBackwardOptimizer(
        mlp_onnx(), learning_rate=_constant(0.01), max_iter=20, validation_every=1,
        callbacks=[stopper], random_state=0).fit(X, y, X_val=X_val, y_val=y_val)
    # nothing improves by 1e9: epoch 1 is the best, training stops 2 later
    assert stopper.best_epoch_ == 1 and stopper.stopped_epoch_ == 3
    assert est.n_iter_ == 3 and len(est.history_) == 3
    assert est.losses(X_val, y_val).mean() == pytest.approx(
        est.history_[0]["valid_loss"], rel=1e-5)
    # a score from EpochScoring, higher is better
    stopper = EarlyStopping(monitor="valid_r2", patience=1, threshold=1e9,
                            lower_is_better=False, load_best=False)
    est.set_params(callbacks=[EpochScoring("r2", X_val, y_val), stopper]).fit(X, y)
    assert est.n_iter_ == 2 and stopper.best_ == est.history_[0]["valid_r2"]


def test_a_callback_returning_true_stops(mlp_onnx, regression_data):
    X, y = regression_data

    class StopAt(Callback):
        def __init__(self, epoch=2):
            self.epoch = epoch

        def on_epoch_end(self, estimator, record):
            record["seen"] = estimator.n_iter_
            return record["epoch"] == self.epoch

    est = OrtGradientForwardBackwardOptimizer(
        mlp_onnx(), max_iter=10, callbacks=[StopAt(3)]).fit(X, y)
    assert est.n_iter_ == 3 and [r["seen"] for r in est.history_] == [1, 2, 3]


def test_mlp_callbacks_see_the_estimator(regression_data):
    X, y, X_val, y_val = _split(regression_data)
    scoring = EpochScoring("r2", X_val, y_val)
    reader = []

    class ReadCoefs(Callback):
        def on_epoch_end(self, estimator, record):
            reader.append(estimator.coefs_[0].copy())

    mlp = MLPRegressor(hidden_layer_sizes=(6,), solver="sgd", max_iter=4,
                       batch_size=20, random_state=0, learning_rate_init=0.01,
                       callbacks=[ReadCoefs(), scoring])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        mlp.fit(X, y)
    assert [r["train_loss"] for r in mlp.history_] == mlp.loss_curve_
    assert scoring.scores_[-1] == pytest.approx(mlp.score(X_val, y_val), abs=1e-12)
    assert_allclose(reader[-1], mlp.coefs_[0])
    assert not np.allclose(reader[0], reader[-1])  # read each epoch, not cached


def test_mlp_checkpoint_and_lr_scheduler(regression_data, tmp_path):
    """An MLP's callbacks: the ONNX checkpoint is to_onnx(), the scheduler
    sets the rate of every batch (half the rate == half the scheduled rate)."""
    X, y = regression_data
    path = tmp_path / "mlp.onnx"
    settings = dict(hidden_layer_sizes=(4,), solver="sgd", momentum=0.0,
                    learning_rate="constant", max_iter=2, batch_size=25,
                    random_state=0, shuffle=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        halved = MLPRegressor(learning_rate_init=0.02, callbacks=[
            LRScheduler(policy=lambda s: 0.5), Checkpoint(path)], **settings).fit(X, y)
        plain = MLPRegressor(learning_rate_init=0.01, **settings).fit(X, y)
    assert_allclose(halved.loss_curve_, plain.loss_curve_, rtol=1e-6)
    session = onnxruntime.InferenceSession(str(path),
                                           providers=["CPUExecutionProvider"])
    assert_allclose(session.run(None, {"X": X})[0].ravel(),
                    halved.predict(X), rtol=1e-5, atol=1e-6)
