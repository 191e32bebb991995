"""Dropouts that copy their input leave the training graph
(graph/identities.py), and a Dropout of constant ratio and training mode
has a two-node VJP (autodiff/rules/nn.py); values against numpy."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from gradcheck import check_gradients, run, session
from onnxtrain import artifacts
from onnxtrain.autodiff import build_fused_model
from onnxtrain.graph.identities import remove_identity_dropouts


W = np.linspace(-1, 1, 4).reshape(1, 4)


def _model(ratio, training, mask_output=False, opset=17):
    """Y = Dropout(X * W, ratio, training) (+ the mask as an output)."""
    inits = [numpy_helper.from_array(W, "W"),
             numpy_helper.from_array(np.array(ratio, dtype=np.float64), "ratio"),
             numpy_helper.from_array(np.array(training), "training")]
    outputs = ["d", "mask"] if mask_output else ["d"]
    nodes = [helper.make_node("Mul", ["X", "W"], ["h"]),
             helper.make_node("Dropout", ["h", "ratio", "training"], outputs),
             helper.make_node("Relu", ["d"], ["Y"])]
    values = [helper.make_tensor_value_info("Y", TensorProto.DOUBLE, ["N", 4])]
    if mask_output:
        values.append(helper.make_tensor_value_info("mask", TensorProto.BOOL, ["N", 4]))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("X", TensorProto.DOUBLE, ["N", 4])],
        values, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("ratio, training", [(0.0, True), (0.4, False)])
def test_dropouts_that_copy_their_input_are_removed(ratio, training):
    model = _model(ratio, training)
    out = remove_identity_dropouts(model, 17)
    assert [n.op_type for n in out.graph.node] == ["Mul", "Relu"]
    assert list(out.graph.node[1].input) == ["h"]
    assert [n.op_type for n in model.graph.node] == ["Mul", "Dropout", "Relu"]
    x = np.random.default_rng(0).normal(size=(3, 4))
    np.testing.assert_array_equal(run(session(out), {"X": x})["Y"],
                                  np.maximum(x * W, 0))


def test_dropout_ratio_from_a_value_float_constant_is_removed():
    # a Constant node written with value_float (not a tensor value)
    model = _model(0.4, True)
    ratio = helper.make_node("Constant", [], ["ratio_c"], value_float=0.0)
    model.graph.node.insert(0, ratio)
    model.graph.node[2].input[1] = "ratio_c"
    out = remove_identity_dropouts(model, 17)
    assert "Dropout" not in [n.op_type for n in out.graph.node]


def test_dropouts_that_drop_or_whose_mask_is_read_stay():
    for model in (_model(0.4, True), _model(0.0, True, mask_output=True),
                  _model(0.0, True, opset=11)):
        opset = model.opset_import[0].version
        assert remove_identity_dropouts(model, opset) is model


def test_constant_ratio_vjp_is_where_of_the_scaled_gradient():
    model = _model(0.4, True, mask_output=True)
    fused, bg = build_fused_model(model, ["W"], outputs=["Y"])
    ops = [n.op_type for n in bg.builder.nodes]
    assert "Div" not in ops and "Sub" not in ops  # Relu's VJP has a Cast
    x = np.random.default_rng(1).normal(size=(50, 4))
    gy = np.random.default_rng(2).normal(size=(50, 4))
    outs = run(session(fused), {"X": x, "W": W, bg.grad_output_names[0]: gy})
    mask = outs["mask"]
    assert 0 < mask.mean() < 1  # some dropped, some kept
    h = x * W
    # onnxruntime divides by 1 - ratio rounded to float32
    scale = 1 / np.float64(np.float32(1) - np.float32(0.4))
    d = h * mask * scale
    np.testing.assert_allclose(outs["Y"], np.maximum(d, 0), rtol=1e-12)
    expected = (gy * (d > 0) * mask * scale * x).sum(0, keepdims=True)
    # the gradient of the same run (another run draws another mask)
    np.testing.assert_allclose(outs[bg.grad_names[0]], expected, rtol=1e-12)


def test_zero_ratio_vjp_passes_the_gradient_and_matches_differences():
    model = _model(0.0, True)
    fused, bg = build_fused_model(model, ["W"])
    assert not {"Where", "Div", "Sub"} & {n.op_type for n in bg.builder.nodes}
    x = np.random.default_rng(3).normal(size=(5, 4))
    check_gradients(model, ["W"], {"X": x, "W": W})


def test_training_graph_has_no_identity_dropout(tmp_path):
    model = _model(0.0, True)
    artifacts.generate_artifacts(
        model, requires_grad=["W"], loss=artifacts.LossType.MSELoss,
        optimizer=artifacts.OptimType.SGD, artifact_directory=tmp_path)
    training = onnx.load(tmp_path / "training_model.onnx")
    assert "Dropout" not in {n.op_type for n in training.graph.node}
    evaluation = onnx.load(tmp_path / "eval_model.onnx")
    assert "Dropout" in {n.op_type for n in evaluation.graph.node}


def test_artifacts_name_the_mask_a_dropout_leaves_out(tmp_path):
    """A Dropout without its mask output (the VJP reads the mask: the
    training graph must name it). With one weight w, Y = X w mask / (1 - r)
    and the mean squared error L = mean(Y^2) against zeros, dL/dw = 2 L / w
    whatever mask was drawn."""
    from onnxtrain import api
    w = np.array([[0.7]], dtype=np.float32)
    inits = [numpy_helper.from_array(w, "W"),
             numpy_helper.from_array(np.array(0.5, np.float32), "ratio"),
             numpy_helper.from_array(np.array(True), "training")]
    nodes = [helper.make_node("Mul", ["X", "W"], ["h"]),
             helper.make_node("Dropout", ["h", "ratio", "training"], ["Y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 1])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 1])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    paths = artifacts.generate_artifacts(
        model, requires_grad=["W"], loss=artifacts.LossType.MSELoss,
        optimizer=artifacts.OptimType.SGD, artifact_directory=tmp_path)
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    module = api.Module(paths["training_model"], state)
    x = np.random.default_rng(0).normal(size=(64, 1)).astype(np.float32)
    loss = float(module(x, np.zeros((64, 1), np.float32)))
    assert 0 < loss
    np.testing.assert_allclose(state.parameters["W"].grad.reshape(-1),
                               [2 * loss / 0.7], rtol=1e-5)


def test_in_place_removal_edits_the_model_given():
    model = _model(0.0, True)
    out = remove_identity_dropouts(model, 17, in_place=True)
    assert out is model
    assert [n.op_type for n in model.graph.node] == ["Mul", "Relu"]
    assert list(model.graph.node[1].input) == ["h"]


def test_estimator_trains_without_identity_dropouts():
    # the estimators' trained graph leaves them out too; the caller's model
    # keeps them, and the training equals that of the model without them
    from onnxtrain import OrtGradientForwardBackwardOptimizer
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 4))
    y = np.maximum(X * W, 0) @ np.ones(4) / 4
    with_dropout = _model(0.0, True)
    plain = remove_identity_dropouts(_model(0.0, True), 17)
    # one output per row, as the estimator expects: Y's row means
    fits = []
    for model in (with_dropout, plain):
        mean_node = helper.make_node("ReduceMean", ["Y"], ["out"], axes=[1], keepdims=0)
        m = onnx.ModelProto()
        m.CopyFrom(model)
        m.graph.node.append(mean_node)
        del m.graph.output[:]
        m.graph.output.append(helper.make_tensor_value_info("out", TensorProto.DOUBLE, ["N"]))
        est = OrtGradientForwardBackwardOptimizer(m, ["W"], max_iter=3, batch_size=10,
                                                  learning_rate=0.05, random_state=0)
        fits.append(est.fit(X, y))
        assert "Dropout" not in {n.op_type for n in est._training_model().graph.node}
        assert ("Dropout" in {n.op_type for n in m.graph.node}) == (model is with_dropout)
    np.testing.assert_allclose(fits[0].train_losses_, fits[1].train_losses_, rtol=1e-12)
    np.testing.assert_allclose(fits[0].get_state()[0], fits[1].get_state()[0], rtol=1e-12)
