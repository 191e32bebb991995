"""Building blocks: elementwise ops, reductions, activations and layers.

Every block takes tensor names and returns the name of the tensor it
creates in the base model (see :func:`onnxtrain.onnxblock.base`). Constants
take the element type of the tensor they meet (float16, float32, float64).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from ..graph import elem_type_to_numpy
from ._block import Block

__all__ = ["Add", "Sub", "Mul", "Div", "Pow", "Constant", "ReduceMean",
           "ReduceSum", "Sigmoid", "Log", "Neg", "Abs", "Relu", "Clip",
           "PassThrough", "InputLike", "MatMul", "Gemm", "Linear", "Softmax",
           "LogSoftmax", "Cast", "LabelEncoder"]


class _Binary(Block):
    """``op_type(input1, input2)`` with numpy broadcasting."""

    op_type = None

    def build(self, input_name1, input_name2):
        state = self._state()
        a, b = state.meet(input_name1, input_name2)
        return state.op(self.op_type, a, b, like=a)


class _Unary(Block):
    """``op_type(input)``, of the input's element type."""

    op_type = None

    def build(self, input_name):
        return self._state().op(self.op_type, input_name, like=input_name)


def _op_block(base, op_type, doc):
    """A public block class: ``base``'s build running the ONNX op
    ``op_type``, documented by ``doc``."""
    return type(op_type, (base,), {"op_type": op_type, "__doc__": doc,
                                   "__module__": __name__, "__qualname__": op_type})


Add = _op_block(_Binary, "Add", "``input1 + input2`` (ONNX Add).")
Sub = _op_block(_Binary, "Sub", "``input1 - input2`` (ONNX Sub).")
Mul = _op_block(_Binary, "Mul", "``input1 * input2`` (ONNX Mul).")
Div = _op_block(_Binary, "Div", "``input1 / input2`` (ONNX Div).")
Sigmoid = _op_block(_Unary, "Sigmoid", "``1 / (1 + exp(-x))`` (ONNX Sigmoid).")
Log = _op_block(_Unary, "Log", "Natural logarithm (ONNX Log).")
Neg = _op_block(_Unary, "Neg", "``-x`` (ONNX Neg).")
Abs = _op_block(_Unary, "Abs", "``|x|`` (ONNX Abs).")
Relu = _op_block(_Unary, "Relu", "``max(x, 0)`` (ONNX Relu).")


class Pow(Block):
    """``input ** exponent`` (ONNX Pow).

    Parameters
    ----------
    exponent : float, default=None
        A constant exponent (created in the element type of the input);
        when None, ``build`` takes the exponent tensor as second argument.
    """

    def __init__(self, exponent=None):
        super().__init__()
        self._exponent = exponent

    def build(self, input_name, exponent_name=None):
        state = self._state()
        if exponent_name is None:
            if self._exponent is None:
                raise ValueError("Pow needs an exponent: Pow(exponent) or "
                                 "build(input_name, exponent_name).")
            exponent_name = state.const(self._exponent, state.elem_type(input_name))
        return state.op("Pow", input_name, exponent_name, like=input_name)


class Constant(Block):
    """A constant tensor.

    Parameters
    ----------
    value : float or array-like
        A scalar makes a tensor of shape [1] (as in onnxruntime's onnxblock);
        an array keeps its shape.

    Notes
    -----
    The constant is created in the float type of the base model (float32
    for an empty base) and re-created in the element type of the tensor it
    meets in a binary block (:class:`Add`, :class:`Mul`...).
    """

    def __init__(self, value):
        super().__init__()
        array = np.asarray(value, dtype=np.float64)
        self._value = array.reshape(1) if array.ndim == 0 else array

    def build(self):
        state = self._state()
        return state.const(self._value, state.float_type(), retypable=True)


class _Reduce(Block):
    op_type = None

    def __init__(self, axes=None, keepdims=False):
        super().__init__()
        self._axes = None if axes is None else [int(a) for a in np.ravel(axes)]
        self._keepdims = bool(keepdims)

    def build(self, input_name):
        state = self._state()
        state.sync()
        out = state.builder.reduce(self.op_type, input_name, self._axes,
                                   keepdims=int(self._keepdims))
        state._flush()
        state.builder.set_type(out, state.elem_type(input_name), None)
        return out


_REDUCE_DOC = """{} over ``axes``.

    Parameters
    ----------
    axes : list of int, default=None
        None reduces every axis (a rank-0 result without ``keepdims``).
    keepdims : bool, default=False
    """
