"""graph.compact_model and graph.without_initializer_values: the copies a
long-kept model is stored as (the upb protobuf runtime keeps a rewritten
model's removed tensors allocated)."""
import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxtrain.graph import compact_model, without_initializer_values
from onnxtrain.graph.builder import copy_fields


def _linear_model(dtype):
    """Y = X @ W + B, W (3, 4) = 0..11, B = 1."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    w = numpy_helper.from_array(np.arange(12, dtype=dtype).reshape(3, 4), "W")
    b = numpy_helper.from_array(np.ones(4, dtype=dtype), "B")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["xw"]),
         helper.make_node("Add", ["xw", "B"], ["Y"])], "g",
        [helper.make_tensor_value_info("X", elem, ["N", 3])],
        [helper.make_tensor_value_info("Y", elem, ["N", 4])], [w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_compact_model_is_an_equal_copy():
    model = _linear_model(np.float32)
    # the rewrite pattern that leaves the old tensors allocated
    kept = [i for i in model.graph.initializer if i.name != "B"]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    model.graph.initializer.append(numpy_helper.from_array(np.full(4, 2.0, np.float32), "B"))
    compact = compact_model(model)
    assert compact is not model
    assert compact.SerializeToString() == model.SerializeToString()
    onnx.checker.check_model(compact)
    values = {i.name: numpy_helper.to_array(i) for i in compact.graph.initializer}
    np.testing.assert_array_equal(values["B"], np.full(4, 2.0, np.float32))
    np.testing.assert_array_equal(values["W"], np.arange(12).reshape(3, 4))


def test_without_initializer_values_keeps_names_types_dims():
    model = _linear_model(np.float64)
    light = without_initializer_values(model, ["W"])
    tensors = {i.name: i for i in light.graph.initializer}
    assert list(tensors) == ["W", "B"]
    assert (tensors["W"].data_type, list(tensors["W"].dims)) == (11, [3, 4])
    assert not tensors["W"].raw_data and not tensors["W"].double_data
    np.testing.assert_array_equal(numpy_helper.to_array(tensors["B"]), np.ones(4))
    # the caller's model keeps its values
    np.testing.assert_array_equal(numpy_helper.to_array(model.graph.initializer[0]),
                                  np.arange(12).reshape(3, 4))
    assert light.graph.node == model.graph.node


def test_without_initializer_values_is_the_cleared_copy():
    """The selective copy equals the whole copy with the values cleared,
    every other field kept (doc strings, metadata, value infos, external
    data fields of the tensors that keep their values)."""
    model = _linear_model(np.float32)
    model.doc_string, model.graph.doc_string = "m", "g"
    model.metadata_props.add().key = "k"
    model.graph.value_info.append(helper.make_tensor_value_info("xw", 1, ["N", 4]))
    model.graph.initializer[0].doc_string = "weight"
    light = without_initializer_values(model, ["W"])
    expected = onnx.ModelProto()
    expected.CopyFrom(model)
    for field in ("raw_data", "float_data"):
        expected.graph.initializer[0].ClearField(field)
    assert light.SerializeToString() == expected.SerializeToString()
    assert light.graph.initializer[0].doc_string == "weight"


def test_copy_fields_skips_the_named_fields():
    node = helper.make_node("Gemm", ["a", "b"], ["c"], name="n", alpha=2.0,
                            doc_string="d")
    copy = copy_fields(onnx.NodeProto(), node, skip=("attribute", "input"))
    assert (copy.op_type, copy.name, copy.doc_string) == ("Gemm", "n", "d")
    assert list(copy.output) == ["c"] and not copy.input and not copy.attribute
    full = copy_fields(onnx.NodeProto(), node)
    assert full == node
    full.attribute[0].f = 3.0  # a copy: the source is not touched
    assert node.attribute[0].f == 2.0
