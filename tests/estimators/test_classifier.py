"""OrtGradientForwardBackwardClassifier on skl2onnx classifier graphs, and
OrtGradientOptimizer on a graph computing its own loss."""
import pickle
import warnings

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal
from onnx import TensorProto, helper, numpy_helper
from scipy.special import expit, log_softmax, softmax
from sklearn.datasets import make_classification
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression, SGDClassifier
from sklearn.metrics import log_loss
from sklearn.model_selection import GridSearchCV
from sklearn.neural_network import MLPClassifier, MLPRegressor

from onnxtrain import to_onnx
from onnxtrain.assembly.rewrite import probability_graph
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
        max_iter=20, random_state=0, init="random").fit(X, y)
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
    # without its label output the graph does not say its classes: y's
    # are the columns', and must be as many
    unlabelled = probability_graph(onx)[0]
    est = OrtGradientForwardBackwardClassifier(unlabelled, max_iter=2)
    with pytest.raises(ValueError, match="3 probability columns but 2 classes"):
        est.fit(X, np.where(y == 2, 1, y))
    # with it, y may hold some of the graph's classes
    est = OrtGradientForwardBackwardClassifier(onx, max_iter=2)
    est.fit(X, np.where(y == 2, 1, y))
    assert_array_equal(est.classes_, [0, 1, 2])
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
        n_iter_no_change=3, tol=1e-2, init="random").fit(X, y)
    assert est.n_iter_ == skl.n_iter_
    assert_allclose(est.validation_scores_, skl.validation_scores_)
    clone = pickle.loads(pickle.dumps(est))
    assert_allclose(clone.predict_proba(X), est.predict_proba(X))


def _linear_loss_graph(n):
    """(X, y = X @ [1, 2, 3] + 1, a linear model's graph with a square-loss
    output) on ``n`` rows."""
    rng = np.random.RandomState(0)
    X = rng.randn(n, 3).astype(np.float32)
    y = (X @ np.array([1.0, 2.0, 3.0]) + 1).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        skl = MLPRegressor(hidden_layer_sizes=(), activation="identity",
                           max_iter=1).fit(X, y)
    return X, y, add_loss_output(to_onnx(skl, X[:1]))


def test_ort_gradient_optimizer_on_a_loss_graph():
    X, y, training = _linear_loss_graph(100)
    assert [i.name for i in training.graph.input] == ["X", "label"]
    assert [o.name for o in training.graph.output] == ["loss", "variable"]
    est = OrtGradientOptimizer(
        training, learning_rate=LearningRateSGD(0.05, learning_rate="constant"),
        max_iter=40, random_state=0).fit(X, y)
    coefficient, intercept = est.get_state()
    assert_allclose(coefficient.ravel(), [1, 2, 3], atol=1e-4)
    assert_allclose(intercept.ravel(), [1], atol=1e-4)
    assert est.losses(X, y) < 1e-8 < est.train_losses_[0]
    with pytest.raises(ValueError, match="not an output"):
        OrtGradientOptimizer(training, loss_output_name="nope").fit(X, y)


def test_loss_output_estimator_scores_by_its_negated_loss():
    """score is -losses (greater is better), so GridSearchCV needs no
    scoring and picks the learning rate that reaches the lower loss."""
    X, y, training = _linear_loss_graph(60)
    est = OrtGradientOptimizer(training, max_iter=5, random_state=0).fit(X, y)
    assert est.score(X, y) == -est.losses(X, y) < 0
    rates = [LearningRateSGD(1e-5, learning_rate="constant"),
             LearningRateSGD(0.05, learning_rate="constant")]
    search = GridSearchCV(OrtGradientOptimizer(training, max_iter=5, random_state=0),
                          {"learning_rate": rates}, cv=2).fit(X, y)
    assert search.best_params_["learning_rate"] is rates[1]
    assert search.cv_results_["mean_test_score"][1] > search.cv_results_["mean_test_score"][0]


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


