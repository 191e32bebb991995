"""graph.compact_model: the copy a long-kept model is stored as (the upb
protobuf runtime keeps a rewritten model's removed tensors allocated)."""
import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnxtrain.graph import compact_model


def test_compact_model_is_an_equal_copy():
    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4), "W")
    b = numpy_helper.from_array(np.ones(4, dtype=np.float32), "B")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["xw"]),
         helper.make_node("Add", ["xw", "B"], ["Y"])], "g",
        [helper.make_tensor_value_info("X", 1, ["N", 3])],
        [helper.make_tensor_value_info("Y", 1, ["N", 4])], [w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
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
