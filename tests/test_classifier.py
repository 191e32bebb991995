"""OrtGradientForwardBackwardClassifier on skl2onnx classifier graphs, and
OrtGradientOptimizer on a graph computing its own loss."""
import pickle
import warnings

import numpy as np
import pytest
from numpy.testing import assert_allclose
from sklearn.datasets import make_classification
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.neural_network import MLPClassifier, MLPRegressor

from onnxtrain import to_onnx
from onnxtrain.estimators import (OrtGradientForwardBackwardClassifier,
                                  OrtGradientOptimizer)
from onnxtrain.models import add_loss_output
from onnxtrain.optim import LearningRateSGD


def _data(n_classes, labels=None):
    X, y = make_classification(n_samples=105, n_features=5, n_informative=4,
                               n_redundant=0, n_classes=n_classes, random_state=0)
    X = X.astype(np.float32)
    return X, (y if labels is None else np.asarray(labels)[y])


def _mlp(**kwargs):
    settings = dict(hidden_layer_sizes=(8,), solver="sgd", learning_rate="constant",
                    learning_rate_init=0.05, momentum=0.0, batch_size=10,
                    max_iter=20, shuffle=False, alpha=0.0, n_iter_no_change=1000,
                    tol=0.0, random_state=0)
    settings.update(kwargs)
    return MLPClassifier(**settings)


