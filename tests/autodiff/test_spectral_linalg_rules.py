"""Finite-difference checks (float64) of the DFT, STFT, Det, MaxUnpool,
scatter-with-'mul' and Einsum-diagonal rules on forms onnx's node tests
leave out: dft_length, symbolic dimensions, inverse and one-sided
combinations, batched Det, duplicate indices and zeros.

Each row is one node whose float inputs are graph inputs (some with
symbolic dims) differentiated against central differences of
``sum(Y * dY)``; integer inputs are constants or graph inputs as noted.
"""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from gradcheck import (check_model, numeric_gradient, relative_error, run,
                       session, split_gradients)
from onnxtrain.autodiff import build_gradient_models
from onnxtrain.graph import make_model

D, I64 = TensorProto.DOUBLE, TensorProto.INT64
STRICT = 1e-6


def _one_node(op, floats, ints, opset, shapes=None, consts=(), **attrs):
    """Model of one node ``op``; ``floats``/``ints``: ordered name -> array
    (an empty name is an omitted input); ints named in ``consts`` become
    initializers, the others graph inputs; ``shapes`` overrides declared
    shapes (symbolic dims)."""
    shapes = shapes or {}
    values = {**floats, **ints}
    order = attrs.pop("order", list(values))
    attrs_rank = attrs.pop("out_rank", None)
    inputs, inits = [], []
    for name in order:
        if not name:
            continue
        value = values[name]
        if name in consts:
            inits.append(numpy_helper.from_array(value, name))
            continue
        elem = D if name in floats else I64
        inputs.append(helper.make_tensor_value_info(
            name, elem, shapes.get(name, value.shape)))
    node = helper.make_node(op, order, ["Y"], name="node", **attrs)
    graph = helper.make_graph([node], "g", inputs,
                              [helper.make_tensor_value_info("Y", D, None)],
                              inits)
    model = make_model(graph, [helper.make_opsetid("", opset)])
    inferred = onnx.shape_inference.infer_shapes(model).graph.output[0]
    if not inferred.type.tensor_type.HasField("shape"):  # rank only
        inferred = helper.make_tensor_value_info(
            "Y", D, [f"y{i}" for i in range(attrs_rank)])
    model.graph.output[0].CopyFrom(inferred)
    return model


def _check(model, feeds, wrt):
    gm = build_gradient_models(model, wrt)
    check_model(gm.forward_model)
    check_model(gm.backward_model)
    inference = session(gm.inference_model)
    ys = run(inference, feeds)
    rng = np.random.default_rng(7)
    grad_outputs = {o: rng.uniform(-1, 1, ys[o].shape) for o in gm.outputs}
    _, grads = split_gradients(gm, feeds, grad_outputs)
    for w in wrt:
        expected = numeric_gradient(inference, feeds, w, grad_outputs)
        assert relative_error(expected, grads[w]) <= STRICT, w


RNG = np.random.default_rng(0)


# ---------------------------------------------------------------------------
# DFT
# ---------------------------------------------------------------------------

# (last dim, inverse, onesided, dft_length)
DFT_FORMS = [(1, 0, 0, None), (2, 0, 0, 4), (2, 0, 0, 9), (1, 0, 1, None),
             (1, 0, 1, 4), (1, 0, 1, 9), (2, 1, 0, None), (1, 1, 0, 7),
             (2, 1, 0, 3), (2, 1, 1, None), (2, 1, 1, 10), (2, 1, 1, 11)]


