"""Helpers shared by the small graphs (losses, update rules)."""
from onnx import TensorProto, helper

from .graph import GraphBuilder, make_model

DEFAULT_OPSET = 17


def new_builder(opset=None):
    """A builder for a small graph at ``opset`` (default 17)."""
    return GraphBuilder(opset or DEFAULT_OPSET)


def tensor_input(name, elem_type, shape=None):
    """A graph input/output declaration."""
    return helper.make_tensor_value_info(name, elem_type, shape)


def finish(g, name, inputs, outputs):
    """A ModelProto from builder ``g``."""
    graph = g.make_graph(name, inputs, outputs)
    return make_model(graph, [helper.make_opsetid("", g.opset)])


def check_float_type(elem_type):
    """Raise ValueError unless ``elem_type`` is float16/32/64."""
    if elem_type not in (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16):
        raise ValueError(f"Small graphs need a float element type, got "
                         f"{helper.tensor_dtype_to_string(elem_type)}.")
    return elem_type
