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
