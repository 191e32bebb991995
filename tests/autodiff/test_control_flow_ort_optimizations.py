"""Gradients through control flow run under onnxruntime's default graph
optimizations (ORT_ENABLE_ALL).

onnxruntime 1.32 (already at ORT_ENABLE_BASIC) breaks a subgraph in which a
graph output is the Identity of a value v that a MatMul also reads when
that MatMul is followed by an Add and reads a Transpose: MatMulAddFusion
turns MatMul + Add into a Gemm; GemmTransposeFusion folds the Transpose
into the Gemm, rebuilding the Gemm with ``FinalizeNodeFusion``, which moves
only the input edges of the Transpose, so the edge v -> Gemm is lost until
the graph is resolved again; EliminateIdentity, in the same pass, then
counts the Identity as v's only consumer, removes it and renames v's
producer's output to the graph output. The Gemm still reads v, which no
longer exists: "Missing Input: v" at run time. The reverse bodies built
for Scan, Loop and If produce that pattern as soon as a body computes
``x @ W + ...`` and the gradient of some value is exactly the gradient of
the pre-activation (a residual or a carried value read once), and only in
float32/float16 (MatMulAddFusion leaves float64 alone). The main graph
has the same pattern when the gradient of a weight or an input is exactly
that of a pre-activation (there onnxruntime refuses the model at session
creation). onnxtrain therefore never makes an output (of the gradient
graph or of a body it builds) the Identity of a value a node of the same
graph produces: that node writes the output itself
(``onnxtrain.autodiff.backward.fold_output_identities``).

Each model here is built in float32 (which triggers the fusions) and in
float64; the float32 gradient models run with the default session options
and are compared with float64 central finite differences and with the same
float32 models run at ORT_DISABLE_ALL; the backward model is then checked
for such Identity outputs.
"""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from gradcheck import check_model, numeric_gradient, relative_error, run
from onnxtrain.autodiff import build_fused_model, build_gradient_models

B, H, T = 2, 3, 4  # batch, hidden (= input) size, iterations


def _session(model, level):
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _make_model(nodes, inputs, outputs, weights, elem, extra_inputs=(),
                extra_inits=()):
    graph = helper.make_graph(
        nodes, "model",
        [_vi(n, elem, s) for n, s in inputs] + list(extra_inputs),
        [_vi(n, elem, s) for n, s in outputs],
        [numpy_helper.from_array(v.astype(helper.tensor_dtype_to_np_dtype(
            elem)), n) for n, v in weights.items()] + list(extra_inits))
    model = helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _weights():
    rng = np.random.default_rng(0)
    return {"W": rng.normal(size=(H, H)) * 0.5,
            "h0": rng.normal(size=(B, H)), "p0": rng.normal(size=(B, H)),
            "Bias": rng.normal(size=(B, H))}


def _scan_model(elem):
    """h_t = h_{t-1} + Tanh(h_{t-1} @ W + x_t) (a residual recurrence: the
    gradient of x_t is that of the pre-activation, which the MatMuls of the
    gradients of W and h also read); y_t = Identity(Tanh(...))."""
    return _scan_of(
        [helper.make_node("MatMul", ["h_in", "W"], ["a"]),
         helper.make_node("Add", ["a", "x_t"], ["pre"]),
         helper.make_node("Tanh", ["pre"], ["t"]),
         helper.make_node("Add", ["h_in", "t"], ["h_out"]),
         helper.make_node("Identity", ["t"], ["y_t"])],
        elem)


def _scan_of(body_nodes, elem):
    """A Scan over X [T, B, H] carrying h (from h0) whose body (inputs h_in,
    x_t; outputs h_out, y_t) is ``body_nodes`` and reads the weight W."""
    body = helper.make_graph(
        body_nodes, "scan_body", [_vi("h_in", elem, [B, H]), _vi("x_t", elem, [B, H])],
        [_vi("h_out", elem, [B, H]), _vi("y_t", elem, [B, H])])
    node = helper.make_node("Scan", ["h0", "X"], ["hT", "Y"], body=body,
                            num_scan_inputs=1)
    w = _weights()
    return _make_model([node], [("X", [T, B, H])],
                       [("hT", [B, H]), ("Y", [T, B, H])],
                       {k: w[k] for k in ("W", "h0")}, elem)


