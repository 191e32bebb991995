"""The training model without gradient accumulation (api/_plain_step.py),
run by Module for the calls that overwrite the gradients."""
import numpy as np
import onnx

import onnxtrain.onnxblock as onnxblock
from onnxtrain import artifacts
from onnxtrain.api._plain_step import unreshaped_outputs, without_accumulation
from onnxtrain.api.module import read_layout
from onnxtrain.onnxblock._training import TRAINING_METADATA
from test_artifacts_models import batch, two_head_model
from gradcheck import run, session

TRAINABLE = ["weight1", "bias1", "weight2", "bias2"]


def _training_model(tmp_path):
    paths = artifacts.generate_artifacts(
        two_head_model(np.float64), requires_grad=TRAINABLE,
        frozen_params=["weight3", "bias3"], loss=onnxblock.loss.MSELoss(),
        loss_input_names=["output1"], artifact_directory=tmp_path)
    model = onnx.load(paths["training_model"])
    return model, read_layout(model, TRAINING_METADATA, "training model")


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
    full, light = run(session(model), feeds), run(session(plain), feeds)
    assert set(full) == set(light)
    for name in layout["gradients"]:
        np.testing.assert_array_equal(light[name], full[name])
    # and the full model does add the buffer when asked
    feeds["lazy_reset_grad"] = np.array(False)
    added = run(session(model), feeds)
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
    light = run(session(plain), feeds)
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
    light = run(session(plain), feeds)
    h = x * inits["W"] + inits["B"]
    dh = 2 * (np.maximum(h, 0) - t) / t.size * (h > 0)
    grads = dict(zip(layout["trainable"], layout["gradients"]))
    np.testing.assert_allclose(light[grads["B"]], dh.sum(axis=0, keepdims=True),
                               rtol=1e-12)
    np.testing.assert_allclose(light[grads["W"]], (dh * x).sum(axis=0, keepdims=True),
                               rtol=1e-12)


