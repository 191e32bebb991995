"""OrtGradientForwardBackwardClassifier on skl2onnx classifier graphs, and
OrtGradientOptimizer on a graph computing its own loss."""
import pickle
import warnings

import numpy as np
import pytest
from numpy.testing import assert_allclose
from onnx import TensorProto, helper, numpy_helper
from scipy.special import expit, log_softmax, softmax
from sklearn.datasets import make_classification
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression, SGDClassifier
from sklearn.metrics import log_loss
from sklearn.neural_network import MLPClassifier, MLPRegressor

from onnxtrain import to_onnx
from onnxtrain.estimators import (OrtGradientForwardBackwardClassifier,
                                  OrtGradientOptimizer)
from onnxtrain.losses import CrossEntropyLearningLoss, NegLogLearningLoss
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
    with warnings.catch_warnings():  # 3 lbfgs iterations: room left to train
        warnings.simplefilter("ignore", ConvergenceWarning)
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


# ------------------------------------------------ what the output means
def _linear_graph(n_columns, tail):
    """X (N, 5) -> z = X W + B (N, n_columns) -> ``tail(z)`` as nodes."""
    rng = np.random.RandomState(0)
    weights = [numpy_helper.from_array(
        (rng.randn(5, n_columns) * 0.3).astype(np.float32), "W"),
        numpy_helper.from_array(np.zeros(n_columns, np.float32), "B")]
    nodes = [helper.make_node("MatMul", ["X", "W"], ["xw"]),
             helper.make_node("Add", ["xw", "B"], ["z"])] + tail
    graph = helper.make_graph(
        nodes, "linear", [helper.make_tensor_value_info("X", TensorProto.FLOAT,
                                                        [None, 5])],
        [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT,
                                       [None, None])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _sigmoid_graph():
    """One column: p = sigmoid(z), read as P(classes_[1])."""
    return _linear_graph(1, [helper.make_node("Sigmoid", ["z"], ["p"])])


def _concat_graph():
    """The same p as two columns (1 - p, p), as skl2onnx writes binary
    classifiers (no final Softmax/Sigmoid: its values are checked)."""
    one = numpy_helper.from_array(np.array(1, np.float32), "one")
    return _linear_graph(1, [
        helper.make_node("Constant", [], ["one"], value=one),
        helper.make_node("Sigmoid", ["z"], ["p"]),
        helper.make_node("Sub", ["one", "p"], ["q"]),
        helper.make_node("Concat", ["q", "p"], ["proba"], axis=1)])


@pytest.mark.parametrize("path", ["split", "fused", "loop"])
def test_one_column_graph_trains_the_binary_log_loss(path):
    """p of shape (N, 1) is P(classes_[1]): training follows the two-column
    (1 - p, p) graph step for step (before, only -y log p was trained and
    every probability went to 1), and the loss is scikit-learn's log_loss."""
    X, y = _data(2, ["no", "yes"])
    rate = LearningRateSGD(0.1, learning_rate="constant")
    reference = OrtGradientForwardBackwardClassifier(
        _concat_graph(), learning_rate=rate, max_iter=15, warm_start=True,
        training_path="split").fit(X, y)
    est = OrtGradientForwardBackwardClassifier(
        _sigmoid_graph(), learning_rate=rate, max_iter=15, warm_start=True,
        training_path=path).fit(X, y)
    assert est.training_path_ == path
    assert_allclose(est.train_losses_, reference.train_losses_, rtol=1e-5)
    assert isinstance(est.learning_loss_, NegLogLearningLoss)
    assert est.learning_loss_.probability_function is None
    for a, b in zip(est.get_state(), reference.get_state()):
        assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    proba = est.predict_proba(X)
    assert_allclose(proba, reference.predict_proba(X), rtol=1e-5, atol=1e-6)
    assert_allclose(est.losses(X, y).mean(), log_loss(y, proba), rtol=1e-5)
    assert est.score(X, y) > 0.7  # -y log p alone gave every row 'yes'


def _graph_with_output(onx, X):
    import onnxruntime
    sess = onnxruntime.InferenceSession(onx.SerializeToString(),
                                        providers=["CPUExecutionProvider"])
    return sess.run(None, {"X": X})[-1]


def test_output_that_is_not_a_probability_is_an_error():
    """A regression graph (one column, any real value) or raw decision
    scores (SGDClassifier) were silently trained as probabilities; fit now
    says so before any step."""
    X, y = _data(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        regression = to_onnx(MLPRegressor(hidden_layer_sizes=(5,), max_iter=1)
                             .fit(X, X[:, 0]), X[:1])
    scores = to_onnx(SGDClassifier(random_state=0).fit(X, y), X[:1],
                     options={"zipmap": False})
    for onx, target, match in [
            (regression, y > 0, r"'variable' is not a probability.*not in \[0, 1\]"),
            (scores, y, r"'probabilities' is not a probability.*not in \[0, 1\]")]:
        est = OrtGradientForwardBackwardClassifier(onx, max_iter=2, random_state=0)
        with pytest.raises(ValueError, match=match):
            est.fit(X, target)
        assert est.n_iter_ == 0 and est.t_ == 0
        with pytest.raises(ValueError, match="from_logits=True"):
            OrtGradientForwardBackwardClassifier(onx, max_iter=2).partial_fit(
                X, target, classes=np.unique(target))


def test_rows_not_summing_to_one_are_an_error():
    """Three columns in [0, 1] not summing to 1 are not class probabilities
    for the cross-entropy; the same graph ending with Sigmoid is taken as
    probabilities by construction (no check)."""
    X, y = _data(3)
    one = numpy_helper.from_array(np.array(1, np.float32), "one")
    scaled = _linear_graph(3, [helper.make_node("Constant", [], ["one"], value=one),
                               helper.make_node("Sigmoid", ["z"], ["s"]),
                               helper.make_node("Mul", ["s", "one"], ["p"])])
    with pytest.raises(ValueError, match=r"rows sum to values in \[.*\], not to 1"):
        OrtGradientForwardBackwardClassifier(scaled, max_iter=1,
                                             warm_start=True).fit(X, y)
    sigmoid = _linear_graph(3, [helper.make_node("Sigmoid", ["z"], ["p"])])
    est = OrtGradientForwardBackwardClassifier(sigmoid, max_iter=1,
                                               warm_start=True).fit(X, y)
    assert est.n_iter_ == 1


def test_logits_output_gets_softmax_or_sigmoid_in_predict_proba():
    """With from_logits=True the output is read as logits: predict_proba is
    the softmax of the trained graph's output (the sigmoid for one
    column, trained with the binary log loss on the score)."""
    X, y = _data(3)
    scores = to_onnx(SGDClassifier(random_state=0).fit(X, y), X[:1],
                     options={"zipmap": False})
    est = OrtGradientForwardBackwardClassifier(
        scores, learning_loss=CrossEntropyLearningLoss(from_logits=True),
        learning_rate=0.05, max_iter=10, warm_start=True).fit(X, y)
    raw = _graph_with_output(est.get_trained_onnx(), X)
    assert_allclose(est.predict_proba(X), softmax(raw, axis=1), rtol=1e-5)
    assert est.train_losses_[-1] < est.train_losses_[0]
    # exact on logits (log_loss would clip p at float32's eps)
    log_p = log_softmax(raw.astype(np.float64), axis=1)
    assert_allclose(est.losses(X, y), -log_p[np.arange(len(y)), y], rtol=1e-4,
                    atol=1e-6)
    # one-vs-rest: a sigmoid per column, rows divided by their sum
    est = OrtGradientForwardBackwardClassifier(
        scores, learning_loss=NegLogLearningLoss(), learning_rate=0.05,
        max_iter=2, warm_start=True).fit(X, y)
    sigmoid = expit(_graph_with_output(est.get_trained_onnx(), X))
    assert_allclose(est.predict_proba(X),
                    sigmoid / sigmoid.sum(axis=1, keepdims=True), rtol=1e-5)

    binary = (y > 0).astype(int)
    linear = _linear_graph(1, [helper.make_node("Identity", ["z"], ["score"])])
    est = OrtGradientForwardBackwardClassifier(
        linear, learning_loss=CrossEntropyLearningLoss(from_logits=True),
        learning_rate=0.05, max_iter=10, warm_start=True).fit(X, binary)
    assert est.learning_loss_.probability_function == "sigmoid"
    p = expit(_graph_with_output(est.get_trained_onnx(), X)).ravel()
    assert_allclose(est.predict_proba(X), np.c_[1 - p, p], rtol=1e-5, atol=1e-7)
    assert_allclose(est.losses(X, binary).mean(), log_loss(binary, p), rtol=1e-5)
