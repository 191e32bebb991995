"""Element types and shapes of every value of a model (onnx shape inference)."""
from __future__ import annotations

import math

import onnx

from .builder import copy_fields, tensor_value_info
from .symbolic import refine_symbolic_dims

__all__ = ["clean_shape", "infer_value_types", "type_of_value_info"]


def type_of_value_info(value_info):
    """``(elem_type, shape)`` of a ValueInfoProto; shape is None if rank unknown.

    Dimensions are ints (static), strs (symbolic) or None (unknown).
    """
    type_proto = value_info.type
    if type_proto.WhichOneof("value") != "tensor_type":
        return None
    tensor = type_proto.tensor_type
    if not tensor.HasField("shape"):
        return tensor.elem_type, None
    # one WhichOneof per dim, not two HasField (thousands of values a build)
    dims = []
    for d in tensor.shape.dim:
        kind = d.WhichOneof("value")
        dims.append(d.dim_value if kind == "dim_value"
                    else (d.dim_param or None) if kind == "dim_param" else None)
    return tensor.elem_type, tuple(dims)


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


#: Float initializers above this many elements go to shape inference as
#: typed graph inputs, without their values.
_WEIGHT_SIZE = 64
_FLOATS = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE,
           onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)


def _without_weights(model):
    """A model for shape inference: ``model``'s nodes, with its float
    initializers of more than :data:`_WEIGHT_SIZE` elements as typed graph
    inputs. Inference reads a weight's type and shape, never its values
    (those of small integer tensors, which stay, feed data propagation),
    and serializing the weights both ways was most of its time."""
    graph = model.graph
    heavy = [t for t in graph.initializer if t.data_type in _FLOATS
             and math.prod(t.dims) > _WEIGHT_SIZE]
    if not heavy:
        return model
    light = onnx.ModelProto()
    copy_fields(light, model, skip=("graph",))
    new = copy_fields(light.graph, graph, skip=("initializer",))
    names = {t.name for t in heavy}
    new.initializer.extend(t for t in graph.initializer if t.name not in names)
    declared = {i.name for i in graph.input}
    new.input.extend(tensor_value_info(t.name, t.data_type, list(t.dims))
                     for t in heavy if t.name not in declared)
    return light


def infer_value_types(model):
    """Map every value name of ``model``'s main graph to ``(elem_type, shape)``.

    Runs :func:`onnx.shape_inference.infer_shapes` on a copy without the
    weights' values (the caller's model is not modified), then
    :func:`~onnxtrain.graph.symbolic.refine_symbolic_dims` on its result.
    Values whose type cannot be inferred are absent.
    """
    try:
        inferred = onnx.shape_inference.infer_shapes(_without_weights(model),
                                                     data_prop=True)
    except Exception:  # pragma: no cover - inference failing on exotic ops
        inferred = model
    graph = inferred.graph
    types = {}
    for init in model.graph.initializer:
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
    return refine_symbolic_dims(graph, types)
