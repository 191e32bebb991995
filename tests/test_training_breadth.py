"""Optimizers, schedules, penalties, stopping rules and incremental training
against scikit-learn's MLP (same initial weights, same batches)."""
import warnings

import numpy as np
import onnxruntime
import pytest
from numpy.testing import assert_allclose
from onnx import TensorProto
from sklearn.exceptions import ConvergenceWarning
from sklearn.neural_network import MLPRegressor

from onnxtrain import to_onnx
from onnxtrain.estimators import OrtGradientForwardBackwardOptimizer
from onnxtrain.optim import (LearningRateAdam, LearningRateAdamW,
                             LearningRateSGD, LearningRateSGDNesterov)
from onnxtrain.penalties import ElasticLearningPenalty

from conftest import _fix_multi_output  # noqa: E402

# ------------------------------------------------------------------ oracles
# numpy references written from sklearn/neural_network/_stochastic_optimizers.py


def _sgd_reference(params, grads_seq, lr, momentum, nesterov):
    velocities = [np.zeros_like(p) for p in params]
    for grads in grads_seq:
        updates = [momentum * v - lr * g for v, g in zip(velocities, grads)]
        velocities = updates
        if nesterov:
            updates = [momentum * v - lr * g for v, g in zip(velocities, grads)]
        params = [p + u for p, u in zip(params, updates)]
    return params, velocities


def _adam_reference(params, grads_seq, lr, beta_1, beta_2, epsilon, decay=0.0):
    ms = [np.zeros_like(p) for p in params]
    vs = [np.zeros_like(p) for p in params]
    for t, grads in enumerate(grads_seq, 1):
        ms = [beta_1 * m + (1 - beta_1) * g for m, g in zip(ms, grads)]
        vs = [beta_2 * v + (1 - beta_2) * g ** 2 for v, g in zip(vs, grads)]
        step = lr * np.sqrt(1 - beta_2 ** t) / (1 - beta_1 ** t)
        params = [p - lr * decay * p - step * m / (np.sqrt(v) + epsilon)
                  for p, m, v in zip(params, ms, vs)]
    return params, ms, vs


UPDATE_RULES = [
    ("sgd", LearningRateSGD(eta0=0.1, learning_rate="constant"),
     lambda p, g: (_sgd_reference(p, g, 0.1, 0.0, False)[0],)),
    ("momentum", LearningRateSGDNesterov(eta0=0.1, learning_rate="constant",
                                         momentum=0.9, nesterov=False),
     lambda p, g: _sgd_reference(p, g, 0.1, 0.9, False)),
    ("nesterov", LearningRateSGDNesterov(eta0=0.1, learning_rate="constant",
                                         momentum=0.8, nesterov=True),
     lambda p, g: _sgd_reference(p, g, 0.1, 0.8, True)),
    ("adam", LearningRateAdam(eta0=0.01, beta_1=0.8, beta_2=0.99, epsilon=1e-7),
     lambda p, g: _adam_reference(p, g, 0.01, 0.8, 0.99, 1e-7)),
    ("adamw", LearningRateAdamW(eta0=0.01, weight_decay=0.1),
     lambda p, g: _adam_reference(p, g, 0.01, 0.9, 0.999, 1e-8, 0.1)),
]


@pytest.mark.parametrize("name,rule,reference", UPDATE_RULES,
                         ids=[r[0] for r in UPDATE_RULES])
def test_update_graph_matches_numpy_reference(name, rule, reference):
    """N steps of each update graph (state fed back) equal the numpy oracle."""
    rng = np.random.RandomState(0)
    shapes = [("W", (3, 2)), ("b", (2,))]
    model = rule.build_onnx(shapes, TensorProto.DOUBLE, 17)
    sess = onnxruntime.InferenceSession(model.SerializeToString(),
                                        providers=["CPUExecutionProvider"])
    params = [rng.randn(*s) for _, s in shapes]
    states = [[np.zeros(s) for _ in rule.state_names] for _, s in shapes]
    grads_seq = [[rng.randn(*s) for _, s in shapes] for _ in range(7)]
    rule.init_learning_rate()
    current = [p.copy() for p in params]
    for step, grads in enumerate(grads_seq, 1):
        feeds = {k: np.array(v) for k, v in rule.step_scalars(step).items()}
        feeds.update(loss=np.array(0.0), penalty_scale=np.array(1.0))
        for (n, _), p, g, st in zip(shapes, current, grads, states):
            feeds[n], feeds[f"{n}_grad"] = p, g
            feeds.update({f"{n}_{s}": v for s, v in zip(rule.state_names, st)})
        out = sess.run(None, feeds)
        width = 1 + len(rule.state_names)
        current = out[:-1:width]
        states = [out[i * width + 1:(i + 1) * width] for i in range(len(shapes))]
    expected = reference(params, grads_seq)
    for got, want in zip(current, expected[0]):
        assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    for index, state_name in enumerate(rule.state_names):
        for got, want in zip(states, expected[1 + index]):
            assert_allclose(got[index], want, rtol=1e-10, atol=1e-12)


