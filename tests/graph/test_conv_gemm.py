"""Small-output Convs with a trained weight lowered to im2col and one
MatMul (graph/conv_gemm.py): the same values as the Conv, gradients
against central differences, and the Convs left alone."""
import numpy as np
import pytest
from onnx import helper, numpy_helper

import onnxtrain.graph.conv_gemm as conv_gemm
from gradcheck import check_gradients, run, session

# (N, C, H, W, M, kernel, stride, pad, bias)
CASES = [(3, 4, 2, 2, 5, 3, 1, 1, True),    # every tap reads data
         (2, 3, 1, 1, 4, 3, 1, 1, False),   # 1x1 input: the centre tap only
         (3, 2, 4, 4, 3, 3, 2, 1, True),    # stride 2
         (2, 3, 5, 4, 2, 3, 2, 1, False),   # stride 2, odd padded sizes
         (2, 3, 3, 3, 4, 1, 2, 0, True),    # 1x1 kernel, stride 2 (downsample)
         (2, 3, 2, 2, 4, 3, 2, 1, True),    # 2x2 -> 1x1 at stride 2: 2x2 taps read data
         (2, 2, 1, 3, 3, 3, 1, 1, False)]   # 1x3 input: one row of taps reads data


def _model(n_ch, h, w, m, k, s, p, bias, group=1, dtype=np.float64):
    """A Conv model; ``k`` and ``s`` an int or a (height, width) pair, ``p``
    an int or the four pads (top, left, bottom, right)."""
    kh, kw = (k, k) if np.isscalar(k) else k
    sh, sw = (s, s) if np.isscalar(s) else s
    pads = [p] * 4 if np.isscalar(p) else list(p)
    rng = np.random.default_rng(0)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inits = [numpy_helper.from_array(
        rng.normal(size=(m, n_ch // group, kh, kw)).astype(dtype), "W")]
    if bias:
        inits.append(numpy_helper.from_array(rng.normal(size=m).astype(dtype), "B"))
    node = helper.make_node("Conv", ["X", "W"] + (["B"] if bias else []), ["Y"],
                            strides=[sh, sw], pads=pads, group=group)
    graph = helper.make_graph(
        [node], "conv", [helper.make_tensor_value_info("X", elem, ["N", n_ch, h, w])],
        [helper.make_tensor_value_info(
            "Y", elem, ["N", m, (h + pads[0] + pads[2] - kh) // sh + 1,
                        (w + pads[1] + pads[3] - kw) // sw + 1])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture
def any_size(monkeypatch):
    monkeypatch.setattr(conv_gemm, "MAX_OUTPUT_PIXELS", 10 ** 6)


@pytest.mark.parametrize("case", CASES)
def test_lowered_conv_values_and_gradients(case, any_size):
    n, c, h, w, m, k, s, p, bias = case
    weights = ["W", "B"] if bias else ["W"]
    x = np.random.default_rng(1).normal(size=(n, c, h, w))
    # values: against onnxruntime's Conv (float32 only on CPU)
    model = _model(c, h, w, m, k, s, p, bias, dtype=np.float32)
    lowered = conv_gemm.lower_small_convs(model, weights)
    assert "Conv" not in {node.op_type for node in lowered.graph.node}
    assert "Conv" in {node.op_type for node in model.graph.node}  # untouched
    x32 = x.astype(np.float32)
    expected = run(session(model), {"X": x32})["Y"]
    got = run(session(lowered), {"X": x32})["Y"]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    # gradients of every input, in float64, against central differences
    lowered = conv_gemm.lower_small_convs(_model(c, h, w, m, k, s, p, bias), weights)
    feeds = {i.name: numpy_helper.to_array(i) for i in lowered.graph.initializer
             if i.name in weights}
    check_gradients(lowered, ["X"] + weights, dict(feeds, X=x))


# depthwise: (N, C, H, W, kernel, stride, pad, bias), group = C = M; images
# of at most as many pixels as the kernel has taps
DEPTHWISE = [(3, 4, 2, 2, 3, 1, 1, True),    # every tap reads data
             (2, 6, 1, 1, 3, 1, 1, False),   # 1x1 input: the centre tap only
             (2, 3, 3, 3, 3, 2, 1, True),    # stride 2
             (2, 3, 2, 2, 3, 2, 1, False),   # 2x2 -> 1x1 at stride 2
             (2, 3, 1, 1, 1, 1, 0, True),    # 1x1 kernel: a scale per channel
             (2, 2, 1, 3, 3, 1, 1, False),   # one row of taps reads data
             (2, 3, 3, 2, (3, 2), (2, 1), (1, 0, 0, 1), True)]  # uneven


@pytest.mark.parametrize("case", DEPTHWISE)
def test_lowered_depthwise_conv_values_and_gradients(case):
    n, c, h, w, k, s, p, bias = case
    weights = ["W", "B"] if bias else ["W"]
    x = np.random.default_rng(1).normal(size=(n, c, h, w))
    model = _model(c, h, w, c, k, s, p, bias, group=c, dtype=np.float32)
    lowered = conv_gemm.lower_small_convs(model, weights)
    ops = {node.op_type for node in lowered.graph.node}
    assert "Conv" not in ops and "ConvTranspose" not in ops
    x32 = x.astype(np.float32)
    np.testing.assert_allclose(run(session(lowered), {"X": x32})["Y"],
                               run(session(model), {"X": x32})["Y"], rtol=1e-5, atol=1e-5)
    lowered = conv_gemm.lower_small_convs(
        _model(c, h, w, c, k, s, p, bias, group=c), weights)
    feeds = {i.name: numpy_helper.to_array(i) for i in lowered.graph.initializer
             if i.name in weights}
    _, grads = check_gradients(lowered, ["X"] + weights, dict(feeds, X=x))
    # the gradient of the Conv itself (onnxruntime's grouped kernels)
    _, direct = check_gradients(_model(c, h, w, c, k, s, p, bias, group=c, dtype=np.float32),
                                ["X"] + weights, dict({k_: v.astype(np.float32)
                                                       for k_, v in feeds.items()}, X=x32),
                                eps=0.5, tol=1e-3)
    for name in ["X"] + weights:
        np.testing.assert_allclose(grads[name], direct[name], rtol=1e-4, atol=1e-4)


def test_depthwise_convs_lowered_up_to_their_size():
    small = _model(4, 3, 3, 4, 3, 1, 1, False, group=4)       # 9 pixels, 9 taps
    assert conv_gemm.lower_small_convs(small, ["W"]) is not small
    large = _model(4, 4, 4, 4, 3, 1, 1, False, group=4)       # 16 pixels
    assert conv_gemm.lower_small_convs(large, ["W"]) is large
    # a lowered Conv keeps only the input and the effective weight for its
    # gradients: no product of the forward is read by the backward
    from onnxtrain.autodiff import build_gradient_models
    lowered = conv_gemm.lower_small_convs(small, ["W"])
    products = {n.output[0] for n in lowered.graph.node if n.op_type == "Mul"}
    backward = build_gradient_models(lowered, ["W"]).backward_model
    read = {i for n in backward.graph.node for i in n.input}
    assert products and not products & read
    multiplier = _model(2, 2, 2, 4, 3, 1, 1, False, group=2)  # 2 filters a channel
    assert conv_gemm.lower_small_convs(multiplier, ["W"]) is multiplier


def test_im2col_gather_matrix_against_numpy():
    # P maps every (input pixel) to the (tap, output pixel) reading it; a
    # tap reading padding has a zero column
    kernel, strides, pads, size = [3, 2], [2, 1], [1, 0, 1, 1], [5, 4]
    out = [(size[i] + pads[i] + pads[i + 2] - kernel[i]) // strides[i] + 1
           for i in range(2)]
    p = conv_gemm.gather_matrix(kernel, strides, pads, size, out)
    x = np.random.default_rng(0).normal(size=size)
    xp = np.pad(x, [(pads[0], pads[2]), (pads[1], pads[3])])
    expected = np.array([[xp[a * strides[0] + i, b * strides[1] + j]
                          for a in range(out[0]) for b in range(out[1])]
                         for i in range(kernel[0]) for j in range(kernel[1])])
    np.testing.assert_array_equal((x.reshape(-1) @ p).reshape(expected.shape), expected)
    assert set(np.unique(p)) == {0.0, 1.0}
    # a 1x1 image padded by 1 under a 3x3 kernel: only the centre tap reads it
    centre = conv_gemm.gather_matrix([3, 3], [1, 1], [1, 1, 1, 1], [1, 1], [1, 1])
    np.testing.assert_array_equal(centre, np.eye(9)[4:5])


@pytest.mark.parametrize("kernel, strides, pads, size", [
    ([3, 3], [1, 1], [1, 1, 1, 1], [1, 1]),     # the centre tap only
    ([3, 3], [2, 2], [1, 1, 1, 1], [2, 2]),     # taps 1..2 on each axis
    ([5, 3], [1, 2], [2, 0, 2, 1], [2, 4]),     # uneven
    ([3, 3], [1, 1], [1, 1, 1, 1], [4, 4]),     # every tap reads data
    ([7, 7], [2, 2], [3, 3, 3, 3], [1, 2])])
def test_live_taps_window(kernel, strides, pads, size):
    # the trimmed Conv reads the same pixels, and every tap outside the
    # window reads only padding (a zero column of the full gather matrix)
    out = conv_gemm.output_size(size, kernel, strides, pads)
    full = conv_gemm.gather_matrix(kernel, strides, pads, size, out)
    first, trimmed, new_pads = conv_gemm._live_taps(kernel, strides, pads, size, out)
    n_out = out[0] * out[1]
    window = [(first[0] + i) * kernel[1] + first[1] + j
              for i in range(trimmed[0]) for j in range(trimmed[1])]
    columns = np.concatenate([np.arange(k * n_out, (k + 1) * n_out) for k in window])
    np.testing.assert_array_equal(
        conv_gemm.gather_matrix(trimmed, strides, new_pads, size, out), full[:, columns])
    outside = np.ones(full.shape[1], bool)
    outside[columns] = False
    assert not full[:, outside].any()
    live = {k for k in range(kernel[0] * kernel[1]) if full[:, k * n_out:(k + 1) * n_out].any()}
    # the window is the smallest: its first and last rows and columns read data
    rows = {k // kernel[1] for k in live}
    cols = {k % kernel[1] for k in live}
    assert (min(rows), max(rows) - min(rows) + 1) == (first[0], trimmed[0])
    assert (min(cols), max(cols) - min(cols) + 1) == (first[1], trimmed[1])


@pytest.mark.parametrize("size, kernel, strides, pads", [
    ([1, 3], [3, 2], [2, 1], [1, 0, 2, 1]),   # rows trimmed, asymmetric pads
    ([2, 1], [2, 5], [1, 3], [0, 2, 1, 2]),   # columns trimmed, stride 3
    ([3, 2], [5, 3], [1, 1], [2, 1, 1, 1]),   # both, uneven
])
def test_lowered_conv_uneven_geometry(size, kernel, strides, pads, any_size):
    rng = np.random.default_rng(0)
    out = conv_gemm.output_size(size, kernel, strides, pads)

    def model(dtype):
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        inits = [numpy_helper.from_array(rng.normal(size=[3, 2] + kernel).astype(dtype), "W"),
                 numpy_helper.from_array(rng.normal(size=3).astype(dtype), "B")]
        node = helper.make_node("Conv", ["X", "W", "B"], ["Y"], kernel_shape=kernel,
                                strides=strides, pads=pads)
        graph = helper.make_graph(
            [node], "conv", [helper.make_tensor_value_info("X", elem, ["N", 2] + size)],
            [helper.make_tensor_value_info("Y", elem, ["N", 3] + out)], inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        return m

    first, trimmed, _ = conv_gemm._live_taps(kernel, strides, pads, size, out)
    assert trimmed != kernel  # the case trims taps
    x = rng.normal(size=[2, 2] + size)
    m32 = model(np.float32)
    lowered = conv_gemm.lower_small_convs(m32, ["W", "B"])
    assert "Conv" not in {n.op_type for n in lowered.graph.node}
    np.testing.assert_allclose(run(session(lowered), {"X": x.astype(np.float32)})["Y"],
                               run(session(m32), {"X": x.astype(np.float32)})["Y"],
                               rtol=1e-5, atol=1e-5)
    lowered = conv_gemm.lower_small_convs(model(np.float64), ["W", "B"])
    feeds = {i.name: numpy_helper.to_array(i) for i in lowered.graph.initializer
             if i.name in ("W", "B")}
    check_gradients(lowered, ["X", "W", "B"], dict(feeds, X=x))


def test_no_live_tap_keeps_the_kernel():
    # a 1-pixel row padded by 2 at stride 3: both output rows read padding
    # only (the output is the bias); the kernel is kept as it is
    assert conv_gemm._live_taps([1, 1], [3, 1], [2, 0, 2, 0], [1, 1], [2, 1]) == \
        ([0, 0], [1, 1], [2, 0, 2, 0])


def test_dead_taps_left_out_of_the_gemm(any_size):
    # resnet18's layer4 at 32x32 inputs: a 3x3 kernel over 1x1 images, the
    # GEMM over the centre tap only (K = C, not 9 C)
    lowered = conv_gemm.lower_small_convs(_model(6, 1, 1, 5, 3, 1, 1, False), ["W"])
    inits = {i.name: numpy_helper.to_array(i) for i in lowered.graph.initializer}
    select = [v for v in inits.values() if v.shape == (9, 1)]
    assert len(select) == 1 and select[0][4, 0] == 1 and select[0].sum() == 1
    # and no MatMul by the identity gather matrix of a 1x1 kernel on 1x1 images
    assert [n.op_type for n in lowered.graph.node].count("MatMul") == 2


def test_lowered_backward_has_no_pad_scatter():
    # the adjoint of the im2col product is a product (no Pad, no scatter)
    from onnxtrain.autodiff import build_fused_model
    lowered = conv_gemm.lower_small_convs(_model(3, 2, 2, 4, 3, 1, 1, True), ["W", "B"])
    fused, _ = build_fused_model(lowered, ["X", "W", "B"])
    ops = {n.op_type for n in fused.graph.node}
    assert not ops & {"Pad", "ScatterElements", "ScatterND", "Conv", "ConvTranspose"}, ops


# (N, C, H, W, M, kernel, stride, pad): Convs left to onnxruntime (64 and
# more output pixels) whose weight gradient is im2col and one GEMM, and
# whose input gradient is one GEMM too at stride 1
WEIGHT_GEMM_CASES = [(2, 3, 8, 8, 4, 3, 1, 1),
                     (2, 3, 9, 8, 4, 3, 1, 0),    # no padding, odd size
                     (2, 3, 8, 9, 4, 5, 1, 2),    # 5x5
                     (2, 3, 8, 8, 4, 1, 1, 0),    # 1x1
                     (2, 2, 9, 8, 3, 3, 2, 1),    # stride 2, odd size
                     (3, 3, 16, 16, 2, 7, 2, 3),  # resnet's 7x7 stem
                     (2, 4, 16, 16, 3, 1, 2, 0),  # 1x1 downsample
                     # pads differing per side, kernels and strides per axis
                     # (a swapped begin/end pad or axis shows here only)
                     (2, 3, 7, 6, 4, 3, 1, [0, 1, 2, 1]),
                     (2, 3, 6, 7, 4, (2, 3), 1, [1, 0, 0, 2]),
                     (2, 3, 8, 7, 4, (3, 2), (2, 1), [1, 0, 1, 1])]


def _stride_1(s):
    return all(v == 1 for v in np.atleast_1d(s))


@pytest.mark.parametrize("form", ["rows", "columns"])
@pytest.mark.parametrize("case", WEIGHT_GEMM_CASES)
def test_conv_weight_gradient_as_one_gemm(case, form, monkeypatch):
    from onnxtrain.autodiff import build_gradient_models
    # both im2col forms of dW (the columns' needs no transpose of dW)
    monkeypatch.setattr(conv_gemm, "columns_form", lambda *args: form == "columns")
    n, c, h, w, m, k, s, p = case
    # float32 (onnxruntime's CPU Conv has no float64 kernel): the Conv is
    # linear in each input, so central differences of a large step are
    # exact up to float32 rounding
    model = _model(c, h, w, m, k, s, p, True, dtype=np.float32)
    assert conv_gemm.lower_small_convs(model, ["W", "B"]) is model  # not lowered
    backward = build_gradient_models(model, ["X", "W", "B"]).backward_model
    ops = [node.op_type for node in backward.graph.node]
    # dW: one GEMM over the rows one Gather makes (no Slice per tap); dX at
    # stride 1: one more, on the rows of dY (no ConvTranspose)
    gemms = 2 if _stride_1(s) else 1
    assert ops.count("MatMul") + ops.count("Gemm") == gemms, ops
    assert ops.count("Gather") == gemms, ops
    assert ops.count("Gemm") == (form == "columns"), ops
    # dW transposed back from (M, K, C) by the rows form only
    assert sum(node.op_type == "Transpose" and list(node.attribute[0].ints) == [0, 3, 1, 2]
               for node in backward.graph.node) == (form == "rows") + _stride_1(s), ops
    assert "Conv" not in ops and ("ConvTranspose" in ops) == (not _stride_1(s)), ops
    # static sizes: ConvTranspose's pads crop dX (no border, no Slice)
    assert "Slice" not in ops, ops
    x = np.random.default_rng(1).normal(size=(n, c, h, w)).astype(np.float32)
    feeds = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    check_gradients(model, ["X", "W", "B"], dict(feeds, X=x), eps=0.5, tol=1e-4)


@pytest.mark.parametrize("n, c, m, pixels, columns", [
    (8, 512, 512, 16, True),   # resnet18 layer4 at 112x112: the weight is big
    (8, 3, 64, 56 * 56, True),  # the stem: runs of 3 values in rows
    # a symbolic batch counts as 8: columns from 8 images here, rows at 4
    ("N", 10, 20, 16, True), (8, 10, 20, 16, True), (4, 10, 20, 16, False),
    (8, 64, 64, 28 * 28, False),  # layer1 at 112x112: many pixels
    (8, 128, 128, 14 * 14, False)])
def test_weight_gradient_form_choice(n, c, m, pixels, columns):
    # the choices measured (conv_gemm.columns_form)
    assert conv_gemm.columns_form(n, c, m, pixels) == columns


@pytest.mark.parametrize("case", [c for c in WEIGHT_GEMM_CASES if _stride_1(c[6])]
                         + [(2, 3, 16, 16, 4, 3, 1, 1)])
def test_conv_input_gradient_as_a_conv(case, monkeypatch):
    # from _CONV_DX_MIN_PIXELS input pixels (16x16 here), dX is a Conv of
    # dY by the weight transposed and flipped, not a GEMM on im2col rows
    from onnxtrain.autodiff import build_gradient_models
    from onnxtrain.autodiff.rules import conv
    n, c, h, w, m, k, s, p = case
    if h * w < conv._CONV_DX_MIN_PIXELS:
        monkeypatch.setattr(conv, "_CONV_DX_MIN_PIXELS", h * w)
    model = _model(c, h, w, m, k, s, p, True, dtype=np.float32)
    backward = build_gradient_models(model, ["X", "W", "B"]).backward_model
    ops = [node.op_type for node in backward.graph.node]
    assert ops.count("Conv") == 1 and "ConvTranspose" not in ops, ops
    assert ops.count("Gather") == 1, ops  # the weight gradient's im2col only
    x = np.random.default_rng(1).normal(size=(n, c, h, w)).astype(np.float32)
    feeds = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    check_gradients(model, ["X", "W", "B"], dict(feeds, X=x), eps=0.5, tol=1e-4)


def test_grouped_conv_weight_gradient_keeps_the_conv_form():
    from onnxtrain.autodiff import build_gradient_models
    model = _model(4, 8, 8, 4, 3, 1, 1, False, group=2, dtype=np.float32)
    backward = build_gradient_models(model, ["W"]).backward_model
    assert "Gemm" not in {node.op_type for node in backward.graph.node}
    x = np.random.default_rng(1).normal(size=(2, 4, 8, 8)).astype(np.float32)
    check_gradients(model, ["X", "W"], {"X": x, "W": numpy_helper.to_array(
        model.graph.initializer[0])}, eps=0.5, tol=1e-4)


def test_convs_left_alone():
    big = _model(2, 8, 8, 3, 3, 1, 1, True)   # 64 output pixels
    assert conv_gemm.lower_small_convs(big, ["W", "B"]) is big
    small = _model(2, 2, 2, 3, 3, 1, 1, True)
    assert conv_gemm.lower_small_convs(small, []) is small       # constant weight
    grouped = _model(4, 2, 2, 4, 3, 1, 1, False, group=2)
    assert conv_gemm.lower_small_convs(grouped, ["W"]) is grouped
    assert conv_gemm.lower_small_convs(small, ["W", "B"]) is not small


@pytest.mark.parametrize("pads, kernel, strides, auto_pad", [
    ([0, 1, 1, 2], [3, 3], [1, 1], None),     # asymmetric
    (None, [3, 2], [1, 1], "SAME_UPPER"),     # non-square kernel, auto padding
    ([1, 0, 2, 1], [3, 3], [2, 1], None),     # asymmetric, strides (2, 1)
])
def test_conv_gradients_as_gemms_with_uneven_geometry(pads, kernel, strides, auto_pad):
    from onnxtrain.autodiff import build_gradient_models
    rng = np.random.default_rng(0)
    attrs = dict(kernel_shape=kernel, strides=strides)
    attrs.update(pads=pads) if pads else attrs.update(auto_pad=auto_pad)
    node = helper.make_node("Conv", ["X", "W"], ["Y"], **attrs)
    w = numpy_helper.from_array(rng.normal(size=[4, 3] + kernel).astype(np.float32), "W")
    graph = helper.make_graph(
        [node], "conv", [helper.make_tensor_value_info("X", 1, ["N", 3, 7, 6])],
        [helper.make_tensor_value_info("Y", 1, ["N", 4, "H", "W"])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    ops = [n.op_type for n in
           build_gradient_models(model, ["X", "W"]).backward_model.graph.node]
    assert ops.count("Gather") == (2 if strides == [1, 1] else 1), ops
    assert ("ConvTranspose" in ops) == (strides != [1, 1]), ops
    x = rng.normal(size=(2, 3, 7, 6)).astype(np.float32)
    check_gradients(model, ["X", "W"], {"X": x, "W": numpy_helper.to_array(w)},
                    eps=0.5, tol=1e-4)


def _two_convs(n_ch, size, first, second):
    """X (N, C, size, size) -> Conv -> Relu -> Conv, float32; ``first`` and
    ``second``: (out channels, kernel, stride, pads, bias)."""
    rng = np.random.default_rng(0)
    nodes, inits, value, c, hw = [], [], "X", n_ch, size
    for i, (m, k, s, pads, bias) in enumerate([first, second]):
        hw = (hw + pads[0] + pads[2] - k) // s + 1  # square maps, pads alike
        w = numpy_helper.from_array(
            (rng.normal(size=(m, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32), f"W{i}")
        inputs = [value, w.name]
        inits.append(w)
        if bias:
            inits.append(numpy_helper.from_array(rng.normal(size=m).astype(np.float32),
                                                 f"B{i}"))
            inputs.append(f"B{i}")
        nodes.append(helper.make_node("Conv", inputs, [f"C{i}"], strides=[s, s],
                                      pads=pads, name=f"conv{i}"))
        value, c = f"C{i}", m
        if i == 0:
            nodes.append(helper.make_node("Relu", [value], ["R0"]))
            value = "R0"
    graph = helper.make_graph(
        nodes, "convs", [helper.make_tensor_value_info("X", 1, ["N", n_ch, size, size])],
        [helper.make_tensor_value_info(value, 1, ["N", c, hw, hw])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("size, first, second, shared", [
    # 3x3 stride 1 with a bias, then 3x3 stride 2 (both on 7x7 / 4x4 maps)
    (7, (6, 3, 1, [1, 1, 1, 1], True), (5, 3, 2, [1, 1, 1, 1], False), 2),
    # uneven pads; a 1x1 Conv keeps onnxruntime's kernel (no columns to share)
    (6, (4, 3, 1, [0, 1, 1, 0], False), (3, 1, 1, [0, 0, 0, 0], True), 1),
    # 9x9 outputs: above MAX_SHARED_PIXELS, Convs left as they are
    (9, (4, 3, 1, [1, 1, 1, 1], True), (3, 3, 1, [1, 1, 1, 1], True), 0),
])
def test_forward_convs_on_the_weight_gradients_columns(size, first, second, shared,
                                                       tmp_path, monkeypatch):
    # the training model's forward reads the columns the weight gradient
    # builds (one Gather for both); values and gradients as PyTorch's
    torch = pytest.importorskip("torch")
    import onnx
    import onnxruntime as ort
    import onnxtrain.onnxblock as onnxblock
    from onnxtrain import artifacts
    from onnxtrain.api.module import read_layout
    from onnxtrain.onnxblock._training import TRAINING_METADATA
    monkeypatch.setattr(conv_gemm, "columns_form", lambda *args: True)
    monkeypatch.setattr(conv_gemm, "MAX_OUTPUT_PIXELS", 0)  # no lowering
    n_ch, n = 3, 2
    model = _two_convs(n_ch, size, first, second)
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    paths = artifacts.generate_artifacts(
        model, requires_grad=list(inits), loss=onnxblock.loss.MSELoss(),
        artifact_directory=tmp_path)
    training = onnx.load(paths["training_model"])
    layout = read_layout(training, TRAINING_METADATA, "training model")
    ops = [node.op_type for node in training.graph.node]
    assert ops.count("Conv") == 2 - shared, ops
    # one Gather per Conv for dW's columns (shared with the forward when
    # rewritten) and, at stride 1, one for the second Conv's dX (X has none)
    assert ops.count("Gather") == 2 + (second[2] == 1), ops
    rng = np.random.default_rng(1)
    x = rng.normal(size=(n, n_ch, size, size)).astype(np.float32)
    xt = torch.tensor(x, requires_grad=True)
    params = {k: torch.tensor(v, requires_grad=True) for k, v in inits.items()}
    h = torch.relu(torch.nn.functional.conv2d(
        torch.nn.functional.pad(xt, _torch_pads(first[3])), params["W0"], params.get("B0"),
        stride=first[2]))
    y = torch.nn.functional.conv2d(torch.nn.functional.pad(h, _torch_pads(second[3])),
                                   params["W1"], params.get("B1"), stride=second[2])
    target = rng.normal(size=tuple(y.shape)).astype(np.float32)
    loss = torch.nn.functional.mse_loss(y, torch.tensor(target))
    loss.backward()
    feeds = dict(inits, lazy_reset_grad=np.array(True))
    feeds[layout["user_inputs"][0]] = x
    feeds[layout["user_inputs"][1]] = target
    for buffer, name in zip(layout["buffers"], layout["trainable"]):
        feeds[buffer] = np.zeros_like(inits[name])
    sess = ort.InferenceSession(training.SerializeToString(),
                                providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    result = dict(zip(names, sess.run(None, {i.name: feeds[i.name]
                                             for i in sess.get_inputs()})))
    np.testing.assert_allclose(result[names[0]], loss.item(), rtol=1e-5)
    for grad, name in zip(layout["gradients"], layout["trainable"]):
        np.testing.assert_allclose(result[grad], params[name].grad.numpy(),
                                   rtol=1e-4, atol=1e-5)


def _torch_pads(pads):
    """ONNX (top, left, bottom, right) as torch's pad (left, right, top, bottom)."""
    return (pads[1], pads[3], pads[0], pads[2])


@pytest.mark.parametrize("strides, dilations, pads, group, size", [
    ([2, 3], [1, 1], [1, 0, 2, 1], 1, (9, 10)),   # output padding 1 and 2
    ([2, 2], [2, 1], [2, 1, 0, 1], 2, (8, 7)),    # dilated, grouped
    ([3, 2], [1, 2], [0, 0, 0, 0], 1, (7, 8)),    # no padding
])
def test_strided_conv_input_gradient_cropped_by_conv_transpose_pads(strides, dilations,
                                                                    pads, group, size):
    # static sizes: dX is one ConvTranspose whose pads and output padding
    # give X's size (no crop after it); against central differences
    from onnxtrain.autodiff import build_gradient_models
    rng = np.random.default_rng(0)
    c, m = 4, 6
    w = numpy_helper.from_array(rng.normal(size=(m, c // group, 3, 3)).astype(np.float32), "W")
    node = helper.make_node("Conv", ["X", "W"], ["Y"], strides=strides, dilations=dilations,
                            pads=pads, group=group)
    out = [(size[i] + pads[i] + pads[i + 2] - dilations[i] * 2 - 1) // strides[i] + 1
           for i in range(2)]
    graph = helper.make_graph(
        [node], "conv", [helper.make_tensor_value_info("X", 1, ["N", c, *size])],
        [helper.make_tensor_value_info("Y", 1, ["N", m, *out])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    nodes = build_gradient_models(model, ["X", "W"]).backward_model.graph.node
    transposed = [n.output[0] for n in nodes if n.op_type == "ConvTranspose"]
    assert len(transposed) == 1
    assert not any(n.op_type == "Slice" and transposed[0] in n.input for n in nodes)
    x = rng.normal(size=(2, c, *size)).astype(np.float32)
    check_gradients(model, ["X", "W"], {"X": x, "W": numpy_helper.to_array(w)},
                    eps=0.5, tol=1e-4)


@pytest.mark.parametrize("kernel, pads", [((3, 3), [1, 1, 1, 1]), ((3, 2), [2, 0, 0, 1]),
                                          ((1, 3), [0, 1, 0, 1])])
def test_conv_input_gradient_flips_the_weight_by_a_product(kernel, pads, monkeypatch):
    # the flipped weight of dX's Conv comes from a product by the anti-identity
    # (no Slice of negative steps); non-square kernels and uneven pads would
    # give wrong gradients if the taps or the pads were reversed wrongly
    import torch
    from onnxtrain.autodiff import build_gradient_models
    from onnxtrain.autodiff.rules import conv
    monkeypatch.setattr(conv, "_CONV_DX_MIN_PIXELS", 1)
    n, c, h, w, m = 2, 3, 6, 5, 4
    model = _model(c, h, w, m, kernel, 1, pads, True, dtype=np.float32)
    backward = build_gradient_models(model, ["X", "W", "B"]).backward_model
    ops = [node.op_type for node in backward.graph.node]
    assert "Slice" not in ops and ops.count("Conv") == 1, ops
    consts = {i.name: numpy_helper.to_array(i) for i in backward.graph.initializer}
    taps = kernel[0] * kernel[1]
    flips = [node for node in backward.graph.node if node.op_type == "MatMul"
             and node.input[1] in consts and consts[node.input[1]].shape == (taps, taps)]
    assert len(flips) == 1
    np.testing.assert_array_equal(consts[flips[0].input[1]], np.eye(taps)[::-1])
    x = np.random.default_rng(1).normal(size=(n, c, h, w)).astype(np.float32)
    feeds = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    check_gradients(model, ["X", "W", "B"], dict(feeds, X=x), eps=0.5, tol=1e-4)
    # dX against PyTorch's
    wt = torch.tensor(feeds["W"], dtype=torch.float64)
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    padded = torch.nn.functional.pad(xt, [pads[1], pads[3], pads[0], pads[2]])
    y = torch.nn.functional.conv2d(padded, wt)
    gy = np.random.default_rng(2).normal(size=tuple(y.shape)).astype(np.float32)
    y.backward(torch.tensor(gy, dtype=torch.float64))
    got = run(session(backward), dict(feeds, X=x, Y_grad=gy))
    np.testing.assert_allclose(got["X_grad"], xt.grad.numpy(), rtol=1e-4, atol=1e-4)