ReduceMean = _op_block(_Reduce, "ReduceMean", _REDUCE_DOC.format("Mean"))
ReduceSum = _op_block(_Reduce, "ReduceSum", _REDUCE_DOC.format("Sum"))


class Clip(Block):
    """``min(max(x, clip_min), clip_max)`` (ONNX Clip).

    Parameters
    ----------
    clip_min, clip_max : float, default=None
        Bounds (None: unbounded), created in the element type of the input.
    """

    def __init__(self, clip_min=None, clip_max=None):
        super().__init__()
        self._min, self._max = clip_min, clip_max

    def build(self, input_name):
        state = self._state()
        elem = state.elem_type(input_name)
        if state.builder.opset < 11:
            return state.op("Clip", input_name, like=input_name,
                            min=None if self._min is None else float(self._min),
                            max=None if self._max is None else float(self._max))
        low = None if self._min is None else state.const(self._min, elem)
        high = None if self._max is None else state.const(self._max, elem)
        inputs = [input_name, low, high]
        while inputs[-1] is None:
            inputs.pop()
        return state.op("Clip", *inputs, like=input_name)


class PassThrough(Block):
    """Return the input name unchanged (no node)."""

    def build(self, input_name):
        return input_name


class InputLike(Block):
    """Create a graph input with the element type and shape of a value.

    Parameters
    ----------
    like_input_name : str
        Existing value whose type the new input copies.
    """

    def __init__(self, like_input_name):
        super().__init__()
        self._like = like_input_name

    def build(self, input_name):
        state = self._state()
        info = state.value_type(self._like)
        if info is None:
            raise ValueError(f"InputLike: {self._like!r} is not a typed value "
                             "of the base model.")
        return state.add_input(input_name, info[0], info[1])


class MatMul(Block):
    """Matrix product with numpy semantics (ONNX MatMul)."""

    def build(self, input_name1, input_name2):
        return self._state().op("MatMul", input_name1, input_name2,
                                like=input_name1)


class Gemm(Block):
    """``alpha * A' @ B' + beta * C`` (ONNX Gemm, 2-D inputs).

    Parameters
    ----------
    alpha, beta : float, default=1.0
    trans_a, trans_b : bool, default=False
    """

    def __init__(self, alpha=1.0, beta=1.0, trans_a=False, trans_b=False):
        super().__init__()
        self._attrs = dict(alpha=float(alpha), beta=float(beta),
                           transA=int(trans_a), transB=int(trans_b))

    def build(self, input_name1, input_name2, input_name3=None):
        inputs = [input_name1, input_name2] + ([input_name3] if input_name3 else [])
        return self._state().op("Gemm", *inputs, like=input_name1, **self._attrs)


class Linear(Block):
    """A fully connected layer ``x @ W.T + b`` with new initializers.

    Parameters
    ----------
    in_features, out_features : int
    bias : bool, default=True
    alpha, beta : float, default=1.0
        Gemm's scales of the product and of the bias.
    seed : int, default=0
        Seed of the initial values, uniform on [-1/sqrt(in_features),
        1/sqrt(in_features)] (PyTorch's ``nn.Linear`` range).

    Notes
    -----
    The weight (shape (out_features, in_features)) and bias (out_features,)
    are initializers named ``linear.weight`` / ``linear.bias`` (made unique)
    in the element type of the input; mark them with
    ``TrainingBlock.requires_grad`` to train them.
    """

    def __init__(self, in_features, out_features, bias=True, alpha=1.0,
                 beta=1.0, seed=0):
        super().__init__()
        self._shape = (int(out_features), int(in_features))
        self._bias, self._alpha, self._beta = bool(bias), alpha, beta
        self._seed = seed
        self.weight_name = self.bias_name = None

    def build(self, linear_input_name):
        state = self._state()
        elem = state.elem_type(linear_input_name)
        rng = np.random.default_rng(self._seed)
        bound = 1.0 / np.sqrt(self._shape[1])
        weight = rng.uniform(-bound, bound, self._shape)
        self.weight_name = _named_const(state, "linear.weight", weight, elem)
        inputs = [linear_input_name, self.weight_name]
        if self._bias:
            bias = rng.uniform(-bound, bound, self._shape[:1])
            self.bias_name = _named_const(state, "linear.bias", bias, elem)
            inputs.append(self.bias_name)
        return state.op("Gemm", *inputs, like=linear_input_name,
                        alpha=float(self._alpha), beta=float(self._beta),
                        transB=1)


