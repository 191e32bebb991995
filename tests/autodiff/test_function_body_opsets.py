"""Ops differentiated through their standard function body, in models of a
newer opset than the body's (the body is converted) and with a dynamic
batch dimension (shapes known only symbolically): every op of
``EXPANDED_OPS`` at its first opset, where its body changes and at the
newest; LayerNormalization stashing in float64 or returning its float32
statistics from float64 inputs; Attention whose hidden sizes are symbolic;
inputs of unknown rank refused with an error naming the node."""
import numpy as np
import onnx
import onnx.defs
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxtrain.autodiff import build_fused_model, build_gradient_models

from gradcheck import (central_differences, check_gradients, check_model,
                       fused_gradients, relative_error, session,
                       split_gradients)

TOL = 1e-6
#: Newest opset of the onnx installed.
LAST = onnx.defs.onnx_opset_version()
#: Settings of a float32 case: finite-difference step, relative error.
EPS32, TOL32 = 1e-3, 2e-2


def _check(model, wrt, feeds, eps=1e-6, tol=TOL):
    """:func:`gradcheck.check_gradients`; onnx's checker refuses
    GroupNormalization-18 (deprecated) in the model given, and so in the
    models holding its node."""
    node = model.graph.node[0]
    check_gradients(model, wrt, feeds, 0, eps=eps, tol=tol, check_node_models=not (
        node.op_type == "GroupNormalization" and model.opset_import[0].version < 21))


