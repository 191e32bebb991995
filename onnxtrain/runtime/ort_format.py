"""Models in ORT format (``.ort``, written by ``generate_artifacts(...,
ort_format=True)``): stock onnxruntime converts them and runs the bytes; a
ModelProto stub carries the inputs, outputs and metadata the api reads."""
from __future__ import annotations

import onnx
import onnxruntime
from onnx import helper

__all__ = ["OrtFormatModel", "is_ort_format", "save_ort_format"]

#: flatbuffers file identifier of ORT-format models (bytes 4 to 8).
_MAGIC = b"ORTM"


def is_ort_format(path):
    """Whether the file at ``path`` is an ORT-format model."""
    with open(path, "rb") as f:
        head = f.read(8)
    return head[4:8] == _MAGIC


def save_ort_format(onnx_path, ort_path):
    """Convert the ONNX model at ``onnx_path`` to ORT format at ``ort_path``
    with stock onnxruntime: a session saving its basic-optimized model in
    ORT format (what ``onnxruntime.tools.convert_onnx_models_to_ort``
    does). Metadata (onnxtrain's layouts) is kept."""
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = \
        onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(ort_path)
    options.add_session_config_entry("session.save_model_format", "ORT")
    options.log_severity_level = 3
    onnxruntime.InferenceSession(str(onnx_path), options,
                                 providers=["CPUExecutionProvider"])


def _value_info(node_arg):
    """ValueInfoProto of an onnxruntime NodeArg ("tensor(float)", shape)."""
    kind = node_arg.type
    if not kind.startswith("tensor("):
        return onnx.ValueInfoProto(name=node_arg.name)
    elem = onnx.TensorProto.DataType.Value(kind[len("tensor("):-1].upper())
    shape = None if node_arg.shape is None else [
        d if isinstance(d, (int, str)) else None for d in node_arg.shape]
    return helper.make_tensor_value_info(node_arg.name, elem, shape)


class OrtFormatModel:
    """An ORT-format model as the api uses a ModelProto.

    Parameters
    ----------
    path : str
        The ``.ort`` file.

    Attributes
    ----------
    graph : onnx.GraphProto
        Inputs and outputs only (no nodes, no initializers).
    metadata_props : list of onnx.StringStringEntryProto
        The model's metadata (onnxtrain's layouts).
    """

    def __init__(self, path):
        with open(path, "rb") as f:
            self._bytes = f.read()
        session = onnxruntime.InferenceSession(
            self._bytes, providers=["CPUExecutionProvider"])
        stub = helper.make_model(helper.make_graph(
            [], "ort_format", [_value_info(i) for i in session.get_inputs()],
            [_value_info(o) for o in session.get_outputs()]))
        helper.set_model_props(stub, session.get_modelmeta().custom_metadata_map)
        self.graph = stub.graph
        self.metadata_props = stub.metadata_props
        self.path = str(path)

    def SerializeToString(self):  # noqa: N802 - the ModelProto method name
        """The ORT-format bytes (onnxruntime.InferenceSession reads them)."""
        return self._bytes
