"""Gradients through control flow (If, Scan, Loop), against central finite
differences.

The weights read by the branches of an ``If`` are its implicit inputs: the
gradient is the one of the branch taken. A Scan's body reads its states,
its scan slices and outer weights; a Loop's body its iteration number,
its carried values and outer weights. Every model is built in float64,
differentiated in the split and the fused forms for both values of the
condition, and every generated model passes
``onnx.checker.check_model(full_check=True)``.
"""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from gradcheck import check_gradients
from onnxtrain.autodiff import build_gradient_models
from onnxtrain.exceptions import MissingVJPRuleError

D = TensorProto.DOUBLE
TOL = 1e-6


def _branch(name, nodes, output, initializers=()):
    return helper.make_graph(
        nodes, name, [], [helper.make_tensor_value_info(output, D, None)],
        list(initializers))


def _model(branch_then, branch_else, after=(), weights=None, opset=17,
           output="Y", before=(), domains=()):
    """X [N, 3] and cond (bool) inputs; ``before`` nodes, then ``If`` ->
    ``Yif``; ``after`` nodes (reading ``Yif``) compute ``output``."""
    rng = np.random.default_rng(0)
    weights = weights or {"W": (3,)}
    inits = [numpy_helper.from_array(rng.normal(size=shape).astype(np.float64),
                                     name) for name, shape in weights.items()]
    nodes = list(before) + [helper.make_node("If", ["cond"], ["Yif"], name="if",
                              then_branch=branch_then,
                              else_branch=branch_else)]
    nodes += list(after)
    if not after:
        nodes[-1].output[0] = output
    graph = helper.make_graph(
        nodes, "if_model",
        [helper.make_tensor_value_info("X", D, ["N", 3]),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info(output, D, ["N", 3])], inits)
    model = helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", opset)] + [
        helper.make_opsetid(d, 1) for d in domains])
    model.ir_version = 8
    if not domains:
        onnx.checker.check_model(model, full_check=True)
    return model


def _then_else_w(opset=17):
    # then: X * W; else: X + W * W
    then_b = _branch("then", [helper.make_node("Mul", ["X", "W"], ["t0"])],
                     "t0")
    else_b = _branch("else", [helper.make_node("Mul", ["W", "W"], ["e0"]),
                              helper.make_node("Add", ["X", "e0"], ["e1"])],
                     "e1")
    return _model(then_b, else_b, opset=opset)


def _initializers(model):
    """``{name: array}`` of the model's initializers."""
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


def _check_gradients(model, wrt, feeds, seed=4, outputs=None):
    """:func:`gradcheck.check_gradients` at this module's tolerance."""
    return check_gradients(model, wrt, feeds, seed, outputs, tol=TOL)


def _check(model, wrt, cond, n=4):
    """:func:`_check_gradients` of an If model on X [n, 3] for ``cond``;
    returns the split gradients."""
    rng = np.random.default_rng(1)
    inits = _initializers(model)
    feeds = {"X": rng.normal(size=(n, 3)), "cond": np.array(cond)}
    feeds.update({w: inits[w] for w in wrt if w in inits})
    return _check_gradients(model, wrt, feeds, rng)[1]


@pytest.mark.parametrize("cond", [True, False])
@pytest.mark.parametrize("opset", [11, 17])
def test_if_weight_used_in_both_branches(cond, opset):
    model = _then_else_w(opset)
    _check(model, ["W"], cond)
    _check(model, ["W", "X"], cond)


@pytest.mark.parametrize("cond", [True, False])
def test_if_weight_used_in_one_branch_has_zero_gradient_in_the_other(cond):
    # then: X * W + B; else: Tanh(X) * W -- B unused by else, and the If
    # output feeds a node also reading W (explicit and implicit uses add up)
    then_b = _branch("then", [helper.make_node("Mul", ["X", "W"], ["t0"]),
                              helper.make_node("Add", ["t0", "B"], ["t1"])],
                     "t1")
    else_b = _branch("else", [helper.make_node("Tanh", ["X"], ["e0"]),
                              helper.make_node("Mul", ["e0", "W"], ["e1"])],
                     "e1")
    after = [helper.make_node("Mul", ["Yif", "W"], ["Y"])]
    model = _model(then_b, else_b, after, weights={"W": (3,), "B": (1, 3)})
    split = _check(model, ["W", "B", "X"], cond)
    if not cond:
        assert np.all(split["B"] == 0)