def test_elastic_penalty_gradient_and_value():
    """The penalty's gradient is added before the update (so scaled by the
    learning rate) and its value joins the loss; biases are left alone."""
    rule = LearningRateSGD(eta0=0.5, learning_rate="constant")
    penalty = ElasticLearningPenalty(l1=0.3, l2=0.2)
    model = rule.build_onnx([("W", (2, 2)), ("b", (2,))], TensorProto.DOUBLE,
                            17, penalty, {"W"})
    sess = onnxruntime.InferenceSession(model.SerializeToString(),
                                        providers=["CPUExecutionProvider"])
    W, b = np.array([[1.0, -2.0], [0.5, 0.0]]), np.array([3.0, -1.0])
    gW, gb = np.full((2, 2), 0.1), np.full(2, 0.2)
    scale = 0.25
    W_new, b_new, total = sess.run(None, {
        "learning_rate": np.array(0.5), "step": np.array(1.0), "loss": np.array(1.5),
        "penalty_scale": np.array(scale), "W": W, "W_grad": gW, "b": b,
        "b_grad": gb})
    expected_grad = gW + scale * (0.3 * np.sign(W) + 2 * 0.2 * W)
    assert_allclose(W_new, W - 0.5 * expected_grad)
    assert_allclose(b_new, b - 0.5 * gb)
    assert total == pytest.approx(1.5 + scale * (0.3 * np.abs(W).sum()
                                                 + 0.2 * (W ** 2).sum()))


def test_adaptive_schedule_divides_by_five_then_stops():
    rule = LearningRateSGD(eta0=0.1, learning_rate="adaptive").init_learning_rate()
    assert rule.trigger_stopping() is False and rule.value == pytest.approx(0.02)
    rule.update_learning_rate(50)  # adaptive ignores time
    assert rule.value == pytest.approx(0.02)
    rule.value = 1e-6
    assert rule.trigger_stopping() is True


# --------------------------------------------------- parity with scikit-learn
def _data(n=105, k=1):
    rng = np.random.RandomState(0)
    X = rng.randn(n, 5).astype(np.float32)
    coef = rng.randn(5, k)
    y = np.tanh(X @ coef) + 0.1 * rng.randn(n, k)
    y = y.astype(np.float32)
    return X, (y.ravel() if k == 1 else y)


def _sklearn(**kwargs):
    settings = dict(hidden_layer_sizes=(8,), batch_size=10, max_iter=20,
                    shuffle=False, alpha=0.0, n_iter_no_change=1000, tol=0.0,
                    random_state=0, learning_rate_init=0.01)
    settings.update(kwargs)
    return MLPRegressor(**settings)


def _converted(skl, X):
    """skl2onnx's graph; its final Reshape to (-1, 1) is fixed for k outputs
    (skl2onnx 1.20 flattens multi-output predictions)."""
    onx = to_onnx(skl, X[:1])
    if skl.n_outputs_ > 1:
        _fix_multi_output(onx, skl.n_outputs_)
    return onx


def _fit_both(skl, X, y, **ours):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        skl.fit(X, y)
    onx = _converted(skl, X)
    settings = dict(max_iter=skl.max_iter, batch_size=skl.batch_size,
                    random_state=0, init="random")
    settings.update(ours)
    est = OrtGradientForwardBackwardOptimizer(onx, **settings).fit(X, y)
    return skl, est


def _weights(skl):
    out = []
    for c, i in zip(skl.coefs_, skl.intercepts_):
        out += [c, i.reshape(1, -1)]
    return out