def _fit_mlp(X, y, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return _mlp(**kwargs).fit(X, y)


CASES = [("binary-int", 2, None, {}), ("multiclass-str", 3, ["x", "y", "z"], {}),
         ("binary-str-zipmap", 2, ["no", "yes"], None)]


@pytest.mark.parametrize("name,n_classes,labels,options", CASES,
                         ids=[c[0] for c in CASES])
def test_mlp_classifier_loss_curve_overlays(name, n_classes, labels, options):
    X, y = _data(n_classes, labels)
    skl = _fit_mlp(X, y)
    onx = to_onnx(skl, X[:1], options=None if options is None else
                  {"zipmap": False})
    est = OrtGradientForwardBackwardClassifier(
        onx, learning_rate=LearningRateSGD(0.05, learning_rate="constant"),
        max_iter=20, random_state=0).fit(X, y)
    assert_allclose(est.train_losses_, skl.loss_curve_, rtol=1e-4)
    assert list(est.classes_) == list(skl.classes_)
    assert_allclose(est.predict_proba(X), skl.predict_proba(X), rtol=1e-3, atol=1e-5)
    assert (est.predict(X) == skl.predict(X)).mean() > 0.98
    assert est.predict(X).dtype == np.asarray(y).dtype
    assert est.score(X, y) == pytest.approx(skl.score(X, y), abs=0.02)


def test_trained_graph_keeps_labels_and_probabilities():
    X, y = _data(3, ["x", "y", "z"])
    onx = to_onnx(_fit_mlp(X, y, max_iter=1), X[:1], options={"zipmap": False})
    est = OrtGradientForwardBackwardClassifier(onx, learning_rate=0.05, max_iter=5,
                                               random_state=0).fit(X, y)
    import onnxruntime
    sess = onnxruntime.InferenceSession(est.get_trained_onnx().SerializeToString(),
                                        providers=["CPUExecutionProvider"])
    label, proba = sess.run(None, {"X": X})
    assert_allclose(proba, est.predict_proba(X), rtol=1e-5, atol=1e-6)
    assert list(label) == list(est.predict(X))


def test_logistic_regression_graph_is_rewritten_and_trains():
    X, y = _data(3)
    lr = LogisticRegression(max_iter=3).fit(X, y)
    onx = to_onnx(lr, X[:1])
    est = OrtGradientForwardBackwardClassifier(
        onx, learning_rate=LearningRateSGD(0.1, learning_rate="constant"),
        max_iter=30, warm_start=True).fit(X, y)
    assert est.weights_to_train_ == ["coefficient", "intercepts"]
    assert est.train_losses_[-1] < est.train_losses_[0]
    assert est.score(X, y) >= lr.score(X, y) - 0.02


def test_class_count_mismatch_and_unseen_labels():
    X, y = _data(3)
    onx = to_onnx(_fit_mlp(X, y, max_iter=1), X[:1], options={"zipmap": False})
    est = OrtGradientForwardBackwardClassifier(onx, max_iter=2)
    with pytest.raises(ValueError, match="3 probability columns but 2 classes"):
        est.fit(X, np.where(y == 2, 1, y))
    est.fit(X, y)
    with pytest.raises(ValueError, match="unseen at fit time: \\[7\\]"):
        est.score(X, np.where(y == 2, 7, y))


def test_partial_fit_with_classes_absent_from_first_batch():
    X, y = _data(3)
    onx = to_onnx(_fit_mlp(X, y, max_iter=1), X[:1], options={"zipmap": False})
    est = OrtGradientForwardBackwardClassifier(onx, learning_rate=0.05,
                                               random_state=0)
    first = y != 2
    est.partial_fit(X[first], y[first], classes=[0, 1, 2])
    est.partial_fit(X, y)
    assert list(est.classes_) == [0, 1, 2] and est.n_iter_ == 2
    assert est.predict_proba(X).shape == (105, 3)
    with pytest.raises(ValueError, match="unseen"):
        est.partial_fit(X, np.where(y == 2, 5, y))


def test_classifier_early_stopping_and_pickle():
    X, y = _data(2)
    skl = _fit_mlp(X, y, early_stopping=True, validation_fraction=0.2,
                   n_iter_no_change=3, tol=1e-2, max_iter=40)
    onx = to_onnx(skl, X[:1], options={"zipmap": False})
    est = OrtGradientForwardBackwardClassifier(
        onx, learning_rate=LearningRateSGD(0.05, learning_rate="constant"),
        max_iter=40, random_state=0, early_stopping=True, validation_fraction=0.2,
        n_iter_no_change=3, tol=1e-2).fit(X, y)
    assert est.n_iter_ == skl.n_iter_
    assert_allclose(est.validation_scores_, skl.validation_scores_)
    clone = pickle.loads(pickle.dumps(est))
    assert_allclose(clone.predict_proba(X), est.predict_proba(X))


def test_ort_gradient_optimizer_on_a_loss_graph():
    rng = np.random.RandomState(0)
    X = rng.randn(100, 3).astype(np.float32)
    y = (X @ np.array([1.0, 2.0, 3.0]) + 1).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        skl = MLPRegressor(hidden_layer_sizes=(), activation="identity",
                           max_iter=1).fit(X, y)
    training = add_loss_output(to_onnx(skl, X[:1]))
    assert [i.name for i in training.graph.input] == ["X", "label"]
    assert [o.name for o in training.graph.output] == ["loss"]
    est = OrtGradientOptimizer(
        training, learning_rate=LearningRateSGD(0.05, learning_rate="constant"),
        max_iter=40, random_state=0).fit(X, y)
    coefficient, intercept = est.get_state()
    assert_allclose(coefficient.ravel(), [1, 2, 3], atol=1e-4)
    assert_allclose(intercept.ravel(), [1], atol=1e-4)
    assert est.losses(X, y) < 1e-8 < est.train_losses_[0]
    with pytest.raises(ValueError, match="not an output"):
        OrtGradientOptimizer(training, loss_output_name="nope").fit(X, y)


def test_attribute_only_graph_says_there_is_nothing_to_train():
    """A graph keeping its coefficients in ai.onnx.ml attributes has no
    trainable initializer: select_weights says so, and the estimators train
    it after rewriting it into MatMul/Add."""
    from sklearn.linear_model import LinearRegression

    from onnxtrain.models import select_weights
    rng = np.random.RandomState(0)
    X = rng.randn(60, 3).astype(np.float32)
    y = (X @ np.array([1.0, -2.0, 0.5]) + 0.3).astype(np.float32)
    onx = to_onnx(LinearRegression().fit(X, y), X[:1])
    assert {n.op_type for n in onx.graph.node} == {"LinearRegressor"}
    with pytest.raises(ValueError, match="nothing to train"):
        select_weights(onx)
    from onnxtrain import OrtGradientForwardBackwardOptimizer
    est = OrtGradientForwardBackwardOptimizer(
        onx, warm_start=True, max_iter=3,
        learning_rate=LearningRateSGD(0.01, learning_rate="constant")).fit(X, y)
    assert est.weights_to_train_ == ["coefficient", "intercepts"]
    assert est.train_losses_[-1] < 1e-6  # starts from the exact solution


def test_errors_of_a_wrong_estimator_or_order():
    """predict before fit is NotFittedError; a classifier graph given to the
    regressor is a clear error naming the class to use."""
    from sklearn.exceptions import NotFittedError

    from onnxtrain import OrtGradientForwardBackwardOptimizer
    X, y = _data(3)
    onx = to_onnx(_fit_mlp(X, y, max_iter=1), X[:1], options={"zipmap": False})
    with pytest.raises(NotFittedError):
        OrtGradientForwardBackwardClassifier(onx).predict(X)
    with pytest.raises(ValueError, match="3 columns but y has 1.*Classifier"):
        OrtGradientForwardBackwardOptimizer(onx, max_iter=1).fit(X, y)