@pytest.mark.parametrize("cond", [True, False])
def test_if_branches_with_initializers_constants_and_outer_intermediates(cond):
    # H = Sigmoid(X) * W outside; then: H * c * k (a branch initializer and
    # a Constant); else: Identity(H)
    then_b = _branch(
        "then",
        [helper.make_node("Mul", ["H", "c"], ["t0"]),
         helper.make_node("Constant", [], ["k"],
                          value=numpy_helper.from_array(np.array(2.0), "k")),
         helper.make_node("Mul", ["t0", "k"], ["t1"])],
        "t1", [numpy_helper.from_array(np.array([1.5, -2.0, 0.5]), "c")])
    else_b = _branch("else", [helper.make_node("Identity", ["H"], ["e0"])],
                     "e0")
    before = [helper.make_node("Sigmoid", ["X"], ["s"]),
              helper.make_node("Mul", ["s", "W"], ["H"])]
    model = _model(then_b, else_b, before=before)
    _check(model, ["W", "X"], cond)


def test_if_with_nested_control_flow_is_refused_clearly():
    inner = _branch("inner", [helper.make_node("Mul", ["X", "W"], ["i0"])],
                    "i0")
    then_b = _branch("then", [helper.make_node(
        "If", ["cond"], ["t0"], then_branch=inner, else_branch=inner)], "t0")
    else_b = _branch("else", [helper.make_node("Mul", ["X", "W"], ["e0"])],
                     "e0")
    model = _model(then_b, else_b)
    with pytest.raises(NotImplementedError, match="nested control flow"):
        build_gradient_models(model, ["W"])


def test_if_branch_op_without_rule_names_it():
    then_b = _branch("then", [helper.make_node("Mul", ["X", "W"], ["t0"])],
                     "t0")
    else_b = _branch("else", [helper.make_node(
        "Custom", ["W"], ["e0"], domain="my.domain")], "e0")
    model = _model(then_b, else_b, domains=["my.domain"])
    with pytest.raises(MissingVJPRuleError, match="Custom"):
        build_gradient_models(model, ["W"])


# ---------------------------------------------------------------------------
# Scan
# ---------------------------------------------------------------------------

def _rnn_model(directions=None, opset=17):
    """h_t = Tanh(h_{t-1} * W + x_t @ U), z_t = h_t * V (W, U, V read from
    the outer scope), c_t = c_{t-1} + x_t summed; outputs h_T, c_T, z."""
    rng = np.random.default_rng(0)
    body = helper.make_graph(
        [helper.make_node("Mul", ["h_in", "W"], ["a"]),
         helper.make_node("MatMul", ["x_t", "U"], ["b"]),
         helper.make_node("Add", ["a", "b"], ["pre"]),
         helper.make_node("Tanh", ["pre"], ["h_out"]),
         helper.make_node("Add", ["c_in", "x_t"], ["c_out"]),
         helper.make_node("Mul", ["h_out", "V"], ["z_t"])],
        "rnn_body",
        [helper.make_tensor_value_info("h_in", D, [2]),
         helper.make_tensor_value_info("c_in", D, [3]),
         helper.make_tensor_value_info("x_t", D, [3])],
        [helper.make_tensor_value_info("h_out", D, [2]),
         helper.make_tensor_value_info("c_out", D, [3]),
         helper.make_tensor_value_info("z_t", D, [2])])
    attrs = {}
    if directions is not None:
        attrs["scan_input_directions"] = directions
    node = helper.make_node("Scan", ["h0", "c0", "X"], ["hT", "cT", "Z"],
                            body=body, num_scan_inputs=1, **attrs)
    inits = [numpy_helper.from_array(rng.normal(size=shape), name)
             for name, shape in (("W", (2,)), ("U", (3, 2)), ("V", (1,)),
                                 ("h0", (2,)), ("c0", (3,)))]
    graph = helper.make_graph(
        [node], "rnn", [helper.make_tensor_value_info("X", D, ["T", 3])],
        [helper.make_tensor_value_info("hT", D, [2]),
         helper.make_tensor_value_info("cT", D, [3]),
         helper.make_tensor_value_info("Z", D, ["T", 2])], inits)
    model = helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("opset", [11, 17])
