"""float16 gradients: every row of the VJP table built and run in float16.

For each row of ``CASES`` (tests/autodiff/test_autodiff_rules.py), plus a few rows of
ops whose rules needed float16 care (:data:`FLOAT16_CASES`), the model is
built in float16 and its split gradient models with
:func:`onnxtrain.autodiff.build_gradient_models`. Two tests per row:

``test_float16_gradient_graph_is_well_typed``
    Both models pass ``onnx.checker.check_model(full_check=True)``; strict
    shape inference types every value of the gradient model, and every float
    tensor there (inputs, outputs, intermediates, initializers, Constant and
    ConstantOfShape values, Cast targets) is float16, unless the forward
    model itself uses that precision (the Cast row computes in float64) or
    the row lists a deliberate float32 detour (:data:`FLOAT32_INSIDE`). A
    rule creating a float32 or float64 constant fails here.

``test_float16_gradient_matches_float64``
    The float16 forward and gradient models run with onnxruntime (CPU) at
    points exactly representable in float16, with a float16 ``grad_output``;
    the weight gradients must be float16 and agree with the float64
    gradients of the same row at the same values (the float64 rules are
    checked against finite differences by test_autodiff_rules.py; where
    onnxruntime has no float64 kernel, the float32 gradient is the
    reference).

    Where onnxruntime has no float16 kernel (``NOT_IMPLEMENTED`` when the
    session is created), this test is skipped with the reason "no float16
    kernel in onnxruntime"; the type check above still runs. With
    onnxruntime 1.32 no row is skipped: its CPU provider runs a float16 node
    whenever it has a float32 kernel (see the note below).

Note: onnxruntime's CPU provider has float16 kernels for data movement
(Transpose, Concat, Reshape...) but runs most arithmetic (Add, MatMul,
Gemm, Softmax...) through casts it inserts itself (float32 compute between
float16 inputs and outputs); this test checks what a float16 model gives on
onnxruntime, not per-op float16 rounding on a GPU.
"""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from gradcheck import check_model, relative_error, run, session, split_gradients
from onnxtrain.autodiff import build_gradient_models
from onnxtrain.graph import GraphBuilder
from test_autodiff_rules import CASES, Case

F16, F32, F64 = np.float16, np.float32, np.float64
FLOATS = {TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE,
          TensorProto.BFLOAT16}

#: Relative error allowed (max |float64 - float16| / max |float64|).
#: float16's unit roundoff is u = 2**-11 = 4.9e-4. Inputs, weights and
#: grad_outputs are exact in float16 and well conditioned (|x| <= 1.5,
#: divisors and Pow/Log/Sqrt bases in [0.5, 1.5]), so the error comes from
#: rounding the intermediates: each row's gradient goes through at most ~10
#: roundings and sums of at most 24 terms, which bounds it by ~20 u = 1e-2
#: (observed: below 1e-3 for one-op rows).
TOLERANCE = 1e-2
#: Rows allowed more: the MLP chains MatMul, Add, Tanh, Gemm and Softmax
#: forward and back (about 20 roundings; observed 6e-3).
ROW_TOLERANCE = {"MLP-dyn(N,3)": 2e-2}