def _layer_norm_model(opset):
    rng = np.random.default_rng(1)
    graph = helper.make_graph(
        [helper.make_node("LayerNormalization", ["X", "scale", "bias"], ["Y"],
                          axis=-1)],
        "layer_norm",
        [helper.make_tensor_value_info("X", TensorProto.DOUBLE, ["N", 4])],
        [helper.make_tensor_value_info("Y", TensorProto.DOUBLE, ["N", 4])],
        [numpy_helper.from_array(rng.normal(size=4), "scale"),
         numpy_helper.from_array(rng.normal(size=4), "bias")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("opset", [17, 18, 19, 20, 21, 22, 23, 24])
def test_layer_normalization_at_every_opset(opset):
    # the body (opset 18) leaves out the Mean and InvStdDev nodes when the
    # node does not use them; converting it to a newer opset used to fail
    model = _layer_norm_model(opset)
    feeds = {"X": np.random.default_rng(2).normal(size=(3, 4)),
             **{i.name: numpy_helper.to_array(i) for i in model.graph.initializer}}
    _check(model, ["scale", "bias", "X"], feeds)


def _cross_entropy_model(opset, batch):
    """Gemm scores then SoftmaxCrossEntropyLoss (mean), as PyTorch exports
    ``cross_entropy``; ``batch``: a static size or a symbolic name."""
    rng = np.random.default_rng(3)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["X", "W", "B"], ["scores"], transB=1),
         helper.make_node("SoftmaxCrossEntropyLoss", ["scores", "label"],
                          ["loss"], reduction="mean")],
        "cross_entropy",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [batch, 4]),
         helper.make_tensor_value_info("label", TensorProto.INT64, [batch])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        [numpy_helper.from_array(rng.normal(size=(3, 4)).astype(np.float32), "W"),
         numpy_helper.from_array(rng.normal(size=3).astype(np.float32), "B")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _softmax_cross_entropy_gradients(model, X, label):
    """dloss/dW, dloss/dB in numpy: (softmax - one_hot) / n."""
    W, B = (numpy_helper.to_array(i).astype(np.float64) for i in model.graph.initializer)
    scores = X @ W.T + B
    p = np.exp(scores - scores.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    delta = (p - np.eye(3)[label]) / X.shape[0]
    return delta.T @ X, delta.sum(axis=0)


@pytest.mark.parametrize("batch", [5, "N"])
@pytest.mark.parametrize("opset", [13, 15, 18, 20, 24])
def test_softmax_cross_entropy_loss_with_a_dynamic_batch(opset, batch):
    # at opset 13 the body reshapes the log-probabilities to Shape(scores):
    # shape inference (Reshape-13 does not read propagated shape data) left
    # their rank unknown with a symbolic batch; from opset 15 the body is
    # converted from an older one
    model = _cross_entropy_model(opset, batch)
    rng = np.random.default_rng(4)
    X = rng.normal(size=(5, 4)).astype(np.float32)
    label = np.array([0, 2, 1, 1, 0], dtype=np.int64)
    gm = build_gradient_models(model, ["W", "B"])
    check_model(gm.backward_model)
    feeds = {"X": X, "label": label,
             **{i.name: numpy_helper.to_array(i) for i in model.graph.initializer}}
    _, split = split_gradients(gm, feeds, {"loss": np.array(1.0, dtype=np.float32)})
    dW, dB = _softmax_cross_entropy_gradients(model, X.astype(np.float64), label)
    np.testing.assert_allclose(split["W"], dW, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(split["B"], dB, rtol=1e-5, atol=1e-6)


def test_a_loss_graph_with_integer_labels_trains_with_float_updates():
    # the learning rate and the update's scalars used to take the labels'
    # dtype (int64): onnxruntime refused the update graph's inputs
    from onnxtrain import LearningRateSGD, OrtGradientOptimizer
    model = _cross_entropy_model(17, "N")
    rng = np.random.default_rng(5)
    X = rng.normal(size=(8, 4)).astype(np.float32)
    label = np.array([0, 2, 1, 1, 0, 2, 2, 1], dtype=np.int64)
    est = OrtGradientOptimizer(model, max_iter=1, batch_size=8, warm_start=True,
                               learning_rate=LearningRateSGD(0.5, learning_rate="constant"))
    est.fit(X, label)
    dW, dB = _softmax_cross_entropy_gradients(model, X.astype(np.float64), label)
    W0, B0 = (numpy_helper.to_array(i) for i in model.graph.initializer)
    W1, B1 = est.get_state()
    np.testing.assert_allclose(W1, W0 - 0.5 * dW, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(B1, B0 - 0.5 * dB, rtol=1e-5, atol=1e-6)
    # the model given is not modified
    assert onnx.numpy_helper.to_array(model.graph.initializer[0]).tolist() == W0.tolist()


# ---------------------------------------------------------------------------
# every op differentiated through its body, at its first opset, at the
# opsets where its body changes and at the newest, with a symbolic batch
# ---------------------------------------------------------------------------

def _node_model(op, inputs, outputs, opset, weights=(), output_types=None,
                **attrs):
    """A model of one ``op`` node. ``inputs``: ``(name, value)`` pairs (name
    "" for an absent optional input); those named in ``weights`` become
    initializers, the others graph inputs whose first dim is the symbolic
    ``N``. The outputs are typed by onnx shape inference, their element
    type by ``output_types`` where given. Returns ``(model, feeds)``."""
    vis, inits, feeds = [], [], {}
    for name, value in inputs:
        if not name:
            continue
        feeds[name] = value
        if name in weights:
            inits.append(numpy_helper.from_array(value, name))
            continue
        vis.append(helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(value.dtype),
            ["N", *value.shape[1:]]))
    node = helper.make_node(op, [i for i, _ in inputs], outputs, name="node0",
                            **attrs)
    graph = helper.make_graph([node], op, vis, [
        helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None)
        for o in outputs if o], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    inferred = onnx.shape_inference.infer_shapes(model)
    model.graph.ClearField("output")
    model.graph.output.extend(inferred.graph.output)
    for o in model.graph.output:
        if not o.type.tensor_type.elem_type:  # GroupNormalization: not inferred
            o.type.CopyFrom(vis[0].type)
        o.type.tensor_type.elem_type = (output_types or {}).get(
            o.name, o.type.tensor_type.elem_type)
    return model, feeds


def _grid_case(op, opset):
    """``(model, wrt, feeds, float64)`` of ``op`` at ``opset``: float64 where
    onnxruntime has a float64 kernel computing in float64, else float32."""
    rng = np.random.default_rng(7)
    f64 = lambda *shape: rng.normal(size=shape)  # noqa: E731
    f32 = lambda *shape: rng.normal(size=shape).astype(np.float32)  # noqa: E731
    if op == "RMSNormalization":
        model, feeds = _node_model(op, [("X", f64(2, 3, 4)), ("S", f64(3, 4))],
                                   ["Y"], opset, ["S"], axis=1)
        return model, ["X", "S"], feeds, True
    if op == "GroupNormalization":  # onnxruntime's float64 kernel: float32 inside
        per = 4 if opset >= 21 else 2
        model, feeds = _node_model(
            op, [("X", f32(2, 4, 3)), ("S", f32(per)), ("B", f32(per))], ["Y"],
            opset, ["S", "B"], num_groups=2, epsilon=1e-3)
        return model, ["X", "S", "B"], feeds, False
    if op == "MeanVarianceNormalization":  # no float64 kernel
        model, feeds = _node_model(op, [("X", f32(2, 3, 2, 2))], ["Y"], opset,
                                   axes=[0, 2, 3])
        return model, ["X"], feeds, False
    if op == "NegativeLogLikelihoodLoss":
        labels = np.array([[0, 1], [2, 1], [1, 0], [2, 2]], dtype=np.int64)
        model, feeds = _node_model(
            op, [("X", f64(4, 3, 2)), ("L", labels), ("W", rng.uniform(0.5, 1.5, 3))],
            ["loss"], opset, ["W"], reduction="mean", ignore_index=1)
        return model, ["X"], feeds, True
    if op == "SoftmaxCrossEntropyLoss":
        labels = np.array([0, 2, 1, 2], dtype=np.int64)
        model, feeds = _node_model(
            op, [("X", f64(4, 3)), ("L", labels), ("W", rng.uniform(0.5, 1.5, 3))],
            ["loss", "log_prob"], opset, ["W"], reduction="sum", ignore_index=2)
        return model, ["X"], feeds, True
    if op == "Attention":  # 3D inputs, GQA, float mask and causal
        model, feeds = _node_model(
            op, [("Q", f64(2, 3, 8)), ("K", f64(2, 4, 4)), ("V", f64(2, 4, 4)),
                 ("M", f64(3, 4))], ["Y"], opset, ["M"],
            q_num_heads=4, kv_num_heads=2, is_causal=1)
        return model, ["Q", "K", "V", "M"], feeds, True
    if op == "RotaryEmbedding":  # no float64 kernel
        pos = np.array([[0, 3, 5], [1, 2, 7]], dtype=np.int64)
        model, feeds = _node_model(
            op, [("X", f32(2, 3, 16)), ("C", f32(10, 4)), ("S", f32(10, 4)),
                 ("P", pos)], ["Y"], opset, ["C", "S"], num_heads=2, interleaved=1)
        return model, ["X", "C", "S"], feeds, False
    if op == "CausalConvWithState":  # float32 only
        model, feeds = _node_model(
            op, [("X", f32(2, 3, 5)), ("W", f32(3, 1, 3)), ("B", f32(3)),
                 ("P", f32(2, 3, 2))], ["Y", "state"], opset, ["W", "B"],
            activation="silu")
        return model, ["X", "W", "B", "P"], feeds, False
    assert op == "LinearAttention"  # float32 only
    key = f32(2, 3, 2, 4)
    key /= np.linalg.norm(key, axis=-1, keepdims=True)
    model, feeds = _node_model(
        op, [("Q", f32(2, 3, 8)), ("K", key.reshape(2, 3, 8)), ("V", f32(2, 3, 8)),
             ("P", 0.3 * f32(2, 2, 4, 4)), ("D", -0.1 * np.abs(f32(2, 3, 8))),
             ("Bt", rng.uniform(0.2, 0.8, (2, 3, 2)).astype(np.float32))],
        ["Y", "state"], opset, update_rule="gated_delta", q_num_heads=2,
        kv_num_heads=2)
    return model, ["Q", "K", "V", "P", "D", "Bt"], feeds, False


GRID = [("RMSNormalization", v) for v in (23, LAST)] + \
    [("GroupNormalization", v) for v in (18, 20, 21, LAST)] + \
    [("MeanVarianceNormalization", v) for v in (9, 13, 18, LAST)] + \
    [("NegativeLogLikelihoodLoss", v) for v in (12, 13, 18, 22, LAST)] + \
    [("SoftmaxCrossEntropyLoss", v) for v in (12, 13, 18, LAST)] + \
    [("Attention", v) for v in (23, 24, 25, LAST)] + \
    [("RotaryEmbedding", v) for v in (23, LAST)] + \
    [("CausalConvWithState", v) for v in (27, LAST)] + \
    [("LinearAttention", v) for v in (27, LAST)]


@pytest.mark.parametrize("op,opset", GRID)
def test_function_body_gradients_across_opsets(op, opset):
    model, wrt, feeds, float64 = _grid_case(op, opset)
    try:
        session(model)
    except Exception as exc:  # noqa: BLE001 - onnxruntime older than onnx
        if "opset" not in str(exc).lower():
            raise
        pytest.skip(f"onnxruntime does not run opset {opset}: {exc}")
    if float64:
        _check(model, wrt, feeds)
    else:
        _check(model, wrt, feeds, eps=EPS32, tol=TOL32)


def _layer_norm_numpy(X, scale, bias, epsilon=1e-5):
    """LayerNormalization over the last axis: ``(Y, Mean, InvStdDev)``."""
    mean = X.mean(axis=-1, keepdims=True)
    inv = 1 / np.sqrt(((X - mean) ** 2).mean(axis=-1, keepdims=True) + epsilon)
    return (X - mean) * inv * scale + bias, mean, inv


@pytest.mark.parametrize("opset", [17, 18, 21, LAST])
def test_float64_layer_normalization_with_its_statistics(opset):
    # a float64 LayerNormalization normalizes in float64 but its Mean and
    # InvStdDev are of the stash type, float32: the backward graph fed
    # their float32 gradients to the float64 expansion (a type error)
    rng = np.random.default_rng(8)
    model, feeds = _node_model(
        "LayerNormalization", [("X", rng.normal(size=(3, 2, 4))),
                               ("S", rng.normal(size=4)), ("B", rng.normal(size=4))],
        ["Y", "Mean", "InvStdDev"], opset, ["S", "B"],
        {"Mean": TensorProto.FLOAT, "InvStdDev": TensorProto.FLOAT})
    gm = build_gradient_models(model, ["X", "S", "B"])
    check_model(gm.backward_model)
    fused, bg = build_fused_model(model, ["X", "S", "B"])
    check_model(fused)
    grads = {"Y": rng.normal(size=(3, 2, 4)),
             "Mean": rng.normal(size=(3, 2, 1)).astype(np.float32),
             "InvStdDev": rng.normal(size=(3, 2, 1)).astype(np.float32)}
    _, split = split_gradients(gm, feeds, grads)
    fused_grads = fused_gradients(fused, bg, feeds, grads)
    for w in ("X", "S", "B"):
        def objective(value, w=w):
            args = {**feeds, w: value}
            outs = _layer_norm_numpy(args["X"], args["S"], args["B"])
            return sum(float(np.sum(o * grads[n])) for o, n in
                       zip(outs, ("Y", "Mean", "InvStdDev")))
        num = central_differences(objective, feeds[w])
        assert relative_error(num, split[w]) < TOL, w
        assert relative_error(num, fused_grads[w]) < TOL, w


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("opset", [17, 18, LAST])
def test_layer_normalization_stashed_in_float64(opset, dtype):
    # stash_type=11 (double): onnx builds no body for it; the rule refused
    rng = np.random.default_rng(11)
    model, feeds = _node_model(
        "LayerNormalization", [("X", rng.normal(size=(3, 2, 4)).astype(dtype)),
                               ("S", rng.normal(size=(2, 4)).astype(dtype))],
        ["Y"], opset, ["S"], axis=1, stash_type=TensorProto.DOUBLE)
    if dtype == np.float64:
        _check(model, ["X", "S"], feeds)
    else:
        _check(model, ["X", "S"], feeds, eps=EPS32, tol=TOL32)


@pytest.mark.parametrize("opset", [23, LAST])
def test_attention_with_symbolic_hidden_sizes(opset):
    # onnx's Attention inference gives the output a dim of 0 where V's dims
    # are symbolic: the backward graph's gradient input took that shape and
    # onnxruntime refused the gradient of the actual output
    rng = np.random.default_rng(9)
    graph = helper.make_graph(
        [helper.make_node("Attention", ["Q", "K", "V"], ["Y"], q_num_heads=2,
                          kv_num_heads=2)], "attention",
        [helper.make_tensor_value_info(n, TensorProto.DOUBLE, ["N", f"{n}_seq", f"{n}_hidden"])
         for n in "QKV"],
        [helper.make_tensor_value_info("Y", TensorProto.DOUBLE, None)])
    model = onnx.shape_inference.infer_shapes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]))
    assert model.graph.output[0].type.tensor_type.shape.dim[2].dim_value == 0
    feeds = {"Q": rng.normal(size=(2, 3, 8)), "K": rng.normal(size=(2, 4, 8)),
             "V": rng.normal(size=(2, 4, 6))}
    _check(model, ["Q", "K", "V"], feeds)