def test_scan_with_states_scan_outputs_and_outer_weights(opset):
    model = _rnn_model(opset=opset)
    rng = np.random.default_rng(2)
    wrt = ["W", "U", "V", "h0", "c0", "X"]
    feeds = {"X": rng.normal(size=(4, 3)), **_initializers(model)}
    _check_gradients(model, wrt, feeds, seed=2)


def test_scan_only_the_scan_output_differentiated():
    model = _rnn_model()
    rng = np.random.default_rng(3)
    feeds = {"X": rng.normal(size=(5, 3)), **_initializers(model)}
    _check_gradients(model, ["W", "U"], feeds, rng, outputs=["Z"])


def _layout_scan_model(axes, directions, out_axis, out_dir, opset=17):
    """h_t = Tanh(h_{t-1} * W + x_t @ U + y_t), z_t = h_t * V: two scan
    inputs X (x_t [3]) and Y (y_t [2]) read along ``axes`` in
    ``directions``, the scan output Z stacked along ``out_axis`` in
    ``out_dir``. T = 4 steps."""
    rng = np.random.default_rng(0)
    body = helper.make_graph(
        [helper.make_node("Mul", ["h_in", "W"], ["a"]),
         helper.make_node("MatMul", ["x_t", "U"], ["b"]),
         helper.make_node("Add", ["a", "b"], ["ab"]),
         helper.make_node("Add", ["ab", "y_t"], ["pre"]),
         helper.make_node("Tanh", ["pre"], ["h_out"]),
         helper.make_node("Mul", ["h_out", "V"], ["z_t"])],
        "layout_body",
        [helper.make_tensor_value_info("h_in", D, [2]),
         helper.make_tensor_value_info("x_t", D, [3]),
         helper.make_tensor_value_info("y_t", D, [2])],
        [helper.make_tensor_value_info("h_out", D, [2]),
         helper.make_tensor_value_info("z_t", D, [2])])
    node = helper.make_node(
        "Scan", ["h0", "X", "Y"], ["hT", "Z"], body=body, num_scan_inputs=2,
        scan_input_axes=list(axes), scan_input_directions=list(directions),
        scan_output_axes=[out_axis], scan_output_directions=[out_dir])

    def shape(width, axis):
        return [4, width] if axis == 0 else [width, 4]
    inits = [numpy_helper.from_array(rng.normal(size=shape), name)
             for name, shape in (("W", (2,)), ("U", (3, 2)), ("V", (1,)),
                                 ("h0", (2,)))]
    graph = helper.make_graph(
        [node], "layout_scan",
        [helper.make_tensor_value_info("X", D, shape(3, axes[0])),
         helper.make_tensor_value_info("Y", D, shape(2, axes[1]))],
        [helper.make_tensor_value_info("hT", D, [2]),
         helper.make_tensor_value_info("Z", D, shape(2, out_axis))], inits)
    model = helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("axes,directions,out_axis,out_dir,opset", [
    ((0, 0), (1, 1), 0, 0, 17),    # both inputs reversed
    ((0, 0), (0, 1), 0, 1, 17),    # mixed directions, reversed output
    ((1, 0), (0, 0), 1, 0, 17),    # scan along axis 1
    ((1, 1), (1, 0), 1, 1, 9),     # axis 1, reverse, at opset 9
    ((-1, 0), (1, 0), -1, 1, 17),  # negative axes (opset >= 11)
])
def test_scan_along_other_axes_and_in_reverse(axes, directions, out_axis,
                                              out_dir, opset):
    model = _layout_scan_model(axes, directions, out_axis, out_dir, opset)
    rng = np.random.default_rng(5)
    feeds = {vi.name: rng.normal(size=[d.dim_value for d in
                                       vi.type.tensor_type.shape.dim])
             for vi in model.graph.input}
    feeds.update(_initializers(model))
    _check_gradients(model, ["W", "U", "V", "h0", "X", "Y"], feeds)


