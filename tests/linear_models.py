"""One linear ONNX graph for the tests that need a small model to train:
X (N, n_features) -> X @ W + B (N, n_outputs) [-> Softmax over axis 1]."""
import numpy as np
from onnx import TensorProto, helper, numpy_helper


def linear_model(n_features=3, n_outputs=1, softmax=False, seed=0, scale=0.1,
                 opset=17, ir_version=None):
    """The graph, with W drawn as ``scale * randn`` from ``seed`` (zeros for
    ``scale=0``) and B zeros, float32; ``ir_version`` None keeps onnx's."""
    rng = np.random.RandomState(seed)
    inits = [numpy_helper.from_array(
                 (scale * rng.randn(n_features, n_outputs)).astype(np.float32), "W"),
             numpy_helper.from_array(np.zeros(n_outputs, dtype=np.float32), "B")]
    nodes = [helper.make_node("MatMul", ["X", "W"], ["XW"]),
             helper.make_node("Add", ["XW", "B"], ["Z" if softmax else "Y"])]
    if softmax:
        nodes.append(helper.make_node("Softmax", ["Z"], ["Y"], axis=1))
    graph = helper.make_graph(
        nodes, "linear",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, n_features])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, n_outputs])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    if ir_version is not None:
        model.ir_version = ir_version
    return model
