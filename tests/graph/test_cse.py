"""graph/cse.py: equal nodes merged (values unchanged), and the nodes that
must stay: graph outputs, random operators, subgraph reads."""
import numpy as np
import onnx
from onnx import TensorProto, helper

from gradcheck import run, session
from onnxtrain.graph.cse import eliminate_common_subexpressions


def _model(nodes, outputs):
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, ["N", 3]) for o in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _with_nodes(model, nodes):
    new = onnx.ModelProto()
    new.CopyFrom(model)
    del new.graph.node[:]
    new.graph.node.extend(nodes)
    onnx.checker.check_model(new)
    return new


def test_equal_nodes_merge_and_values_stay():
    nodes = [helper.make_node("Exp", ["X"], ["a"]),
             helper.make_node("Exp", ["X"], ["b"]),            # = a
             helper.make_node("Mul", ["a", "X"], ["c"]),
             helper.make_node("Mul", ["b", "X"], ["d"]),       # = c once b is a
             helper.make_node("Softmax", ["c"], ["e"], axis=1),
             helper.make_node("Softmax", ["d"], ["f"], axis=0),  # other axis
             helper.make_node("Add", ["e", "f"], ["Y"])]
    model = _model(nodes, ["Y"])
    kept = eliminate_common_subexpressions(list(model.graph.node), keep=["Y"])
    assert [n.output[0] for n in kept] == ["a", "c", "e", "f", "Y"]
    assert list(kept[3].input) == ["c"]  # Softmax(d) reads c now
    assert list(model.graph.node[5].input) == ["d"]  # the caller's node unchanged
    x = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    expected = run(session(model), {"X": x})["Y"]
    got = run(session(_with_nodes(model, kept)), {"X": x})["Y"]
    np.testing.assert_array_equal(got, expected)


def test_graph_outputs_random_ops_and_subgraph_reads_stay():
    then = helper.make_graph(
        [helper.make_node("Identity", ["s2"], ["t"])], "then", [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("Relu", ["X"], ["r1"]),
             helper.make_node("Relu", ["X"], ["r2"]),      # a graph output
             helper.make_node("Dropout", ["X", "", "on"], ["d1"]),
             helper.make_node("Dropout", ["X", "", "on"], ["d2"]),
             helper.make_node("Sigmoid", ["X"], ["s1"]),
             helper.make_node("Sigmoid", ["X"], ["s2"]),   # read inside If
             helper.make_node("If", ["cond"], ["i"], then_branch=then,
                              else_branch=then)]
    kept = eliminate_common_subexpressions(nodes, keep=["r1", "r2"])
    assert [n.output[0] for n in kept] == [n.output[0] for n in nodes]
    # an unused optional output cannot stand for a used one
    masks = [helper.make_node("MaxPool", ["X"], ["m1", ""], kernel_shape=[2]),
             helper.make_node("MaxPool", ["X"], ["m2", "idx"], kernel_shape=[2])]
    assert len(eliminate_common_subexpressions(masks)) == 2


def test_equal_small_constants_are_read_under_one_name():
    from onnx import numpy_helper
    from onnxtrain.graph.cse import SMALL_CONSTANT

    def const(name, value, dtype=np.float32):
        return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)

    initializers = [const("two", 2.0), const("two_again", 2.0),  # merged
                    const("two_f64", 2.0, np.float64),            # other type
                    const("row", [[2.0, 2.0, 2.0]]),              # other shape
                    const("kept", 2.0),                           # an interface name
                    const("w1", np.ones((SMALL_CONSTANT + 1, 1))),  # too big to compare
                    const("w2", np.ones((SMALL_CONSTANT + 1, 1)))]
    # typed fields (no raw_data) compare by value; strings by their text
    initializers += [helper.make_tensor("i1", TensorProto.INT64, [2], [3, 4]),
                     helper.make_tensor("i2", TensorProto.INT64, [2], [3, 4]),
                     helper.make_tensor("i3", TensorProto.INT64, [2], [3, 5])]
    initializers += [helper.make_tensor(f"s{k}", TensorProto.STRING, [1],
                                        [f"word{k}".encode()]) for k in range(40)]
    initializers.append(helper.make_tensor("s_again", TensorProto.STRING, [1],
                                           [b"word3"]))
    nodes = [helper.make_node("Mul", ["X", "two"], ["a"]),
             helper.make_node("Mul", ["X", "two_again"], ["b"]),  # = a once merged
             helper.make_node("Mul", ["X", "kept"], ["c"]),
             helper.make_node("Add", ["a", "b"], ["s"]),
             helper.make_node("Add", ["s", "c"], ["Y"])]
    kept, constants = eliminate_common_subexpressions(
        nodes, keep=["Y", "kept"], initializers=initializers)
    # Mul(X, two_again) merged into Mul(X, two); "kept" is an interface name
    assert [n.output[0] for n in kept] == ["a", "c", "s", "Y"]
    assert [list(n.input) for n in kept] == [["X", "two"], ["X", "kept"], ["a", "a"],
                                             ["s", "c"]]
    assert list(nodes[1].input) == ["X", "two_again"]  # the caller's node unchanged
    assert [t.name for t in constants] == (
        ["two", "two_f64", "row", "kept", "w1", "w2", "i1", "i3"]
        + [f"s{k}" for k in range(40)])  # i2 = i1, s_again = s3 merged
    # without initializers: the names differ, nothing merges
    assert len(eliminate_common_subexpressions(nodes, keep=["Y"])) == 5
    model = _model(nodes, ["Y"])
    model.graph.initializer.extend(initializers[:2] + initializers[4:5])
    x = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    expected = run(session(model), {"X": x})["Y"]
    new = _with_nodes(model, kept)
    del new.graph.initializer[:]
    new.graph.initializer.extend(t for t in constants if t.name in ("two", "kept"))
    np.testing.assert_array_equal(run(session(new), {"X": x})["Y"], expected)