def _named_const(state, base_name, value, elem_type):
    """A new initializer named after ``base_name`` (made unique)."""
    state.sync()
    name = state.builder.unique_name(base_name)
    array = np.asarray(value, dtype=elem_type_to_numpy(elem_type))
    state.model.graph.initializer.append(numpy_helper.from_array(array, name))
    state.builder.set_type(name, elem_type, array.shape)
    state.sync()
    return name


class _SoftmaxLike(Block):
    op_type = None

    def __init__(self, axis=-1):
        super().__init__()
        self._axis = int(axis)

    def build(self, input_name):
        return self._state().op(self.op_type, input_name, like=input_name,
                                axis=self._axis)


Softmax = _op_block(_SoftmaxLike, "Softmax", "Softmax along ``axis`` (default -1; "
                    "opset >= 13 semantics).")
LogSoftmax = _op_block(_SoftmaxLike, "LogSoftmax", "Log of the softmax along ``axis`` "
                       "(default -1; opset >= 13 semantics).")


class Cast(Block):
    """Cast to another element type (ONNX Cast).

    Parameters
    ----------
    to : int
        The target ``onnx.TensorProto`` element type (e.g.
        ``onnx.TensorProto.FLOAT``); strings holding numbers are parsed.
    """

    def __init__(self, to):
        super().__init__()
        self._to = int(to)

    def build(self, input_name):
        state = self._state()
        out = state.op("Cast", input_name, to=self._to)
        state.builder.set_type(out, self._to, None)
        return out


#: ai.onnx.ml opset imported for LabelEncoder when the model has none.
_ML_OPSET = 3


class LabelEncoder(Block):
    """Map keys to values (``ai.onnx.ml`` LabelEncoder).

    Parameters
    ----------
    default_float, default_int64, default_string : float, int, str, default=None
        Value of the keys absent from the keys list (None: the operator's
        default, -0.0, -1 and "_Unused").
    keys_floats, keys_int64s, keys_strings : list, default=None
        The keys: exactly one of the three lists.
    values_floats, values_int64s, values_strings : list, default=None
        The values, as many as keys: exactly one of the three lists; its
        type is the output's.

    Raises
    ------
    ValueError
        If not exactly one keys list and one values list are given, or
        their lengths differ.

    Notes
    -----
    The base model gets the ``ai.onnx.ml`` opset import (version 3) when it
    has none. Nothing differentiates through this block: it maps labels.
    """

    _OUTPUT = {"values_floats": 1, "values_int64s": 7, "values_strings": 8}

    def __init__(self, default_float=None, default_int64=None, default_string=None,
                 keys_floats=None, keys_int64s=None, keys_strings=None,
                 values_floats=None, values_int64s=None, values_strings=None):
        super().__init__()
        keys = {k: v for k, v in (("keys_floats", keys_floats),
                                  ("keys_int64s", keys_int64s),
                                  ("keys_strings", keys_strings)) if v is not None}
        values = {k: v for k, v in (("values_floats", values_floats),
                                    ("values_int64s", values_int64s),
                                    ("values_strings", values_strings))
                  if v is not None}
        if len(keys) != 1 or len(values) != 1:
            raise ValueError("LabelEncoder needs exactly one keys_* list and one "
                             f"values_* list; got {sorted(keys) + sorted(values)}.")
        (key_kind, key_list), = keys.items()
        (value_kind, value_list), = values.items()
        if len(key_list) != len(value_list):
            raise ValueError(f"LabelEncoder: {len(key_list)} keys but "
                             f"{len(value_list)} values.")
        self._attributes = {key_kind: list(key_list), value_kind: list(value_list)}
        for name, value in (("default_float", default_float),
                            ("default_int64", default_int64),
                            ("default_string", default_string)):
            if value is not None:
                self._attributes[name] = value
        self._output_type = self._OUTPUT[value_kind]

    def build(self, input_name):
        state = self._state()
        model = state.model
        if not any(o.domain == "ai.onnx.ml" for o in model.opset_import):
            model.opset_import.append(onnx.helper.make_opsetid("ai.onnx.ml",
                                                               _ML_OPSET))
        out = state.op("LabelEncoder", input_name, domain="ai.onnx.ml",
                       **self._attributes)
        state.builder.set_type(out, self._output_type, None)
        return out