def _assert_left_unfitted(est, params, X):
    """A first fit that failed left nothing: the very parameter objects it
    had, no fitted attribute, predict raises NotFittedError, a clone gets
    the parameters given."""
    from sklearn.base import clone
    from sklearn.exceptions import NotFittedError
    assert set(vars(est)) == set(params)
    assert all(est.get_params(deep=False)[k] is v for k, v in params.items())
    with pytest.raises(NotFittedError):
        est.predict(X)
    given, copied = params["learning_loss"], clone(est).learning_loss
    assert (copied.get_params() == given.get_params() and type(copied) is
            type(given)) if hasattr(given, "get_params") else copied == given


def test_output_that_is_not_a_probability_is_an_error():
    """A regression graph (one column, any real value) or raw decision
    scores (SGDClassifier) were silently trained as probabilities; fit now
    says so before any step and leaves the estimator unfitted, its
    parameters untouched (it published the resolved objects: predict then
    returned the untrained graph's scores)."""
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
        params = est.get_params(deep=False)
        with pytest.raises(ValueError, match=match):
            est.fit(X, target)
        _assert_left_unfitted(est, params, X)
        assert est.get_params()["learning_loss"] == "cross_entropy"
        est = OrtGradientForwardBackwardClassifier(onx, max_iter=2)
        params = est.get_params(deep=False)
        with pytest.raises(ValueError, match="from_logits=True"):
            est.partial_fit(X, target, classes=np.unique(target))
        _assert_left_unfitted(est, params, X)


def test_failed_fit_leaves_a_fitted_estimator_as_it_was():
    """A refit refused before its first step (a loss reading scores as
    probabilities, an early-stopping split that cannot stratify) keeps the
    previous fit whole: attributes, weights, optimizer state, predictions;
    only the parameter set by the caller differs."""
    from onnxtrain.optim import LearningRateAdam
    X, y = _data(3)
    scores = _linear_graph(3, [helper.make_node("Identity", ["z"], ["scores"])])
    est = OrtGradientForwardBackwardClassifier(
        scores, learning_loss=CrossEntropyLearningLoss(from_logits=True),
        learning_rate=LearningRateAdam(0.01), max_iter=3, warm_start=True,
        random_state=0).fit(X, y)
    proba = est.predict_proba(X)
    optimizer_state = est._trainer.get_state()
    single = np.r_[np.flatnonzero(y != 2), np.flatnonzero(y == 2)[:1]]
    for params, data, match in [
            ({"learning_loss": "cross_entropy", "warm_start": True}, (X, y),
             "'scores' is not a probability"),
            ({"learning_loss": "cross_entropy", "warm_start": False}, (X, y),
             "'scores' is not a probability"),
            ({"early_stopping": True}, (X[single], y[single]),
             "least populated class")]:
        fitted = est.get_params(deep=False)
        before = dict(vars(est.set_params(**params)))
        with pytest.raises(ValueError, match=match):
            est.fit(*data)
        assert vars(est).keys() == before.keys()
        assert all(vars(est)[k] is v for k, v in before.items())
        assert_allclose(est.predict_proba(X), proba, rtol=0, atol=0)
        for a, b in zip(est._trainer.get_state(), optimizer_state):
            for u, v in zip(a, b):
                assert_allclose(u, v, rtol=0, atol=0)
        assert est.get_params(deep=False) == {**fitted, **params}
        est.set_params(**{k: fitted[k] for k in params})
    assert est.n_iter_ == 3 and len(est.train_losses_) == 3
    assert est.learning_loss_.from_logits


