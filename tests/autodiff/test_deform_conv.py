"""Gradients of DeformConv (:mod:`onnxtrain.autodiff.rules.deform_conv`).

Oracles:

- onnxruntime's own DeformConv kernel checks the sampling the rule
  differentiates (:func:`~onnxtrain.autodiff.rules.deform_conv.expand`);
- central finite differences in float64 of onnxruntime's kernel check the
  gradient of every input (X, W, offset, B, mask), with a symbolic batch
  size run at two sizes. Offsets are drawn away from integers (the
  interpolation has kinks at integer sample positions) and far enough to
  put samples outside the image;
- at integer sample positions, a forward difference checks the convention
  (the right derivative).
"""
import copy

import numpy as np
import pytest
from onnx import TensorProto, helper

from gradcheck import (check_model, expansion_model, numeric_gradient,
                       relative_error, run, session, split_gradients)
from onnxtrain.autodiff import build_gradient_models
from onnxtrain.autodiff.rules.deform_conv import expand

D = TensorProto.DOUBLE


def _out_size(size, k, s, d, begin, end):
    return (size + begin + end - (k - 1) * d - 1) // s + 1


def _model(channels=2, out_channels=2, image=(4, 5), kernel=(2, 2),
           inputs=("B", "mask"), kernel_attr=True, **attrs):
    """A one-node float64 model with a symbolic batch size ``N``."""
    group, og = attrs.get("group", 1), attrs.get("offset_group", 1)
    strides = attrs.get("strides", [1, 1])
    dilations = attrs.get("dilations", [1, 1])
    pads = attrs.get("pads", [0, 0, 0, 0])
    out = [_out_size(image[i], kernel[i], strides[i], dilations[i], pads[i],
                     pads[i + 2]) for i in (0, 1)]
    taps = kernel[0] * kernel[1]
    shapes = {"X": ["N", channels, *image],
              "W": [out_channels, channels // group, *kernel],
              "offset": ["N", og * taps * 2, *out], "B": [out_channels],
              "mask": ["N", og * taps, *out]}
    names = ["X", "W", "offset", "B" if "B" in inputs else "",
             "mask" if "mask" in inputs else ""]
    while not names[-1]:
        names.pop()
    if kernel_attr:
        attrs["kernel_shape"] = list(kernel)
    node = helper.make_node("DeformConv", names, ["Y"], **attrs)
    graph = helper.make_graph(
        [node], "deform_conv",
        [helper.make_tensor_value_info(n, D, shapes[n]) for n in names if n],
        [helper.make_tensor_value_info("Y", D, ["N", out_channels, *out])])
    model = helper.make_model(graph,
                              opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    check_model(model)
    return model


def _feeds(model, n, seed):
    """Random inputs; offsets k + u with u in [0.05, 0.95] (away from
    integer positions), k in [-3, 2] (samples outside the image)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in model.graph.input:
        dims = [d.dim_value or n for d in vi.type.tensor_type.shape.dim]
        if vi.name == "offset":
            feeds[vi.name] = (rng.integers(-3, 3, dims)
                              + rng.uniform(0.05, 0.95, dims))
        else:
            feeds[vi.name] = rng.uniform(-1, 1, dims)
    return feeds


# one row per configuration: (model arguments, attributes)
CASES = [
    ({"inputs": ()}, {"pads": [1, 1, 1, 1]}),
    ({"channels": 4, "out_channels": 4, "inputs": ("B", "mask")},
     {"group": 2, "offset_group": 2, "strides": [2, 1],
      "pads": [1, 0, 2, 1]}),
    ({"channels": 4, "out_channels": 2, "inputs": ("mask",)},
     {"offset_group": 4, "dilations": [2, 1]}),
    ({"channels": 2, "out_channels": 4, "kernel": (3, 2), "inputs": ("B",),
      "kernel_attr": False},
     {"group": 2, "strides": [1, 2], "dilations": [1, 2],
      "pads": [2, 1, 0, 1]}),
]


@pytest.mark.parametrize("args, attrs", CASES)
def test_expansion_matches_onnxruntime(args, attrs):
    model = _model(**args, **attrs)
    feeds = _feeds(model, 2, seed=1)
    expected = session(model).run(None, feeds)[0]
    got = session(expansion_model(model, expand)).run(None, feeds)[0]
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("args, attrs", CASES)
def test_gradients_match_finite_differences_float64(args, attrs):
    model = _model(**args, **attrs)
    wrt = [i.name for i in model.graph.input]
    gm = build_gradient_models(model, wrt)
    check_model(gm.forward_model)
    check_model(gm.backward_model)
    reference = session(model)
    for n in (2, 1):  # symbolic batch size
        feeds = _feeds(model, n, seed=n)
        rng = np.random.default_rng(n)
        grad_outputs = {"Y": rng.normal(size=run(reference, feeds)["Y"].shape)}
        _, grads = split_gradients(gm, feeds, grad_outputs)
        for w in wrt:
            expected = numeric_gradient(reference, feeds, w, grad_outputs)
            assert np.any(expected), w
            assert relative_error(expected, grads[w]) < 1e-7, (w, n)


def test_symbolic_image_size():
    concrete = _model(pads=[1, 0, 1, 1], strides=[2, 1])
    model = copy.deepcopy(concrete)
    for vi in list(model.graph.input) + list(model.graph.output):
        if vi.name not in ("W", "B"):
            for axis, dim in zip((2, 3), vi.type.tensor_type.shape.dim[2:]):
                dim.dim_param = f"{'oi'[vi.name == 'X']}{axis}"
    wrt = [i.name for i in model.graph.input]
    gm = build_gradient_models(model, wrt)
    check_model(gm.backward_model)
    feeds = _feeds(concrete, 2, seed=7)
    reference = session(concrete)
    grad_outputs = {"Y": np.random.default_rng(8).normal(
        size=run(reference, feeds)["Y"].shape)}
    _, grads = split_gradients(gm, feeds, grad_outputs)
    for w in wrt:
        expected = numeric_gradient(reference, feeds, w, grad_outputs)
        assert relative_error(expected, grads[w]) < 1e-7, w


def test_offset_gradient_at_integer_positions_is_the_right_derivative():
    # integer offsets: every sample lies on a pixel (or on the border);
    # the gradient is the slope of the cell [p, p + 1)
    model = _model(inputs=("mask",), pads=[1, 1, 1, 1])
    feeds = _feeds(model, 1, seed=3)
    feeds["offset"] = np.floor(feeds["offset"])
    gm = build_gradient_models(model, ["offset"])
    grad_outputs = {"Y": np.random.default_rng(4).normal(
        size=run(session(model), feeds)["Y"].shape)}
    grad = split_gradients(gm, feeds, grad_outputs)[1]["offset"]
    sess, eps = session(model), 1e-6

    def objective(offset):
        return float(np.sum(run(sess, {**feeds, "offset": offset})["Y"]
                            * grad_outputs["Y"]))
    right = np.zeros_like(grad)
    for idx in np.ndindex(grad.shape):
        moved = feeds["offset"].copy()
        moved[idx] += eps
        right[idx] = (objective(moved) - objective(feeds["offset"])) / eps
    assert relative_error(right, grad) < 1e-6


def test_only_some_inputs():
    model = _model(channels=4, out_channels=2, offset_group=2, group=2)
    gm = build_gradient_models(model, ["offset", "mask"])
    feeds = _feeds(model, 2, seed=5)
    reference = session(model)
    grad_outputs = {"Y": np.random.default_rng(6).normal(
        size=run(reference, feeds)["Y"].shape)}
    _, grads = split_gradients(gm, feeds, grad_outputs)
    for w in ("offset", "mask"):
        expected = numeric_gradient(reference, feeds, w, grad_outputs)
        assert relative_error(expected, grads[w]) < 1e-7, w


def test_refusals_name_the_reason():
    x = helper.make_tensor_value_info("X", D, [1, 1, 5])
    w = helper.make_tensor_value_info("W", D, [1, 1, 2])
    off = helper.make_tensor_value_info("offset", D, [1, 2, 4])
    node = helper.make_node("DeformConv", ["X", "W", "offset"], ["Y"])
    graph = helper.make_graph([node], "g", [x, w, off], [
        helper.make_tensor_value_info("Y", D, None)])
    model = helper.make_model(graph,
                              opset_imports=[helper.make_opsetid("", 19)])
    with pytest.raises(NotImplementedError, match="X of rank 3"):
        build_gradient_models(model, ["W"])
    model = _model(kernel_attr=False)
    model.graph.input[1].type.tensor_type.shape.dim[3].dim_param = "k"
    with pytest.raises(NotImplementedError, match="kernel_shape"):
        build_gradient_models(model, ["W"])