PARITY = [
    ("momentum", dict(solver="sgd", learning_rate="constant", momentum=0.9,
                      nesterovs_momentum=False),
     dict(learning_rate=LearningRateSGDNesterov(eta0=0.01, learning_rate="constant",
                                                momentum=0.9, nesterov=False))),
    ("nesterov", dict(solver="sgd", learning_rate="constant", momentum=0.9,
                      nesterovs_momentum=True),
     dict(learning_rate=LearningRateSGDNesterov(eta0=0.01, learning_rate="constant",
                                                momentum=0.9, nesterov=True))),
    ("adam", dict(solver="adam", learning_rate_init=0.005),
     dict(learning_rate=LearningRateAdam(eta0=0.005))),
    ("alpha", dict(solver="sgd", learning_rate="constant", momentum=0.0,
                   alpha=0.05),
     dict(learning_rate=LearningRateSGD(eta0=0.01, learning_rate="constant"),
          learning_penalty=ElasticLearningPenalty(l1=0.0, l2=0.025))),
    ("adam-alpha-shuffle", dict(solver="adam", alpha=0.01, shuffle=True),
     dict(learning_rate=LearningRateAdam(eta0=0.01), shuffle=True,
          learning_penalty=ElasticLearningPenalty(l1=0.0, l2=0.005))),
]


@pytest.mark.parametrize("name,skl_kwargs,our_kwargs", PARITY,
                         ids=[p[0] for p in PARITY])
def test_loss_curve_overlays_mlp_regressor(name, skl_kwargs, our_kwargs):
    X, y = _data()
    skl, est = _fit_both(_sklearn(**skl_kwargs), X, y, **our_kwargs)
    assert_allclose(est.train_losses_, skl.loss_curve_, rtol=1e-4)
    for ours, theirs in zip(est.get_state(), _weights(skl)):
        assert_allclose(ours, theirs, rtol=1e-3, atol=1e-5)


def test_multi_output_regression_overlays():
    X, y = _data(k=3)
    skl, est = _fit_both(_sklearn(solver="sgd", learning_rate="constant",
                                  momentum=0.0), X, y,
                         learning_rate=LearningRateSGD(0.01, learning_rate="constant"))
    assert_allclose(est.train_losses_, skl.loss_curve_, rtol=1e-4)
    assert est.predict(X).shape == (105, 3)
    assert_allclose(est.predict(X), skl.predict(X), rtol=1e-3, atol=1e-5)


def test_early_stopping_matches_scikit_learn():
    X, y = _data(n=300)
    skl_kwargs = dict(solver="sgd", learning_rate="constant", momentum=0.0,
                      early_stopping=True, validation_fraction=0.2,
                      learning_rate_init=0.05, n_iter_no_change=3, tol=1e-2,
                      max_iter=60)
    skl, est = _fit_both(_sklearn(**skl_kwargs), X, y,
                         learning_rate=LearningRateSGD(0.05, learning_rate="constant"),
                         early_stopping=True, validation_fraction=0.2,
                         n_iter_no_change=3, tol=1e-2)
    assert est.n_iter_ == skl.n_iter_ < 60
    assert_allclose(est.validation_scores_, skl.validation_scores_, rtol=1e-4)
    assert_allclose(est.train_losses_, skl.loss_curve_, rtol=1e-4)
    assert est.best_validation_score_ == pytest.approx(skl.best_validation_score_,
                                                       rel=1e-4)
    # the best weights are kept, as scikit-learn keeps them
    for ours, theirs in zip(est.get_state(), _weights(skl)):
        assert_allclose(ours, theirs, rtol=1e-3, atol=1e-5)


def test_adaptive_learning_rate_matches_scikit_learn():
    X, y = _data(n=60)
    skl_kwargs = dict(solver="sgd", learning_rate="adaptive", momentum=0.0,
                      learning_rate_init=0.2, n_iter_no_change=2, tol=0.05,
                      max_iter=40)
    skl, est = _fit_both(_sklearn(**skl_kwargs), X, y,
                         learning_rate=LearningRateSGD(0.2, learning_rate="adaptive"),
                         n_iter_no_change=2, tol=0.05)
    assert est.learning_rate_.value < 0.2  # the rule fired
    assert est.n_iter_ == skl.n_iter_
    assert_allclose(est.train_losses_, skl.loss_curve_, rtol=1e-4)


def test_training_loss_stopping_rule():
    X, y = _data()
    skl, est = _fit_both(
        _sklearn(solver="sgd", learning_rate="constant", momentum=0.0,
                 n_iter_no_change=2, tol=0.01, max_iter=100), X, y,
        learning_rate=LearningRateSGD(0.01, learning_rate="constant"),
        n_iter_no_change=2, tol=0.01, max_iter=100)
    assert est.n_iter_ == skl.n_iter_ < 100
    assert est.best_loss_ == pytest.approx(skl.best_loss_, rel=1e-4)