def _unknown_rank_model(op, opset, **attrs):
    """``op`` reading X reshaped to a shape given at run time: its rank is
    unknown to shape inference."""
    rng = np.random.default_rng(10)
    inputs = {"RMSNormalization": ["X", "S"],
              "RotaryEmbedding": ["X", "C", "S", "P"]}[op]
    inits = [numpy_helper.from_array(rng.normal(size=4).astype(np.float32), "S")]
    if op == "RotaryEmbedding":
        inits = [numpy_helper.from_array(rng.normal(size=(8, 2)).astype(np.float32), n)
                 for n in ("C", "S")]
        inits.append(numpy_helper.from_array(np.zeros((2, 3), np.int64), "P"))
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["X0", "shape"], ["X"]),
         helper.make_node(op, inputs, ["Y"], name="node0", **attrs)], op,
        [helper.make_tensor_value_info("X0", TensorProto.FLOAT, [2, 2, 3, 4]),
         helper.make_tensor_value_info("shape", TensorProto.INT64, ["R"])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 2, 3, 4])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_unknown_rank_is_refused_naming_the_node():
    # the body cannot be built, or its gradient needs ranks: a clear error
    # naming the node, never a wrong gradient
    with pytest.raises(NotImplementedError,
                       match=r"RotaryEmbedding \(node 'node0'\).*rank of 'X' is unknown"):
        build_gradient_models(_unknown_rank_model("RotaryEmbedding", 23), ["X0"])
    with pytest.raises(ValueError, match="RMSNormalization node 'node0', through "
                                         "its function body: .*rank"):
        build_gradient_models(_unknown_rank_model("RMSNormalization", 23), ["X0", "S"])
