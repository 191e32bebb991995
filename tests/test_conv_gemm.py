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
         (2, 3, 3, 3, 4, 1, 2, 0, True)]    # 1x1 kernel, stride 2 (downsample)


def _model(n_ch, h, w, m, k, s, p, bias, group=1, dtype=np.float64):
    rng = np.random.default_rng(0)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inits = [numpy_helper.from_array(
        rng.normal(size=(m, n_ch // group, k, k)).astype(dtype), "W")]
    if bias:
        inits.append(numpy_helper.from_array(rng.normal(size=m).astype(dtype), "B"))
    node = helper.make_node("Conv", ["X", "W"] + (["B"] if bias else []), ["Y"],
                            strides=[s, s], pads=[p] * 4, group=group)
    graph = helper.make_graph(
        [node], "conv", [helper.make_tensor_value_info("X", elem, ["N", n_ch, h, w])],
        [helper.make_tensor_value_info(
            "Y", elem, ["N", m, (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1])],
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


def test_taps_reading_padding_only_are_dropped(any_size):
    # a 3x3 kernel over a 1x1 image padded by 1: only the centre tap
    lowered = conv_gemm.lower_small_convs(_model(3, 1, 1, 4, 3, 1, 1, False), ["W"])
    # two Slices: the one tap of the input, the centre column of the weight
    slices = [n for n in lowered.graph.node if n.op_type == "Slice"]
    assert len(slices) == 2 and slices[1].input[0] == "W"


def test_convs_left_alone():
    big = _model(2, 8, 8, 3, 3, 1, 1, True)   # 64 output pixels
    assert conv_gemm.lower_small_convs(big, ["W", "B"]) is big
    small = _model(2, 2, 2, 3, 3, 1, 1, True)
    assert conv_gemm.lower_small_convs(small, []) is small       # constant weight
    grouped = _model(4, 2, 2, 4, 3, 1, 1, False, group=2)
    assert conv_gemm.lower_small_convs(grouped, ["W"]) is grouped
    assert conv_gemm.lower_small_convs(small, ["W", "B"]) is not small