def _scan8_model(directions=(0,), seq_lens=None):
    """Scan-8 (opset 8, batch axis 0, scan axis 1) of the RNN of
    :func:`_rnn_model` on a batch of 2 sequences of 4 steps; ``seq_lens``:
    the sequence_lens initializer (None: omitted)."""
    rng = np.random.default_rng(0)
    body = _rnn_model().graph.node[0].attribute[0].g
    inits = [numpy_helper.from_array(rng.normal(size=shape), name)
             for name, shape in (("W", (2,)), ("U", (3, 2)), ("V", (1,)),
                                 ("h0", (2, 2)), ("c0", (2, 3)))]
    lens = ""
    if seq_lens is not None:
        lens = "L"
        inits.append(numpy_helper.from_array(np.array(seq_lens, np.int64),
                                             "L"))
    node = helper.make_node("Scan", [lens, "h0", "c0", "X"], ["hT", "cT", "Z"],
                            body=body, num_scan_inputs=1,
                            directions=list(directions))
    graph = helper.make_graph(
        [node], "rnn8", [helper.make_tensor_value_info("X", D, [2, 4, 3])],
        [helper.make_tensor_value_info("hT", D, [2, 2]),
         helper.make_tensor_value_info("cT", D, [2, 3]),
         helper.make_tensor_value_info("Z", D, [2, 4, 2])], inits)
    model = helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", 8)])
    model.ir_version = 4
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("directions", [(0,), (1,)])
@pytest.mark.parametrize("seq_lens", [None, (4, 2)])
def test_scan8_with_batch_axis_and_sequence_lens(directions, seq_lens):
    model = _scan8_model(directions, seq_lens)
    rng = np.random.default_rng(6)
    feeds = {"X": rng.normal(size=(2, 4, 3)), **_initializers(model)}
    wrt = ["W", "U", "V", "h0", "c0", "X"]
    _check_gradients(model, wrt, feeds)


