"""Reshape targets known at build time written as constants
(graph/static_shapes.py): the outputs of the model as it was, the nodes
that computed the targets gone, and the Reshapes whose output inference
does not know kept as they are."""
import numpy as np
from onnx import TensorProto, helper, numpy_helper

from gradcheck import run, session
from onnxtrain.graph import infer_value_types
from onnxtrain.graph.static_shapes import fold_reshape_targets


def _heads_model(hidden=8, heads=2, batch="N", seq=4):
    """x (batch, seq, hidden) viewed as (batch, seq, heads, hidden/heads)
    by the Shape, Gather, Unsqueeze, Concat chain torch.onnx writes, then
    transposed; the batch dimension symbolic."""
    inits = [numpy_helper.from_array(np.array(k, np.int64), f"k{k}") for k in (0, 1)]
    inits += [numpy_helper.from_array(np.array([heads, hidden // heads], np.int64), "tail"),
              numpy_helper.from_array(np.array([0], np.int64), "zero_axis")]
    nodes = [helper.make_node("Shape", ["X"], ["s"]),
             helper.make_node("Gather", ["s", "k0"], ["b"], axis=0),
             helper.make_node("Gather", ["s", "k1"], ["t"], axis=0),
             helper.make_node("Unsqueeze", ["b", "zero_axis"], ["b1"]),
             helper.make_node("Unsqueeze", ["t", "zero_axis"], ["t1"]),
             helper.make_node("Concat", ["b1", "t1", "tail"], ["target"], axis=0),
             helper.make_node("Reshape", ["X", "target"], ["r"]),
             helper.make_node("Transpose", ["r"], ["Y"], perm=[0, 2, 1, 3])]
    graph = helper.make_graph(
        nodes, "heads", [helper.make_tensor_value_info("X", TensorProto.FLOAT,
                                                       [batch, seq, hidden])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_target_known_but_the_batch_is_a_constant():
    model = _heads_model()
    folded, types = fold_reshape_targets(model, infer_value_types(model))
    reshape = next(n for n in folded.graph.node if n.op_type == "Reshape")
    target = next(i for i in folded.graph.initializer if i.name == reshape.input[1])
    np.testing.assert_array_equal(numpy_helper.to_array(target), [-1, 4, 2, 4])
    assert types[reshape.input[1]] == (TensorProto.INT64, (4,))
    assert [n.op_type for n in folded.graph.node] == ["Reshape", "Transpose"]
    assert len(model.graph.node) == 8  # the model given is not modified
    for batch in (1, 3):
        X = np.random.default_rng(batch).normal(size=(batch, 4, 8)).astype(np.float32)
        expected = run(session(model), {"X": X})["Y"]
        np.testing.assert_array_equal(run(session(folded), {"X": X})["Y"], expected)
        assert expected.shape == (batch, 2, 4, 4)


def test_two_unknown_dimensions_keep_the_computed_target():
    model = _heads_model(seq="S")
    folded, types = fold_reshape_targets(model, infer_value_types(model))
    assert folded is model and len(model.graph.node) == 8


def test_a_shape_read_elsewhere_stays():
    model = _heads_model()
    model.graph.node.append(helper.make_node("Cast", ["t"], ["T"], to=TensorProto.FLOAT))
    model.graph.output.append(helper.make_tensor_value_info("T", TensorProto.FLOAT, []))
    folded, _ = fold_reshape_targets(model, infer_value_types(model))
    ops = [n.op_type for n in folded.graph.node]
    # the target's Concat and the batch's Gather go; t's chain stays for T
    assert ops == ["Shape", "Gather", "Reshape", "Transpose", "Cast"]
    X = np.ones((2, 4, 8), np.float32)
    assert run(session(folded), {"X": X})["T"] == 4.0


def _window_model(window=2):
    """x (N, H, W, C) viewed as (N, H // window, window, W // window,
    window, C), the window counts computed from Shape as torch.onnx writes
    ``H // window``: Gather, integer Div, Cast, Unsqueeze, Concat; and a
    Sub and a Mul of dims feeding a second Reshape, (N, H * W - 0, C)."""
    i64 = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    inits = [i64(f"k{k}", k) for k in range(4)] + [
        i64("win", window), i64("zero", 0), i64("axis0", [0])]
    nodes = [helper.make_node("Shape", ["X"], ["s"])]
    for k in range(4):
        nodes.append(helper.make_node("Gather", ["s", f"k{k}"], [f"d{k}"], axis=0))
    nodes += [helper.make_node("Div", ["d1", "win"], ["h"]),
              helper.make_node("Cast", ["h"], ["hc"], to=TensorProto.INT64),
              helper.make_node("Div", ["d2", "win"], ["w"])]
    for p in ["d0", "hc", "win", "w", "d3"]:
        nodes.append(helper.make_node("Unsqueeze", [p, "axis0"], [p + "_1"]))
    nodes += [helper.make_node("Concat", ["d0_1", "hc_1", "win_1", "w_1", "win_1", "d3_1"],
                               ["target"], axis=0),
              helper.make_node("Reshape", ["X", "target"], ["Y"]),
              helper.make_node("Mul", ["d1", "d2"], ["hw"]),
              helper.make_node("Sub", ["hw", "zero"], ["hw0"]),
              helper.make_node("Unsqueeze", ["hw0", "axis0"], ["hw_1"]),
              helper.make_node("Concat", ["d0_1", "hw_1", "d3_1"], ["flat"], axis=0),
              helper.make_node("Reshape", ["X", "flat"], ["Z"])]
    graph = helper.make_graph(
        nodes, "windows", [helper.make_tensor_value_info("X", TensorProto.FLOAT,
                                                         ["N", 4, 6, 3])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "YZ"], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_integer_arithmetic_of_dims_gives_the_target():
    model = _window_model()
    types = infer_value_types(model)
    assert types["Y"][1] == ("N", 2, 2, 3, 2, 3) and types["Z"][1] == ("N", 24, 3)
    folded, _ = fold_reshape_targets(model, types)
    assert [n.op_type for n in folded.graph.node] == ["Reshape", "Reshape"]
    targets = {i.name: numpy_helper.to_array(i) for i in folded.graph.initializer}
    np.testing.assert_array_equal(targets[folded.graph.node[0].input[1]],
                                  [-1, 2, 2, 3, 2, 3])
    np.testing.assert_array_equal(targets[folded.graph.node[1].input[1]], [-1, 24, 3])
    for batch in (1, 3):
        X = np.random.default_rng(batch).normal(size=(batch, 4, 6, 3)).astype(np.float32)
        expected, got = run(session(model), {"X": X}), run(session(folded), {"X": X})
        for name in "YZ":
            np.testing.assert_array_equal(got[name], expected[name])
        assert expected["Y"].shape == (batch, 2, 2, 3, 2, 3)
