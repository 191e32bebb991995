"""The base model blocks edit, held in a context variable.

``with base(model):`` (a deep copy of ``model``) or ``with empty_base():``
sets the model every :class:`~onnxtrain.onnxblock.Block` called inside the
``with`` statement appends to. The model lives in a
:class:`contextvars.ContextVar`, not in a module global, so threads and
asyncio tasks each see their own base, and nested ``with`` statements
restore the outer base on exit.

Each base owns one :class:`~onnxtrain.graph.GraphBuilder`: it hands out the
names of new nodes and values (unique within that model, never taken from a
process-wide counter), creates constants in the element type they are asked
for and emits opset-aware reductions.
"""
from __future__ import annotations

import contextlib
import contextvars
import pathlib

import numpy as np
import onnx
from onnx import helper

from ..graph import (FLOAT_TYPES, GraphBuilder, infer_value_types, opset_of,
                     type_of_value_info)
from ..graph.builder import tensor_value_info
from ..runtime.checks import check_onnx_model, load_checked_model

__all__ = ["base", "owned_base", "empty_base", "current_base", "BaseState",
           "ModelAccessor", "DEFAULT_OPSET"]

#: Default-domain opset of :func:`empty_base` when none is given (read by
#: every onnxruntime release since 1.14).
DEFAULT_OPSET = 17

_CURRENT = contextvars.ContextVar("onnxtrain_onnxblock_base", default=None)


