"""Describe tensor types and shapes as text."""
import onnx


_DTYPE_NAMES = {"FLOAT": "float32", "DOUBLE": "float64", "FLOAT16": "float16"}


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
