"""GraphBuilder.transpose leaves out the Transposes its input's producer
makes useless (graph/builder.py), and the reverse pass drops what that
leaves unread (autodiff/backward.py): a linear layer exported as
X @ Transpose(W) gets its gradients without a Transpose; values against
central differences and numpy."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from gradcheck import check_gradients, run, session
from onnxtrain.autodiff import build_fused_model
from onnxtrain.graph import GraphBuilder


def _linear(rank=3):
    """Y = X @ Transpose(W) + B, as torch.onnx exports nn.Linear on a
    sequence (rank 3) or a batch of rows (rank 2)."""
    rng = np.random.default_rng(0)
    dims = ["N", 3, 4][-rank:] if rank == 3 else ["N", 4]
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["W"], ["Wt"], perm=[1, 0]),
         helper.make_node("MatMul", ["X", "Wt"], ["h"]),
         helper.make_node("Add", ["h", "B"], ["Y"])],
        "linear", [helper.make_tensor_value_info("X", TensorProto.DOUBLE, dims)],
        [helper.make_tensor_value_info("Y", TensorProto.DOUBLE, dims[:-1] + [5])],
        [numpy_helper.from_array(rng.normal(size=(5, 4)), "W"),
         numpy_helper.from_array(rng.normal(size=5), "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("rank", [2, 3])
def test_linear_layer_gradients_without_transpose(rank):
    model = _linear(rank)
    _, bg = build_fused_model(model, ["W", "B", "X"])
    ops = [n.op_type for n in bg.builder.nodes]
    if rank == 3:  # dW: one Gemm over the flattened batch, transposed in it
        assert "Transpose" not in ops
    else:  # dW^T = X^T dY by MatMul, transposed back; dX without one
        assert ops.count("Transpose") == 2
    read = {i for n in bg.builder.nodes for i in n.input} | set(bg.grad_names)
    assert all(any(o in read for o in n.output) for n in bg.builder.nodes)
    shape = (2, 3, 4) if rank == 3 else (6, 4)
    feeds = {"X": np.random.default_rng(rank).normal(size=shape),
             **{i.name: numpy_helper.to_array(i) for i in model.graph.initializer}}
    check_gradients(model, ["W", "B", "X"], feeds)


def _values(g, inputs, feeds, out):
    graph = helper.make_graph(
        g.nodes, "g", [helper.make_tensor_value_info(n, TensorProto.DOUBLE, None)
                       for n in inputs],
        [helper.make_tensor_value_info(out, TensorProto.DOUBLE, None)],
        g.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return run(session(model), feeds)[out]


def test_transpose_of_a_gemm_is_the_swapped_gemm():
    rng = np.random.default_rng(1)
    left, right = rng.normal(size=(3, 4)), rng.normal(size=(4, 5))
    for trans_a in (0, 1):
        for trans_b in (0, 1):
            a = left.T if trans_a else left
            b = right.T if trans_b else right
            g = GraphBuilder(17, ["A", "B"])
            x = g.op("Gemm", "A", "B", alpha=2.0, transA=trans_a, transB=trans_b)
            y = g.transpose(x, [1, 0])
            assert [n.op_type for n in g.nodes] == ["Gemm", "Gemm"]
            np.testing.assert_allclose(
                _values(g, ["A", "B"], {"A": a, "B": b}, y),
                (2.0 * left @ right).T, rtol=1e-12)


def test_transposes_that_stay():
    g = GraphBuilder(17, ["X", "C"])
    t = g.op("Transpose", "X", perm=[1, 2, 0])
    assert g.transpose(t, [1, 2, 0]) != "X"  # not the inverse: a node
    assert g.transpose(t, [2, 0, 1]) == "X"  # the inverse: none
    gemm = g.op("Gemm", "X", "X", "C", transA=1)
    n = len(g.nodes)
    g.transpose(gemm, [1, 0])  # with C: a Transpose
    assert [x.op_type for x in g.nodes[n:]] == ["Transpose"]
    known = helper.make_node("Transpose", ["W"], ["Wt"])  # default perm
    g.know_nodes([known])
    assert g.transpose("Wt", [1, 0]) == "W"


def test_scalar_constants_are_shared_and_keep_their_bits():
    g = GraphBuilder(17)
    zero, again = g.const(0.0, TensorProto.FLOAT), g.const(0.0, TensorProto.FLOAT)
    negative = g.const(-0.0, TensorProto.FLOAT)
    array = g.const(np.float32(0), TensorProto.FLOAT)  # same bytes as 0.0
    assert zero == again == array and negative != zero
    assert g.const(1, TensorProto.DOUBLE) != g.const(1, TensorProto.FLOAT)
    assert g.const(True, TensorProto.BOOL) != g.const(1, TensorProto.INT64)
    values = {i.name: numpy_helper.to_array(i) for i in g.initializers}
    assert np.signbit(values[negative]) and not np.signbit(values[zero])
    assert len(g.initializers) == 6
