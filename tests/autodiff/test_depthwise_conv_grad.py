"""Conv gradients of autodiff/rules/conv.py against PyTorch in float64 and
central differences: the weight gradient of a depthwise Conv (group =
channels, one filter a channel), taken tap by tap in channels-last layout,
over strides, dilations, uneven pads and kernels, and the Convs that keep
the general form; the input gradient as a ConvTranspose cropping through
its own pads (static sizes), and the 1x1 Conv's input gradient over a
large image (no flip of its kernel)."""
import numpy as np
import pytest
import torch
from onnx import helper, numpy_helper

from gradcheck import check_gradients, run, session
from onnxtrain.autodiff import build_gradient_models

# (N, C, H, W, kernel, stride, dilation, pads (top, left, bottom, right))
CASES = [(2, 4, 8, 8, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
         (2, 4, 9, 8, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),   # stride 2, odd height
         (1, 3, 7, 6, (3, 2), (2, 1), (1, 1), (1, 0, 0, 1)),   # uneven
         (3, 2, 9, 9, (3, 3), (1, 2), (2, 1), (2, 1, 2, 1)),   # dilation
         (2, 5, 6, 6, (5, 5), (1, 1), (1, 1), (0, 0, 0, 0)),   # no padding
         (2, 3, 5, 5, (1, 1), (2, 2), (1, 1), (0, 0, 0, 0))]   # 1x1 kernel


def _model(c, h, w, kernel, strides, dilations, pads, group=None, m=None):
    """A Conv with bias, depthwise unless ``group`` (then ``m`` filters)."""
    group, m = (c, c) if group is None else (group, m)
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(
        rng.normal(size=(m, c // group) + tuple(kernel)).astype(np.float32), "W"),
        numpy_helper.from_array(rng.normal(size=m).astype(np.float32), "B")]
    node = helper.make_node("Conv", ["X", "W", "B"], ["Y"],
                            strides=list(strides), dilations=list(dilations),
                            pads=list(pads), group=group)
    out = [(s + pads[i] + pads[i + 2] - d * (k - 1) - 1) // st + 1
           for i, (s, k, st, d) in enumerate(zip((h, w), kernel, strides, dilations))]
    f = helper.make_tensor_value_info
    graph = helper.make_graph(
        [node], "dw", [f("X", 1, ["N", c, h, w])], [f("Y", 1, ["N", m] + out)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _ops(model):
    return [n.op_type for n in model.graph.node]


def _check(model, case, group):
    n, c, h, w, kernel, strides, dilations, pads = case
    x = np.random.default_rng(1).normal(size=(n, c, h, w)).astype(np.float32)
    weights = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    # a Conv is linear in each input: central differences of a large step
    # are exact up to float32 rounding
    _, grads = check_gradients(model, ["X", "W", "B"], dict(weights, X=x),
                               eps=0.5, tol=2e-3)
    # torch in float64 on the same values, with the output gradient
    # check_gradients drew (seed 0)
    y = run(session(model), dict(weights, X=x))["Y"]
    gy = np.random.default_rng(0).normal(size=y.shape).astype(np.float32)
    tx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    tw = torch.tensor(weights["W"], dtype=torch.float64, requires_grad=True)
    tb = torch.tensor(weights["B"], dtype=torch.float64, requires_grad=True)
    padded = torch.nn.functional.pad(tx, (pads[1], pads[3], pads[0], pads[2]))
    ty = torch.nn.functional.conv2d(padded, tw, tb, stride=strides,
                                    dilation=dilations, groups=group)
    np.testing.assert_allclose(ty.detach().numpy(), y, rtol=1e-4, atol=1e-4)
    ty.backward(torch.tensor(gy, dtype=torch.float64))
    for name, t in (("X", tx), ("W", tw), ("B", tb)):
        np.testing.assert_allclose(grads[name], t.grad.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", CASES)
def test_depthwise_conv_gradients_against_torch(case):
    model = _model(*case[1:])
    backward = build_gradient_models(model, ["X", "W", "B"]).backward_model
    # the weight's taps, no Conv; the input's ConvTranspose crops itself
    assert "Conv" not in _ops(backward)
    (transposed,) = [n for n in backward.graph.node if n.op_type == "ConvTranspose"]
    assert "pads" in {a.name for a in transposed.attribute}
    _check(model, case, case[1])


# (N, C, H, W, kernel, stride, dilation, pads, group, M)
GROUPED = [(2, 4, 9, 8, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 1, 3),
           (2, 4, 7, 9, (3, 2), (2, 3), (2, 1), (2, 0, 1, 1), 2, 4),
           (1, 3, 16, 16, (1, 1), (1, 1), (1, 1), (0, 0, 0, 0), 1, 5),  # 1x1, 256 pixels
           (1, 2, 16, 17, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1, 2)]  # 3x3, 272 pixels


@pytest.mark.parametrize("case", GROUPED)
def test_conv_input_gradients_against_torch(case):
    _check(_model(*case[1:]), case[:8], case[8])


def test_other_grouped_convs_keep_the_conv_form():
    # two filters a channel, or symbolic spatial sizes: the general Conv form
    rng = np.random.default_rng(0)
    f = helper.make_tensor_value_info
    for w_shape, x_shape in (((4, 1, 3, 3), ["N", 2, 6, 6]), ((2, 1, 3, 3), ["N", 2, "H", "W"])):
        node = helper.make_node("Conv", ["X", "W"], ["Y"], pads=[1] * 4, group=2)
        graph = helper.make_graph(
            [node], "g", [f("X", 1, x_shape)], [f("Y", 1, None)],
            [numpy_helper.from_array(rng.normal(size=w_shape).astype(np.float32), "W")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        assert "Conv" in _ops(build_gradient_models(model, ["W"]).backward_model)