class BaseState:
    """The model blocks edit, with its name registry and known value types.

    Parameters
    ----------
    model : onnx.ModelProto
        Owned by the state (edited in place): :func:`base` passes a copy.

    Attributes
    ----------
    model : onnx.ModelProto
    builder : GraphBuilder
        Owns the names of the model; its pending nodes and initializers are
        moved into ``model`` after every emission (:meth:`op`, :meth:`const`).
    """

    def __init__(self, model):
        self.model = model
        self.builder = GraphBuilder(opset_of(model) or DEFAULT_OPSET)
        self._seen = {"node": 0, "initializer": 0, "input": 0, "output": 0,
                      "value_info": 0}
        self._retypable = {}
        self._declare_types()
        self.sync()

    def _declare_types(self):
        """Record the types the model declares (graph inputs, outputs and
        value_info with a shape): a block reading them (a loss on the
        model's output) needs no shape inference."""
        graph = self.model.graph
        for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
            info = type_of_value_info(vi)
            if info is not None and info[0] and info[1] is not None:
                self.builder.set_type(vi.name, *info)

    # names -------------------------------------------------------------
    def sync(self):
        """Register the names of graph entries added since the last call.

        Blocks that edit ``model.graph`` directly (as the original onnxblock
        allowed) keep working: their names are reserved before the next
        block runs. Only entries added since the last call are scanned.
        """
        graph = self.model.graph
        used = self.builder._used
        for field in ("initializer", "input", "output", "value_info"):
            entries = getattr(graph, field)
            if len(entries) == self._seen[field]:  # the usual case: no slice
                continue
            for entry in entries[self._seen[field]:]:
                used.add(entry.name)
            self._seen[field] = len(entries)
        if len(graph.node) == self._seen["node"]:
            return
        for node in graph.node[self._seen["node"]:]:
            used.update(n for n in node.output if n)
            if node.name:
                used.add(node.name)
        self._seen["node"] = len(graph.node)

    def has_name(self, name):
        """Whether ``name`` is already a value or node name of the model."""
        self.sync()
        return name in self.builder._used

    def is_value(self, name):
        """Whether ``name`` is an input, initializer or node output."""
        graph = self.model.graph
        if any(i.name == name for i in graph.input) or \
                any(i.name == name for i in graph.initializer):
            return True
        return any(name in node.output for node in graph.node)

    def _flush(self):
        graph = self.model.graph
        graph.node.extend(self.builder.nodes)
        graph.initializer.extend(self.builder.initializers)
        self.builder.nodes.clear()
        self.builder.initializers.clear()
        self._seen["node"] = len(graph.node)
        self._seen["initializer"] = len(graph.initializer)

    # emission ------------------------------------------------------------
    def op(self, op_type, *inputs, like=None, **attributes):
        """Append one node to the model and return its output name(s).

        ``like``: a value whose element type the (first) output takes; when
        omitted the output type is found later by shape inference if needed.
        """
        self.sync()
        out = self.builder.op(op_type, *inputs, **attributes)
        self._flush()
        if like is not None:
            elem = self.elem_type(like, required=False)
            if elem is not None:
                first = out if isinstance(out, str) else out[0]
                self.builder.set_type(first, elem, None)
        return out

    def const(self, value, elem_type, retypable=False):
        """An initializer holding ``value`` in ``elem_type``; its name.

        ``retypable`` constants (those of ``blocks.Constant``) are re-created
        in the element type of the tensor they meet in a binary block.
        """
        self.sync()
        name = self.builder.const(value, elem_type)
        self._flush()
        if retypable:
            self._retypable[name] = np.asarray(value)
        return name

    def add_input(self, name, elem_type, shape):
        """Add a graph input; ``shape`` is a tuple of dims or None."""
        self.sync()
        self.builder.reserve(name)
        self.model.graph.input.append(
            tensor_value_info(name, elem_type, _clean(shape)))
        self.builder.set_type(name, elem_type, shape)
        self._seen["input"] = len(self.model.graph.input)
        return name

    # types ---------------------------------------------------------------
    def value_type(self, name):
        """``(elem_type, shape)`` of a value, running shape inference on a
        miss; None when inference cannot tell."""
        info = self.builder.types.get(name)
        if info is None or info[1] is None:
            for key, value in infer_value_types(self.model).items():
                known = self.builder.types.get(key)
                if known is None or known[1] is None:
                    self.builder.types[key] = value
            info = self.builder.types.get(name, info)
        return info

    def elem_type(self, name, required=True):
        """ONNX element type of ``name``.

        Raises
        ------
        ValueError
            If ``required`` and the type cannot be found (the message names
            the value).
        """
        info = self.builder.types.get(name) or self.value_type(name)
        if info is None or not info[0]:
            if required:
                raise ValueError(
                    f"The element type of {name!r} is unknown: it is not a "
                    "value of the base model, or shape inference cannot type "
                    "it (add value_info or input types to the model).")
            return None
        return info[0]

    def float_type(self):
        """The float element type of the model (that of its first float
        graph output or input), FLOAT when it has none."""
        graph = self.model.graph
        for vi in list(graph.output) + list(graph.input):
            elem = vi.type.tensor_type.elem_type
            if elem in FLOAT_TYPES:
                return elem
        return onnx.TensorProto.FLOAT

    def meet(self, a, b):
        """Re-create a retypable constant among ``a``, ``b`` in the element
        type of the other value; return the two names."""
        if a in self._retypable and b not in self._retypable:
            a = self._retype(a, b)
        elif b in self._retypable and a not in self._retypable:
            b = self._retype(b, a)
        return a, b

    def _retype(self, constant, other):
        target = self.elem_type(other, required=False)
        if target is None or target not in FLOAT_TYPES or \
                target == self.elem_type(constant):
            return constant
        return self.const(self._retypable[constant], target, retypable=True)


def _clean(shape):
    if shape is None:
        return None
    return [None if isinstance(d, str) and d.startswith("unk__") else d
            for d in shape]


class ModelAccessor:
    """What ``with base(...)`` and ``with empty_base(...)`` yield.

    Attributes
    ----------
    model : onnx.ModelProto
        The base model the blocks edit (onnxruntime's onnxblock yields an
        object with this attribute). Other attributes are read from the
        model, so ``with base(m) as model: model.graph`` works too.
    """

    __slots__ = ("model",)

    def __init__(self, model):
        self.model = model

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __setattr__(self, name, value):
        if name == "model":
            object.__setattr__(self, name, value)
        else:
            setattr(self.model, name, value)

    def __repr__(self):
        return f"ModelAccessor(graph={self.model.graph.name!r})"


