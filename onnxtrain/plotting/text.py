"""A compact text rendering of an ONNX model (:func:`onnx_to_text`)."""
import onnx
from onnx import helper, numpy_helper

from ..assembly.models import load_model
from ._model import dtype_name, type_to_str

MAX_VALUES = 8  # initializers and tensors with more elements show their shape only
MAX_STRING = 24
_DTYPE_ATTRIBUTES = {"to", "dtype", "output_dtype"}


def onnx_to_text(model):
    """Render an ONNX model as short text lines, for terminals and logs.

    One line per graph input and initializer (name, dtype, shape and, for
    tensors of at most 8 elements, the values), one line per node written
    as ``outputs = OpType(inputs) attributes``, then one line per output::

        input  X: float32[?, 2]
        init   coefficient: float32[2, 1] = [51.09, 80.77]
        mul_result = MatMul(cast_input, coefficient)
        output variable: float32[?, 1]

    Parameters
    ----------
    model : onnx.ModelProto, bytes, str or os.PathLike
        The model, its serialization or the path of an ONNX file.

    Returns
    -------
    str
        The lines joined by newlines. Ops outside the default domain are
        prefixed with their domain; empty (omitted) inputs show as ``_``.

    Raises
    ------
    TypeError
        If ``model`` is neither a ModelProto, bytes nor a path.
    """
    model = load_model(model)
    graph = model.graph
    opsets = ", ".join(f"{o.domain or 'ai.onnx'} {o.version}" for o in model.opset_import)
    lines = [f"graph {graph.name or '?'}  (ir {model.ir_version}; opset {opsets})"]
    lines.extend(f"input  {i.name}: {type_to_str(i.type)}" for i in graph.input)
    lines.extend(f"init   {t.name}: {_tensor_text(t)}" for t in graph.initializer)
    lines.extend(f"init   {t.values.name}: sparse {dtype_name(t.values.data_type)}"
                 f"[{', '.join(map(str, t.dims))}]" for t in graph.sparse_initializer)
    lines.extend(_node_text(node) for node in graph.node)
    lines.extend(f"output {o.name}: {type_to_str(o.type)}" for o in graph.output)
    lines.extend(f"function {f.domain}.{f.name}({', '.join(f.input)}): {len(f.node)} nodes"
                 for f in model.functions)
    return "\n".join(lines)


def _node_text(node):
    op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
    inputs = ", ".join(name or "_" for name in node.input)
    text = f"{', '.join(name or '_' for name in node.output)} = {op}({inputs})"
    if node.attribute:
        text += " " + ", ".join(f"{a.name}={_attribute_text(a)}" for a in node.attribute)
    return text


def _attribute_text(attr):
    if attr.ref_attr_name:
        return f"@{attr.ref_attr_name}"
    if attr.type == onnx.AttributeProto.INT and attr.name in _DTYPE_ATTRIBUTES:
        return dtype_name(attr.i)
    if attr.type == onnx.AttributeProto.TENSOR:
        return _tensor_text(attr.t)
    if attr.type == onnx.AttributeProto.GRAPH:
        return f"<graph {len(attr.g.node)} nodes>"
    if attr.type == onnx.AttributeProto.GRAPHS:
        return f"<{len(attr.graphs)} graphs>"
    if attr.type in (onnx.AttributeProto.SPARSE_TENSOR, onnx.AttributeProto.SPARSE_TENSORS,
                     onnx.AttributeProto.TENSORS, onnx.AttributeProto.TYPE_PROTO,
                     onnx.AttributeProto.TYPE_PROTOS):
        return f"<{onnx.AttributeProto.AttributeType.Name(attr.type).lower()}>"
    return _values_text(helper.get_attribute_value(attr))


def _tensor_text(tensor):
    text = f"{dtype_name(tensor.data_type)}[{', '.join(map(str, tensor.dims))}]"
    size = 1
    for dim in tensor.dims:
        size *= dim
    if size > MAX_VALUES or tensor.data_location == onnx.TensorProto.EXTERNAL:
        return text
    try:
        values = numpy_helper.to_array(tensor).ravel().tolist()
    except Exception:  # an element type numpy cannot hold: the shape says enough
        return text
    return f"{text} = {_values_text(values)}"


def _values_text(value):
    if isinstance(value, (list, tuple)):
        shown = [_values_text(v) for v in value[:MAX_VALUES]]
        more = f", ... ({len(value)})" if len(value) > MAX_VALUES else ""
        return "[" + ", ".join(shown) + more + "]"
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    if isinstance(value, str):
        return repr(value if len(value) <= MAX_STRING else value[:MAX_STRING] + "...")
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
