"""Gradients of RNN, GRU and LSTM (:mod:`onnxtrain.autodiff.rules.recurrent`).

Three oracles:

- onnxruntime's own kernels check the expansion the rule differentiates
  (float32: onnxruntime has no float64 GRU or LSTM kernel and no
  ``layout=1``; the ``layout=1`` expansion is checked against the kernel
  run on transposed inputs);
- central finite differences in float64 of that expansion check the
  gradient of every input (X, W, R, B, initial_h, initial_c, P), through the
  backward model of :func:`onnxtrain.autodiff.build_gradient_models` run in
  float64, with symbolic sequence length and batch size, run at two sizes;
- torch autograd checks an LSTM end to end (float32).
"""
import numpy as np
import pytest
import onnx
from onnx import TensorProto, helper

from gradcheck import (check_model, expansion_model, numeric_gradient,
                       relative_error, run, session, split_gradients)
from onnxtrain.autodiff import build_gradient_models
from onnxtrain.autodiff.rules.recurrent import expand
from onnxtrain.graph.recurrent_lowering import lower_lstms, lower_recurrent

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
OPTIONAL = ("B", "L", "H0", "C0", "P")


def _model(op, dtype=np.float32, direction="forward", layout=0, hidden=2,
           inputs=("B", "H0", "C0"), symbolic=False, **attrs):
    """A one-node model; X is (T, N, 3), or (N, T, 3) with layout=1."""
    d = 2 if direction == "bidirectional" else 1
    g = GATES[op]
    t, n = ("T", "N") if symbolic else (3, 2)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    state = [n, d, hidden] if layout else [d, n, hidden]
    shapes = {"X": [n, t, 3] if layout else [t, n, 3], "W": [d, g * hidden, 3],
              "R": [d, g * hidden, hidden], "B": [d, 2 * g * hidden],
              "L": [n], "H0": state, "C0": state, "P": [d, 3 * hidden]}
    names = ["X", "W", "R", "B", "L", "H0", "C0", "P"][:8 if op == "LSTM" else 6]
    names = [k if k in ("X", "W", "R") or k in inputs else "" for k in names]
    while not names[-1]:
        names.pop()
    outputs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    node = helper.make_node(op, names, outputs, hidden_size=hidden,
                            direction=direction, **attrs,
                            **({"layout": 1} if layout else {}))
    vis = [helper.make_tensor_value_info(
        k, TensorProto.INT32 if k == "L" else elem, shapes[k])
        for k in names if k]
    y = [n, t, d, hidden] if layout else [t, d, n, hidden]
    outs = [helper.make_tensor_value_info(o, elem, y if o == "Y" else state)
            for o in outputs]
    model = helper.make_model(helper.make_graph([node], op, vis, outs),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    check_model(model)
    return model


def _feeds(model, dtype, seed=0, t=3, n=2, lens=None):
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in model.graph.input:
        dims = [d.dim_value or {"T": t, "N": n}[d.dim_param]
                for d in vi.type.tensor_type.shape.dim]
        if vi.name == "L":
            feeds["L"] = np.asarray(lens, dtype=np.int32)
        else:
            feeds[vi.name] = rng.uniform(-1, 1, dims).astype(dtype)
    return feeds


def _to_layout0(feeds):
    moved = dict(feeds)
    for k in ("X", "H0", "C0"):
        if k in moved:
            moved[k] = np.ascontiguousarray(np.swapaxes(feeds[k], 0, 1))
    return moved


# one row per configuration: (op, attributes, optional inputs, sequence_lens)
FORWARD_CASES = [
    ("RNN", {}, ("B", "H0"), None),
    ("RNN", {"direction": "reverse", "clip": 0.3}, ("B",), [3, 1]),
    ("RNN", {"direction": "bidirectional", "activations": ["Relu", "Affine"],
             "activation_alpha": [0.7], "activation_beta": [0.2]}, (), None),
    ("GRU", {"linear_before_reset": 1}, ("B", "H0"), None),
    ("GRU", {"linear_before_reset": 1, "direction": "bidirectional",
             "clip": 0.4}, ("B", "H0"), [2, 3]),
    ("GRU", {"activations": ["HardSigmoid", "LeakyRelu"],
             "activation_alpha": [0.3, 0.2], "activation_beta": [0.6]},
     ("B",), None),
    ("LSTM", {"input_forget": 1}, ("B", "H0", "C0"), None),
    ("LSTM", {"direction": "bidirectional", "clip": 0.5},
     ("B", "H0", "C0", "P"), [1, 3]),
    ("LSTM", {"direction": "reverse", "input_forget": 1},
     ("B", "P"), [3, 2]),
    ("LSTM", {"activations": ["Sigmoid", "Softsign", "ScaledTanh"],
              "activation_alpha": [0.8], "activation_beta": [1.5]}, (), None),
]


@pytest.mark.parametrize("op, attrs, inputs, lens", FORWARD_CASES)
def test_expansion_matches_onnxruntime(op, attrs, inputs, lens):
    inputs = tuple(inputs) + (("L",) if lens else ())
    model = _model(op, inputs=inputs, **attrs)
    feeds = _feeds(model, np.float32, lens=lens)
    expected = session(model).run(None, feeds)
    got = session(expansion_model(model, expand)).run(None, feeds)
    for e, a in zip(expected, got):
        np.testing.assert_allclose(a, e, atol=2e-6)
    if lens is not None:  # Y is zero after the shortest row's length
        b = int(np.argmin(lens))
        assert not np.any(expected[0][lens[b]:, :, b])


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_layout_1_matches_onnxruntime_on_transposed_inputs(op):
    inputs = ("B", "H0", "C0", "P", "L")
    model = _model(op, inputs=inputs, layout=1, direction="bidirectional")
    feeds = _feeds(model, np.float32, lens=[3, 2])
    reference = _model(op, inputs=inputs, direction="bidirectional")
    expected = session(reference).run(None, _to_layout0(feeds))
    got = session(expansion_model(model, expand)).run(None, feeds)
    np.testing.assert_allclose(got[0], np.transpose(expected[0], (2, 0, 1, 3)),
                               atol=2e-6)
    for e, a in zip(expected[1:], got[1:]):
        np.testing.assert_allclose(a, np.swapaxes(e, 0, 1), atol=2e-6)


def _backward_gradients(gm, feeds, grad_outputs, forward=None):
    """Run only the backward model (the forward one holds the recurrent
    node, which onnxruntime does not run in float64); ``forward``: the
    node's outputs it reads (the direct LSTM gradient reads Y)."""
    bfeeds = {g: grad_outputs[o]
              for g, o in zip(gm.grad_output_names, gm.outputs)}
    known = dict(feeds, **(forward or {}))
    bfeeds.update({name: known[name] for name in gm.backward_inputs})
    result = run(session(gm.backward_model), bfeeds)
    return {w: result[g] for w, g in zip(gm.wrt, gm.grad_names)}


# (op, attributes, sequence_lens), every optional float input present
GRADIENT_CASES = [
    ("RNN", {"direction": "bidirectional"}, [3, 1]),
    ("GRU", {"linear_before_reset": 1}, None),
    ("GRU", {"direction": "bidirectional"}, [2, 3]),
    ("LSTM", {"input_forget": 1, "direction": "reverse"}, [1, 3]),
    ("LSTM", {"direction": "bidirectional", "layout": 1}, [3, 2]),
]


@pytest.mark.parametrize("op, attrs, lens", GRADIENT_CASES)
def test_gradients_match_finite_differences_float64(op, attrs, lens):
    inputs = OPTIONAL if lens else tuple(k for k in OPTIONAL if k != "L")
    model = _model(op, np.float64, inputs=inputs, symbolic=True, **attrs)
    wrt = [i.name for i in model.graph.input if i.name != "L"]
    gm = build_gradient_models(model, wrt)
    check_model(gm.backward_model)
    reference = session(expansion_model(model, expand))
    for t, n, lens_tn in ((3, 2, lens), (4, 1, lens and [4])):
        feeds = _feeds(model, np.float64, seed=t, t=t, n=n, lens=lens_tn)
        outputs = run(reference, feeds)
        rng = np.random.default_rng(t)
        grad_outputs = {o: rng.normal(size=v.shape) for o, v in outputs.items()}
        grads = _backward_gradients(gm, feeds, grad_outputs)
        for w in wrt:
            expected = numeric_gradient(reference, feeds, w, grad_outputs)
            assert relative_error(expected, grads[w]) < 1e-6, (w, t, n)


# float32 through onnxruntime's kernels and default graph optimizations
KERNEL_CASES = [
    ("RNN", {"direction": "bidirectional", "activations": ["Relu", "Tanh"]},
     [1, 3]),
    ("GRU", {"direction": "reverse", "linear_before_reset": 1, "clip": 0.6},
     [2, 3]),
    ("LSTM", {"input_forget": 1, "clip": 0.7}, None),
]


@pytest.mark.parametrize("op, attrs, lens", KERNEL_CASES)
def test_split_form_against_onnxruntime_kernels_float32(op, attrs, lens):
    inputs = OPTIONAL if lens else tuple(k for k in OPTIONAL if k != "L")
    model = _model(op, inputs=inputs, **attrs)
    wrt = [i.name for i in model.graph.input if i.name != "L"]
    gm = build_gradient_models(model, wrt)
    feeds = _feeds(model, np.float32, lens=lens)
    inference = session(gm.inference_model)
    rng = np.random.default_rng(5)
    grad_outputs = {o: rng.normal(size=v.shape)
                    for o, v in run(inference, feeds).items()}
    _, grads = split_gradients(gm, feeds, {
        o: v.astype(np.float32) for o, v in grad_outputs.items()})
    for w in wrt:
        expected = numeric_gradient(inference, feeds, w, grad_outputs,
                                    eps=1e-3)
        assert relative_error(expected, grads[w]) < 5e-3, w


def test_only_some_outputs_and_inputs():
    # Y_h alone, gradient of R and initial_c only
    model = _model("LSTM", np.float64, inputs=("B", "H0", "C0", "P"))
    gm = build_gradient_models(model, ["R", "C0"], outputs=["Y_h"])
    feeds = _feeds(model, np.float64)
    reference = session(expansion_model(model, expand))
    grad_outputs = {"Y_h": np.random.default_rng(3).normal(size=(1, 2, 2))}
    grads = _backward_gradients(gm, feeds, grad_outputs)
    for w in ("R", "C0"):
        expected = numeric_gradient(reference, feeds, w, grad_outputs)
        assert relative_error(expected, grads[w]) < 1e-6, w


@pytest.mark.parametrize("attrs, match", [
    ({"activations": ["Sigmoid", "Swish"]}, "activations: 'Swish'"),
    ({"activations": ["Sigmoid"]}, "activations="),
    ({"activations": ["ThresholdedRelu", "Tanh"]}, "activation_alpha"),
])
def test_refusals_name_the_attribute(attrs, match):
    model = _model("GRU", **attrs)
    with pytest.raises(NotImplementedError, match=match):
        build_gradient_models(model, ["W"])


def test_unknown_hidden_size_is_refused():
    model = _model("RNN")
    node = model.graph.node[0]
    del node.attribute[:]
    model.graph.input[2].type.tensor_type.ClearField("shape")
    with pytest.raises(NotImplementedError, match="hidden_size"):
        build_gradient_models(model, ["W"])


def test_lstm_gradients_match_torch():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(3, 4, bidirectional=True).double()
    x = torch.randn(5, 2, 3, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(2, 2, 4, dtype=torch.float64)
    c0 = torch.randn(2, 2, 4, dtype=torch.float64)
    y, _ = lstm(x, (h0, c0))
    weight = torch.randn(y.shape, dtype=torch.float64)
    (y * weight).sum().backward()

    def onnx_order(t):  # torch's gates are i, f, g, o; ONNX's i, o, f, c
        i, f, c, o = t.detach().numpy().astype(np.float32).reshape(
            4, 4, *t.shape[1:])
        return np.concatenate([i, o, f, c])
    params = {}
    for key, suffix in (("W", "weight_ih"), ("R", "weight_hh"),
                        ("Wb", "bias_ih"), ("Rb", "bias_hh")):
        params[key] = np.stack([onnx_order(getattr(lstm, f"{suffix}_l0{s}"))
                                for s in ("", "_reverse")])
    model = _model("LSTM", direction="bidirectional", hidden=4,
                   inputs=("B", "H0", "C0"), symbolic=True)
    feeds = {"X": x.detach().numpy().astype(np.float32), "W": params["W"],
             "R": params["R"],
             "B": np.concatenate([params["Wb"], params["Rb"]], axis=1),
             "H0": h0.numpy().astype(np.float32),
             "C0": c0.numpy().astype(np.float32)}
    gm = build_gradient_models(model, ["X", "W"], outputs=["Y"])
    grad_y = weight.numpy().astype(np.float32).reshape(5, 2, 2, 4).transpose(
        0, 2, 1, 3)
    outputs = run(session(gm.forward_model), feeds)
    np.testing.assert_allclose(
        outputs["Y"], y.detach().numpy().reshape(5, 2, 2, 4).transpose(0, 2, 1, 3),
        atol=1e-5)
    grads = _backward_gradients(gm, feeds, {"Y": grad_y}, outputs)
    np.testing.assert_allclose(grads["X"], x.grad.numpy(), atol=1e-5)
    expected_w = np.stack([onnx_order(getattr(lstm, f"weight_ih_l0{s}").grad)
                           for s in ("", "_reverse")])
    np.testing.assert_allclose(grads["W"], expected_w, atol=1e-5)


def _scan_count(model):
    return sum(node.op_type == "Scan" for node in model.graph.node)


def _assert_gradients_match_differences(model, gm, wrt, outputs, forward_session=None):
    """``gm``'s gradients of ``wrt`` equal float64 central differences of
    ``model``'s expansion at two (T, N); the forward values come from
    ``forward_session`` (the expansion's when None)."""
    reference = session(expansion_model(model, expand))
    forward_session = forward_session or reference
    for t, n in ((3, 2), (5, 1)):
        feeds = _feeds(model, np.float64, seed=t, t=t, n=n)
        forward = run(forward_session, feeds)
        rng = np.random.default_rng(t)
        grad_outputs = {o: rng.normal(size=forward[o].shape) for o in outputs}
        grads = _backward_gradients(gm, feeds, grad_outputs, forward)
        for w in wrt:
            expected = numeric_gradient(reference, feeds, w, grad_outputs)
            assert relative_error(expected, grads[w]) < 1e-6, (w, t, n)


# the direct LSTM gradient (no expansion: gates of every step from Y, a
# Scan of the cell states and one backward Scan per direction)
DIRECT_CASES = [
    ({"direction": "bidirectional"}, ("B", "H0", "C0"), ["Y", "Y_h", "Y_c"]),
    ({"direction": "reverse"}, ("B", "C0"), ["Y", "Y_c"]),
    ({}, (), ["Y_h"]),
]


@pytest.mark.parametrize("attrs, inputs, outputs", DIRECT_CASES)
def test_direct_lstm_gradient_matches_finite_differences_float64(
        attrs, inputs, outputs):
    model = _model("LSTM", np.float64, inputs=inputs, symbolic=True, **attrs)
    wrt = [i.name for i in model.graph.input]
    gm = build_gradient_models(model, wrt, outputs=outputs)
    check_model(gm.backward_model)
    directions = 2 if attrs.get("direction") == "bidirectional" else 1
    assert _scan_count(gm.backward_model) == 2 * directions
    assert "Y" in gm.backward_inputs  # the gates come from the node's Y
    _assert_gradients_match_differences(model, gm, wrt, outputs)


@pytest.mark.parametrize("attrs", [{"clip": 0.5}, {"input_forget": 1},
                                   {"activations": ["Sigmoid", "Tanh", "Relu"]}])
def test_lstm_outside_the_direct_gradient_takes_the_expansion(attrs):
    # the direct gradient covers the default LSTM only: the others
    # differentiate the expansion (a recompute Scan and a reverse Scan)
    model = _model("LSTM", np.float64, inputs=("B",), **attrs)
    gm = build_gradient_models(model, ["W"])
    assert "Y" not in gm.backward_inputs
    assert _scan_count(gm.backward_model) == 2


# LSTMs of a training graph lowered to one Scan per direction emitting its
# gates (onnxtrain.graph.recurrent_lowering), whose gradient is the direct
# one's backward Scan alone
def _check_lowered_forward(model, lowered, attrs):
    """``lowered`` (one Scan per direction) computes what onnxruntime's
    kernel computes for ``model``, float32."""
    check_model(lowered)
    directions = 2 if attrs.get("direction") == "bidirectional" else 1
    assert _scan_count(lowered) == directions
    for t, n in ((4, 2), (1, 3)):
        feeds = _feeds(model, np.float32, seed=t, t=t, n=n)
        expected = session(model).run(None, feeds)
        got = session(lowered).run(None, feeds)
        assert len(got) == len(expected)
        for e, a in zip(expected, got):
            np.testing.assert_allclose(a, e, atol=1e-6)


def _check_lowered_gradient(model, lowered, attrs, outputs):
    """The gradient of ``lowered`` (float64) equals finite differences of
    ``model``'s expansion, and its backward pass is one Scan per direction
    recomputing no gate (the gates come from the forward Scan's outputs)."""
    wrt = [i.name for i in model.graph.input]
    gm = build_gradient_models(lowered, wrt, outputs=outputs)
    check_model(gm.backward_model)
    directions = 2 if attrs.get("direction") == "bidirectional" else 1
    assert _scan_count(gm.backward_model) == directions
    assert not {"Sigmoid", "Tanh"} & {n.op_type for n in gm.backward_model.graph.node}
    _assert_gradients_match_differences(model, gm, wrt, outputs, session(gm.forward_model))


def _lowered(model):
    lowered = lower_lstms(model, [i.name for i in model.graph.input])
    ops = [n.op_type for n in lowered.graph.node]
    assert "LSTM" not in ops
    return lowered


@pytest.mark.parametrize("attrs, inputs, outputs", DIRECT_CASES + [
    ({"direction": "bidirectional"}, (), ["Y_h"]),
    ({"direction": "reverse"}, ("B", "H0"), ["Y", "Y_c"]),
])
def test_lowered_lstm_matches_onnxruntime_kernel(attrs, inputs, outputs):
    model = _model("LSTM", inputs=inputs, symbolic=True, hidden=3, **attrs)
    _check_lowered_forward(model, _lowered(model), attrs)


@pytest.mark.parametrize("attrs, inputs, outputs", DIRECT_CASES)
def test_lowered_lstm_gradient_matches_finite_differences_float64(
        attrs, inputs, outputs):
    model = _model("LSTM", np.float64, inputs=inputs, symbolic=True, **attrs)
    _check_lowered_gradient(model, _lowered(model), attrs, outputs)


def test_lstm_on_constant_weights_keeps_the_kernel():
    # no trained value reaches the LSTM: onnxruntime's kernel stays
    model = _model("LSTM", inputs=("B",))
    assert lower_lstms(model, []) is model
    assert lower_lstms(model, ["not_a_name"]) is model
    clipped = _model("LSTM", inputs=("B",), clip=0.5)
    assert lower_lstms(clipped, ["W"]) is clipped


# GRUs as torch exports them (linear_before_reset) lowered the same way: one
# Scan per direction emitting z, r, the candidate n and the recurrent
# product's n part, whose gradient is one backward Scan reading them
GRU_CASES = [
    ({"direction": "bidirectional"}, ("B", "H0"), ["Y", "Y_h"]),
    ({"direction": "reverse"}, ("B",), ["Y"]),
    ({}, (), ["Y_h"]),
    ({"direction": "bidirectional"}, ("H0",), ["Y_h"]),
]


def _gru(dtype, inputs, hidden=2, y=True, **attrs):
    model = _model("GRU", dtype, inputs=inputs, symbolic=True, hidden=hidden,
                   linear_before_reset=1, **attrs)
    if not y:  # Y not computed
        model.graph.node[0].output[0] = ""
        del model.graph.output[0]
    return model


def _lowered_gru(model):
    lowered = lower_recurrent(model, [i.name for i in model.graph.input])
    assert "GRU" not in [n.op_type for n in lowered.graph.node]
    return lowered


@pytest.mark.parametrize("attrs, inputs, outputs", GRU_CASES)
def test_lowered_gru_matches_onnxruntime_kernel(attrs, inputs, outputs):
    model = _gru(np.float32, inputs, hidden=3, y="Y" in outputs, **attrs)
    _check_lowered_forward(model, _lowered_gru(model), attrs)


@pytest.mark.parametrize("attrs, inputs, outputs", GRU_CASES)
def test_lowered_gru_gradient_matches_finite_differences_float64(
        attrs, inputs, outputs):
    model = _gru(np.float64, inputs, **attrs)
    _check_lowered_gradient(model, _lowered_gru(model), attrs, outputs)


def test_gru_outside_the_lowering_keeps_the_kernel():
    # without linear_before_reset, with clip or sequence_lens, or on
    # constant weights, onnxruntime's GRU kernel stays
    for model, weights in (
            (_model("GRU", inputs=("B",)), ["W"]),
            (_model("GRU", inputs=("B",), linear_before_reset=1, clip=0.5), ["W"]),
            (_model("GRU", inputs=("B", "L"), linear_before_reset=1), ["W"]),
            (_model("GRU", inputs=("B",), linear_before_reset=1), [])):
        assert lower_recurrent(model, weights) is model
    # lower_lstms leaves GRUs alone
    gru = _model("GRU", inputs=("B",), linear_before_reset=1)
    assert lower_lstms(gru, ["W"]) is gru


def _stacked(model, negative=False, output=False):
    """``model`` (one bidirectional node) reading W, R and B as exporters
    write them: a Concat along axis 0 (written as a negative axis with
    ``negative``) of one (1, ...) input per direction (``<name>_0``,
    ``<name>_1``); with ``output``, W is also a graph output."""
    stacked = onnx.ModelProto()
    stacked.CopyFrom(model)
    graph = stacked.graph
    by_name = {vi.name: vi for vi in graph.input}
    inputs, concats = [graph.input[0]], []
    for name in ("W", "R", "B"):
        parts = [f"{name}_{d}" for d in range(2)]
        for part in parts:
            vi = onnx.ValueInfoProto()
            vi.CopyFrom(by_name[name])
            vi.name = part
            vi.type.tensor_type.shape.dim[0].dim_value = 1
            inputs.append(vi)
        rank = len(by_name[name].type.tensor_type.shape.dim)
        concats.append(helper.make_node("Concat", parts, [name],
                                        axis=-rank if negative else 0))
    inputs += [vi for vi in graph.input if vi.name not in ("X", "W", "R", "B")]
    del graph.input[:]
    graph.input.extend(inputs)
    nodes = concats + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    if output:
        graph.output.append(by_name["W"])
    return stacked


@pytest.mark.parametrize("negative", [False, True], ids=["axis0", "negative"])
@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_lowering_reads_the_directions_an_exporter_stacked(op, negative):
    # W, R and B stacked by a Concat of one value per direction (as torch
    # exports a bidirectional layer): the lowering reads the directions'
    # values, with no Concat nor Split of them (nor of their gradients),
    # and computes what the kernel and the unstacked lowering compute
    attrs = {"linear_before_reset": 1} if op == "GRU" else {}
    base = _model(op, np.float64, inputs=("B", "H0"), symbolic=True,
                  direction="bidirectional", **attrs)
    model = _stacked(base, negative)
    wrt = [vi.name for vi in model.graph.input]
    lowered = lower_recurrent(model, wrt)
    check_model(lowered)
    nodes = lowered.graph.node
    assert not any(n.op_type in ("Concat", "Split") and set(n.input) & {"W", "R", "B"}
                   for n in nodes)
    assert not {"W", "R", "B"} & {o for n in nodes for o in n.output}
    float32 = _stacked(_model(op, inputs=("B", "H0"), symbolic=True,
                              direction="bidirectional", **attrs), negative)
    feeds32 = _feeds(float32, np.float32, seed=1, t=4, n=2)
    for e, a in zip(session(float32).run(None, feeds32),
                    session(lower_recurrent(float32, wrt)).run(None, feeds32)):
        np.testing.assert_allclose(a, e, atol=1e-6)
    # gradients: each direction's slice of the unstacked lowering's
    gm = build_gradient_models(lowered, wrt, outputs=["Y", "Y_h"])
    gm_base = build_gradient_models(lower_recurrent(base, [i.name for i in base.graph.input]),
                                    [i.name for i in base.graph.input],
                                    outputs=["Y", "Y_h"])
    feeds = _feeds(model, np.float64, seed=2, t=5, n=3)
    base_feeds = {k: v for k, v in feeds.items() if k[:2] not in ("W_", "R_", "B_")}
    for name in ("W", "R", "B"):
        base_feeds[name] = np.concatenate([feeds[f"{name}_0"], feeds[f"{name}_1"]])
    forward = run(session(gm.forward_model), feeds)
    rng = np.random.default_rng(0)
    grad_outputs = {o: rng.normal(size=forward[o].shape) for o in ("Y", "Y_h")}
    got = _backward_gradients(gm, feeds, grad_outputs, forward)
    expected = _backward_gradients(gm_base, base_feeds, grad_outputs,
                                   run(session(gm_base.forward_model), base_feeds))
    for name in ("W", "R", "B"):
        for d in range(2):
            np.testing.assert_allclose(got[f"{name}_{d}"], expected[name][d:d + 1],
                                       rtol=1e-12, atol=1e-12)
    for name in ("X", "H0"):
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-12, atol=1e-12)


def test_a_stacked_weight_read_elsewhere_keeps_its_concat():
    # W is also a graph output: its Concat stays (the lowering still reads
    # each direction's value) and every output is the kernel's
    model = _stacked(_model("LSTM", inputs=("B", "H0"), symbolic=True,
                            direction="bidirectional"), output=True)
    wrt = [vi.name for vi in model.graph.input]
    lowered = lower_recurrent(model, wrt)
    check_model(lowered)
    assert [n.output[0] for n in lowered.graph.node if n.op_type == "Concat"
            and n.output[0] in ("W", "R", "B")] == ["W"]
    feeds = _feeds(model, np.float32, seed=3, t=4, n=2)
    expected = session(model).run(None, feeds)
    got = session(lowered).run(None, feeds)
    assert [o.name for o in lowered.graph.output][-1] == "W"
    for e, a in zip(expected, got):
        np.testing.assert_allclose(a, e, atol=1e-6)


def test_lstm_whose_w_shape_is_unknown_reads_the_input_size_from_x():
    """torch's dynamo exporter builds W in the graph, where shape inference
    loses its dimensions: the input size comes from X's last dimension, for
    the direct gradient and for the lowering to Scans."""
    model = _model("LSTM", np.float64, inputs=("B",), symbolic=True,
                   direction="bidirectional")
    unknown = onnx.ModelProto()
    unknown.CopyFrom(model)
    w = next(i for i in unknown.graph.input if i.name == "W")
    for k, dim in enumerate(w.type.tensor_type.shape.dim):
        if k:
            dim.dim_param = f"w{k}"
    wrt = [i.name for i in model.graph.input]
    gm = build_gradient_models(unknown, wrt, outputs=["Y"])
    _assert_gradients_match_differences(model, gm, wrt, ["Y"])
    _check_lowered_gradient(model, _lowered(unknown), {"direction": "bidirectional"},
                            ["Y"])