#: Rows of ops whose rules needed float16 fixes, not in the float64 table
#: (their float64 gradients are checked by the onnx node-test corpus).
#: Slice over 2500 elements: copy_adjoint's positions 1..2500 are not all
#: float16 numbers (exact below 2**11); Pad, Gather with repeated indices
#: and overlapping MaxPool at opset >= 16 sum with ScatterElements(add),
#: which onnxruntime's CPU kernel refuses in float16. The rest cover rule
#: families absent from the table; onnxruntime has no float64 kernel for
#: them, so their reference is the float32 gradient.
FLOAT16_CASES = [
    Case("Slice-(50,50)-step2-op18",
         [("Slice", ["W", "starts", "ends", "axes", "steps"], ["Y"], {})],
         weights={"W": (50, 50)}, opset=18,
         consts={"starts": np.array([1], np.int64),
                 "ends": np.array([50], np.int64),
                 "axes": np.array([0], np.int64),
                 "steps": np.array([2], np.int64)}),
    Case("Pad-constant-value-op18", [("Pad", ["W", "pads", "v"], ["Y"], {})],
         weights={"W": (2, 3), "v": ()}, opset=18,
         consts={"pads": np.array([1, 0, 0, 2], np.int64)}),
    Case("Gather-repeated-indices-op16",
         [("Gather", ["W", "idx"], ["Y"], {"axis": 0})], weights={"W": (4, 3)},
         consts={"idx": np.array([[0, 2], [0, 3]], np.int64)}, opset=16),
    Case("MaxPool-overlapping-op18",
         [("MaxPool", ["W"], ["Y"], {"kernel_shape": [2, 2], "strides": [1, 1]})],
         weights={"W": (1, 1, 4, 4)}, opset=18),
    Case("Erf-op13", [("Erf", ["W"], ["Y"], {})], weights={"W": (3, 4)}),
    Case("Softplus-op13", [("Softplus", ["W"], ["Y"], {})], weights={"W": (3, 4)}),
    Case("Elu-op13", [("Elu", ["W"], ["Y"], {})], weights={"W": (3, 4)},
         kinds={"W": "nonzero"}),
    Case("Conv-pads-op11", [("Conv", ["X", "W", "b"], ["Y"],
                             {"pads": [1, 0, 0, 1]})],
         inputs={"X": ("N", 2, 3, 3)}, weights={"W": (2, 2, 2, 2), "b": (2,)},
         wrt_inputs=("X",), opset=11),
    Case("AveragePool-pads-op19", [("AveragePool", ["W"], ["Y"],
                                    {"kernel_shape": [2, 2], "pads": [1, 1, 0, 0]})],
         weights={"W": (1, 2, 3, 3)}, opset=19),
    Case("InstanceNormalization-op13",
         [("InstanceNormalization", ["W", "s", "b"], ["Y"], {})],
         weights={"W": (2, 2, 3), "s": (2,), "b": (2,)}),
]

#: Rows whose gradient graph computes partly in float32 on purpose.
FLOAT32_INSIDE = {
    "Slice-(50,50)-step2-op18": "positions of copy_adjoint in float32",
    "Pad-constant-value-op18": "positions and scatter-add in float32",
    "Gather-repeated-indices-op16": "positions and scatter-add in float32",
    "MaxPool-overlapping-op18": "scatter-add in float32",
}

ROWS = CASES + FLOAT16_CASES


def _rounded_values(case):
    """The row's random values, moved to the nearest float16 numbers (the
    float16 and float64 models then see the same point)."""
    return {n: v.astype(F16).astype(F64) if v.dtype.kind == "f" else v
            for n, v in case.values().items()}


def _feeds(case, values, dtype):
    return {n: v if v.dtype.kind == "i" else v.astype(case.dtype_of(n, dtype))
            for n, v in values.items()}


