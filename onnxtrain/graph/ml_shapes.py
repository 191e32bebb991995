"""Element types and shapes of the outputs of the ``ai.onnx.ml`` operators
skl2onnx emits, which onnx's shape inference leaves without a shape (and
so every value downstream of them).

The rules follow onnxruntime's kernels: each takes the ``(elem_type,
shape)`` of the node's inputs (None when unknown) and gives those of its
outputs, or None when the inputs do not say. ``ZipMap`` and the other
operators producing sequences or maps have no tensor output to describe.
"""
from __future__ import annotations

import math

from onnx import TensorProto, helper

__all__ = ["ML_DOMAIN", "ml_output_types"]

ML_DOMAIN = "ai.onnx.ml"

_FLOAT = TensorProto.FLOAT


def _attrs(node):
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _batch(shape):
    """The first dim of a 2-D (or more) input, None for a 1-D one."""
    return shape[0] if shape is not None and len(shape) >= 2 else None


def _same_shape(elem_type):
    """Ops mapping each value (Scaler, Normalizer, Binarizer...)."""
    def rule(node, inputs, values):
        elem, shape = inputs[0]
        if shape is None:
            return None
        return [(elem if elem_type is None else elem_type, shape)]
    return rule


def _array_feature_extractor(node, inputs, values):
    elem, shape = inputs[0]
    indices = values.get(node.input[1])
    count = None if indices is None else math.prod(indices)
    if shape is None or count is None:
        return None
    if len(shape) == 1:  # onnxruntime: a row of the selected values
        return [(elem, (1, count))]
    return [(elem, tuple(shape[:-1]) + (count,))]


def _one_hot_encoder(node, inputs, values):
    _, shape = inputs[0]
    attrs = _attrs(node)
    categories = attrs.get("cats_int64s") or attrs.get("cats_strings")
    if shape is None or not categories:
        return None
    return [(_FLOAT, tuple(shape) + (len(categories),))]


def _feature_vectorizer(node, inputs, values):
    dims = _attrs(node).get("inputdimensions")
    shapes = [shape for _, shape in inputs]
    if not dims or any(s is None for s in shapes):
        return None
    batch = next((_batch(s) for s in shapes if _batch(s) is not None), None)
    return [(_FLOAT, (batch, int(sum(dims))))]


def _label_encoder(node, inputs, values):
    _, shape = inputs[0]
    attrs = _attrs(node)
    if shape is None:
        return None
    if "values_tensor" in attrs:
        return [(attrs["values_tensor"].data_type, shape)]
    for key, elem in (("values_int64s", TensorProto.INT64),
                      ("values_strings", TensorProto.STRING),
                      ("values_floats", _FLOAT)):
        if key in attrs:
            return [(elem, shape)]
    return None


def _linear_regressor(node, inputs, values):
    _, shape = inputs[0]
    targets = int(_attrs(node).get("targets", 1))
    return [(_FLOAT, (_batch(shape) if shape is not None else None, targets))]


def _linear_classifier(node, inputs, values):
    _, shape = inputs[0]
    attrs = _attrs(node)
    labels = attrs.get("classlabels_ints") or attrs.get("classlabels_strings")
    if not labels:
        return None
    label_elem = (TensorProto.INT64 if attrs.get("classlabels_ints")
                  else TensorProto.STRING)
    batch = _batch(shape) if shape is not None else None
    intercepts = attrs.get("intercepts")
    rows = len(intercepts) if intercepts else len(labels)
    # one coefficient row of two labels: onnxruntime writes both columns
    columns = 2 if rows == 1 and len(labels) == 2 else rows
    return [(label_elem, (batch,)), (_FLOAT, (batch, columns))]


_RULES = {
    "Scaler": _same_shape(_FLOAT),
    "Normalizer": _same_shape(_FLOAT),
    "Binarizer": _same_shape(None),
    "Imputer": _same_shape(None),
    "ArrayFeatureExtractor": _array_feature_extractor,
    "OneHotEncoder": _one_hot_encoder,
    "FeatureVectorizer": _feature_vectorizer,
    "LabelEncoder": _label_encoder,
    "LinearRegressor": _linear_regressor,
    "LinearClassifier": _linear_classifier,
}


def ml_output_types(node, types, shapes_of_values):
    """``(elem_type, shape)`` of each output of an ``ai.onnx.ml`` node.

    Parameters
    ----------
    node : onnx.NodeProto
    types : dict
        ``value name -> (elem_type, shape)`` known so far.
    shapes_of_values : dict
        ``initializer name -> dims`` (an ArrayFeatureExtractor's indices).

    Returns
    -------
    list of (int, tuple) or None
        One entry per output of the node, None when the op has no rule
        here or its inputs' types are not known.
    """
    rule = _RULES.get(node.op_type)
    if rule is None or node.domain != ML_DOMAIN:
        return None
    inputs = [types.get(name, (None, None)) for name in node.input]
    if not inputs or inputs[0][0] is None:
        return None
    result = rule(node, inputs, shapes_of_values)
    if result is None:
        return None
    return result[:len(node.output)]