def test_rows_not_summing_to_one_are_an_error():
    """Three columns in [0, 1] not summing to 1 are not class probabilities,
    for the cross-entropy nor for the log loss of each column
    (predict_proba is the graph's output, which must then be
    probabilities): seen on the first batch without a final activation,
    from the graph with a final Sigmoid (it trained, and predict_proba
    returned rows summing to up to 3)."""
    X, y = _data(3)
    one = numpy_helper.from_array(np.array(1, np.float32), "one")
    scaled = _linear_graph(3, [helper.make_node("Constant", [], ["one"], value=one),
                               helper.make_node("Sigmoid", ["z"], ["s"]),
                               helper.make_node("Mul", ["s", "one"], ["p"])])
    for loss in ("cross_entropy", NegLogLearningLoss(probability_function=None)):
        est = OrtGradientForwardBackwardClassifier(scaled, learning_loss=loss,
                                                   max_iter=1, warm_start=True)
        params = est.get_params(deep=False)
        with pytest.raises(ValueError, match=r"rows sum to values in \[.*\], not to 1"):
            est.fit(X, y)
        _assert_left_unfitted(est, params, X)
    sigmoid = _linear_graph(3, [helper.make_node("Sigmoid", ["z"], ["p"])])
    for loss in ("cross_entropy", NegLogLearningLoss(probability_function=None),
                 "log"):
        est = OrtGradientForwardBackwardClassifier(sigmoid, learning_loss=loss,
                                                   max_iter=1, warm_start=True)
        params = est.get_params(deep=False)
        with pytest.raises(ValueError, match=(
                r"'p' comes from a Sigmoid over 3 columns and learning_loss=.*"
                r"3 sigmoids do not sum to 1.*End the graph with a Softmax"
                r".*learning_loss='cross_entropy'")):
            est.fit(X, y)
        _assert_left_unfitted(est, params, X)
    # several columns summing to 1: the log loss of each column trains, and
    # predict_proba is the graph's output, not divided again
    softmax3 = _linear_graph(3, [helper.make_node("Softmax", ["z"], ["p"], axis=1)])
    est = OrtGradientForwardBackwardClassifier(
        softmax3, learning_loss=NegLogLearningLoss(probability_function=None),
        learning_rate=0.05, max_iter=5, warm_start=True).fit(X, y)
    output = _graph_with_output(est.get_trained_onnx(), X)
    assert_allclose(est.predict_proba(X), output, rtol=0, atol=0)
    assert est.train_losses_[-1] < est.train_losses_[0]


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


def _softmax_graph(n_columns):
    return _linear_graph(n_columns, [helper.make_node("Softmax", ["z"], ["p"],
                                                      axis=1)])


ACTIVATION_AND_LOSS = [
    ("sigmoid-log", 2, _sigmoid_graph, "log"),
    ("sigmoid-from-logits", 2, _sigmoid_graph,
     CrossEntropyLearningLoss(from_logits=True)),
    ("softmax-from-logits", 3, lambda: _softmax_graph(3),
     CrossEntropyLearningLoss(from_logits=True))]


@pytest.mark.parametrize("path", ["split", "fused", "loop"])
@pytest.mark.parametrize("name,n_classes,graph,loss", ACTIVATION_AND_LOSS,
                         ids=[c[0] for c in ACTIVATION_AND_LOSS])
def test_final_activation_is_the_one_the_loss_applies(name, n_classes, graph,
                                                      loss, path):
    """A loss applying a sigmoid ('log') to a final Sigmoid, or a softmax
    (from_logits=True) to a final Softmax, reads the output as
    probabilities: it trains as the default loss does (through the logits
    on the fused paths) and predict_proba is the deployed graph's output.
    It applied the activation a second time: every row of the Sigmoid
    graph was predicted class 1."""
    X, y = _data(n_classes)
    rate = LearningRateSGD(0.1, learning_rate="constant")
    reference = OrtGradientForwardBackwardClassifier(
        graph(), learning_rate=rate, max_iter=15, warm_start=True,
        training_path=path).fit(X, y)
    est = OrtGradientForwardBackwardClassifier(
        graph(), learning_loss=loss, learning_rate=rate, max_iter=15,
        warm_start=True, training_path=path).fit(X, y)
    assert_allclose(est.train_losses_, reference.train_losses_, rtol=1e-6)
    assert type(est.learning_loss_) is type(reference.learning_loss_)
    assert getattr(est.learning_loss_, "probability_function", None) is None
    assert not getattr(est.learning_loss_, "from_logits", False)
    published = est.get_params()["learning_loss"]  # what was given, resolved
    assert type(published) is {"log": NegLogLearningLoss}.get(loss, type(loss))
    assert published.get_params() == (
        NegLogLearningLoss() if loss == "log" else loss).get_params()
    output = _graph_with_output(est.get_trained_onnx(), X)
    expected = np.c_[1 - output, output] if output.shape[1] == 1 else output
    assert_allclose(est.predict_proba(X), expected, rtol=1e-6, atol=1e-7)
    assert_allclose(est.predict_proba(X), reference.predict_proba(X), rtol=1e-5,
                    atol=1e-6)
    assert (est.predict(X) == expected.argmax(axis=1)).all()
    assert est.score(X, y) > 0.7


