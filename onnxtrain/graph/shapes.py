"""Element types and shapes of every value of a model (onnx shape inference)."""
from __future__ import annotations

import onnx

__all__ = ["clean_shape", "infer_value_types", "type_of_value_info"]


def type_of_value_info(value_info):
    """``(elem_type, shape)`` of a ValueInfoProto; shape is None if rank unknown.

    Dimensions are ints (static), strs (symbolic) or None (unknown).
    """
    tensor = value_info.type.tensor_type
    if not value_info.type.HasField("tensor_type"):
        return None
    shape = None
    if tensor.HasField("shape"):
        shape = tuple(
            d.dim_value if d.HasField("dim_value")
            else (d.dim_param if d.HasField("dim_param") and d.dim_param else None)
            for d in tensor.shape.dim)
    return tensor.elem_type, shape


def clean_shape(shape):
    """``shape`` without the symbolic dims shape inference invents.

    :func:`onnx.shape_inference.infer_shapes` names the dims it cannot tell
    ``unk__0``, ``unk__1``... Those names mean something only within the
    model inference ran on, so they become unknown dims (None) before a
    shape is written into another graph.

    Parameters
    ----------
    shape : tuple of (int, str or None) or None
        Dims as :func:`type_of_value_info` returns them; None: rank unknown.

    Returns
    -------
    tuple or None
        The same dims, those named ``unk__*`` replaced by None.
    """
    if shape is None:
        return None
    return tuple(None if isinstance(d, str) and d.startswith("unk__") else d
                 for d in shape)


def infer_value_types(model):
    """Map every value name of ``model``'s main graph to ``(elem_type, shape)``.

    Runs :func:`onnx.shape_inference.infer_shapes` on a copy (the caller's
    model is not modified). Values whose type cannot be inferred are absent.
    """
    try:
        inferred = onnx.shape_inference.infer_shapes(_without_weight_data(model),
                                                     data_prop=True)
    except Exception:  # pragma: no cover - inference failing on exotic ops
        inferred = model
    graph = inferred.graph
    types = {}
    for init in graph.initializer:
        types[init.name] = (init.data_type, tuple(init.dims))
    for vi in list(graph.input) + list(graph.value_info) + list(graph.output):
        info = type_of_value_info(vi)
        if info is not None and vi.name not in types:
            types[vi.name] = info
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for att in node.attribute:
                if att.name == "value":
                    types[node.output[0]] = (att.t.data_type, tuple(att.t.dims))
    return types


#: Float initializers with more elements than this are typed without their
#: data during shape inference.
_INFERENCE_DATA_LIMIT = 64
_FLOAT_DATA_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE,
                               onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16})


def _without_weight_data(model):
    """``model`` with its large float initializers (weights) turned into
    typed graph inputs, for shape inference: ``infer_shapes`` serializes and
    parses the whole model, weights included, which for a CNN of 45 MB of
    weights was 90 MB of copies per call (two thirds of the peak memory of
    ``generate_artifacts`` on resnet18). The types and shapes are the
    initializers'; shape inference reads no float values (its data
    propagation follows integer shape tensors). Returns ``model`` itself
    when it has no such initializer."""
    graph = model.graph
    large = [i for i in graph.initializer if i.data_type in _FLOAT_DATA_TYPES
             and _size(i.dims) > _INFERENCE_DATA_LIMIT]
    if not large:
        return model
    new = onnx.ModelProto(ir_version=model.ir_version)
    new.opset_import.extend(model.opset_import)
    new.functions.extend(model.functions)
    new.graph.name = graph.name
    for field in ("node", "input", "output", "value_info", "sparse_initializer"):
        getattr(new.graph, field).extend(getattr(graph, field))
    names = {i.name for i in large}
    inputs = {i.name for i in graph.input}
    new.graph.initializer.extend(i for i in graph.initializer if i.name not in names)
    new.graph.input.extend(
        onnx.helper.make_tensor_value_info(i.name, i.data_type, list(i.dims))
        for i in large if i.name not in inputs)
    return new


def _size(dims):
    size = 1
    for d in dims:
        size *= d
    return size
