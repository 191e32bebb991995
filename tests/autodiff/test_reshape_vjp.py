"""The Reshape (Flatten, Squeeze, Unsqueeze) VJP reshapes to a constant
target when the input's dims are static or copied from the gradient
(autodiff/rules/shape.py): no Shape node; gradients against central
differences at batch 1 and 3."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from gradcheck import check_gradients
from onnxtrain.autodiff import build_fused_model
from onnxtrain.autodiff.rules.shape import _constant_target


@pytest.mark.parametrize("x, y, expected", [
    ((2, 3), (6,), [2, 3]),
    (("N", 3, 4), ("N", 12), [0, 3, 4]),
    (("N", 3, 4), (12, "N"), [-1, 3, 4]),
    ((1, "N"), ("N",), [1, -1]),
    (("N", "M"), ("M", "N"), None),
    (("N", None), ("N", 4), None),  # -1 beside a copied dim (may be 0)
    (("N", 0), ("N",), None),
    (None, (3,), None)])
def test_constant_target(x, y, expected):
    assert _constant_target(x, y) == expected


def _model(op, x_dims, y_dims, **attrs):
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Mul", ["X", "W"], ["h"])]
    inits = [numpy_helper.from_array(rng.normal(size=x_dims[1:]), "W")]
    if op == "Reshape":
        inits.append(numpy_helper.from_array(np.array([0, -1]), "shape"))
        nodes.append(helper.make_node("Reshape", ["h", "shape"], ["r"]))
    elif op == "Unsqueeze":
        inits.append(numpy_helper.from_array(np.array([1]), "axes"))
        nodes.append(helper.make_node("Unsqueeze", ["h", "axes"], ["r"]))
    else:
        nodes.append(helper.make_node(op, ["h"], ["r"], **attrs))
    nodes.append(helper.make_node("Tanh", ["r"], ["Y"]))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("X", TensorProto.DOUBLE, x_dims)],
        [helper.make_tensor_value_info("Y", TensorProto.DOUBLE, y_dims)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("op, y_dims, attrs", [
    ("Reshape", ["N", 6], {}), ("Flatten", ["N", 6], {"axis": 1}),
    ("Unsqueeze", ["N", 1, 2, 3], {})])
def test_gradients_without_shape_nodes(op, y_dims, attrs, n):
    model = _model(op, ["N", 2, 3], y_dims, **attrs)
    _, bg = build_fused_model(model, ["W", "X"])
    assert "Shape" not in [node.op_type for node in bg.builder.nodes]
    feeds = {"X": np.random.default_rng(n).normal(size=(n, 2, 3)),
             "W": numpy_helper.to_array(model.graph.initializer[0])}
    check_gradients(model, ["W", "X"], feeds)