@pytest.mark.parametrize("opset", [17, 20])
@pytest.mark.parametrize("last, inverse, onesided, n", DFT_FORMS)
def test_dft(opset, last, inverse, onesided, n):
    x = RNG.standard_normal((2, 6, 3, last))
    ints = {"n": np.array(n, np.int64)} if n is not None else {}
    attrs = dict(inverse=inverse, onesided=onesided)
    order = ["x", "n" if n is not None else ""]
    if opset >= 20:  # axis as an input computed at run time
        ints["axis"] = np.array(-3, np.int64)
        order.append("axis")
    else:
        attrs["axis"] = 1
    # an inverse one-sided DFT with a dft_length needs the number of bins
    # and a constant axis
    irfft_n = bool(inverse and onesided and n)
    symbolic = ("B", 6 if irfft_n else "L", 3, last)
    consts = ("n", "axis") if irfft_n else ("n",)
    model = _one_node("DFT", {"x": x}, ints, opset, order=order,
                      shapes={"x": symbolic}, consts=consts, **attrs)
    _check(model, {"x": x, **{k: v for k, v in ints.items()
                              if k not in consts}}, ["x"])


def test_dft_irfft_with_unsupported_length_refused():
    x = RNG.standard_normal((2, 6, 3, 2))
    model = _one_node("DFT", {"x": x}, {"n": np.array(12, np.int64)}, 17,
                      consts=("n",), axis=1, inverse=1, onesided=1)
    with pytest.raises(NotImplementedError, match="dft_length"):
        build_gradient_models(model, ["x"])


# ---------------------------------------------------------------------------
# STFT
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("opset", [17, 20])
@pytest.mark.parametrize("last, onesided, window, length", [
    (1, 1, True, True), (1, 0, True, False), (2, 0, True, True),
    (2, 0, False, True), (1, 1, False, True)])
def test_stft(opset, last, onesided, window, length):
    signal = RNG.standard_normal((2, 19, last))
    floats = {"signal": signal}
    if window:
        floats["window"] = RNG.standard_normal(6)
    ints = {"step": np.array(3, np.int64)}
    if length:
        ints["length"] = np.array(6, np.int64)
    order = ["signal", "step", "window" if window else "",
             "length" if length else ""]
    model = _one_node("STFT", floats, ints, opset, order=order,
                      shapes={"signal": ("B", "L", last)}, onesided=onesided,
                      out_rank=4)
    _check(model, {**floats, **ints}, list(floats))


# ---------------------------------------------------------------------------
# MaxUnpool (onnxruntime's kernel is float32 only; the op is linear in X, so
# a long finite-difference step is exact)
# ---------------------------------------------------------------------------

def test_maxunpool_repeated_indices():
    x = RNG.standard_normal((2, 1, 2, 2)).astype(np.float32)
    indices = np.array([5, 5, 0, 5, 16, 17, 31, 17], np.int64).reshape(x.shape)
    node = helper.make_node("MaxUnpool", ["x", "i"], ["Y"], name="node",
                            kernel_shape=[2, 2], strides=[2, 2])
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ("N", 1, 2, 2)),
         helper.make_tensor_value_info("i", I64, ("N", 1, 2, 2))],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT,
                                       ("N", 1, 4, 4))])
    model = make_model(graph, [helper.make_opsetid("", 22)])
    gm = build_gradient_models(model, ["x"])
    feeds = {"x": x, "i": indices}
    dy = RNG.uniform(-1, 1, (2, 1, 4, 4)).astype(np.float32)
    _, grads = split_gradients(gm, feeds, {"Y": dy})
    expected = numeric_gradient(session(gm.inference_model), feeds, "x",
                                {"Y": dy}, eps=0.5)
    assert relative_error(expected, grads["x"]) <= 1e-6
    assert grads["x"].ravel()[[0, 1]].tolist() == [0.0, 0.0]  # overwritten


# ---------------------------------------------------------------------------
# Det (onnxruntime's kernel is float32 only: compared with numpy's float64
# cofactors, at float32 precision)
# ---------------------------------------------------------------------------

def _cofactors(a):
    n = a.shape[-1]
    out = np.empty(a.shape)
    for i in range(n):
        for j in range(n):
            minor = np.delete(np.delete(a, i, axis=-2), j, axis=-1)
            out[..., i, j] = (-1) ** (i + j) * (
                np.linalg.det(minor) if n > 1 else 1.0)
    return out


