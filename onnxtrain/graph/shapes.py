"""Element types and shapes of every value of a model (onnx shape inference)."""
from __future__ import annotations

import math

import onnx

from .builder import copy_fields, tensor_value_info
from .ml_shapes import ML_DOMAIN, ml_output_types
from .symbolic import refine_symbolic_dims

__all__ = ["clean_shape", "infer_value_types", "initializers_as_inputs",
           "type_of_value_info"]


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
    heavy = [t for t in model.graph.initializer if t.data_type in _FLOATS
             and math.prod(t.dims) > _WEIGHT_SIZE]
    # an initializer that is also a graph output declared without a shape:
    # onnx's inference types the value from that declaration, and every
    # value computed from it loses its shape
    stored = {t.name: t for t in model.graph.initializer}
    shapeless = [o for o in model.graph.output if o.name in stored
                 and not o.type.tensor_type.HasField("shape")]
    light = initializers_as_inputs(model, heavy) if heavy or shapeless else model
    for out in light.graph.output if shapeless else ():
        tensor = stored.get(out.name)
        if tensor is not None and not out.type.tensor_type.HasField("shape"):
            out.CopyFrom(tensor_value_info(out.name, tensor.data_type, list(tensor.dims)))
    return light


def initializers_as_inputs(model, tensors):
    """A copy of ``model`` where the initializers ``tensors`` are typed
    graph inputs (type and shape, no values) and the others stay.

    Parameters
    ----------
    model : onnx.ModelProto
        Left unchanged.
    tensors : sequence of onnx.TensorProto
        Initializers of ``model`` (their names count).

    Returns
    -------
    onnx.ModelProto
        For the passes that read a weight's type and shape only (shape
        inference, onnx's checker): serializing the values both ways would
        be most of their time.
    """
    graph = model.graph
    light = onnx.ModelProto()
    copy_fields(light, model, skip=("graph",))
    new = copy_fields(light.graph, graph, skip=("initializer",))
    names = {t.name for t in tensors}
    new.initializer.extend(t for t in graph.initializer if t.name not in names)
    declared = {i.name for i in graph.input}
    new.input.extend(tensor_value_info(t.name, t.data_type, list(t.dims))
                     for t in tensors if t.name not in declared)
    return light


def _without_output_shapes(light):
    """A copy of ``light`` whose outputs are typed without their declared
    shapes, for a model declaring a shape its nodes contradict (skl2onnx
    declares a PLSRegression's prediction (N, n_features)): inference then
    computes them, :func:`_declared_dims` completes them."""
    model = onnx.ModelProto()
    copy_fields(model, light, skip=("graph",))
    graph = copy_fields(model.graph, light.graph, skip=("output",))
    graph.output.extend(
        tensor_value_info(o.name, o.type.tensor_type.elem_type, None)
        if o.type.WhichOneof("value") == "tensor_type" else o
        for o in light.graph.output)
    return model


def _declared_dims(inferred, declared):
    """An output's inferred shape completed by its declared one: the
    declared rank and dims where inference does not tell, the inferred
    static dims where they differ."""
    if inferred is None or declared is None or len(inferred) != len(declared):
        return declared if inferred is None else inferred
    return tuple(i if isinstance(i, int) or d is None or (
        isinstance(d, str) and d.startswith("unk__")) else d
        for i, d in zip(inferred, declared))


def _onnx_types(model, light):
    """``name -> (elem_type, shape)`` from onnx's shape inference on
    ``light`` (``model`` or its copy without the weights' values)."""
    stripped = False
    try:
        # strict: a declared shape the nodes contradict is an error, not
        # silently kept
        inferred = onnx.shape_inference.infer_shapes(light, strict_mode=True,
                                                     data_prop=True)
    except Exception as error:
        stripped = "existing shape differ" in str(error)
        if stripped:
            light = _without_output_shapes(light)
        try:
            inferred = onnx.shape_inference.infer_shapes(light, data_prop=True)
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
    for vi in model.graph.output if stripped else ():
        info = type_of_value_info(vi)
        if info is not None and vi.name in types and types[vi.name][0] == info[0]:
            types[vi.name] = (info[0], _declared_dims(types[vi.name][1], info[1]))
        elif info is not None and vi.name not in types:
            types[vi.name] = info
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for att in node.attribute:
                if att.name == "value":
                    types[node.output[0]] = (att.t.data_type, tuple(att.t.dims))
    return inferred.graph, types


def _conflicts(declared, computed):
    """Whether a declared shape contradicts the one onnxruntime computes
    (another rank, or another static dim)."""
    if declared is None or computed is None:
        return False
    if len(declared) != len(computed):
        return True
    return any(isinstance(a, int) and isinstance(b, int) and a != b
               for a, b in zip(declared, computed))


def _ml_types(model, types):
    """Types of the ``ai.onnx.ml`` outputs onnx left unknown
    (:func:`~onnxtrain.graph.ml_shapes.ml_output_types`), in node order so
    that chains (Imputer, then Scaler...) resolve in one pass, and
    ``(unknown, wrong)``: the outputs whose declared shape contradicts
    onnxruntime's (skl2onnx declares a binary RidgeClassifier's
    probabilities (N, 2); the ArrayFeatureExtractor writing them gives
    (N, 1))."""
    dims = {i.name: tuple(i.dims) for i in model.graph.initializer}
    found, wrong = {}, {}
    for node in model.graph.node:
        if node.domain != ML_DOMAIN:
            continue
        outputs = ml_output_types(node, {**types, **found, **wrong}, dims)
        for name, info in zip(node.output, outputs or ()):
            if not name:
                continue
            if types.get(name, (None, None))[1] is None:  # rank unknown
                found[name] = info
            elif types[name][0] == info[0] and _conflicts(types[name][1], info[1]):
                wrong[name] = info
    return found, wrong


def infer_value_types(model):
    """Map every value name of ``model``'s main graph to ``(elem_type, shape)``.

    Runs :func:`onnx.shape_inference.infer_shapes` on a copy without the
    weights' values (the caller's model is not modified), then
    :func:`~onnxtrain.graph.symbolic.refine_symbolic_dims` on its result.
    The outputs of the ``ai.onnx.ml`` operators onnx gives no shape
    (Scaler, Normalizer, Imputer...) get theirs from
    :func:`~onnxtrain.graph.ml_shapes.ml_output_types`, and inference runs
    again from them for the values downstream; their rules also replace a
    declared output shape onnxruntime contradicts. Values whose type
    cannot be inferred are absent.
    """
    light = _without_weights(model)
    graph, types = _onnx_types(model, light)
    extra, wrong = _ml_types(model, types)
    while extra:
        if light is model:  # the caller's model is not modified
            light = onnx.ModelProto()
            light.CopyFrom(model)
        light.graph.value_info.extend(
            tensor_value_info(name, elem, shape)
            for name, (elem, shape) in extra.items())
        graph, types = _onnx_types(model, light)
        types.update((k, v) for k, v in extra.items()
                     if types.get(k, (None, None))[1] is None)
        extra, wrong = _ml_types(model, types)
    types.update(wrong)
    return refine_symbolic_dims(graph, types)
