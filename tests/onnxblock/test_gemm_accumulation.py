"""Weight gradients written by a Gemm accumulate in that Gemm: its C is
``Where(lazy_reset_grad, 0, buffer)``; vectors accumulate together,
concatenated (onnxblock/_training.py); the api's plain model drops both
(api/_plain_step.py)."""
import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

import onnxtrain.onnxblock as onnxblock
from onnxtrain import artifacts
from onnxtrain.api import CheckpointState, Module
from onnxtrain.api._plain_step import without_accumulation
from onnxtrain.api.module import read_layout
from onnxtrain.onnxblock._training import TRAINING_METADATA

from gradcheck import run, session

RNG = np.random.default_rng(7)
INITS = {"W1": RNG.standard_normal((4, 3)), "b1": RNG.standard_normal(4),
         "W2": RNG.standard_normal((2, 4)), "b2": RNG.standard_normal(2)}


def _model():
    # two Linear layers as exporters write them: Gemm(X, W, b, transB=1)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["X", "W1", "b1"], ["h"], transB=1),
         helper.make_node("Tanh", ["h"], ["a"]),
         helper.make_node("Gemm", ["a", "W2", "b2"], ["Y"], transB=1)], "g",
        [helper.make_tensor_value_info("X", TensorProto.DOUBLE, ["N", 3])],
        [helper.make_tensor_value_info("Y", TensorProto.DOUBLE, ["N", 2])],
        [numpy_helper.from_array(v, k) for k, v in INITS.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _artifacts(tmp_path):
    artifacts.generate_artifacts(
        _model(), requires_grad=list(INITS), loss=onnxblock.loss.MSELoss(),
        optimizer=artifacts.OptimType.SGD, artifact_directory=tmp_path)
    training = onnx.load(str(tmp_path / "training_model.onnx"))
    return training, read_layout(training, TRAINING_METADATA, "training model")


def _torch_grads(x, t):
    params = {k: torch.tensor(v, requires_grad=True) for k, v in INITS.items()}
    h = torch.tanh(torch.tensor(x) @ params["W1"].T + params["b1"])
    y = h @ params["W2"].T + params["b2"]
    torch.mean((y - torch.tensor(t)) ** 2).backward()
    return {k: p.grad.numpy() for k, p in params.items()}


def test_weight_gradients_accumulate_in_their_gemm(tmp_path):
    training, layout = _artifacts(tmp_path)
    graph = training.graph
    lazy = layout["lazy_reset_grad"]
    grads = dict(zip(layout["trainable"], layout["gradients"]))
    buffers = dict(zip(layout["trainable"], layout["buffers"]))
    producers = {o: n for n in graph.node for o in n.output}
    for name in ["W1", "W2"]:
        gemm = producers[grads[name]]
        assert gemm.op_type == "Gemm" and len(gemm.input) == 3
        mask = producers[gemm.input[2]]
        assert mask.op_type == "Where" and mask.input[0] == lazy
        assert mask.input[2] == buffers[name]
    # the biases accumulate together: Split(Where(lazy, G, B + G))
    split = producers[grads["b1"]]
    assert split.op_type == "Split" and producers[grads["b2"]] is split
    assert producers[split.input[0]].op_type == "Where"
    x, t = RNG.standard_normal((5, 3)), RNG.standard_normal((5, 2))
    expected = _torch_grads(x, t)
    feeds = dict(INITS, X=x, **{layout["user_inputs"][1]: t})
    for name in INITS:
        feeds[buffers[name]] = RNG.standard_normal(INITS[name].shape)
    feeds[buffers["W1"]][0, 0] = np.nan  # never read when overwriting
    feeds[buffers["b2"]][1] = np.nan
    feeds[lazy] = np.array(True)
    overwritten = run(session(training), feeds)
    for name in INITS:
        np.testing.assert_allclose(overwritten[grads[name]], expected[name],
                                   rtol=1e-12, atol=1e-14)
    feeds[buffers["W1"]][0, 0] = 0.5
    feeds[buffers["b2"]][1] = -0.25
    feeds[lazy] = np.array(False)
    added = run(session(training), feeds)
    for name in INITS:
        np.testing.assert_allclose(added[grads[name]],
                                   feeds[buffers[name]] + expected[name],
                                   rtol=1e-12, atol=1e-14)
    # the plain model drops the masks and the Gemms' C, same gradients
    plain = without_accumulation(training, layout)
    onnx.checker.check_model(plain)
    assert not any(n.op_type in ("Where", "Split", "Concat") for n in plain.graph.node)
    assert all(len(n.input) == 2 for n in plain.graph.node if n.op_type == "Gemm"
               and n.output[0] in grads.values())
    light = run(session(plain), feeds)
    for name in INITS:
        np.testing.assert_array_equal(light[grads[name]], overwritten[grads[name]])


def test_module_accumulates_and_resets_gemm_gradients(tmp_path):
    training, layout = _artifacts(tmp_path)
    state = CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    module = Module(str(tmp_path / "training_model.onnx"), state,
                    str(tmp_path / "eval_model.onnx"))
    module.train()
    x1, t1 = RNG.standard_normal((5, 3)), RNG.standard_normal((5, 2))
    x2, t2 = RNG.standard_normal((4, 3)), RNG.standard_normal((4, 2))
    g1, g2 = _torch_grads(x1, t1), _torch_grads(x2, t2)
    module(x1, t1)
    first = {name: state.parameters[name]._grad for name in INITS}
    module(x2, t2)  # accumulates: the training model with its Gemms' C
    for name in INITS:  # written over its buffer
        assert state.parameters[name]._grad is first[name]
    for name in INITS:
        np.testing.assert_allclose(state.parameters[name].grad, g1[name] + g2[name],
                                   rtol=1e-12, atol=1e-14)
    module.lazy_reset_grad()
    module(x2, t2)  # overwrites: the plain model
    for name in INITS:
        np.testing.assert_allclose(state.parameters[name].grad, g2[name],
                                   rtol=1e-12, atol=1e-14)
