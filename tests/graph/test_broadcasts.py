"""Scalar operands given the output's rank and reductions without their
size-1 axes where onnxruntime's CPU broadcast runs one call per element
(graph/broadcasts.py): the same outputs, the new shapes, and the graphs
left alone."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxtrain.graph import infer_value_types
from onnxtrain.graph.broadcasts import may_broadcast_slowly, avoid_slow_broadcasts
from gradcheck import run, session

F = TensorProto.FLOAT


def _model(shape, nodes, inits, extra_inputs=()):
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("X", F, shape)] + list(extra_inputs),
        [helper.make_tensor_value_info(n.output[0], F, None) for n in nodes
         if n.output[0].startswith("Y")], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _scalar(name, value, dims=()):
    return numpy_helper.from_array(np.full(dims, value, dtype=np.float32), name)


def test_scalars_take_the_output_rank_with_the_same_values():
    # feature maps at 1x1 meeting scalars (rank 0 and 1), a Where with a
    # scalar branch, a computed rank-0 value, a full-rank scalar (fast
    # already) and an initializer that is also a graph input (it may be fed
    # another value: reshaped at run time, not baked in)
    nodes = [helper.make_node("Mul", ["X", "mu"], ["Y1"]),
             helper.make_node("Greater", ["X", "zero"], ["mask"]),
             helper.make_node("Where", ["mask", "X", "zero"], ["Y2"]),
             helper.make_node("Div", ["X", "ones4"], ["Y3"]),
             helper.make_node("Sub", ["X", "lr"], ["Y4"]),
             helper.make_node("Cast", ["mask"], ["Y5"], to=F),
             helper.make_node("Add", ["X", "fed"], ["Y6"])]
    model = _model(["N", 512, 1, 1], nodes,
                   [_scalar("mu", 0.9, (1,)), _scalar("zero", 0.0),
                    _scalar("ones4", 2.0, (1, 1, 1, 1)), _scalar("fed", 1.0)],
                   [helper.make_tensor_value_info("lr", F, []),
                    helper.make_tensor_value_info("fed", F, [])])
    new = avoid_slow_broadcasts(model)
    inits = {i.name: numpy_helper.to_array(i) for i in new.graph.initializer}
    by_output = {n.output[0]: n for n in new.graph.node}
    mul, where, div = by_output["Y1"], by_output["Y2"], by_output["Y3"]
    assert inits[mul.input[1]].shape == (1, 1, 1, 1)
    assert inits[mul.input[1]].ravel()[0] == np.float32(0.9)
    assert inits[where.input[2]].shape == (1, 1, 1, 1)
    assert where.input[0] == "mask"  # full rank already
    assert div.input[1] == "ones4"  # full rank already
    # computed scalars and overridable initializers through one Reshape
    for output, name in (("Y4", "lr"), ("Y6", "fed")):
        reshape = by_output[by_output[output].input[1]]
        assert reshape.op_type == "Reshape" and reshape.input[0] == name
        assert tuple(inits[reshape.input[1]]) == (1, 1, 1, 1)
    # the caller's model untouched, the outputs equal
    assert [n.input[1] for n in model.graph.node[:2]] == ["mu", "zero"]
    x = np.random.default_rng(0).normal(size=(3, 512, 1, 1)).astype(np.float32)
    feeds = {"X": x, "lr": np.array(0.25, dtype=np.float32),
             "fed": np.array(-3.0, dtype=np.float32)}
    expected = run(session(model), feeds)
    got = run(session(new), feeds)
    assert set(got) == set(expected) == {"Y1", "Y2", "Y3", "Y4", "Y5", "Y6"}
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name])
    # fed a new value (an overridable initializer): not baked in
    for m in (model, new):
        y6 = session(m).run(["Y6"], {"X": x, "lr": feeds["lr"], "fed": feeds["fed"]})[0]
        np.testing.assert_allclose(y6, x - 3.0)


def test_one_padded_copy_per_scalar_and_rank():
    nodes = [helper.make_node("Mul", ["X", "mu"], ["a"]),
             helper.make_node("Add", ["a", "mu"], ["Y"])]
    new = avoid_slow_broadcasts(_model([64, 32, 1, 1], nodes, [_scalar("mu", 0.5)]))
    assert new.graph.node[0].input[1] == new.graph.node[1].input[1] != "mu"
    assert len(new.graph.initializer) == 2


@pytest.mark.parametrize("shape", [
    [32, 512],          # no trailing ones
    [32, 256, 2, 2],    # no trailing ones
    [1, 512, 1, 1],     # 512 calls: below MIN_RUNS
    [512, 1, 1, "W"],   # a symbolic trailing dimension
])
def test_fast_broadcasts_left_alone(shape):
    nodes = [helper.make_node("Mul", ["X", "mu"], ["Y"])]
    model = _model(shape, nodes, [_scalar("mu", 0.5)])
    assert avoid_slow_broadcasts(model) is model


def test_per_channel_operands_are_not_scalars():
    # (1, C, 1, 1) against (N, C, 1, 1): runs of C elements already
    nodes = [helper.make_node("Mul", ["X", "s"], ["Y"])]
    model = _model(["N", 512, 1, 1], nodes, [_scalar("s", 0.5, (1, 512, 1, 1))])
    assert avoid_slow_broadcasts(model) is model


def test_the_cheap_test_on_forward_types():
    conv1x1 = _model(["N", 512, 1, 1], [helper.make_node("Relu", ["X"], ["Y"])], [])
    assert may_broadcast_slowly(infer_value_types(conv1x1))
    mlp = _model(["N", 100], [helper.make_node("Relu", ["X"], ["Y"])],
                 [_scalar("W", 0.1, (100, 1))])  # 100 runs
    assert not may_broadcast_slowly(infer_value_types(mlp))
    # the pass returns the graph as it is when the forward types are clear
    slow = _model(["N", 512, 1, 1], [helper.make_node("Mul", ["X", "mu"], ["Y"])],
                  [_scalar("mu", 0.5)])
    assert avoid_slow_broadcasts(slow, forward_types=infer_value_types(mlp)) is slow
    assert avoid_slow_broadcasts(slow, forward_types=infer_value_types(conv1x1)) is not slow


@pytest.mark.parametrize("opset", [13, 18])
def test_reductions_keeping_dims_leave_out_size_one_axes(opset):
    # ReduceSum takes its axes as an input from opset 13, ReduceMean from 18
    def axes_of(op_type, axes, name):
        if op_type == "ReduceSum" or opset >= 18:
            return dict(inputs=["X", name], attrs={})
        return dict(inputs=["X"], attrs=dict(axes=axes))

    nodes, inits = [], []
    for k, (op_type, axes, keep) in enumerate([
            ("ReduceSum", [0, 2, 3], 1), ("ReduceMean", [0, -1, 2], 1),
            ("ReduceSum", [0, 2, 3], 0), ("ReduceMean", [2, 3], 1)]):
        spec = axes_of(op_type, axes, f"axes{k}")
        if len(spec["inputs"]) > 1:
            inits.append(numpy_helper.from_array(np.array(axes, np.int64), f"axes{k}"))
        nodes.append(helper.make_node(op_type, spec["inputs"], [f"Y{k}"],
                                      keepdims=keep, **spec["attrs"]))
    model = _model(["N", 512, 1, 1], nodes, inits)
    model.opset_import[0].version = opset
    new = avoid_slow_broadcasts(model)
    inits_new = {i.name: numpy_helper.to_array(i) for i in new.graph.initializer}

    def axes(node):
        if len(node.input) > 1:
            return list(inits_new[node.input[1]])
        return list(next(a for a in node.attribute if a.name == "axes").ints)

    got = [axes(n) for n in new.graph.node]
    # keepdims=0 changes the shape: left as it is; so is a reduction over
    # size-1 axes only
    assert got == [[0], [0], [0, 2, 3], [2, 3]]
    x = np.random.default_rng(0).normal(size=(4, 512, 1, 1)).astype(np.float32)
    expected, result = run(session(model), {"X": x}), run(session(new), {"X": x})
    for name in expected:
        assert result[name].shape == expected[name].shape
        np.testing.assert_allclose(result[name], expected[name], rtol=1e-6, atol=1e-6)
