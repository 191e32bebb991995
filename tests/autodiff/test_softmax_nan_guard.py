"""Softmax's gradient zeroes the NaN rows of a masked softmax (a row of
-inf), and skips that guard on unmasked attention scores (a product,
possibly scaled by a constant), where a NaN row means an overflowed
forward pass."""
import numpy as np
import torch
from onnx import TensorProto, helper, numpy_helper

from gradcheck import split_gradients
from onnxtrain.autodiff import build_gradient_models
from onnxtrain.graph import make_model

D = TensorProto.DOUBLE
RNG = np.random.default_rng(5)


def _attention(extra_nodes, extra_inits, scores):
    nodes = [helper.make_node("Transpose", ["K"], ["Kt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["Q", "Kt"], ["qk"]),
             helper.make_node("Mul", ["qk", "scale"], ["s"])] + extra_nodes + [
             helper.make_node("Softmax", [scores], ["P"], axis=-1),
             helper.make_node("MatMul", ["P", "V"], ["Y"])]
    inits = dict(extra_inits, scale=np.array(0.125))
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, D, [2, 4, 3]) for n in ("Q", "K", "V")],
        [helper.make_tensor_value_info("Y", D, [2, 4, 3])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return make_model(graph, [helper.make_opsetid("", 17)])


def test_unmasked_scores_need_no_guard_and_match_torch():
    model = _attention([], {}, "s")
    gm = build_gradient_models(model, ["Q", "K", "V"])
    assert not any(n.op_type == "IsNaN" for n in gm.backward_model.graph.node)
    feeds = {n: RNG.standard_normal((2, 4, 3)) for n in ("Q", "K", "V")}
    dy = RNG.standard_normal((2, 4, 3))
    _, grads = split_gradients(gm, feeds, {"Y": dy})
    t = {n: torch.tensor(v, requires_grad=True) for n, v in feeds.items()}
    p = torch.softmax(t["Q"] @ t["K"].transpose(1, 2) * 0.125, dim=-1)
    (p @ t["V"]).backward(torch.tensor(dy))
    for name in t:
        np.testing.assert_allclose(grads[name], t[name].grad.numpy(), rtol=1e-10,
                                   atol=1e-12)


def test_masked_row_keeps_its_zero_gradient():
    # a row of -inf (all keys masked): NaN probabilities, masked again after
    mask = np.zeros((2, 4, 4))
    mask[0, 1] = -np.inf
    keep = np.ones((2, 4, 1), bool)
    keep[0, 1] = False
    model = _attention([helper.make_node("Add", ["s", "mask"], ["masked"])],
                       {"mask": mask}, "masked")
    graph = model.graph
    graph.node[-1].output[0] = "Yraw"
    graph.node.append(helper.make_node("Where", ["keep", "Yraw", "zero"], ["Y"]))
    graph.initializer.extend([numpy_helper.from_array(keep, "keep"),
                              numpy_helper.from_array(np.array(0.0), "zero")])
    gm = build_gradient_models(model, ["Q", "K", "V"])
    assert any(n.op_type == "IsNaN" for n in gm.backward_model.graph.node)
    feeds = {n: RNG.standard_normal((2, 4, 3)) for n in ("Q", "K", "V")}
    _, grads = split_gradients(gm, feeds, {"Y": RNG.standard_normal((2, 4, 3))})
    for name in ("Q", "K"):
        assert np.isfinite(grads[name]).all()
    np.testing.assert_array_equal(grads["Q"][0, 1], 0)
