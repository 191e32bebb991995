"""The training model without gradient accumulation (api/_plain_step.py),
run by Module for the calls that overwrite the gradients."""
import numpy as np
import onnx
import onnxruntime as ort

import onnxtrain.onnxblock as onnxblock
from onnxtrain import artifacts
from onnxtrain.api._plain_step import without_accumulation
from onnxtrain.api.module import read_layout
from onnxtrain.onnxblock._training import TRAINING_METADATA
from test_artifacts_models import batch, two_head_model

TRAINABLE = ["weight1", "bias1", "weight2", "bias2"]


def _training_model(tmp_path):
    paths = artifacts.generate_artifacts(
        two_head_model(np.float64), requires_grad=TRAINABLE,
        frozen_params=["weight3", "bias3"], loss=onnxblock.loss.MSELoss(),
        loss_input_names=["output1"], artifact_directory=tmp_path)
    model = onnx.load(paths["training_model"])
    return model, read_layout(model, TRAINING_METADATA, "training model")


def _run(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    inputs = {i.name for i in sess.get_inputs()}
    return dict(zip(names, sess.run(None, {k: v for k, v in feeds.items()
                                           if k in inputs})))


def test_plain_model_equals_the_training_model_when_it_overwrites(tmp_path):
    model, layout = _training_model(tmp_path)
    plain = without_accumulation(model, layout)
    onnx.checker.check_model(plain)
    assert not any(n.op_type == "Where" for n in plain.graph.node)
    names = {i.name for i in plain.graph.input}
    assert layout["lazy_reset_grad"] not in names
    assert not names & set(layout["buffers"])
    x, t1, _ = batch(dtype=np.float64)
    inits = {i.name: onnx.numpy_helper.to_array(i)
             for i in two_head_model(np.float64).graph.initializer}
    rng = np.random.default_rng(3)
    feeds = dict(inits, input=x, **{layout["user_inputs"][1]: t1},
                 lazy_reset_grad=np.array(True))
    for buffer, name in zip(layout["buffers"], layout["trainable"]):
        # a non-zero buffer: ignored when lazy_reset_grad is True
        feeds[buffer] = rng.standard_normal(inits[name].shape)
    full, light = _run(model, feeds), _run(plain, feeds)
    assert set(full) == set(light)
    for name in layout["gradients"]:
        np.testing.assert_array_equal(light[name], full[name])
    # and the full model does add the buffer when asked
    feeds["lazy_reset_grad"] = np.array(False)
    added = _run(model, feeds)
    for buffer, name in zip(layout["buffers"], layout["gradients"]):
        np.testing.assert_allclose(added[name], full[name] + feeds[buffer])


def test_a_model_not_laid_out_for_it_is_run_as_it_is(tmp_path):
    model, layout = _training_model(tmp_path)
    # an accumulation node that is not Where(lazy, grad, buffer + grad)
    for node in model.graph.node:
        if node.op_type == "Where" and node.input[0] == layout["lazy_reset_grad"]:
            node.input[0] = node.input[0] + "_other"
            break
    assert without_accumulation(model, layout) is None


def test_two_parameters_sharing_one_gradient(tmp_path):
    # Y = X W + b1 + b2: both biases get ReduceSum(dY), one node after CSE;
    # the plain model names it after one output and copies it to the other
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    inits = {"W": rng.standard_normal((3, 2)), "b1": rng.standard_normal(2),
             "b2": rng.standard_normal(2)}
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["xw"]),
         helper.make_node("Add", ["xw", "b1"], ["h"]),
         helper.make_node("Add", ["h", "b2"], ["Y"])], "g",
        [helper.make_tensor_value_info("X", TensorProto.DOUBLE, ["N", 3])],
        [helper.make_tensor_value_info("Y", TensorProto.DOUBLE, ["N", 2])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    paths = artifacts.generate_artifacts(
        model, requires_grad=["W", "b1", "b2"], loss=onnxblock.loss.MSELoss(),
        artifact_directory=tmp_path)
    training = onnx.load(paths["training_model"])
    layout = read_layout(training, TRAINING_METADATA, "training model")
    plain = without_accumulation(training, layout)
    onnx.checker.check_model(plain)
    x, t = rng.standard_normal((5, 3)), rng.standard_normal((5, 2))
    feeds = dict(inits, X=x, **{layout["user_inputs"][1]: t},
                 lazy_reset_grad=np.array(True))
    for buffer, name in zip(layout["buffers"], layout["trainable"]):
        feeds[buffer] = np.zeros_like(inits[name])
    light = _run(plain, feeds)
    # MSE: mean over elements of (Y - t)^2, dY = 2 (Y - t) / Y.size
    dy = 2 * (x @ inits["W"] + inits["b1"] + inits["b2"] - t) / t.size
    grads = dict(zip(layout["trainable"], layout["gradients"]))
    np.testing.assert_allclose(light[grads["b1"]], dy.sum(axis=0), rtol=1e-12)
    np.testing.assert_allclose(light[grads["b2"]], dy.sum(axis=0), rtol=1e-12)
    np.testing.assert_allclose(light[grads["W"]], x.T @ dy, rtol=1e-12)


def test_plain_model_of_a_graph_with_padded_scalars(tmp_path):
    # feature maps of 1x1 (N, 1024, 1, 1) and weights (1, 1024, 1, 1): the
    # artifacts' graph gets scalar operands padded (graph/broadcasts.py),
    # the accumulation's Where still reads lazy_reset_grad itself, so the
    # plain model exists
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    c = 1024
    inits = {"W": rng.standard_normal((1, c, 1, 1)), "B": rng.standard_normal((1, c, 1, 1))}
    graph = helper.make_graph(
        [helper.make_node("Mul", ["X", "W"], ["xw"]),
         helper.make_node("Add", ["xw", "B"], ["h"]),
         helper.make_node("Relu", ["h"], ["Y"])], "g",
        [helper.make_tensor_value_info("X", TensorProto.DOUBLE, ["N", c, 1, 1])],
        [helper.make_tensor_value_info("Y", TensorProto.DOUBLE, ["N", c, 1, 1])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    paths = artifacts.generate_artifacts(
        model, requires_grad=["W", "B"], loss=onnxblock.loss.MSELoss(),
        artifact_directory=tmp_path)
    training = onnx.load(paths["training_model"])
    padded = {o for n in training.graph.node for o in n.input if "__padded" in o}
    assert padded  # some scalar met (N, c, 1, 1)
    layout = read_layout(training, TRAINING_METADATA, "training model")
    plain = without_accumulation(training, layout)
    assert plain is not None
    x, t = rng.standard_normal((5, c, 1, 1)), rng.standard_normal((5, c, 1, 1))
    feeds = dict(inits, X=x, **{layout["user_inputs"][1]: t},
                 lazy_reset_grad=np.array(True))
    light = _run(plain, feeds)
    h = x * inits["W"] + inits["B"]
    dh = 2 * (np.maximum(h, 0) - t) / t.size * (h > 0)
    grads = dict(zip(layout["trainable"], layout["gradients"]))
    np.testing.assert_allclose(light[grads["B"]], dh.sum(axis=0, keepdims=True),
                               rtol=1e-12)
    np.testing.assert_allclose(light[grads["W"]], (dh * x).sum(axis=0, keepdims=True),
                               rtol=1e-12)