def _refuses_before_any_work(monkeypatch):
    """Building a StepRunner (sessions, gradient graphs) fails the test."""
    import onnxtrain.estimators._base as base

    def no_trainer(*args, **kwargs):
        raise AssertionError("a Trainer was built before the error")
    monkeypatch.setattr(base, "StepRunner", no_trainer)


DISAGREEING = [
    ("softmax-one-column", 2, lambda: _softmax_graph(1), "cross_entropy",
     r"'p' comes from a Softmax over 1 column and learning_loss='cross_entropy'"
     r": a Softmax over one column is 1 for every row: nothing would train\. "
     r"End the graph with a Sigmoid"),
    ("softmax-one-column-log", 2, lambda: _softmax_graph(1), "log",
     r"Softmax over 1 column and learning_loss='log': a Softmax over one column"),
    ("softmax-sigmoid-loss", 3, lambda: _softmax_graph(3), "log",
     r"Softmax over 3 columns and learning_loss='log': NegLogLearningLoss\("
     r"probability_function='sigmoid'\) would apply a sigmoid.*Pass "
     r"learning_loss='cross_entropy'"),
    ("sigmoid-softmax-loss", 3,
     lambda: _linear_graph(3, [helper.make_node("Sigmoid", ["z"], ["p"])]),
     CrossEntropyLearningLoss(from_logits=True),
     r"Sigmoid over 3 columns and learning_loss=CrossEntropyLearningLoss\("
     r"from_logits=True\): CrossEntropyLearningLoss\(from_logits=True\) would "
     r"apply a softmax.*End the graph with a Softmax.*'cross_entropy'")]


@pytest.mark.parametrize("name,n_classes,graph,loss,match", DISAGREEING,
                         ids=[c[0] for c in DISAGREEING])
def test_final_activation_and_loss_that_disagree_are_an_error(
        name, n_classes, graph, loss, match, monkeypatch):
    """A Softmax over one column (always 1: nothing trained), a sigmoid loss
    on a Softmax, a softmax loss on a Sigmoid: refused by fit and
    partial_fit before any graph is built, the estimator left unfitted."""
    X, y = _data(n_classes)
    _refuses_before_any_work(monkeypatch)
    for method in ("fit", "partial_fit"):
        est = OrtGradientForwardBackwardClassifier(graph(), learning_loss=loss,
                                                   max_iter=2, warm_start=True)
        params = est.get_params(deep=False)
        with pytest.raises(ValueError, match=match):
            getattr(est, method)(X, y)
        _assert_left_unfitted(est, params, X)


