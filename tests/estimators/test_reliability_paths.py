"""Reliability: every training path computes the same steps (issue 32,
class 2). The fused and loop paths train a final Softmax or Sigmoid
through its input (the logits); the loss they use there must still be the
clipped loss of the probabilities that the split path differentiates, also
at learning rates where the probabilities saturate and the clipping zeroes
gradients."""
import warnings

import numpy as np
import pytest
from numpy.testing import assert_allclose
from onnx import helper, numpy_helper

from onnxtrain.estimators import OrtGradientForwardBackwardClassifier
from onnxtrain.losses.learning_losses import (CrossEntropyLearningLoss,
                                              NegLogLearningLoss,
                                              _CrossEntropyOfSoftmax,
                                              _LogLossOfSigmoid)
from onnxtrain.optim import LearningRateSGD

PATHS = ("split", "fused", "loop")


def _graph(n_features, n_out, activation, dtype=np.float32):
    rng = np.random.RandomState(3)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inits = [numpy_helper.from_array((0.5 * rng.randn(n_features, n_out)).astype(dtype), "W"),
             numpy_helper.from_array(np.zeros(n_out, dtype=dtype), "B")]
    attrs = {"axis": 1} if activation == "Softmax" else {}
    nodes = [helper.make_node("MatMul", ["X", "W"], ["XW"]),
             helper.make_node("Add", ["XW", "B"], ["Z"]),
             helper.make_node(activation, ["Z"], ["P"], **attrs)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("X", elem, [None, n_features])],
        [helper.make_tensor_value_info("P", elem, [None, n_out])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _data(n_classes):
    rng = np.random.RandomState(0)
    X = rng.randn(80, 4).astype(np.float32) * 3
    y = (X @ rng.randn(4, n_classes)).argmax(axis=1) if n_classes > 2 else \
        (X[:, 0] + 0.5 * X[:, 1] > 0).astype(np.int64)
    y[::7] = (y[::7] + 1) % n_classes  # label noise: some rows stay wrong, their p saturates
    return X, y


def _fits(model, X, y, rate, sample_weight=None):
    runs = {}
    for path in PATHS:
        est = OrtGradientForwardBackwardClassifier(
            model, max_iter=10, batch_size=16, training_path=path, random_state=0,
            learning_rate=LearningRateSGD(rate, learning_rate="constant"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est.fit(X, y, sample_weight=sample_weight)
        runs[path] = est
    return runs


# float32 sigmoids within a few ulps of 1 are rounding noise of the
# kernel (1 - p jumps between 0, 6e-8 and 1.2e-7 for scores in [16, 17]):
# there the clipping at 1 - eps (eps=1e-7) is decided by that noise, and
# the paths' weights, equal up to rounding, could meet it. The sigmoid rows
# run in float64, where the bounds are far above the rounding.
@pytest.mark.parametrize("activation,n_classes,rate,dtype", [
    ("Softmax", 3, 2.0, np.float32), ("Softmax", 3, 0.05, np.float32),
    ("Softmax", 3, 5.0, np.float64), ("Sigmoid", 2, 30.0, np.float64),
    ("Sigmoid", 2, 3.0, np.float64)])
@pytest.mark.parametrize("weighted", [False, True])
def test_paths_agree_where_clipping_is_active(activation, n_classes, rate, dtype, weighted):
    X, y = _data(n_classes)
    X = X.astype(dtype)
    model = _graph(4, n_classes if activation == "Softmax" else 1, activation, dtype)
    weight = np.linspace(0.5, 2.0, len(y)).astype(dtype) if weighted else None
    runs = _fits(model, X, y, rate, weight)
    split = runs["split"]
    for path in ("fused", "loop"):
        assert_allclose(runs[path].train_losses_, split.train_losses_, rtol=2e-4,
                        err_msg=path)
        for a, b in zip(runs[path].get_state(), split.get_state()):
            assert_allclose(a, b, rtol=2e-4, atol=2e-4 * np.abs(b).max(), err_msg=path)


@pytest.mark.parametrize("activation,n_classes,rate,dtype", [
    ("Softmax", 3, 2.0, np.float32), ("Sigmoid", 2, 30.0, np.float64)])
def test_clipping_is_active_in_the_agreement_test(activation, n_classes, rate, dtype):
    # the high-rate rows above test something only if probabilities do
    # reach the bounds: the loss on unclipped logits then trains otherwise
    X, y = _data(n_classes)
    model = _graph(4, n_classes if activation == "Softmax" else 1, activation, dtype)
    est = _fits(model, X.astype(dtype), y, rate)["split"]
    p = est.predict_proba(X.astype(dtype))
    eps = CrossEntropyLearningLoss().eps
    assert ((p < eps) | (p > 1 - eps)).any()


@pytest.mark.parametrize("loss,logits_loss,activation", [
    (CrossEntropyLearningLoss(eps=1e-3), _CrossEntropyOfSoftmax(eps=1e-3), "softmax"),
    (NegLogLearningLoss(eps=1e-3, probability_function=None),
     _LogLossOfSigmoid(eps=1e-3, probability_function=None), "sigmoid")])
def test_logits_loss_is_the_clipped_loss_of_the_probabilities(loss, logits_loss, activation):
    # value and gradient against finite differences of the clipped loss of
    # the probabilities, with rows inside and outside the bounds
    z = np.array([[9.0, -3.0, 0.5], [0.2, 0.1, -0.3], [-8.0, 8.5, 0.0]])
    y = np.eye(3)[[1, 0, 1]]
    if activation == "sigmoid":
        z, y = z[:, :1].copy(), np.array([[0.0], [1.0], [1.0]])

    def prob(v):
        if activation == "sigmoid":
            return 1 / (1 + np.exp(-v))
        e = np.exp(v - v.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    def value(v):
        return loss.loss_per_row(y, prob(v)).mean()

    graph = logits_loss.build_onnx(elem_type=11, opset=17)
    import onnxruntime
    sess = onnxruntime.InferenceSession(graph.SerializeToString(),
                                        providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    got, grad = sess.run(None, {names[0]: y, names[1]: z})
    assert_allclose(got, value(z), rtol=1e-10)
    assert_allclose(logits_loss.loss_per_row(y, z).mean(), value(z), rtol=1e-10)
    numeric = np.zeros_like(z)
    for idx in np.ndindex(*z.shape):
        step = np.zeros_like(z)
        step[idx] = 1e-6
        numeric[idx] = (value(z + step) - value(z - step)) / 2e-6
    assert_allclose(grad, numeric, atol=1e-6)
