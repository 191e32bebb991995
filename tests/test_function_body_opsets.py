"""Ops differentiated through their standard function body, in models of a
newer opset than the body's (the body is converted) and with a dynamic
batch dimension (shapes known only symbolically)."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxtrain.autodiff import build_fused_model, build_gradient_models

from gradcheck import (check_model, fused_gradients, numeric_gradient,
                        relative_error, run, session, split_gradients)

TOL = 1e-6


def _check(model, wrt, feeds):
    """Split and fused gradients against central differences."""
    rng = np.random.default_rng(0)
    gm = build_gradient_models(model, wrt)
    check_model(gm.backward_model)
    fused, bg = build_fused_model(model, wrt)
    check_model(fused)
    inference = session(gm.inference_model)
    y = run(inference, feeds)
    grad_outputs = {o: rng.normal(size=y[o].shape) for o in gm.outputs}
    _, split = split_gradients(gm, feeds, grad_outputs)
    fused_grads = fused_gradients(fused, bg, feeds, grad_outputs)
    for w in wrt:
        num = numeric_gradient(inference, feeds, w, grad_outputs)
        assert relative_error(num, split[w]) < TOL, w
        assert relative_error(num, fused_grads[w]) < TOL, w


def _layer_norm_model(opset):
    rng = np.random.default_rng(1)
    graph = helper.make_graph(
        [helper.make_node("LayerNormalization", ["X", "scale", "bias"], ["Y"],
                          axis=-1)],
        "layer_norm",
        [helper.make_tensor_value_info("X", TensorProto.DOUBLE, ["N", 4])],
        [helper.make_tensor_value_info("Y", TensorProto.DOUBLE, ["N", 4])],
        [numpy_helper.from_array(rng.normal(size=4), "scale"),
         numpy_helper.from_array(rng.normal(size=4), "bias")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("opset", [17, 18, 19, 20, 21, 22, 23, 24])
def test_layer_normalization_at_every_opset(opset):
    # the body (opset 18) leaves out the Mean and InvStdDev nodes when the
    # node does not use them; converting it to a newer opset used to fail
    model = _layer_norm_model(opset)
    feeds = {"X": np.random.default_rng(2).normal(size=(3, 4)),
             **{i.name: numpy_helper.to_array(i) for i in model.graph.initializer}}
    _check(model, ["scale", "bias", "X"], feeds)


def _cross_entropy_model(opset, batch):
    """Gemm scores then SoftmaxCrossEntropyLoss (mean), as PyTorch exports
    ``cross_entropy``; ``batch``: a static size or a symbolic name."""
    rng = np.random.default_rng(3)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["X", "W", "B"], ["scores"], transB=1),
         helper.make_node("SoftmaxCrossEntropyLoss", ["scores", "label"],
                          ["loss"], reduction="mean")],
        "cross_entropy",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [batch, 4]),
         helper.make_tensor_value_info("label", TensorProto.INT64, [batch])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        [numpy_helper.from_array(rng.normal(size=(3, 4)).astype(np.float32), "W"),
         numpy_helper.from_array(rng.normal(size=3).astype(np.float32), "B")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _softmax_cross_entropy_gradients(model, X, label):
    """dloss/dW, dloss/dB in numpy: (softmax - one_hot) / n."""
    W, B = (numpy_helper.to_array(i).astype(np.float64) for i in model.graph.initializer)
    scores = X @ W.T + B
    p = np.exp(scores - scores.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    delta = (p - np.eye(3)[label]) / X.shape[0]
    return delta.T @ X, delta.sum(axis=0)


@pytest.mark.parametrize("batch", [5, "N"])
@pytest.mark.parametrize("opset", [13, 15, 18, 20, 24])
def test_softmax_cross_entropy_loss_with_a_dynamic_batch(opset, batch):
    # at opset 13 the body reshapes the log-probabilities to Shape(scores):
    # shape inference (Reshape-13 does not read propagated shape data) left
    # their rank unknown with a symbolic batch; from opset 15 the body is
    # converted from an older one
    model = _cross_entropy_model(opset, batch)
    rng = np.random.default_rng(4)
    X = rng.normal(size=(5, 4)).astype(np.float32)
    label = np.array([0, 2, 1, 1, 0], dtype=np.int64)
    gm = build_gradient_models(model, ["W", "B"])
    check_model(gm.backward_model)
    feeds = {"X": X, "label": label,
             **{i.name: numpy_helper.to_array(i) for i in model.graph.initializer}}
    _, split = split_gradients(gm, feeds, {"loss": np.array(1.0, dtype=np.float32)})
    dW, dB = _softmax_cross_entropy_gradients(model, X.astype(np.float64), label)
    np.testing.assert_allclose(split["W"], dW, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(split["B"], dB, rtol=1e-5, atol=1e-6)


def test_a_loss_graph_with_integer_labels_trains_with_float_updates():
    # the learning rate and the update's scalars used to take the labels'
    # dtype (int64): onnxruntime refused the update graph's inputs
    from onnxtrain import LearningRateSGD, OrtGradientOptimizer
    model = _cross_entropy_model(17, "N")
    rng = np.random.default_rng(5)
    X = rng.normal(size=(8, 4)).astype(np.float32)
    label = np.array([0, 2, 1, 1, 0, 2, 2, 1], dtype=np.int64)
    est = OrtGradientOptimizer(model, max_iter=1, batch_size=8, warm_start=True,
                               learning_rate=LearningRateSGD(0.5, learning_rate="constant"))
    est.fit(X, label)
    dW, dB = _softmax_cross_entropy_gradients(model, X.astype(np.float64), label)
    W0, B0 = (numpy_helper.to_array(i) for i in model.graph.initializer)
    W1, B1 = est.get_state()
    np.testing.assert_allclose(W1, W0 - 0.5 * dW, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(B1, B0 - 0.5 * dB, rtol=1e-5, atol=1e-6)
    # the model given is not modified
    assert onnx.numpy_helper.to_array(model.graph.initializer[0]).tolist() == W0.tolist()
