"""Place the boxes of an ONNX graph on a plane: graphviz ``dot`` or layered.

A graph is drawn as boxes: one per node (labelled with its op type), one per
graph input, initializer and graph output (labelled with name and shape).
Edges follow the data from producer to consumer. Coordinates are in inches,
y grows upwards, and the data flows downwards.
"""
import shutil
import warnings

import onnx

from ..assembly.models import load_model
from ._boxes import BOX_KINDS, FONT_SIZE, Box, Edge, GraphLayout  # noqa: F401
from ._dot import DotError, dot_layout
from ._layered import layered_layout
from ._model import shape_label, value_shape_label

_FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE,
                onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
LAYOUTS = ("auto", "dot", "python")

__all__ = ["BOX_KINDS", "FONT_SIZE", "LAYOUTS", "Box", "Edge", "GraphLayout",
           "describe_graph", "layout_onnx"]


def layout_onnx(model, layout="auto", weights=None):
    """Compute where every box and edge of an ONNX graph is drawn.

    Parameters
    ----------
    model : onnx.ModelProto, bytes, str or os.PathLike
        The model, its serialization or the path of an ONNX file.
    layout : {"auto", "dot", "python"}, default="auto"
        ``"dot"`` runs the graphviz ``dot`` executable, ``"python"`` the
        built-in layered layout, ``"auto"`` the first when ``dot`` is found
        on the PATH (falling back, with a warning, if it fails), else the
        second.
    weights : iterable of str, default=None
        Names drawn as trainable weights. By default: graph inputs that also
        are initializers, floating-point initializers that are not scalars,
        and every value ``w`` for which ``w_grad`` appears in the graph.

    Returns
    -------
    GraphLayout
        Boxes (kind ``"op"``, ``"input"``, ``"initializer"``, ``"weight"``,
        ``"output"`` or ``"gradient"``) with centre and size in inches, and
        edges; ``node_count`` equals ``len(model.graph.node)``.

    Raises
    ------
    TypeError
        If ``model`` is not a model, bytes or path.
    ValueError
        If ``layout`` is not one of the three names.
    RuntimeError
        If ``layout="dot"`` and ``dot`` is missing or fails.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    boxes, edges = describe_graph(load_model(model).graph, weights)
    for box in boxes:
        box.width, box.height = _text_box_size(box.label)
    if layout == "python" or (layout == "auto" and shutil.which("dot") is None):
        return layered_layout(boxes, edges)
    try:
        return dot_layout(boxes, edges)
    except DotError as exc:
        if layout == "dot":
            raise RuntimeError(str(exc)) from exc
        warnings.warn(f"{exc}; using the python layout", RuntimeWarning, stacklevel=2)
        return layered_layout(boxes, edges)


def describe_graph(graph, weights=None):
    """Boxes (unplaced) and edges of a ``GraphProto``; see :func:`layout_onnx`."""
    trainable = _trainable_names(graph, weights)
    boxes, producer = [], {}

    def add_value(name, kind, shape):
        if name.endswith("_grad"):
            kind = "gradient"
        elif name in trainable and kind != "output":
            kind = "weight"
        boxes.append(Box(f"v{len(boxes)}", kind, f"{name}\n{shape}"))
        return boxes[-1].id

    for init in graph.initializer:
        producer[init.name] = add_value(init.name, "initializer", _dims_label(init.dims))
    for init in graph.sparse_initializer:
        producer[init.values.name] = add_value(init.values.name, "initializer",
                                               _dims_label(init.dims))
    for inp in graph.input:
        if inp.name not in producer:  # an input with an initializer is drawn once
            producer[inp.name] = add_value(inp.name, "input", value_shape_label(inp))
    edges = []
    for node in graph.node:
        boxes.append(Box(f"n{len(boxes)}", "op", node.op_type))
        edges.extend(Edge(producer[name], boxes[-1].id) for name in node.input if name in producer)
        producer.update((name, boxes[-1].id) for name in node.output if name)
    for out in graph.output:
        box_id = add_value(out.name, "output", value_shape_label(out))
        if out.name in producer:
            edges.append(Edge(producer[out.name], box_id))
    return boxes, edges


def _dims_label(dims):
    return shape_label([str(d) for d in dims])


def _trainable_names(graph, weights):
    if weights is not None:
        return set(weights)
    inits = {init.name: init for init in graph.initializer}
    names = {inp.name for inp in graph.input if inp.name in inits}
    names.update(name for name, init in inits.items()
                 if init.data_type in _FLOAT_TYPES and len(init.dims) > 0)
    values = set(inits) | {inp.name for inp in graph.input}
    seen = {name for node in graph.node for name in node.output}
    seen.update(out.name for out in graph.output)
    names.update(name for name in values if name + "_grad" in seen)
    return names


def _text_box_size(label, font_size=FONT_SIZE):
    """Width and height (inches) of a box holding ``label``, as dot sizes it."""
    lines = label.split("\n")
    char_width = 0.6 * font_size / 72
    width = max(0.75, max(len(line) for line in lines) * char_width + 0.3)
    height = max(0.5, len(lines) * 1.2 * font_size / 72 + 0.2)
    return width, height