def _scan_shared_gradient_model(elem):
    """h_t = Tanh(h_{t-1} + x_t) @ W, y_t = Identity(Tanh(...)): the
    gradients of h and of x_t entering the step are one value, two outputs
    of the reverse body (the second stays an Identity of the first)."""
    return _scan_of(
        [helper.make_node("Add", ["h_in", "x_t"], ["pre"]),
         helper.make_node("Tanh", ["pre"], ["t"]),
         helper.make_node("MatMul", ["t", "W"], ["h_out"]),
         helper.make_node("Identity", ["t"], ["y_t"])],
        elem)


def _loop_model(elem):
    """Carried h and p: h_i = h_{i-1} + Tanh(h_{i-1} @ W + p_{i-1}),
    p_i = X[i]; z_i = Tanh(...) stacked. The gradient of p entering an
    iteration is that of the pre-activation."""
    i64 = TensorProto.INT64
    body = helper.make_graph(
        [helper.make_node("MatMul", ["h_in", "W"], ["a"]),
         helper.make_node("Add", ["a", "p_in"], ["pre"]),
         helper.make_node("Tanh", ["pre"], ["t"]),
         helper.make_node("Add", ["h_in", "t"], ["h_out"]),
         helper.make_node("Gather", ["X", "i"], ["p_out"], axis=0),
         helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Identity", ["t"], ["z"])],
        "loop_body",
        [helper.make_tensor_value_info("i", i64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         _vi("h_in", elem, [B, H]), _vi("p_in", elem, [B, H])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         _vi("h_out", elem, [B, H]), _vi("p_out", elem, [B, H]),
         _vi("z", elem, [B, H])])
    node = helper.make_node("Loop", ["M", "", "h0", "p0"], ["hM", "pM", "Z"],
                            body=body)
    w = _weights()
    return _make_model(
        [node], [("X", [T, B, H])],
        [("hM", [B, H]), ("pM", [B, H]), ("Z", [T, B, H])],
        {k: w[k] for k in ("W", "h0", "p0")}, elem,
        extra_inits=[numpy_helper.from_array(np.array(T, np.int64), "M")])


def _dense_nodes(prefix, out):
    """out = Tanh(X @ W + Bias) @ W: the gradient of Bias is that of the
    pre-activation, which the MatMul of one term of W's gradient reads."""
    return [helper.make_node("MatMul", ["X", "W"], [f"{prefix}a"]),
            helper.make_node("Add", [f"{prefix}a", "Bias"], [f"{prefix}pre"]),
            helper.make_node("Tanh", [f"{prefix}pre"], [f"{prefix}t"]),
            helper.make_node("MatMul", [f"{prefix}t", "W"], [out])]


def _if_model(elem):
    """then: Tanh(X @ W + Bias) @ W; else: X @ W."""
    then_b = helper.make_graph(_dense_nodes("th_", "then_y"), "then", [],
                               [_vi("then_y", elem, [B, H])])
    else_b = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["else_y"])], "else", [],
        [_vi("else_y", elem, [B, H])])
    node = helper.make_node("If", ["cond"], ["Y"], then_branch=then_b,
                            else_branch=else_b)
    w = _weights()
    return _make_model(
        [node], [("X", [B, H])], [("Y", [B, H])],
        {k: w[k] for k in ("W", "Bias")}, elem,
        extra_inputs=[helper.make_tensor_value_info(
            "cond", TensorProto.BOOL, [])])


def _dense_model(elem):
    """No control flow: the same pattern in the main graph (the Identity
    naming the gradient ``Bias_grad``)."""
    w = _weights()
    return _make_model(_dense_nodes("", "Y"), [("X", [B, H])],
                       [("Y", [B, H])], {k: w[k] for k in ("W", "Bias")},
                       elem)


def _graphs(graph):
    yield graph
    for node in graph.node:
        for att in node.attribute:
            for sub in list(att.graphs) + ([att.g] if att.HasField("g")
                                            else []):
                yield from _graphs(sub)


