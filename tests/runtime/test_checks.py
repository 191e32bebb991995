"""check_onnx_model's checker sees the big initializers as typed graph
inputs once their data size is checked here (runtime/checks.py): the
bytes it parses leave the weights out, and a model whose weight data is
short or in two fields is refused with the messages of the whole model."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxtrain.exceptions import InvalidModelError
from onnxtrain.runtime.checks import _checked_bytes, check_onnx_model


def _model(weight):
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"])], "mm",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 50])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 4])],
        [weight, numpy_helper.from_array(np.ones(3, np.float32), "unused_small")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _weight():
    return numpy_helper.from_array(np.ones((50, 4), np.float32), "W")


def test_the_checker_reads_no_weight_data():
    model = _model(_weight())
    data = _checked_bytes(model)
    assert len(data) < 300 < model.ByteSize()
    light = onnx.load_from_string(data)
    assert [i.name for i in light.graph.initializer] == ["unused_small"]
    assert light.graph.input[-1].name == "W"
    assert [d.dim_value for d in light.graph.input[-1].type.tensor_type.shape.dim] == [50, 4]
    check_onnx_model(model)  # valid


@pytest.mark.parametrize("fault, says", [
    ("short raw", r"initializer 'W' declares shape \(50, 4\) \(200 float values\) "
                  r"but its data holds 796 bytes"),
    ("short typed", r"initializer 'W' declares shape \(50, 4\) \(200 float values\) "
                    r"but its data holds 199 values in float_data"),
    ("two fields", r"one and only one value field"),
    ("wrong field", r"its data holds 0 values in float_data")])
def test_a_big_initializer_at_fault_is_named(fault, says):
    weight = _weight()
    if fault == "short raw":
        weight.raw_data = weight.raw_data[:-4]
    elif fault == "short typed":
        weight = helper.make_tensor("W", TensorProto.FLOAT, [199], [1.0] * 199)
        weight.dims[:] = [50, 4]
    elif fault == "two fields":
        weight.float_data.extend([1.0] * 200)
    else:
        weight = helper.make_tensor("W", TensorProto.DOUBLE, [50, 4], [1.0] * 200)
        weight.data_type = TensorProto.FLOAT  # values in double_data
    model = _model(weight)
    assert _checked_bytes(model) == model.SerializeToString()  # whole: refused
    with pytest.raises(InvalidModelError, match=says):
        check_onnx_model(model)