def test_estimator_with_if_trains_on_every_path():
    """A graph with control flow trains on every path with the same curve:
    the fused loop renames the weights and the batch inside the If branches
    too, which read them from the enclosing scope."""
    from onnx import TensorProto, helper, numpy_helper

    from onnxtrain import LearningRateSGD, OrtGradientForwardBackwardOptimizer
    then = helper.make_graph([helper.make_node("MatMul", ["X", "W"], ["t"])],
                             "then", [], [helper.make_tensor_value_info("t", 1, None)])
    other = helper.make_graph([helper.make_node("Add", ["X", "B"], ["e"])],
                              "else", [], [helper.make_tensor_value_info("e", 1, None)])
    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["Y"], then_branch=then, else_branch=other)],
        "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 1])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 1])],
        [numpy_helper.from_array(np.array([[0.5]], np.float32), "W"),
         numpy_helper.from_array(np.array([[0.0]], np.float32), "B"),
         numpy_helper.from_array(np.array(True), "cond")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    X = np.linspace(-1, 1, 40, dtype=np.float32).reshape(-1, 1)
    y = 3 * X.ravel()
    fits = {}
    for path in ("split", "fused", "loop", "auto"):
        fits[path] = OrtGradientForwardBackwardOptimizer(
            model, weights_to_train=["W"], warm_start=True, max_iter=100,
            training_path=path, batch_size=8,
            learning_rate=LearningRateSGD(0.3, learning_rate="constant")).fit(X, y)
    assert fits["auto"].training_path_ == "loop"
    np.testing.assert_allclose(fits["split"].get_state()[0], [[3.0]], atol=1e-3)
    for path in ("fused", "loop", "auto"):
        np.testing.assert_allclose(fits[path].train_losses_, fits["split"].train_losses_,
                                   rtol=1e-5, atol=1e-12)
        np.testing.assert_allclose(fits[path].get_state()[0],
                                   fits["split"].get_state()[0], rtol=1e-5)


# ---------------------------------------------------------------------------
# Loop
# ---------------------------------------------------------------------------

def _loop_model(opset=17, cond="absent", trip="input", n=4):
    """h_i = Tanh(h_{i-1} @ W + X[i] @ U) (X[i] gathered from the outer X on
    the iteration number i), k_i = k_{i-1} + 1 (an int64 carried value),
    z_i = h_i * V stacked; outputs h_M, k_M and Z [M, 2].

    ``cond``: 'absent' (""), 'identity' (a cond input the body passes
    through), 'true' (the body outputs a constant true), 'data' (the body
    outputs ReduceSum(h) < 0.1: data-dependent), 'counter' (k < 3).
    ``trip``: 'input' (the trip
    count is a graph input) or 'constant' (an initializer).
    """
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["h_in", "W"], ["a"]),
             helper.make_node("MatMul", ["x_i", "U"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["pre"]),
             helper.make_node("Tanh", ["pre"], ["h_out"]),
             helper.make_node("Constant", [], ["one"], value=numpy_helper
                              .from_array(np.array(1, np.int64), "one")),
             helper.make_node("Add", ["k_in", "one"], ["k_out"]),
             helper.make_node("Mul", ["h_out", "V"], ["z_i"])]
    if opset >= 16:
        nodes.insert(0, helper.make_node("Gather", ["X", "i"], ["x_i"], axis=0))
    else:
        # Gather's rule before opset 16 (one-hot contraction) does not take
        # rank-0 indices yet: gather rows [i] then reshape to one row
        nodes[:0] = [
            helper.make_node("Constant", [], ["row"], value=numpy_helper
                             .from_array(np.array([1], np.int64), "row")),
            helper.make_node("Reshape", ["i", "row"], ["i1"]),
            helper.make_node("Gather", ["X", "i1"], ["x_rows"], axis=0),
            helper.make_node("Constant", [], ["width"], value=numpy_helper
                             .from_array(np.array([3], np.int64), "width")),
            helper.make_node("Reshape", ["x_rows", "width"], ["x_i"])]
    if cond == "true":
        nodes.append(helper.make_node("Constant", [], ["cond_out"],
                                      value=numpy_helper.from_array(
                                          np.array(True), "t")))
    elif cond == "counter":
        nodes += [helper.make_node("Constant", [], ["stop"], value=numpy_helper
                                   .from_array(np.array(3, np.int64), "stop")),
                  helper.make_node("Less", ["k_out", "stop"], ["cond_out"])]
    elif cond == "data":
        nodes += [helper.make_node("ReduceSum", ["h_out"], ["s"], keepdims=0),
                  helper.make_node("Constant", [], ["limit"],
                                   value=numpy_helper.from_array(
                                       np.array(0.1), "limit")),
                  helper.make_node("Less", ["s", "limit"], ["cond_out"])]
    else:
        nodes.append(helper.make_node("Identity", ["cond_in"], ["cond_out"]))
    body = helper.make_graph(
        nodes, "loop_body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_in", D, [2]),
         helper.make_tensor_value_info("k_in", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_out", D, [2]),
         helper.make_tensor_value_info("k_out", TensorProto.INT64, []),
         helper.make_tensor_value_info("z_i", D, [2])])
    inits = [numpy_helper.from_array(rng.normal(size=shape) * scale, name)
             for name, shape, scale in (("W", (2, 2), 0.8), ("U", (3, 2), 1.0),
                                        ("V", (2,), 1.0), ("h0", (2,), 1.0))]
    inits.append(numpy_helper.from_array(np.array(0, np.int64), "k0"))
    inputs = [helper.make_tensor_value_info("X", D, ["T", 3])]
    if trip == "input":
        inputs.append(helper.make_tensor_value_info("M", TensorProto.INT64, []))
    else:
        inits.append(numpy_helper.from_array(np.array(n, np.int64), "M"))
    cond_name = ""
    if cond != "absent":
        cond_name = "cond"
        inits.append(numpy_helper.from_array(np.array(True), "cond"))
    node = helper.make_node("Loop", ["M", cond_name, "h0", "k0"],
                            ["hM", "kM", "Z"], body=body, name="loop")
    graph = helper.make_graph(
        [node], "rnn_loop", inputs,
        [helper.make_tensor_value_info("hM", D, [2]),
         helper.make_tensor_value_info("kM", TensorProto.INT64, []),
         helper.make_tensor_value_info("Z", D, [None, 2])], inits)
    model = helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _check_loop(model, wrt, n=4, outputs=None, iterations=None):
    """:func:`_check_gradients` of a Loop model run ``n`` times (Z has
    ``iterations`` rows, default n); returns the split gradients."""
    rng = np.random.default_rng(2)
    feeds = {"X": rng.normal(size=(n + 1, 3)), "M": np.array(n, np.int64),
             **_initializers(model)}
    y, split = _check_gradients(model, wrt, feeds, rng, outputs=outputs)
    assert y["Z"].shape == (n if iterations is None else iterations, 2)
    return split


