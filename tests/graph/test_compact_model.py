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


def _decorated(model):
    """``model`` with a field of every kind the selective copies must keep:
    doc strings, metadata, a function, training_info, a value info, and a
    field no onnx version knows (field 100 of ModelProto and GraphProto)."""
    model.doc_string, model.graph.doc_string = "m", "g"
    model.metadata_props.add().key = "k"
    model.functions.append(helper.make_function(
        "custom", "f", ["a"], ["b"], [helper.make_node("Neg", ["a"], ["b"])],
        [helper.make_opsetid("", 17)]))
    model.training_info.add().algorithm.name = "algorithm"
    model.graph.value_info.append(helper.make_tensor_value_info("xw", 1, ["N", 4]))
    unknown = b"\xa0\x06\x05"  # field 100, varint 5
    graph = onnx.GraphProto.FromString(model.graph.SerializeToString() + unknown)
    model.graph.CopyFrom(graph)
    return onnx.ModelProto.FromString(model.SerializeToString() + unknown)


def test_without_initializer_values_is_the_cleared_copy():
    """The selective copy equals the whole copy with the values cleared,
    every other field kept: those of _decorated, and the external-data
    fields of the tensors that keep their values."""
    model = _decorated(_linear_model(np.float32))
    model.graph.initializer[0].doc_string = "weight"
    kept = model.graph.initializer[1]
    kept.data_location = onnx.TensorProto.EXTERNAL
    entry = kept.external_data.add()
    entry.key, entry.value = "location", "weights.bin"
    light = without_initializer_values(model, ["W"])
    expected = onnx.ModelProto()
    expected.CopyFrom(model)
    for field in ("raw_data", "float_data"):
        expected.graph.initializer[0].ClearField(field)
    assert light.SerializeToString() == expected.SerializeToString()
    assert light.graph.initializer[0].doc_string == "weight"
    assert light.graph.initializer[1].external_data[0].value == "weights.bin"
    assert not light.graph.initializer[0].raw_data


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
    # a singular message field
    info = helper.make_tensor_value_info("v", 1, ["N", 3])
    copy = copy_fields(onnx.ValueInfoProto(), info, skip=("name",))
    assert copy.type == info.type and not copy.name
    # a field the schema does not know: the whole message is copied
    model = _decorated(_linear_model(np.float32))
    copy = copy_fields(onnx.ModelProto(), model, skip=("graph",))
    model.ClearField("graph")
    assert copy.SerializeToString() == model.SerializeToString()


def test_copy_fields_of_maps():
    """Map fields (none in onnx's messages): scalar and message values."""
    from google.protobuf import struct_pb2
    source = struct_pb2.Struct()
    source.update({"a": 1.0, "b": {"c": "d"}})
    assert copy_fields(struct_pb2.Struct(), source) == source


def test_prediction_graph_copies_every_kept_field():
    """prediction_graph of a graph whose every node computes the output:
    the model itself, byte for byte (fields of _decorated included, the
    value info of a kept value, training_info, unknown fields)."""
    from onnxtrain.rewrite import prediction_graph
    model = _decorated(_linear_model(np.float32))
    before = model.SerializeToString()
    new = prediction_graph(model, "Y")
    assert new.SerializeToString() == before
    assert model.SerializeToString() == before
    # a dropped node takes its value info along, the rest stays
    new = prediction_graph(model, "xw")
    assert [n.op_type for n in new.graph.node] == ["MatMul"]
    assert [i.name for i in new.graph.initializer] == ["W"]
    assert not new.graph.value_info and new.training_info == model.training_info


def test_running_statistics_copy_keeps_every_other_field():
    """with_running_statistics_updates builds its model field by field: the
    fields of _decorated stay, and the running statistics of an export
    listing its initializers as inputs (keep_initializers_as_inputs) become
    inputs once, at the end."""
    from onnxtrain.training_mode import updated_name, with_running_statistics_updates
    vi = helper.make_tensor_value_info
    stats = {n: numpy_helper.from_array(np.full(2, v, np.float32), n)
             for n, v in (("scale", 1.0), ("bias", 0.0), ("mean", 0.0), ("var", 1.0))}
    graph = helper.make_graph(
        [helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"],
                          ["y", "mean_out", "var_out"], training_mode=1)],
        "g", [vi("x", 1, ["N", 2, 3])] + [vi(n, 1, [2]) for n in
                                          ("mean", "var", "scale", "bias")],
        [vi("y", 1, ["N", 2, 3])], list(stats.values()))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.graph.value_info.append(vi("y", 1, ["N", 2, 3]))
    model = _decorated(model)
    before = model.SerializeToString()
    for as_inputs in (True, False):
        new, buffers, initial = with_running_statistics_updates(model, as_inputs=as_inputs)
        assert model.SerializeToString() == before
        assert buffers == ["mean", "var"]
        assert (new.doc_string, new.graph.doc_string) == ("m", "g")
        assert new.metadata_props == model.metadata_props
        assert new.functions == model.functions
        assert new.training_info == model.training_info
        assert new.graph.value_info == model.graph.value_info
        inputs = [i.name for i in new.graph.input]
        inits = [i.name for i in new.graph.initializer]
        if as_inputs:  # moved to the end, listed once
            assert inputs == ["x", "scale", "bias", "mean", "var"]
            assert "mean" not in inits and "var" not in inits
        else:  # left where they were, initializers too
            assert inputs == ["x", "mean", "var", "scale", "bias"]
            assert inits[:4] == ["scale", "bias", "mean", "var"]
        assert [o.name for o in new.graph.output] == [
            "y", updated_name("mean"), updated_name("var")]
        np.testing.assert_array_equal(initial["var"], np.ones(2, np.float32))
        assert new.SerializeToString().endswith(b"\xa0\x06\x05")


def test_split_weight_values_and_back_give_the_same_model():
    """The float initializers of more than ``min_elements`` elements leave
    without their values (the others, the integer ones, keep them); the
    values are the model's own tensors, and putting them back gives the
    model byte for byte; the model is not modified."""
    from onnxtrain.graph.builder import split_weight_values, with_initializer_values
    model = _linear_model(np.float32)
    model.graph.initializer.append(
        numpy_helper.from_array(np.arange(20, dtype=np.int64), "I"))
    data = model.SerializeToString()
    light, values = split_weight_values(model, min_elements=4)
    assert sorted(values) == ["W"]  # B: 4 elements; I: integers
    assert values["W"] is model.graph.initializer[0]
    by_name = {i.name: i for i in light.graph.initializer}
    assert not by_name["W"].raw_data and list(by_name["W"].dims) == [3, 4]
    np.testing.assert_array_equal(numpy_helper.to_array(by_name["B"]), np.ones(4))
    np.testing.assert_array_equal(numpy_helper.to_array(by_name["I"]), np.arange(20))
    assert with_initializer_values(light, values).SerializeToString() == data
    assert model.SerializeToString() == data
    # nothing to leave out: the model itself
    assert split_weight_values(model, min_elements=12) == (model, {})
