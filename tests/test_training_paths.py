"""The three execution paths (split, fused step, in-graph loop) compute the
same steps: same loss curves and same weights."""
import warnings

import numpy as np
import onnx
import pytest
from numpy.testing import assert_allclose
from sklearn.exceptions import ConvergenceWarning
from sklearn.neural_network import MLPClassifier, MLPRegressor

from onnxtrain import ConvergenceError, to_onnx
from onnxtrain.estimators import (OrtGradientForwardBackwardClassifier,
                                  OrtGradientForwardBackwardOptimizer)
from onnxtrain.optim import (LearningRateAdam, LearningRateAdamW,
                             LearningRateSGD, LearningRateSGDNesterov)
from onnxtrain.penalties import ElasticLearningPenalty

PATHS = ["split", "fused", "loop"]


@pytest.fixture(scope="module")
def regression():
    rng = np.random.RandomState(0)
    X = rng.randn(105, 5).astype(np.float32)
    y = np.tanh(X @ rng.randn(5)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        skl = MLPRegressor(hidden_layer_sizes=(8,), max_iter=1).fit(X, y)
    return X, y, to_onnx(skl, X[:1])


SETTINGS = [
    ("sgd-constant", dict(learning_rate=LearningRateSGD(0.02, learning_rate="constant"))),
    ("sgd-invscaling", dict(learning_rate=LearningRateSGD(0.05))),
    ("momentum", dict(learning_rate=LearningRateSGDNesterov(
        0.01, learning_rate="constant", nesterov=False))),
    ("nesterov", dict(learning_rate=LearningRateSGDNesterov(0.01))),
    ("adam", dict(learning_rate=LearningRateAdam(0.01))),
    ("adamw-penalty", dict(learning_rate=LearningRateAdamW(0.01),
                           learning_penalty=ElasticLearningPenalty(0.001, 0.01))),
    ("shuffle", dict(learning_rate=0.02, shuffle=True)),
    ("validation-tol", dict(learning_rate=0.02, tol=1e-4, n_iter_no_change=3)),
    ("sample-weight", dict(learning_rate=0.02)),
]


@pytest.mark.parametrize("name,settings", SETTINGS, ids=[s[0] for s in SETTINGS])
def test_paths_agree_on_regression(regression, name, settings):
    X, y, onx = regression
    sample_weight = (np.arange(X.shape[0]) % 3 + 1).astype(np.float32) \
        if name == "sample-weight" else None
    results = {}
    for path in PATHS:
        est = OrtGradientForwardBackwardOptimizer(
            onx, max_iter=12, random_state=0, training_path=path, **settings)
        kwargs = {} if name != "validation-tol" else dict(X_val=X[:30], y_val=y[:30])
        est.fit(X, y, sample_weight=sample_weight, **kwargs)
        assert est.training_path_ == path
        results[path] = est
    reference = results["split"]
    for path in ("fused", "loop"):
        assert_allclose(results[path].train_losses_, reference.train_losses_,
                        rtol=1e-5)
        for a, b in zip(results[path].get_state(), reference.get_state()):
            assert_allclose(a, b, rtol=1e-5, atol=1e-7)
        if reference.validation_losses_:
            assert_allclose(results[path].validation_losses_,
                            reference.validation_losses_, rtol=1e-5)


def test_paths_agree_on_classifier():
    rng = np.random.RandomState(1)
    X = rng.randn(90, 4).astype(np.float32)
    y = (X[:, 0] + X[:, 1] > 0).astype(int) + (X[:, 2] > 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        skl = MLPClassifier(hidden_layer_sizes=(6,), max_iter=1).fit(X, y)
    onx = to_onnx(skl, X[:1], options={"zipmap": False})
    fits = [OrtGradientForwardBackwardClassifier(
        onx, learning_rate=0.1, max_iter=8, random_state=0,
        training_path=path).fit(X, y) for path in PATHS]
    for est in fits[1:]:
        assert_allclose(est.train_losses_, fits[0].train_losses_, rtol=1e-5)
        assert_allclose(est.predict_proba(X), fits[0].predict_proba(X), rtol=1e-5)


def test_auto_takes_the_loop(regression):
    X, y, onx = regression
    est = OrtGradientForwardBackwardOptimizer(onx, max_iter=2).fit(X, y)
    assert est.training_path_ == "loop"


def test_auto_takes_the_fused_step_for_big_parameters(regression, monkeypatch):
    """Above LOOP_MAX_PARAMETER_BYTES the Loop's extra copies of the
    parameters cost more than they save; the bytes counted are the weights'
    and the optimizer state's (two velocities here double them)."""
    from onnxtrain.estimators import _base
    X, y, onx = regression
    rate = LearningRateSGDNesterov(0.01, learning_rate="constant", momentum=0.9)
    est = OrtGradientForwardBackwardOptimizer(onx, learning_rate=rate, max_iter=1)
    est.fit(X, y)
    weights = sum(w.nbytes for w in est.get_state())
    assert est._trainer.parameter_bytes() == 2 * weights
    monkeypatch.setattr(_base, "LOOP_MAX_PARAMETER_BYTES", 2 * weights - 1)
    assert est.fit(X, y).training_path_ == "fused"
    monkeypatch.setattr(_base, "LOOP_MAX_PARAMETER_BYTES", 2 * weights)
    assert est.fit(X, y).training_path_ == "loop"


def test_non_finite_loss_stops_at_the_same_step_on_every_path(regression):
    X, y, onx = regression
    states = []
    for path in PATHS:
        est = OrtGradientForwardBackwardOptimizer(
            onx, learning_rate=LearningRateSGD(1e4, learning_rate="constant"),
            max_iter=5, random_state=0, training_path=path)
        with pytest.raises(ConvergenceError):
            est.fit(X, y)
        state = est.get_state()
        assert all(np.isfinite(w).all() for w in state)
        states.append(state)
    for other in states[1:]:
        for a, b in zip(other, states[0]):
            assert_allclose(a, b, rtol=1e-5)


def test_old_opset_falls_back_to_split(regression):
    X, y, _ = regression
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        skl = MLPRegressor(hidden_layer_sizes=(4,), max_iter=1).fit(X, y)
    onx = to_onnx(skl, X[:1], target_opset=11)
    est = OrtGradientForwardBackwardOptimizer(onx, max_iter=2).fit(X, y)
    assert est.training_path_ == "split"
    with pytest.raises(ValueError, match="training_path='loop' is not available"):
        OrtGradientForwardBackwardOptimizer(onx, max_iter=2,
                                            training_path="loop").fit(X, y)
    with pytest.raises(ValueError, match="training_path must be one of"):
        OrtGradientForwardBackwardOptimizer(onx, training_path="fast").fit(X, y)


def test_fused_graphs_are_valid_onnx(regression):
    X, y, onx = regression
    est = OrtGradientForwardBackwardOptimizer(
        onx, learning_rate=LearningRateAdam(0.01), max_iter=1,
        training_path="loop").fit(X, y)
    trainer = est._trainer
    for kind in ("step", "loop", "epochs"):
        graph = trainer.fused_graph(kind, False)
        onnx.checker.check_model(graph.model, full_check=True)
        ops = {n.op_type for n in graph.model.graph.node}
        domains = {n.domain for n in graph.model.graph.node}
        assert domains <= {"", "ai.onnx"}
        if kind != "step":
            assert ops & {"Loop"}


@pytest.mark.skipif(
    "CUDAExecutionProvider" not in __import__("onnxruntime").get_available_providers(),
    reason="needs onnxruntime-gpu and a CUDA device")
@pytest.mark.parametrize("path", PATHS)
def test_cuda_paths_match_cpu(regression, path):
    """device='cuda' keeps the loop on the GPU and computes the CPU's steps."""
    X, y, onx = regression
    fits = [OrtGradientForwardBackwardOptimizer(
        onx, learning_rate=0.02, max_iter=5, random_state=0, training_path=path,
        device=device).fit(X, y) for device in ("cpu", "cuda")]
    assert_allclose(fits[1].train_losses_, fits[0].train_losses_, rtol=1e-4)
    for a, b in zip(fits[1].get_state(), fits[0].get_state()):
        assert_allclose(a, b, rtol=1e-4, atol=1e-6)