def _check_det(a, symbolic=None):
    model = _one_node("Det", {"a": a}, {}, 22, shapes={"a": symbolic or a.shape})
    for vi in list(model.graph.input) + list(model.graph.output):
        vi.type.tensor_type.elem_type = TensorProto.FLOAT
    gm = build_gradient_models(model, ["a"])
    check_model(gm.backward_model)
    a32 = a.astype(np.float32)
    dy = RNG.uniform(-1, 1, a.shape[:-2]).astype(np.float32)
    _, grads = split_gradients(gm, {"a": a32}, {"Y": dy})
    expected = dy[..., None, None] * _cofactors(a32.astype(np.float64))
    assert relative_error(expected, grads["a"]) <= 1e-5


@pytest.mark.parametrize("shape", [(1, 1), (3, 3), (2, 3, 4, 4), (5, 2, 2)])
def test_det(shape):
    a = RNG.standard_normal(shape)
    _check_det(a, tuple(f"b{i}" for i in range(len(shape) - 2)) + shape[-2:])


def test_det_singular_matrix():
    # det(A) A^-T would fail at this rank-2 matrix; its cofactors, of rank
    # 1, are not zero
    a = np.arange(1.0, 10.0).reshape(3, 3) / 4
    _check_det(a)
    assert np.linalg.matrix_rank(_cofactors(a)) == 1


def test_det_symbolic_size_refused():
    a = RNG.standard_normal((3, 3))
    model = _one_node("Det", {"a": a}, {}, 22, shapes={"a": ("n", "n")})
    with pytest.raises(NotImplementedError, match="not static"):
        build_gradient_models(model, ["a"])


# ---------------------------------------------------------------------------
# ScatterElements and ScatterND with reduction='mul': duplicate indices,
# zero updates (one or two at the same position) and zero data
# ---------------------------------------------------------------------------

def test_scatter_elements_mul_duplicates_and_zeros():
    data = RNG.standard_normal((3, 4))
    data[2, 0] = 0.0
    indices = np.array([[1, 1, 1], [2, 0, 2], [0, 0, 3]], np.int64)
    updates = RNG.standard_normal((3, 3))
    updates[0, 1] = 0.0           # the only zero among three at [0, 1]
    updates[1, 0] = updates[1, 2] = 0.0  # two zeros at [1, 2]
    model = _one_node("ScatterElements", {"data": data, "updates": updates},
                      {"indices": indices}, 18, consts=("indices",),
                      order=["data", "indices", "updates"], axis=1,
                      reduction="mul")
    _check(model, {"data": data, "updates": updates}, ["data", "updates"])


def test_scatternd_mul_duplicates_and_zeros():
    data = RNG.standard_normal((4, 3))
    indices = np.array([[0], [2], [0], [0]], np.int64)
    updates = RNG.standard_normal((4, 3))
    updates[0, 1] = 0.0
    updates[2, 2] = updates[3, 2] = 0.0
    model = _one_node("ScatterND", {"data": data, "updates": updates},
                      {"indices": indices}, 18, consts=("indices",),
                      order=["data", "indices", "updates"],
                      shapes={"data": ("N", 3), "updates": ("K", 3)},
                      reduction="mul")
    _check(model, {"data": data, "updates": updates}, ["data", "updates"])


# ---------------------------------------------------------------------------
# TensorScatter: wrapping circular writes, axis 1, no write_indices
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("mode, write", [("circular", [3, 4]),
                                         ("linear", [1, 0]),
                                         ("linear", None)])
def test_tensorscatter(mode, write):
    past = RNG.standard_normal((2, 5, 3))
    update = RNG.standard_normal((2, 4, 3))
    ints = {} if write is None else {"w": np.array(write, np.int64)}
    model = _one_node("TensorScatter", {"past": past, "update": update}, ints,
                      24, order=["past", "update"] + list(ints), axis=1,
                      mode=mode, shapes={"past": ("B", 5, 3),
                                         "update": ("B", 4, 3)})
    _check(model, {"past": past, "update": update, **ints}, ["past", "update"])


