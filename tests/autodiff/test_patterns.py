"""Chains of nodes whose gradient the reverse pass writes as one formula
(autodiff/patterns.py), and gradients of three or more parts summed by one
Sum: the values of central differences in float64, of torch's GELU, and of
the node-by-node chain rule."""
import math

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from gradcheck import (central_differences, check_gradients, fused_gradients,
                       relative_error)
from onnxtrain.autodiff import build_fused_model

SQRT2 = math.sqrt(2.0)


def _gelu_model(dtype, scale="div", order=("x", "c"), half_first=False, extra_reader=False):
    """y = gelu(x W) as torch.onnx writes it below opset 20 (Div by sqrt(2),
    Erf, Add 1, Mul by x, Mul by 0.5), in the variants the pattern takes;
    ``extra_reader``: the Erf's output read by a second output too."""
    elem = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.normal(size=(4, 5)).astype(dtype), "W"),
             numpy_helper.from_array(np.array(SQRT2 if scale == "div" else 1 / SQRT2,
                                              dtype), "s"),
             numpy_helper.from_array(np.array(1.0, dtype), "one"),
             numpy_helper.from_array(np.array(0.5, dtype), "half")]
    names = {"x": "h", "c": "c"}
    nodes = [helper.make_node("MatMul", ["X", "W"], ["h"]),
             helper.make_node("Div" if scale == "div" else "Mul", ["h", "s"], ["u"]),
             helper.make_node("Erf", ["u"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["c"]),
             helper.make_node("Mul", [names[order[0]], names[order[1]]], ["m"]),
             helper.make_node("Mul", ["half", "m"] if half_first else ["m", "half"], ["Y"])]
    outputs = [helper.make_tensor_value_info("Y", elem, ["N", 5])]
    if extra_reader:
        nodes.append(helper.make_node("Mul", ["e", "e"], ["E2"]))
        outputs.append(helper.make_tensor_value_info("E2", elem, ["N", 5]))
    graph = helper.make_graph(nodes, "gelu", [helper.make_tensor_value_info(
        "X", elem, ["N", 4])], outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _feeds(model, dtype):
    rng = np.random.default_rng(7)
    feeds = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    feeds["X"] = rng.normal(size=(6, 4)).astype(dtype)
    return feeds


_ERF = np.vectorize(math.erf)


def _numpy_gelu(X, W, extra_reader=False):
    """float64 reference of the model's outputs (onnxruntime has no float64 Erf)."""
    h = X @ W
    e = _ERF(h / SQRT2)
    y = 0.5 * h * (1 + e)
    return (y, e * e) if extra_reader else (y,)


@pytest.mark.parametrize("variant", [
    dict(), dict(scale="mul"), dict(order=("c", "x")), dict(half_first=True),
    dict(extra_reader=True)], ids=["torch", "mul", "c-first", "half-first", "erf-read"])
def test_gelu_chain_against_central_differences(variant):
    model = _gelu_model(np.float32, **variant)
    feeds = _feeds(model, np.float32)
    rng = np.random.default_rng(11)
    gys = {o.name: rng.normal(size=(6, 5)).astype(np.float32) for o in model.graph.output}
    fused, bg = build_fused_model(model, ["W", "X"])
    grads = fused_gradients(fused, bg, feeds, gys)
    wide = {k: v.astype(np.float64) for k, v in feeds.items()}
    extra = bool(variant.get("extra_reader"))

    def scalar(name, value):
        values = dict(wide, **{name: value})
        outputs = _numpy_gelu(values["X"], values["W"], extra)
        return float(sum(np.sum(y * g) for y, g in zip(outputs, gys.values())))

    for name in ("W", "X"):
        num = central_differences(lambda value, name=name: scalar(name, value), wide[name])
        assert relative_error(num, grads[name]) < 1e-5, name


def test_gelu_chain_is_one_formula():
    _, bg = build_fused_model(_gelu_model(np.float32), ["W"])
    ops = [n.op_type for n in bg.builder.nodes]
    # the formula reads erf from the forward: no Erf, no Div, one Exp
    assert "Erf" not in ops and "Div" not in ops and ops.count("Exp") == 1
    # the chain rule through the five nodes takes ten
    gelu_nodes = len(ops) - ops.count("MatMul") - ops.count("Transpose")
    assert gelu_nodes == 7


def test_gelu_chain_equals_torch():
    torch = pytest.importorskip("torch")
    model = _gelu_model(np.float32)
    feeds = _feeds(model, np.float32)
    gy = np.random.default_rng(2).normal(size=(6, 5)).astype(np.float32)
    fused, bg = build_fused_model(model, ["W", "X"])
    grads = fused_gradients(fused, bg, feeds, {"Y": gy})
    X = torch.tensor(feeds["X"], requires_grad=True)
    W = torch.tensor(feeds["W"], requires_grad=True)
    torch.nn.functional.gelu(X @ W).backward(torch.tensor(gy))
    np.testing.assert_allclose(grads["W"], W.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grads["X"], X.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_other_constants_keep_the_chain_rule():
    """0.4 instead of 0.5 is not a GELU: every node's own rule, which
    differentiates the Erf."""
    model = _gelu_model(np.float32)
    for init in model.graph.initializer:
        if init.name == "half":
            init.CopyFrom(numpy_helper.from_array(np.array(0.4, np.float32), "half"))
    _, bg = build_fused_model(model, ["W"])
    ops = [n.op_type for n in bg.builder.nodes]
    assert "Div" in ops and ops.count("Exp") == 1 and len(ops) > 9


def test_three_gradient_parts_are_one_sum():
    """x read by three MatMuls: its gradient is one Sum of three parts."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.normal(size=(3, 3)), n) for n in ("A", "B", "C")]
    nodes = [helper.make_node("Tanh", ["X"], ["x"])] + [
        helper.make_node("MatMul", ["x", w], [f"y{w}"]) for w in ("A", "B", "C")] + [
        helper.make_node("Sum", ["yA", "yB", "yC"], ["Y"])]
    graph = helper.make_graph(nodes, "fan", [helper.make_tensor_value_info(
        "X", TensorProto.DOUBLE, ["N", 3])], [helper.make_tensor_value_info(
            "Y", TensorProto.DOUBLE, ["N", 3])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    _, bg = build_fused_model(model, ["X"])
    ops = [n.op_type for n in bg.builder.nodes]
    assert ops.count("Sum") == 1 and "Add" not in ops
    feeds = {i.name: numpy_helper.to_array(i) for i in inits}
    feeds["X"] = rng.normal(size=(4, 3))
    check_gradients(model, ["X", "A"], feeds, tol=1e-6)
    # float32 adds in the chain's order: Sum(a, b, c) is (a + b) + c
    fused, bg = build_fused_model(model, ["X"])
    grads = fused_gradients(fused, bg, feeds, {"Y": np.ones((4, 3))})
    x = np.tanh(feeds["X"])
    parts = [np.ones((4, 3)) @ feeds[w].T for w in ("A", "B", "C")]
    expected = ((parts[0] + parts[1]) + parts[2]) * (1 - x ** 2)
    assert relative_error(expected, grads["X"]) < 1e-12


def _slices_model(pieces):
    """W (6, 4) cut by Slices along axis 0 into ``pieces`` ((start, end)
    pairs), concatenated in that order and multiplied by X."""
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array(rng.normal(size=(6, 4)), "W")]
    nodes = []
    for k, (start, end) in enumerate(pieces):
        for name, value in (("s", start), ("e", end)):
            inits.append(numpy_helper.from_array(np.array([value], np.int64), f"{name}{k}"))
        nodes.append(helper.make_node("Slice", ["W", f"s{k}", f"e{k}"], [f"w{k}"]))
    nodes += [helper.make_node("Concat", [f"w{k}" for k in range(len(pieces))], ["Wr"],
                               axis=0),
              helper.make_node("MatMul", ["X", "Wr"], ["Y"])]
    rows = sum(end - start for start, end in pieces)
    graph = helper.make_graph(nodes, "slices", [helper.make_tensor_value_info(
        "X", TensorProto.DOUBLE, ["N", rows])], [helper.make_tensor_value_info(
            "Y", TensorProto.DOUBLE, ["N", 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, {"W": numpy_helper.to_array(inits[0]),
                   "X": rng.normal(size=(3, rows))}


@pytest.mark.parametrize("pieces, tiled", [
    ([(0, 2), (4, 6), (2, 4)], True),   # an LSTM export's reordering of gates
    ([(3, 6), (0, 3)], True),
    ([(0, 2), (1, 6)], False),          # overlapping: the rows of both summed
    ([(0, 2), (3, 6)], False),          # a gap: row 2's gradient is zero
    ([(0, 2), (2, 4), (0, 2)], False),  # a piece taken twice
])
def test_gradients_of_slices_tiling_a_weight_are_one_concat(pieces, tiled):
    model, feeds = _slices_model(pieces)
    _, bg = build_fused_model(model, ["W"])
    ops = [n.op_type for n in bg.builder.nodes]
    assert ("Pad" not in ops and "Sum" not in ops) == tiled, ops
    # no constant left unread (the pads of the Pads the Concat replaced)
    reads = {i for n in bg.builder.nodes for i in n.input}
    assert {t.name for t in bg.builder.initializers} <= reads
    check_gradients(model, ["W", "X"], feeds, tol=1e-6)
    fused, bg = build_fused_model(model, ["W"])
    gy = np.random.default_rng(5).normal(size=(3, 4))
    grads = fused_gradients(fused, bg, feeds, {"Y": gy})
    rows = feeds["X"].T @ gy
    expected, at = np.zeros((6, 4)), 0
    for start, end in pieces:
        expected[start:end] += rows[at:at + end - start]
        at += end - start
    assert relative_error(expected, grads["W"]) < 1e-12