def _check_no_output_identity(model):
    """No output of the graph or of a subgraph is the Identity of a value
    another node of that graph produces, unless that value is an output too
    (the user's own Scan/Loop/If bodies run in the forward and fused models
    as written: not checked)."""
    for graph in _graphs(model.graph):
        producers = {o: n for n in graph.node for o in n.output}
        outputs = {o.name for o in graph.output}
        for out in graph.output:
            node = producers.get(out.name)
            if node is not None and node.op_type == "Identity":
                source = node.input[0]
                assert source not in producers or source in outputs, (
                    graph.name, out.name)


def _feeds(model, cond=True):
    rng = np.random.default_rng(1)
    feeds = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    feeds["X"] = rng.normal(size=(T, B, H) if any(
        n.op_type in ("Scan", "Loop") for n in model.graph.node) else (B, H))
    feeds["cond"] = np.array(cond)
    return feeds


def _cast(feeds, dtype):
    return {k: v.astype(dtype) if v.dtype.kind == "f" else v
            for k, v in feeds.items()}


def _split(gm, feeds, grad_outputs, level):
    """Weight gradients through the split form, both sessions at ``level``."""
    fwd = run(_session(gm.forward_model, level), feeds)
    bfeeds = {g: grad_outputs[o]
              for g, o in zip(gm.grad_output_names, gm.outputs)}
    for name in gm.backward_inputs:
        bfeeds[name] = feeds[name] if name in feeds else fwd[name]
    result = run(_session(gm.backward_model, level), bfeeds)
    return {w: result[g] for w, g in zip(gm.wrt, gm.grad_names)}


def _fused(fused, bg, feeds, grad_outputs, level):
    all_feeds = dict(feeds)
    all_feeds.update({g: grad_outputs[o]
                      for g, o in zip(bg.grad_output_names, bg.outputs)})
    result = run(_session(fused, level), all_feeds)
    return {w: result[g] for w, g in zip(bg.wrt, bg.grad_names)}


def _check(build, wrt, cond=True):
    model64, model32 = build(TensorProto.DOUBLE), build(TensorProto.FLOAT)
    feeds64 = _feeds(model64, cond)
    feeds32 = _cast(feeds64, np.float32)
    gm = build_gradient_models(model32, wrt)
    fused, bg = build_fused_model(model32, wrt)
    for m in (gm.forward_model, gm.backward_model, fused):
        check_model(m)
    inference64 = _session(build_gradient_models(model64, wrt).inference_model,
                           ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    y = run(inference64, feeds64)
    rng = np.random.default_rng(2)
    grad_outputs64 = {o: rng.normal(size=y[o].shape) for o in gm.outputs}
    grad_outputs32 = _cast(grad_outputs64, np.float32)
    full = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    none = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    split = _split(gm, feeds32, grad_outputs32, full)
    fused_grads = _fused(fused, bg, feeds32, grad_outputs32, full)
    reference = _split(gm, feeds32, grad_outputs32, none)
    for w in wrt:
        num = numeric_gradient(inference64, feeds64, w, grad_outputs64)
        for got in (split[w], fused_grads[w]):
            assert got.dtype == np.float32
            assert relative_error(num, got) < 1e-4, (w, got, num)
            assert relative_error(reference[w], got) < 1e-5, w
    _check_no_output_identity(gm.backward_model)  # the user's bodies aside


@pytest.mark.parametrize("wrt", [["W", "X"], ["W", "h0", "X"]])
def test_scan_residual_rnn_with_outer_weight(wrt):
    _check(_scan_model, wrt)


def test_scan_one_gradient_for_a_state_and_a_scan_input():
    _check(_scan_shared_gradient_model, ["W", "h0", "X"])


def test_loop_with_carried_pre_activation_input():
    _check(_loop_model, ["W", "h0", "p0", "X"])


@pytest.mark.parametrize("cond", [True, False])
def test_if_dense_branch(cond):
    _check(_if_model, ["W", "Bias"], cond)


@pytest.mark.parametrize("wrt", [["W", "Bias"], ["W", "Bias", "X"]])
def test_main_graph_dense(wrt):
    _check(_dense_model, wrt)