def _conv_model(rng):
    """Conv (weight "w") -> Flatten -> MatMul ("fc"), float32 (onnxruntime
    has no float64 Conv)."""
    from onnx import TensorProto, helper, numpy_helper
    inits = {"w": rng.standard_normal((8, 3, 3, 3)).astype(np.float32),
             "fc": rng.standard_normal((288, 2)).astype(np.float32)}
    graph = helper.make_graph(
        [helper.make_node("Conv", ["X", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Flatten", ["c"], ["f"]),
         helper.make_node("MatMul", ["f", "fc"], ["Y"])], "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4, 3, 6, 6])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4, 2])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, inits


def _batch(rng):
    return (rng.standard_normal((4, 3, 6, 6)).astype(np.float32),
            rng.standard_normal((4, 2)).astype(np.float32))


def _torch_conv_grads(inits, x, t):
    """Gradients of MSE(Flatten(Conv(x, w)) @ fc, t) by torch, in float64."""
    import torch
    w, fc = (torch.tensor(inits[k], dtype=torch.float64, requires_grad=True)
             for k in ("w", "fc"))
    y = torch.nn.functional.conv2d(torch.tensor(x, dtype=torch.float64), w,
                                   padding=1).flatten(1) @ fc
    torch.nn.functional.mse_loss(y, torch.tensor(t, dtype=torch.float64)).backward()
    return {"w": w.grad.numpy(), "fc": fc.grad.numpy()}


def _close(actual, expected):
    """float32 sums against float64 ones: the tolerance scaled to the values."""
    np.testing.assert_allclose(actual, expected, rtol=1e-4,
                               atol=1e-5 * np.abs(expected).max())


def test_conv_weight_gradient_output_as_its_product(tmp_path):
    # the weight gradient's final Reshape is dropped: the output is the
    # GEMM's result, of the weight's size, with the same values
    rng = np.random.default_rng(0)
    model, inits = _conv_model(rng)
    paths = artifacts.generate_artifacts(
        model, requires_grad=["w", "fc"], loss=onnxblock.loss.MSELoss(),
        artifact_directory=tmp_path)
    training = onnx.load(paths["training_model"])
    layout = read_layout(training, TRAINING_METADATA, "training model")
    plain = without_accumulation(training, layout, unreshape=True)
    onnx.checker.check_model(plain)
    grads = dict(zip(layout["trainable"], layout["gradients"]))
    shapes = unreshaped_outputs(plain, {grads[k]: v.shape for k, v in inits.items()})
    assert set(shapes) == {grads["w"]} and shapes[grads["w"]] != [8, 3, 3, 3]
    assert int(np.prod(shapes[grads["w"]])) == 8 * 3 * 3 * 3
    x, t = _batch(rng)
    feeds = dict(inits, X=x, **{layout["user_inputs"][1]: t},
                 lazy_reset_grad=np.array(True))
    for buffer, name in zip(layout["buffers"], layout["trainable"]):
        feeds[buffer] = np.zeros_like(inits[name])
    full = run(session(training), feeds)
    light = run(session(without_accumulation(training, layout)), feeds)
    unreshaped = run(session(plain), feeds)
    assert list(unreshaped[grads["w"]].shape) == shapes[grads["w"]]
    for name in layout["gradients"]:
        got = unreshaped[name].reshape(full[name].shape)
        np.testing.assert_array_equal(got, light[name])
        np.testing.assert_array_equal(got, full[name])
    expected = _torch_conv_grads(inits, x, t)
    for key, name in grads.items():
        _close(full[name], expected[key])


def test_module_writes_unreshaped_gradients_into_the_parameters_buffers(tmp_path):
    # Module binds views of the gradient buffers of the product's shape: the
    # parameters' gradients keep their shapes, hold torch's values over
    # several calls, and the Optimizer's steps follow plain SGD
    from onnxtrain import api
    rng = np.random.default_rng(1)
    model, inits = _conv_model(rng)
    paths = artifacts.generate_artifacts(
        model, requires_grad=["w", "fc"], loss=onnxblock.loss.MSELoss(),
        optimizer=artifacts.OptimType.SGD, artifact_directory=tmp_path)
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    module = api.Module(paths["training_model"], state)
    optimizer = api.Optimizer(paths["optimizer_model"], module)
    optimizer.set_learning_rate(0.05)
    params = {k: v.copy() for k, v in inits.items()}
    for step in range(3):
        x, t = _batch(rng)
        module.lazy_reset_grad()
        module(x, t)
        expected = _torch_conv_grads(params, x, t)
        for name, grad in expected.items():
            got = state.parameters[name].grad
            assert got.shape == grad.shape
            _close(got, grad)
        optimizer.step()
        params = {k: (params[k] - 0.05 * expected[k]).astype(np.float32)
                  for k in params}
        for name, value in params.items():
            _close(state.parameters[name].data, value)
    assert module._unreshaped["train_plain"]  # the views were used


def test_string_inputs_keep_the_gradients_shapes(tmp_path):
    # a model with a string input runs without IOBinding (no buffer to
    # view): its plain model keeps the Reshape, the gradients their shapes
    from onnx import TensorProto, helper
    from onnxtrain import api
    rng = np.random.default_rng(2)
    model, inits = _conv_model(rng)
    graph = model.graph
    graph.input.append(helper.make_tensor_value_info("tag", TensorProto.STRING, [4]))
    graph.node[-1].output[0] = "y0"
    graph.node.extend([
        helper.make_node("LabelEncoder", ["tag"], ["code"], domain="ai.onnx.ml",
                         keys_strings=["a", "b"], values_floats=[0.5, -1.0]),
        helper.make_node("Unsqueeze", ["code", "one"], ["code2"]),
        helper.make_node("Add", ["y0", "code2"], ["Y"])])
    graph.initializer.append(onnx.numpy_helper.from_array(np.array([1], np.int64), "one"))
    model.opset_import.append(helper.make_opsetid("ai.onnx.ml", 2))
    paths = artifacts.generate_artifacts(
        model, requires_grad=["w", "fc"], loss=onnxblock.loss.MSELoss(),
        artifact_directory=tmp_path)
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    module = api.Module(paths["training_model"], state)
    x, t = _batch(rng)
    tags = np.array(["a", "b", "a", "a"], dtype=object)
    # the target moved by the codes: the loss and gradients of the Conv model
    module(x, tags, t + np.array([[0.5], [-1.0], [0.5], [0.5]], np.float32))
    assert not module._unreshaped["train_plain"]
    expected = _torch_conv_grads(inits, x, t)
    for name, grad in expected.items():
        _close(state.parameters[name].grad, grad)


def test_module_without_optimizer_allocates_the_viewed_buffers(tmp_path):
    # no Optimizer, hence no flat gradient buffer: the first call allocates
    # one per parameter, the next calls write into it
    from onnxtrain import api
    rng = np.random.default_rng(3)
    model, inits = _conv_model(rng)
    paths = artifacts.generate_artifacts(
        model, requires_grad=["w", "fc"], loss=onnxblock.loss.MSELoss(),
        artifact_directory=tmp_path)
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    module = api.Module(paths["training_model"], state)
    buffers = []
    for _ in range(2):
        x, t = _batch(rng)
        module.lazy_reset_grad()
        module(x, t)
        expected = _torch_conv_grads(inits, x, t)
        for name, grad in expected.items():
            _close(state.parameters[name].grad, grad)
        buffers.append(state.parameters.raw("w")._grad)
    assert module._unreshaped["train_plain"]
    assert buffers[0] is buffers[1]  # written over, not reallocated