def current_base():
    """The :class:`BaseState` of the innermost ``with base(...)`` block.

    Raises
    ------
    RuntimeError
        Outside ``with onnxblock.base(model):`` / ``with
        onnxblock.empty_base():``.
    """
    state = _CURRENT.get()
    if state is None:
        raise RuntimeError(
            "No base model: call blocks inside `with onnxblock.base(model):` "
            "or `with onnxblock.empty_base():`.")
    return state


def read_model(model):
    """``model`` itself (a ModelProto) or the model a path holds, loaded with
    its external data: the model :func:`load_model` copies, for a caller
    that only reads it.

    Raises
    ------
    TypeError, ValueError
        As :func:`load_model`.
    """
    if isinstance(model, (str, pathlib.Path)):
        return load_checked_model(model)
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"model must be an onnx.ModelProto, a str or a "
                        f"pathlib.Path, not {type(model).__name__}.")
    external = [t.name for t in model.graph.initializer
                if t.data_location == onnx.TensorProto.EXTERNAL]
    if external:
        raise ValueError(
            f"Initializers {external[:5]} of the model point to external data "
            "that was not loaded; pass the model's path, or load it with "
            "onnx.load(path) (load_external_data=True).")
    check_onnx_model(model)
    return model


def load_model(model):
    """A private copy of ``model`` (ModelProto, str or pathlib.Path).

    A path is loaded with its external data, so the copy is self-contained.

    Raises
    ------
    TypeError
        For any other type.
    ValueError
        For a ModelProto whose tensors still point to external data files
        (load it with ``onnx.load(path)``, which reads them, or pass the path);
        :class:`~onnxtrain.exceptions.InvalidModelError` for a path to a
        file that is not an ONNX model or whose external data cannot be
        read, a graph onnx's checker refuses, an opset the installed
        onnxruntime does not run (:func:`onnxtrain.runtime.checks.check_onnx_model`).
    """
    if isinstance(model, (str, pathlib.Path)):
        return read_model(model)  # loaded here: already private
    copy = onnx.ModelProto()
    copy.CopyFrom(read_model(model))
    return copy


@contextlib.contextmanager
def base(model):
    """Make a deep copy of ``model`` the base model of the blocks called in
    the ``with`` statement.

    Parameters
    ----------
    model : onnx.ModelProto, str or pathlib.Path
        Never modified (a path is loaded with its external data).

    Yields
    ------
    ModelAccessor
        ``.model`` is the copy the blocks edit (as onnxruntime's onnxblock);
        the accessor also forwards attribute access to it
        (``accessor.graph``).
    """
    with owned_base(load_model(model)) as accessor:
        yield accessor


@contextlib.contextmanager
def owned_base(model):
    """:func:`base` on ``model`` itself, which the blocks edit in place: for
    a caller's private copy (``generate_artifacts`` loads one), whose
    weights a second copy would only duplicate.

    Yields
    ------
    ModelAccessor
    """
    state = BaseState(model)
    token = _CURRENT.set(state)
    try:
        yield ModelAccessor(state.model)
    finally:
        _CURRENT.reset(token)


@contextlib.contextmanager
def empty_base(opset_version=None):
    """Make an empty model the base model of the blocks called in the
    ``with`` statement.

    Parameters
    ----------
    opset_version : int, default=None
        Default-domain opset of the model (None: :data:`DEFAULT_OPSET`).

    Yields
    ------
    ModelAccessor
        ``.model`` is the empty model the blocks edit.
    """
    opset = int(opset_version or DEFAULT_OPSET)
    graph = helper.make_graph([], "onnxblock", [], [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="onnxtrain")
    model.ir_version = helper.find_min_ir_version_for(
        [helper.make_opsetid("", opset)])
    with owned_base(model) as accessor:
        yield accessor