def _float_tensor_types(model):
    """``name -> elem_type`` of every float tensor of the graph (and of its
    subgraphs) after strict shape inference: values, initializers, Constant
    and ConstantOfShape values (``<node>.value``), Cast targets
    (``<node>.to``). Raises if a node output is left untyped."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    return _graph_float_types(inferred.graph)


def _graph_float_types(graph):
    typed = {}
    for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
        typed[vi.name] = vi.type.tensor_type.elem_type
    for init in graph.initializer:
        typed[init.name] = init.data_type
    found = {}
    for node in graph.node:
        for out in node.output:
            assert not out or out in typed, f"{out!r} ({node.op_type}) is untyped"
        for att in node.attribute:
            if att.type == onnx.AttributeProto.TENSOR:
                found[f"{node.name}.{att.name}"] = att.t.data_type
            if node.op_type == "Cast" and att.name == "to":
                found[f"{node.name}.to"] = att.i
            for sub in list(att.graphs) + ([att.g] if att.HasField("g") else []):
                found.update(_graph_float_types(sub))
    found.update(typed)
    return {n: t for n, t in found.items() if t in FLOATS}


def _precisions_used(model):
    """Float element types of the (inferred) forward model."""
    return set(_float_tensor_types(model).values())


def _build(case, values):
    model = case.model(F16, values)
    gm = build_gradient_models(model, case.wrt)
    check_model(gm.forward_model)
    check_model(gm.backward_model)
    return model, gm


def _assert_float16_only(backward_model, allowed):
    wrong = {n: helper.tensor_dtype_to_string(t)
             for n, t in _float_tensor_types(backward_model).items()
             if t not in allowed}
    assert not wrong, f"float tensors not in float16: {wrong}"


@pytest.mark.parametrize("case", ROWS, ids=[c.id for c in ROWS])
def test_float16_gradient_graph_is_well_typed(case):
    model, gm = _build(case, _rounded_values(case))
    allowed = _precisions_used(gm.forward_model) | {TensorProto.FLOAT16}
    if case.id in FLOAT32_INSIDE:
        allowed.add(TensorProto.FLOAT)
    assert TensorProto.FLOAT not in _precisions_used(model)
    _assert_float16_only(gm.backward_model, allowed)
    outputs = {o.name: o.type.tensor_type.elem_type
               for o in gm.backward_model.graph.output}
    for w, g in zip(gm.wrt, gm.grad_names):
        assert outputs[g] == TensorProto.FLOAT16, f"{g} is not float16"


def test_the_type_check_sees_a_float32_constant():
    # the kind of graph a rule creating ``const(0.5)`` in float32 makes:
    # valid ONNX once cast, so only the float16 check catches it
    half = numpy_helper.from_array(np.array(0.5, F32), "half")
    graph = helper.make_graph(
        [helper.make_node("Cast", ["half"], ["half16"], to=TensorProto.FLOAT16),
         helper.make_node("Mul", ["X", "half16"], ["Y"])], "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT16, [2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT16, [2])], [half])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    check_model(model)
    with pytest.raises(AssertionError, match="half"):
        _assert_float16_only(model, {TensorProto.FLOAT16})


# ---------------------------------------------------------------------------
# running the float16 models
# ---------------------------------------------------------------------------

def _float16_sessions(gm):
    """Sessions of the float16 forward and gradient models; skip the test
    where onnxruntime has no float16 kernel (the type check still runs)."""
    try:
        return session(gm.forward_model), session(gm.backward_model)
    except Exception as exc:  # onnxruntime's NotImplemented
        if "NOT_IMPLEMENTED" not in str(exc):
            raise
        pytest.skip("no float16 kernel in onnxruntime: "
                    + str(exc).splitlines()[0][:200])


def _reference_gradients(case, values, gy):
    """Gradients of the row in float64, or float32 where onnxruntime has no
    float64 kernel."""
    for dtype in (F64, F32):
        gm = build_gradient_models(case.model(dtype, values), case.wrt)
        feeds = _feeds(case, values, dtype)
        try:
            sessions = (session(gm.forward_model), session(gm.backward_model))
        except Exception as exc:  # onnxruntime's NotImplemented
            if "NOT_IMPLEMENTED" not in str(exc):
                raise
            continue
        out_type = case.dtype_of("Y", dtype)
        return split_gradients(gm, feeds, {"Y": gy.astype(out_type)}, sessions)[1]
    raise AssertionError(f"{case.id}: onnxruntime runs neither float64 nor float32")


@pytest.mark.parametrize("case", ROWS, ids=[c.id for c in ROWS])
def test_float16_gradient_matches_float64(case):
    values = _rounded_values(case)
    _, gm = _build(case, values)
    sessions = _float16_sessions(gm)
    feeds = _feeds(case, values, F16)
    y = run(sessions[0], feeds)["Y"]
    gy = np.random.default_rng(0).uniform(-1, 1, y.shape).astype(F16)
    _, grads = split_gradients(gm, feeds, {"Y": gy.astype(y.dtype)}, sessions)
    expected = _reference_gradients(case, values, gy)
    tolerance = ROW_TOLERANCE.get(case.id, TOLERANCE)
    for w in case.wrt:
        assert grads[w].dtype == case.dtype_of(w, F16), w
        err = relative_error(expected[w], grads[w])
        assert err <= tolerance, f"{w}: relative error {err:.2e}"


# ---------------------------------------------------------------------------
# the builder's float16 constants
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("value, expected", [
    (1e-9, 2.0 ** -24), (-1e-9, -2.0 ** -24), (1e-5, F16(1e-5)),
    (1e6, 65504.0), (-1e9, -65504.0), (0.0, 0.0), (-np.inf, -np.inf),
    (0.1, F16(0.1))])
def test_float16_constants_saturate(value, expected):
    # an epsilon below float16's smallest subnormal stays positive, a large
    # mask value stays finite; zeros, infinities and ordinary values as numpy
    g = GraphBuilder(13)
    name = g.const(value, TensorProto.FLOAT16)
    array = numpy_helper.to_array(g.initializers[-1])
    assert g.initializers[-1].name == name and array.dtype == F16
    assert array == F16(expected)
    g.const(1e-9, TensorProto.FLOAT)  # float32 represents it: unchanged
    assert numpy_helper.to_array(g.initializers[-1]) == F32(1e-9)


# ---------------------------------------------------------------------------
# training a float16 graph
# ---------------------------------------------------------------------------

def _as_float16(model):
    """Copy of a float32 ``model`` with every float32 tensor (values,
    initializers, Cast targets) in float16, as a float16 export would be."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = TensorProto.FLOAT16
    for i, init in enumerate(graph.initializer):
        if init.data_type == TensorProto.FLOAT:
            graph.initializer[i].CopyFrom(numpy_helper.from_array(
                numpy_helper.to_array(init).astype(F16), init.name))
    for node in graph.node:
        for att in node.attribute:
            if node.op_type == "Cast" and att.name == "to" and att.i == TensorProto.FLOAT:
                att.i = TensorProto.FLOAT16
    return copy


