"""Rules that write fewer nodes when the shapes or indices are known at
build time: a Gather of one constant index (dy padded with zeros), and the
reductions with keepdims=0 (an Unsqueeze instead of a second reduction, a
constant count for ReduceMean). Gradients against central differences in
float64; the nodes they no longer write."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from gradcheck import check_gradients
from onnxtrain.autodiff import build_fused_model


def _model(nodes, x_shape, y_shape, inits=()):
    graph = helper.make_graph(
        nodes, "m", [helper.make_tensor_value_info("X", TensorProto.DOUBLE, x_shape)],
        [helper.make_tensor_value_info("Y", TensorProto.DOUBLE, y_shape)], list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


def _ops(model, wrt=("X",)):
    _, bg = build_fused_model(model, list(wrt))
    return [n.op_type for n in bg.builder.nodes]


@pytest.mark.parametrize("index, axis, y_shape", [
    (0, 1, ["N", 4]), (-1, 1, ["N", 4]), (2, 2, ["N", 3]), (1, 0, [3, 4])])
def test_one_constant_index_is_padded_back(index, axis, y_shape):
    model = _model([helper.make_node("Tanh", ["X"], ["t"]),
                    helper.make_node("Gather", ["t", "i"], ["Y"], axis=axis)],
                   ["N", 3, 4] if axis else [3, 3, 4], y_shape,
                   [numpy_helper.from_array(np.array(index, np.int64), "i")])
    ops = _ops(model)
    assert "Pad" in ops and not {"ScatterElements", "ScatterND", "Range"} & set(ops)
    X = np.random.default_rng(index + 5).normal(size=(3, 3, 4))
    check_gradients(model, ["X"], {"X": X}, tol=1e-7)


def test_indices_of_several_elements_keep_the_scatter():
    model = _model([helper.make_node("Gather", ["X", "i"], ["Y"], axis=1)],
                   ["N", 3, 4], ["N", 3, 4],
                   [numpy_helper.from_array(np.array([0, 2, 0], np.int64), "i")])
    assert "Pad" not in _ops(model)
    check_gradients(model, ["X"], {"X": np.random.default_rng(0).normal(size=(2, 3, 4))},
                    tol=1e-7)


@pytest.mark.parametrize("op, axes, x_shape, y_shape", [
    ("ReduceMean", None, ["N", 3], []), ("ReduceMean", [1], ["N", 3, 2], ["N", 2]),
    ("ReduceMean", [0], ["N", 3], [3]), ("ReduceSum", [1, -1], ["N", 3, 2], ["N"]),
    ("ReduceSum", None, [2, 3], [])])
def test_reductions_without_kept_dims(op, axes, x_shape, y_shape):
    inits = [] if axes is None else [numpy_helper.from_array(np.array(axes, np.int64), "a")]
    inputs = ["X"] if axes is None else ["X", "a"]
    model = _model([helper.make_node(op, inputs, ["Y"], keepdims=0)], x_shape, y_shape, inits)
    ops = _ops(model)
    # no second reduction of x for its kept shape; a static count is a constant
    assert "ReduceSum" not in ops and "ReduceMean" not in ops
    static = axes is not None and all(isinstance(x_shape[a], int) for a in axes)
    assert ("Size" in ops) == (op == "ReduceMean" and not static)
    X = np.random.default_rng(1).normal(size=[2 if d == "N" else d for d in x_shape])
    check_gradients(model, ["X"], {"X": X}, tol=1e-7)