# ---------------------------------------------------------------------------
# Einsum: repeated subscripts (diagonals)
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("equation, shapes", [
    ("ii->i", [(4, 4)]), ("ii->", [(3, 3)]), ("...ii->...i", [(2, 3, 4, 4)]),
    ("iij,jk->ik", [(3, 3, 2), (2, 5)]), ("ij,jj->i", [(3, 4), (4, 4)]),
    ("iji->j", [(3, 2, 3)]), ("...ii", [(2, 3, 3)])])
def test_einsum_diagonal(equation, shapes):
    floats = {f"x{k}": RNG.standard_normal(s) for k, s in enumerate(shapes)}
    symbolic = {f"x{k}": tuple(f"d{k}_{a}" if a < len(s) - 2 else d
                               for a, d in enumerate(s))
                for k, s in enumerate(shapes)}
    model = _one_node("Einsum", floats, {}, 12, shapes=symbolic,
                      equation=equation)
    _check(model, floats, list(floats))


@pytest.mark.parametrize("equation, shapes", [
    ("...ij,jk->...ik", [(2, 3, 4, 5), (5, 2)]),
    ("ij,...jk->...ik", [(4, 5), (3, 5, 2)]),
    ("...ij,jk->...ik", [(4, 5), (5, 2)]),        # an empty ellipsis
    ("bij,...jk->...ik", [(3, 4, 5), (3, 5, 2)]),
    ("i...j,jk->i...k", [(4, 2, 3, 5), (5, 2)]),   # an ellipsis mid-term
    ("jk,i...j->i...k", [(5, 2), (4, 3, 5)]),
    ("i...j->i...j", [(2, 3, 4)])])
def test_einsum_ellipsis_in_one_operand(equation, shapes):
    """An ellipsis in one operand only: the other operand's gradient sums
    over those broadcast axes (onnx's Einsum keeps an input's ellipsis in
    an explicit output), the first's keeps them."""
    floats = {f"x{k}": RNG.standard_normal(s) for k, s in enumerate(shapes)}
    model = _one_node("Einsum", floats, {}, 12, equation=equation)
    _check(model, floats, list(floats))


# ---------------------------------------------------------------------------
# DynamicQuantizeLinear's y_scale (float32 only; piecewise linear in x, so
# a long finite-difference step is exact away from ties)
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("x", [[0.5, 2.0, -1.5, 0.25, -0.75, 1.0],
                               [-0.5, -2.0, -1.5, -0.25, -0.75, -1.0]])
def test_dynamic_quantize_linear_scale(x):
    x = np.array(x, np.float32).reshape(2, 3)
    f = TensorProto.FLOAT
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "scale", "zp"],
                            name="node")
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", f, ("N", 3))],
        [helper.make_tensor_value_info("scale", f, [])])
    model = make_model(graph, [helper.make_opsetid("", 11)])
    gm = build_gradient_models(model, ["x"])
    dscale = {"scale": np.array(0.7, np.float32)}
    _, grads = split_gradients(gm, {"x": x}, dscale)
    expected = numeric_gradient(session(gm.inference_model), {"x": x}, "x",
                                dscale, eps=1e-2)
    assert relative_error(expected, grads["x"]) <= 1e-4
    assert np.count_nonzero(grads["x"]) == (2 if x.max() > 0 else 1)


# ---------------------------------------------------------------------------
# Pad (constant) below opset 16, where the gradient is written with a plain
# scatter: the border's zeros must not overwrite element 0's gradient
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("opset, value", [(11, False), (13, True)])
def test_pad_border_below_opset_16(opset, value):
    x = RNG.standard_normal((2, 3))
    ints = {"pads": np.array([0, 0, 1, 2], np.int64)}
    floats = {"x": x, **({"value": np.array(0.5)} if value else {})}
    model = _one_node("Pad", floats, ints, opset, consts=("pads",),
                      order=["x", "pads"] + (["value"] if value else []))
    _check(model, floats, list(floats))
