"""The helpers shared by the rules that differentiate through an expansion."""
import numpy as np
from onnx import TensorProto, helper

from onnxtrain.autodiff.expansion import outer_reads, prune_unread, record_types
from onnxtrain.graph import GraphBuilder


def _if_reading(name, out):
    """An If node whose branches return Identity(``name``), an outer value."""
    branch = helper.make_graph(
        [helper.make_node("Identity", [name], [f"{out}_in"])], "branch", [],
        [helper.make_tensor_value_info(f"{out}_in", TensorProto.FLOAT, None)])
    return helper.make_node("If", ["cond"], [out], then_branch=branch,
                            else_branch=branch)


def test_prune_unread_keeps_values_read_only_by_a_subgraph():
    nodes = [helper.make_node("Neg", ["x"], ["a"]),  # read by the If's branch
             helper.make_node("Abs", ["x"], ["unused"]),
             helper.make_node("Exp", ["a"], ["b"]),  # read by nothing later
             _if_reading("a", "y")]
    prune_unread(nodes, 0, 3)
    assert [n.op_type for n in nodes] == ["Neg", "If"]


def test_prune_unread_keeps_the_inputs_of_kept_nodes():
    nodes = [helper.make_node("Neg", ["x"], ["a"]),  # read by the kept Exp
             helper.make_node("Exp", ["a"], ["b"]),
             helper.make_node("Abs", ["x"], ["unused"]),
             helper.make_node("Relu", ["b"], ["y"]),
             helper.make_node("Sigmoid", ["x"], ["z"])]
    prune_unread(nodes, 1, 3)  # only Exp and Abs may go
    assert [n.op_type for n in nodes] == ["Neg", "Exp", "Relu", "Sigmoid"]
    prune_unread(nodes, 0, 2)  # Relu reads b, Exp reads a
    assert [n.op_type for n in nodes] == ["Neg", "Exp", "Relu", "Sigmoid"]


def test_record_types_reads_constant_inputs_as_initializers():
    g = GraphBuilder(13, (), {"x": (TensorProto.FLOAT, (3,))})
    nodes = [helper.make_node("Unsqueeze", ["x", "axes"], ["y"])]
    values = record_types(g, nodes, outer_reads(nodes), ["y"],
                          {"axes": np.array([0, 2], dtype=np.int64)})
    assert g.types["y"] == (TensorProto.FLOAT, (1, 3, 1))
    assert list(values) == ["axes"]
