"""Load a model from the accepted input types; describe tensor types as text."""
import os

import onnx

_DTYPE_NAMES = {"FLOAT": "float32", "DOUBLE": "float64", "FLOAT16": "float16"}


def load_model(model):
    """Return a ``onnx.ModelProto`` from a model, its serialized bytes or a path.

    Parameters
    ----------
    model : onnx.ModelProto, bytes, str or os.PathLike
        The model, its serialization, or the path of a ``.onnx`` file.

    Returns
    -------
    onnx.ModelProto
        ``model`` itself when it already is one (never copied nor modified).

    Raises
    ------
    TypeError
        When ``model`` is of any other type; the message names the type.
    FileNotFoundError
        When a path does not exist.
    """
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray, memoryview)):
        return onnx.load_model_from_string(bytes(model))
    if isinstance(model, (str, os.PathLike)):
        return onnx.load(os.fspath(model))
    raise TypeError(
        f"expected an onnx.ModelProto, serialized bytes or a path to an ONNX "
        f"file, got {type(model).__module__}.{type(model).__qualname__}")


def dtype_name(elem_type):
    """numpy-like name of an ONNX element type: 1 -> 'float32', 7 -> 'int64'."""
    try:
        name = onnx.TensorProto.DataType.Name(elem_type)
    except ValueError:
        return f"dtype{elem_type}"
    return _DTYPE_NAMES.get(name, name.lower())


def tensor_dims(type_proto):
    """Dimensions of a tensor type as strings ('2', 'N', '?'), None if rank unknown."""
    tensor = getattr(type_proto, type_proto.WhichOneof("value") or "tensor_type")
    if not tensor.HasField("shape"):
        return None
    return [str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?")
            for d in tensor.shape.dim]


def type_to_str(type_proto):
    """Compact text for a type: 'float32[?, 2]', 'seq(map(int64, float32))'."""
    kind = type_proto.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        dims = tensor_dims(type_proto)
        shape = "[...]" if dims is None else "[" + ", ".join(dims) + "]"
        prefix = "sparse " if kind == "sparse_tensor_type" else ""
        return prefix + dtype_name(getattr(type_proto, kind).elem_type) + shape
    if kind == "sequence_type":
        return f"seq({type_to_str(type_proto.sequence_type.elem_type)})"
    if kind == "map_type":
        key = dtype_name(type_proto.map_type.key_type)
        return f"map({key}, {type_to_str(type_proto.map_type.value_type)})"
    if kind == "optional_type":
        return f"optional({type_to_str(type_proto.optional_type.elem_type)})"
    return "?"


def shape_label(dims):
    """Shape as drawn in a box: '2x1', '?x2', 'scalar', or '?' when unknown."""
    if dims is None:
        return "?"
    return "x".join(dims) if dims else "scalar"


def value_shape_label(value_info):
    """Shape label of a graph input or output (its type text if not a tensor)."""
    if value_info.type.WhichOneof("value") in ("tensor_type", "sparse_tensor_type"):
        return shape_label(tensor_dims(value_info.type))
    return type_to_str(value_info.type)