def test_published_loss_is_the_parameter_s_not_its_adaptation():
    """The binary log loss a one-column graph trains stays in
    learning_loss_: the parameter keeps the cross-entropy resolved from
    'cross_entropy', so a fit on a 3-column Softmax graph set afterwards
    trains the cross-entropy (it trained the one-column loss: losses 2.27,
    1.99 instead of 1.37, 1.23), a warm refit with nothing changed keeps its
    objects, and one with another loss resolves it."""
    from sklearn.base import clone
    X2, y2 = _data(2)
    X3, y3 = _data(3)
    est = OrtGradientForwardBackwardClassifier(_sigmoid_graph(), max_iter=2,
                                               warm_start=True).fit(X2, y2)
    published, trained = est.get_params()["learning_loss"], est.learning_loss_
    assert type(published) is CrossEntropyLearningLoss
    assert published.get_params() == CrossEntropyLearningLoss().get_params()
    assert type(trained) is NegLogLearningLoss
    assert trained.get_params() == {"eps": 1e-7, "probability_function": None}
    est.fit(X2, y2)  # nothing changed: the same objects, no new resolution
    assert est.learning_loss_ is trained
    assert est.get_params()["learning_loss"] is published
    twin = clone(est).fit(X2, y2)
    assert twin.learning_loss_.get_params() == trained.get_params()
    est.set_params(learning_loss="log").fit(X2, y2)  # resolved anew
    assert est.learning_loss_ is not trained
    assert est.learning_loss_.get_params() == {"eps": 1e-5,
                                               "probability_function": None}
    assert est.get_params()["learning_loss"].probability_function == "sigmoid"

    est.set_params(learning_loss="cross_entropy", model_onnx=_softmax_graph(3))
    est.fit(X3, y3)
    fresh = OrtGradientForwardBackwardClassifier(
        _softmax_graph(3), max_iter=2, warm_start=True).fit(X3, y3)
    assert type(est.learning_loss_) is CrossEntropyLearningLoss
    assert_allclose(est.train_losses_, fresh.train_losses_, rtol=1e-6)
    assert_allclose(est.predict_proba(X3), fresh.predict_proba(X3), rtol=1e-6)


def test_default_sample_weight_of_a_loss_graph_takes_its_float_type(monkeypatch):
    """A graph computing its own weighted loss, trained with int64 labels
    and no sample_weight: the ones fed to its weight input are built in the
    type it declares (float32), not the labels' int64, and train as
    explicit unit weights do."""
    from onnxtrain.runtime import OrtGradientForwardBackward
    rng = np.random.RandomState(3)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["X", "W", "B"], ["scores"], transB=1),
         helper.make_node("SoftmaxCrossEntropyLoss", ["scores", "label"],
                          ["per_row"], reduction="none"),
         helper.make_node("Mul", ["per_row", "weight"], ["weighted"]),
         helper.make_node("ReduceMean", ["weighted"], ["loss"], keepdims=0)],
        "ce", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4]),
               helper.make_tensor_value_info("label", TensorProto.INT64, ["N"]),
               helper.make_tensor_value_info("weight", TensorProto.FLOAT, ["N"])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        [numpy_helper.from_array(rng.randn(3, 4).astype(np.float32), "W"),
         numpy_helper.from_array(rng.randn(3).astype(np.float32), "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    X = rng.randn(8, 4).astype(np.float32)
    label = np.array([0, 2, 1, 1, 0, 2, 2, 1], dtype=np.int64)
    fed = []
    forward = OrtGradientForwardBackward.forward

    def recording(self, inputs, training=True):
        fed.append([np.asarray(v).dtype for v in inputs])
        return forward(self, inputs, training)
    monkeypatch.setattr(OrtGradientForwardBackward, "forward", recording)
    rate = LearningRateSGD(0.5, learning_rate="constant")
    est = OrtGradientOptimizer(model, max_iter=2, batch_size=4, warm_start=True,
                               learning_rate=rate).fit(X, label)
    assert len(fed) == 4
    assert fed[0] == [np.float32, np.int64, np.float32]
    assert all(dtypes == fed[0] for dtypes in fed)
    unit = OrtGradientOptimizer(model, max_iter=2, batch_size=4, warm_start=True,
                                learning_rate=rate).fit(X, label, np.ones(8))
    assert_allclose(est.train_losses_, unit.train_losses_, rtol=0, atol=0)
    for a, b in zip(est.get_state(), unit.get_state()):
        assert_allclose(a, b, rtol=0, atol=0)