@pytest.mark.parametrize("opset", [13, 17])
@pytest.mark.parametrize("cond,trip", [("absent", "input"),
                                       ("identity", "constant"),
                                       ("true", "input")])
def test_loop_rnn_with_carried_values_scan_output_and_outer_weights(
        opset, cond, trip):
    model = _loop_model(opset, cond, trip)
    _check_loop(model, ["W", "U", "V", "h0", "X"])


def test_loop_only_the_scan_output_differentiated():
    model = _loop_model()
    _check_loop(model, ["W", "U"], outputs=["Z"])


def test_loop_with_zero_iterations():
    model = _loop_model()
    _check_loop(model, ["W", "h0"], n=0)


@pytest.mark.parametrize("opset", [13, 17])
def test_loop_with_a_data_dependent_condition(opset):
    """The body's condition is ReduceSum(h) < 0.1: the loop stops after 2
    of its 4 iterations (sums -0.37, 0.51: far from the limit for finite
    differences); the reverse Loop runs the iterations the forward ran."""
    model = _loop_model(opset, cond="data")
    _check_loop(model, ["W", "U", "V", "h0", "X"], n=4, iterations=2)


def test_loop_without_trip_count():
    """No trip count; the body stops once its int64 counter reaches 3."""
    model = _loop_model(cond="counter")
    model.graph.node[0].input[0] = ""
    _check_loop(model, ["W", "U", "V", "h0", "X"], n=4, iterations=3)


def test_scan_without_states_a_map():
    """A Scan with scan inputs and outputs only (y_t = tanh(x_t * W)): its
    gradient has no state to recompute (no empty Scan in the graph)."""
    D = TensorProto.DOUBLE
    vi = helper.make_tensor_value_info
    body = helper.make_graph(
        [helper.make_node("Mul", ["x_t", "W"], ["m_t"]),
         helper.make_node("Tanh", ["m_t"], ["y_out"])],
        "body", [vi("x_t", D, [3])], [vi("y_out", D, [3])])
    rng = np.random.default_rng(11)
    weights = {"W": rng.normal(size=(3,))}
    graph = helper.make_graph(
        [helper.make_node("Scan", ["X"], ["Y"], body=body, num_scan_inputs=1)],
        "g", [vi("X", D, ["T", 3])], [vi("Y", D, ["T", 3])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    _check_gradients(model, ["W", "X"], {"X": rng.normal(size=(4, 3)), **weights})