def _mlp_float32():
    """skl2onnx float32 graph of a small fitted MLPRegressor, X and y."""
    import warnings

    from skl2onnx import to_onnx
    from sklearn.neural_network import MLPRegressor
    rng = np.random.default_rng(0)
    X = rng.normal(size=(64, 3)).astype(F16).astype(F32)  # float16 numbers
    y = (X @ np.array([0.5, -0.3, 0.2]) + 0.1).astype(F16).astype(F32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mlp = MLPRegressor(hidden_layer_sizes=(4,), max_iter=20, random_state=0)
        return to_onnx(mlp.fit(X, y), X[:1]), X, y


def test_float16_mlp_first_gradient_and_training():
    from onnxtrain import (OrtGradientForwardBackward,
                           OrtGradientForwardBackwardOptimizer)
    m32, X, y = _mlp_float32()
    m16 = _as_float16(m32)
    # float32 engine at the float16 weights: both start from the same point
    engines = {F16: OrtGradientForwardBackward(m16),
               F32: OrtGradientForwardBackward(m32)}
    engines[F32].set_weights([w.astype(F32) for w in engines[F16].get_weights()])
    grads = {}
    for dtype, engine in engines.items():
        prediction = engine.forward({"X": X.astype(dtype)})[0].numpy()
        assert prediction.dtype == dtype
        # scikit-learn's squared error 0.5 * mean((p - y)**2): dE/dp
        grad_output = (prediction - y.reshape(prediction.shape).astype(dtype))
        grad_output = (grad_output / dtype(len(X))).astype(dtype)
        grads[dtype] = [g.numpy() for g in engine.backward([grad_output])]
    for name, g16, g32 in zip(engines[F16].weights_to_train, grads[F16], grads[F32]):
        assert g16.dtype == F16, name
        # float16 rounding of predictions, residuals and sums over 64 rows,
        # judged against the largest entry (observed: below 3e-4)
        err = relative_error(g32, g16)
        assert err <= TOLERANCE, f"{name}: relative error {err:.2e}"
    # training: the same loss curve as the float32 graph, decreasing
    curves = {}
    for dtype, model in ((F16, m16), (F32, m32)):
        est = OrtGradientForwardBackwardOptimizer(
            model, max_iter=5, learning_rate=1e-2, batch_size=16,
            warm_start=True)
        est.fit(X, y)
        assert est.predict(X[:3]).dtype == dtype
        curves[dtype] = np.asarray(est.train_losses_, dtype=F64)
    assert np.all(np.diff(curves[F16]) < 0), curves[F16]
    np.testing.assert_allclose(curves[F16], curves[F32], rtol=1e-2)