# ----------------------------------------------------------- incremental use
def test_partial_fit_is_one_epoch_of_fit():
    X, y = _data()
    onx = _fit_both(_sklearn(solver="sgd", max_iter=1), X, y)[0]
    onx = to_onnx(onx, X[:1])
    lr = LearningRateSGD(0.01, learning_rate="constant")
    full = OrtGradientForwardBackwardOptimizer(onx, learning_rate=lr, max_iter=3,
                                               random_state=1).fit(X, y)
    inc = OrtGradientForwardBackwardOptimizer(onx, learning_rate=lr, random_state=1)
    for _ in range(3):
        inc.partial_fit(X, y)
    assert inc.n_iter_ == 3 and inc.t_ == 3 * X.shape[0]
    assert_allclose(inc.train_losses_, full.train_losses_, rtol=1e-6)
    for a, b in zip(inc.get_state(), full.get_state()):
        assert_allclose(a, b, rtol=1e-6)


def test_shuffle_is_reproducible_and_changes_the_order():
    X, y = _data()
    onx = to_onnx(_fit_both(_sklearn(solver="sgd", max_iter=1), X, y)[0], X[:1])
    fits = [OrtGradientForwardBackwardOptimizer(
        onx, learning_rate=0.01, max_iter=3, shuffle=True, random_state=seed).fit(X, y)
        for seed in (5, 5, 6)]
    assert fits[0].train_losses_ == fits[1].train_losses_
    assert fits[0].train_losses_ != fits[2].train_losses_
    unshuffled = OrtGradientForwardBackwardOptimizer(
        onx, learning_rate=0.01, max_iter=3, random_state=5).fit(X, y)
    assert unshuffled.train_losses_ != fits[0].train_losses_


@pytest.mark.parametrize("bad", ["nan_X", "inf_y", "nan_w", "negative_w"])
def test_bad_input_rejected_before_training(bad):
    X, y = _data()
    onx = to_onnx(_fit_both(_sklearn(solver="sgd", max_iter=1), X, y)[0], X[:1])
    w = np.ones(X.shape[0])
    if bad == "nan_X":
        X = X.copy()
        X[3, 1] = np.nan
    elif bad == "inf_y":
        y = y.copy()
        y[2] = np.inf
    elif bad == "nan_w":
        w[4] = np.nan
    else:
        w[4] = -1
    est = OrtGradientForwardBackwardOptimizer(onx, max_iter=2)
    with pytest.raises(ValueError, match="NaN|infinity|negative"):
        est.fit(X, y, sample_weight=w)
    assert not hasattr(est, "train_losses_")


def test_warm_start_after_set_params_uses_the_new_learning_rate():
    """set_params between warm-start fits takes effect (the trainer is
    rebuilt on the current weights); without a change nothing is rebuilt."""
    X, y = _data()
    onx = _converted(_fit_both(_sklearn(solver="sgd", max_iter=1), X, y)[0], X)
    est = OrtGradientForwardBackwardOptimizer(
        onx, learning_rate=LearningRateSGD(0.01, learning_rate="constant"),
        max_iter=3, random_state=0, warm_start=True).fit(X, y)
    trainer = est._trainer
    est.fit(X, y)
    assert est._trainer is trainer  # unchanged parameters: same sessions
    before = est.get_state()
    est.set_params(learning_rate=LearningRateSGD(1e-12, learning_rate="constant"))
    est.fit(X, y)
    assert est.learning_rate_.eta0 == 1e-12
    for a, b in zip(est.get_state(), before):
        assert_allclose(a, b, rtol=1e-6, atol=1e-8)  # a tiny rate barely moves


def test_dataframe_feature_names_are_kept():
    pd = pytest.importorskip("pandas")
    X, y = _data()
    onx = _converted(_fit_both(_sklearn(solver="sgd", max_iter=1), X, y)[0], X)
    frame = pd.DataFrame(X, columns=[f"f{i}" for i in range(X.shape[1])])
    est = OrtGradientForwardBackwardOptimizer(onx, max_iter=1).fit(frame, y)
    assert list(est.feature_names_in_) == list(frame.columns)
    with pytest.warns(UserWarning, match="X does not have valid feature names"):
        unnamed = est.predict(X)  # scikit-learn's warning, as for its estimators
    assert_allclose(est.predict(frame), unnamed)
    with pytest.raises(ValueError, match="feature names should match"):
        est.predict(frame.rename(columns={"f0": "other"}))
