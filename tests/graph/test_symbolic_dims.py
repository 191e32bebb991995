"""graph/symbolic.py: the dims onnx shape inference leaves unknown that
arithmetic on the graph determines (a Reshape's -1 whose symbols cancel,
broadcasts), and the gradients the reverse pass builds from them, against
central differences, at batch sizes where the symbolic dim is 1 too."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from gradcheck import check_gradients
from onnxtrain.autodiff import build_gradient_models
from onnxtrain.graph import infer_value_types
from onnxtrain.graph.symbolic import broadcast_dims


@pytest.mark.parametrize("dims, expected", [
    ([1, "a"], "a"), (["a", "a"], "a"), (["a", 3], 3), ([1, 1], 1),
    (["a", "b"], None), ([None, 1], None), ([None, 4], 4), ([2, 3], None),
    ([], 1)])
def test_broadcast_dims(dims, expected):
    assert broadcast_dims(dims) == expected


def _heads_model(target_tail=(4, -1, 3), x_shape=("N", 4, 6)):
    """Y = W2 * (Q @ Q^T) with Q the heads of X @ W1:
    X @ W1 (N, 4, 6) -> Reshape [N, 4, -1, 3] -> Transpose (N, 2, 4, 3)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(6, 6)), "W1"),
             numpy_helper.from_array(rng.normal(size=(2, 1, 1)), "W2"),
             numpy_helper.from_array(np.array(0, dtype=np.int64), "zero"),
             numpy_helper.from_array(np.array([0], dtype=np.int64), "axis0"),
             numpy_helper.from_array(np.array(target_tail, dtype=np.int64), "tail")]
    nodes = [
        helper.make_node("MatMul", ["X", "W1"], ["h"]),
        helper.make_node("Shape", ["h"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axis0"], ["n1"]),
        helper.make_node("Concat", ["n1", "tail"], ["target"], axis=0),
        helper.make_node("Reshape", ["h", "target"], ["r"]),
        helper.make_node("Transpose", ["r"], ["q"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["q"], ["qt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "qt"], ["s"]),
        helper.make_node("Mul", ["s", "W2"], ["Y"])]
    graph = helper.make_graph(
        nodes, "heads",
        [helper.make_tensor_value_info("X", TensorProto.DOUBLE, list(x_shape))],
        [helper.make_tensor_value_info("Y", TensorProto.DOUBLE, ["N", None, 4, 4])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_reshape_minus_one_whose_symbols_cancel_is_static():
    model = _heads_model()
    plain = onnx.shape_inference.infer_shapes(model, data_prop=True)
    onnx_dims = {vi.name: vi.type.tensor_type.shape.dim[1]
                 for vi in plain.graph.value_info if vi.name == "q"}
    assert not onnx_dims["q"].HasField("dim_value")  # what onnx leaves unknown
    types = infer_value_types(model)
    assert types["r"][1] == ("N", 4, 2, 3)
    assert types["q"][1] == ("N", 2, 4, 3)
    assert types["s"][1] == ("N", 2, 4, 4)
    assert types["Y"][1] == ("N", 2, 4, 4)


def test_dims_that_do_not_cancel_stay_unknown():
    # (N, 4, 6) -> [N, 4, -1, 3] is 2; (N, M, 6) -> [N, 4, -1, 3] is M / 2
    types = infer_value_types(_heads_model(x_shape=("N", "M", 6)))
    assert not isinstance(types["r"][1][2], int)
    types = infer_value_types(_heads_model(target_tail=(-1, 4, 3)))
    assert types["r"][1][1] == 2  # N * 4 * 6 / (N * 4 * 3)


@pytest.mark.parametrize("attribute", ["value_ints", "value"])
def test_a_shape_written_by_a_constant_node_is_tracked(attribute):
    # the tail [4, -1, 3] as a Constant node, its ints as value_ints (as
    # some exporters write shapes) or as a tensor: the -1 is 2 either way
    model = _heads_model()
    tail = [4, -1, 3]
    value = (helper.make_tensor("t", TensorProto.INT64, [3], tail)
             if attribute == "value" else tail)
    kept = [i for i in model.graph.initializer if i.name != "tail"]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    model.graph.node.insert(0, helper.make_node("Constant", [], ["tail"],
                                                **{attribute: value}))
    types = infer_value_types(model)
    assert types["r"][1] == ("N", 4, 2, 3)


@pytest.mark.parametrize("n", [1, 3])
def test_gradients_through_the_heads_without_runtime_reductions(n):
    model = _heads_model()
    gm = build_gradient_models(model, ["W1", "W2"])
    ops = {node.op_type for node in gm.backward_model.graph.node}
    assert not {"Compress", "Equal", "Not"} & ops
    feeds = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    feeds["X"] = np.random.default_rng(n).normal(size=(n, 4, 6))
    check_gradients(model, ["W1", "W2"], feeds)


@pytest.mark.parametrize("weights_as_inputs", [False, True])
def test_inference_without_the_weights_values_types_the_same(weights_as_inputs):
    from onnxtrain.graph.shapes import _without_weights
    model = _heads_model()
    big = numpy_helper.from_array(np.ones((10, 7)), "big")
    model.graph.initializer.append(big)
    model.graph.node.append(helper.make_node("MatMul", ["big", "W2"], ["unused"]))
    if weights_as_inputs:  # keep_initializers_as_inputs exports
        model.graph.input.extend(
            helper.make_tensor_value_info(i.name, i.data_type, list(i.dims))
            for i in model.graph.initializer)
    light = _without_weights(model)
    # only "big" is above 64 elements
    assert [i.name for i in light.graph.initializer] == [
        "W1", "W2", "zero", "axis0", "tail"]
    assert len({i.name for i in light.graph.input}) == len(light.graph.input)
    full = onnx.shape_inference.infer_shapes(model, data_prop=True)
    stripped = onnx.shape_inference.infer_shapes(light, data_prop=True)
    assert {v.name: v for v in full.graph.value_info} == \
        {v.name: v for v in stripped.graph.value_info}
    types = infer_value_types(model)
    assert types["big"] == (TensorProto.DOUBLE, (10, 7))
    assert types["W1"] == (TensorProto.DOUBLE, (6, 6))
    assert len(model.graph.initializer) == 6  # the caller's model unchanged
