"""LayerNormalization's VJP reads the node's own Mean and InvStdDev in
float32 (autodiff/rules/layer_norm.py): two ReduceMean instead of four,
gradients against central differences of a float64 numpy layer norm; the
reverse pass types the outputs it names by inferring their node alone."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from gradcheck import central_differences, fused_gradients, relative_error
from onnxtrain.autodiff import backward, build_fused_model
from onnxtrain.graph import infer_value_types


def _model(dtype):
    rng = np.random.default_rng(4)
    elem = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE
    graph = helper.make_graph(
        [helper.make_node("LayerNormalization", ["X", "S", "B"], ["Y"], axis=1)],
        "layer_norm", [helper.make_tensor_value_info("X", elem, ["N", 3, 4])],
        [helper.make_tensor_value_info("Y", elem, ["N", 3, 4])],
        [numpy_helper.from_array(rng.normal(size=(3, 4)).astype(dtype), "S"),
         numpy_helper.from_array(rng.normal(size=(3, 4)).astype(dtype), "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _layer_norm(X, S, B):
    """float64 layer norm over axes 1 and 2."""
    mean = X.mean(axis=(1, 2), keepdims=True)
    var = ((X - mean) ** 2).mean(axis=(1, 2), keepdims=True)
    return (X - mean) / np.sqrt(var + 1e-5) * S + B


@pytest.mark.parametrize("dtype, reduce_means", [(np.float32, 2), (np.float64, 4)])
def test_saved_statistics_in_float32_only(dtype, reduce_means):
    fused, bg = build_fused_model(_model(dtype), ["X", "S", "B"])
    ops = [n.op_type for n in bg.builder.nodes]
    assert ops.count("ReduceMean") == reduce_means
    node = next(n for n in fused.graph.node if n.op_type == "LayerNormalization")
    assert len([o for o in node.output if o]) == 3  # Mean and InvStdDev named


def test_float32_gradients_against_central_differences():
    model = _model(np.float32)
    rng = np.random.default_rng(5)
    feeds = {"X": rng.normal(size=(5, 3, 4)).astype(np.float32),
             **{i.name: numpy_helper.to_array(i) for i in model.graph.initializer}}
    gy = rng.normal(size=(5, 3, 4)).astype(np.float32)
    fused, bg = build_fused_model(model, ["X", "S", "B"])
    grads = fused_gradients(fused, bg, feeds, {"Y": gy})
    wide = {k: v.astype(np.float64) for k, v in feeds.items()}
    for w in ("X", "S", "B"):
        num = central_differences(
            lambda value, w=w: float(np.sum(_layer_norm(**{**wide, w: value}) * gy)),
            wide[w])
        assert relative_error(num, grads[w]) < 1e-5, w


def test_named_outputs_are_typed_without_inferring_the_model(monkeypatch):
    model = _model(np.float32)
    types = infer_value_types(model)
    calls = []
    original = onnx.shape_inference.infer_shapes
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes",
                        lambda *a, **k: calls.append(1) or original(*a, **k))
    bg = backward(model, ["X", "S"], types=types)
    assert calls == []
    node = next(n for n in bg.model.graph.node if n.op_type == "LayerNormalization")
    assert bg.types[node.output[1]] == (TensorProto.FLOAT, ("N", 1, 1))
