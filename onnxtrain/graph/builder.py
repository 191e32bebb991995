"""One builder for every graph onnxtrain emits.

The builder owns names (each new name is unique within the graph being
built), constants (created in the element type of the tensor they meet and
deduplicated) and the opset (helpers such as :meth:`GraphBuilder.reduce_sum`
emit the form valid at the builder's opset: axes as an attribute before
opset 13 and as an input from opset 13 on).
"""
from __future__ import annotations

import functools

import numpy as np
import onnx
from google.protobuf.message import EncodeError
from onnx import TensorProto, helper, numpy_helper

from .scopes import without_unread

__all__ = ["GraphBuilder", "Dim", "elem_type_to_numpy", "numpy_to_elem_type",
           "FLOAT_TYPES", "OpsetError", "tensor_value_info"]

#: ONNX element types onnxtrain differentiates.
FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.DOUBLE,
                         TensorProto.FLOAT16, TensorProto.BFLOAT16})

#: A dimension: an int (static), a str (symbolic name) or None (unknown).
Dim = "int | str | None"


#: The fields of a TensorProto holding its values in the file itself.
VALUE_FIELDS = ("raw_data", "float_data", "double_data", "int32_data", "int64_data",
                "uint64_data", "string_data")

#: Largest spatial size (H W) at which :func:`onnxtrain.graph.broadcasts.per_channel`
#: expands a per-channel operand (above it the Expand costs more than the
#: slow broadcast it avoids).
SMALL_SPATIAL_SIZE = 16


def elem_type_to_numpy(elem_type):
    """Return the numpy dtype of an ONNX element type (``TensorProto.FLOAT``...)."""
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


def numpy_to_elem_type(dtype):
    """Return the ONNX element type of a numpy dtype."""
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _reduce_axes_as_input_since(op_type):
    """The opset from which ``op_type`` takes its axes as an input."""
    if op_type in ("ReduceSum", "Squeeze", "Unsqueeze"):
        return 13
    return 18  # ReduceMean, ReduceMax, ReduceMin, ReduceProd, ...


def _saturating_array(value, dtype):
    """``np.asarray(value, dtype)`` where a float ``dtype`` saturates
    instead of overflowing to +-inf or underflowing to 0 (see
    :meth:`GraphBuilder.const`)."""
    with np.errstate(over="ignore", under="ignore"):
        array = np.asarray(value, dtype=dtype)
    if dtype.kind != "f":
        return array
    exact = np.asarray(value, dtype=np.float64)
    info = np.finfo(dtype)
    sign = np.sign(exact)
    array = np.where(np.isfinite(exact) & np.isinf(array), sign * info.max, array)
    array = np.where((exact != 0) & (array == 0), sign * info.smallest_subnormal,
                     array)
    return array.astype(dtype)


class OpsetError(ValueError):
    """An op does not exist in the default domain at the graph's opset.

    Attributes: ``op_type``, ``opset`` and ``since`` (the first opset that
    has it, None when no later opset does)."""

    def __init__(self, op_type, opset, since):
        self.op_type, self.opset, self.since = op_type, opset, since
        if since is None:
            text = (f"{op_type} is not a default-domain op at opset {opset} or "
                    "any later one")
        else:
            text = (f"{op_type} does not exist at opset {opset} (it needs opset "
                    f">= {since}); upgrade the model with "
                    f"onnx.version_converter.convert_version(model, {since})")
        super().__init__(text)


def _has_schema(op_type, opset):
    """Whether the default domain defines ``op_type`` at ``opset``."""
    try:
        onnx.defs.get_schema(op_type, opset, "")
    except onnx.defs.SchemaError:
        return False
    return True


@functools.lru_cache(maxsize=None)
def _check_op_exists(op_type, opset):
    """Raise OpsetError if ``op_type`` has no default-domain schema at ``opset``."""
    if not _has_schema(op_type, opset):
        since = next((v for v in range(opset + 1, onnx.defs.onnx_opset_version() + 1)
                      if _has_schema(op_type, v)), None)
        raise OpsetError(op_type, opset, since)


#: ``(name, frozen value) -> AttributeProto`` of :func:`_attribute`.
_ATTRIBUTES = {}
#: Entries of each cache (attributes, tensor types) before it is emptied.
_MAX_CACHED = 4096


def _frozen(value):
    """A hashable key telling ``value`` from any value making another
    attribute (its Python types included: 1 and 1.0 are an INT and a
    FLOAT; floats by their hex form: -0.0 is not 0.0); TypeError for values
    not cached (tensors, graphs, numpy)."""
    if type(value) is float:  # 0.0 and -0.0 are equal, not the same attribute
        return float, value.hex()
    if value is None or type(value) in (int, str, bytes, bool):
        return type(value), value
    if type(value) in (list, tuple):
        return "sequence", tuple(_frozen(v) for v in value)
    raise TypeError(type(value).__name__)


def _attribute(name, value):
    """``onnx.helper.make_attribute(name, value)``, from a cache for
    scalars, strings and lists of them (the copy a node's ``extend`` makes
    leaves the cached proto as it is)."""
    try:
        key = (name, _frozen(value))
    except TypeError:
        return helper.make_attribute(name, value)
    cached = _ATTRIBUTES.get(key)
    if cached is None:
        if len(_ATTRIBUTES) >= _MAX_CACHED:
            _ATTRIBUTES.clear()
        cached = _ATTRIBUTES[key] = helper.make_attribute(name, value)
    return cached


#: ``(elem_type, frozen shape) -> TypeProto`` of :func:`tensor_value_info`.
_TENSOR_TYPES = {}


def tensor_value_info(name, elem_type, shape):
    """``onnx.helper.make_tensor_value_info(name, elem_type, shape)``, its
    type copied from a cache (a build declares thousands of inputs and
    outputs of a few types).

    Parameters
    ----------
    name : str
    elem_type : int
    shape : sequence of int, str or None, or None
        Dims (None: an unknown dim); None: unknown rank.

    Returns
    -------
    onnx.ValueInfoProto
    """
    try:
        key = (int(elem_type), None if shape is None else _frozen(tuple(shape)))
    except TypeError:  # numpy dims...: the helper itself
        return helper.make_tensor_value_info(name, elem_type, shape)
    proto = _TENSOR_TYPES.get(key)
    if proto is None:
        if len(_TENSOR_TYPES) >= _MAX_CACHED:
            _TENSOR_TYPES.clear()
        proto = _TENSOR_TYPES[key] = helper.make_tensor_type_proto(elem_type, shape)
    info = onnx.ValueInfoProto()
    info.name = name
    info.type.CopyFrom(proto)
    return info


class GraphBuilder:
    """Collect nodes and initializers with unique names at one opset.

    Parameters
    ----------
    opset : int
        Version of the default ONNX domain the emitted nodes must be valid at.
    used_names : iterable of str, default=()
        Names already taken in the graph the nodes will join.
    value_types : dict, default=None
        ``name -> (elem_type, shape)`` for values that already exist, where
        ``shape`` is a tuple of :data:`Dim` or None when the rank is unknown.
    prefix : str, default=""
        Prefix of generated names.
    """

    def __init__(self, opset, used_names=(), value_types=None, prefix=""):
        self.opset = int(opset)
        self.nodes = []
        self.initializers = []
        self.types = dict(value_types or {})
        self._used = set(used_names)
        self._prefix = prefix
        self._constants = {}
        self._next_suffix = {}
        self._producers = {}  # output name -> node emitted here
        self._known = {}  # output name -> node of know_nodes

    # names -----------------------------------------------------------------
    @property
    def used_names(self):
        """frozenset of the names taken so far (given or generated)."""
        return frozenset(self._used)

    def unique_name(self, base):
        """Return ``base`` or ``base_<k>``, a name not used yet, and reserve it."""
        base = f"{self._prefix}{base}"
        # names are only ever added: the first free suffix of a base never
        # goes down, so the search resumes where the last one stopped
        # (linear build time in the number of nodes, the same names)
        k = self._next_suffix.get(base, 0)
        name = base if k == 0 else f"{base}_{k}"
        while name in self._used:
            k += 1
            name = f"{base}_{k}"
        self._next_suffix[base] = k
        self._used.add(name)
        return name

    def reserve(self, name):
        """Reserve an exact name; raise ValueError if it is already taken."""
        if name in self._used:
            raise ValueError(f"Name {name!r} is already used in the graph.")
        self._used.add(name)
        return name

    # types -----------------------------------------------------------------
    def elem_type(self, name):
        """ONNX element type of ``name`` (KeyError when unknown)."""
        return self.types[name][0]

    def shape(self, name):
        """Known shape of ``name`` as a tuple of dims, or None."""
        info = self.types.get(name)
        return None if info is None else info[1]

    def rank(self, name):
        """Rank of ``name`` or None when unknown."""
        shape = self.shape(name)
        return None if shape is None else len(shape)

    def set_type(self, name, elem_type, shape=None):
        """Record the element type and shape of a value the caller created."""
        self.types[name] = (elem_type, None if shape is None else tuple(shape))

    # nodes -----------------------------------------------------------------
    def op(self, op_type, *inputs, n_outputs=1, outputs=None, domain="",
           **attributes):
        """Append one node and return its output name (a tuple if several).

        ``outputs``, when given, are names the caller reserved with
        :meth:`unique_name` or :meth:`reserve`. ``None`` in ``inputs``
        becomes an empty name (an omitted optional input). Attributes with
        value None are dropped.

        Raises
        ------
        OpsetError
            (a ValueError) If ``op_type`` does not exist in the default
            domain at the builder's opset (e.g. ``Range`` in an opset-9 graph): the message
            names the op and the opset to upgrade to.
        """
        if domain in ("", "ai.onnx"):
            _check_op_exists(op_type, self.opset)
        if outputs is None:
            outputs = [self.unique_name(op_type.lower()) for _ in range(n_outputs)]
        else:
            outputs = list(outputs)  # reserved by the caller (unique_name)
        # onnx.helper.make_node's node, attributes sorted by name; the
        # attributes from a cache (make_attribute costs about as much as
        # the rest of the node)
        node = onnx.NodeProto()
        node.op_type = op_type
        node.input.extend("" if i is None else i for i in inputs)
        node.output.extend(outputs)
        node.name = self.unique_name(f"{op_type}_node")
        node.domain = domain
        if attributes:
            node.attribute.extend(_attribute(k, v) for k, v in sorted(attributes.items())
                                  if v is not None)
        self.nodes.append(node)
        for out in outputs:
            self._producers[out] = node
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def know_nodes(self, nodes):
        """Record ``nodes`` (of the graph the built nodes join, e.g. the
        forward pass) as the producers of their outputs, for the
        simplifications of :meth:`transpose`."""
        for node in nodes:
            for out in node.output:
                if out:
                    self._known[out] = node

    def producer(self, name):
        """The node outputting ``name``, emitted here or recorded by
        :meth:`know_nodes`, or None (a graph input, an initializer)."""
        return self._producers.get(name) or self._known.get(name)

    def const(self, value, elem_type):
        """Return the name of an initializer holding ``value`` in ``elem_type``.

        Equal constants (same element type, shape and bytes) share a name.
        A finite value too large for a float ``elem_type`` becomes its
        largest finite value, a non-zero one too small its smallest positive
        (subnormal) one, both with the value's sign: in float16 (largest
        65504, smallest 6e-8) an epsilon of 1e-9 stays positive and a mask
        value of -1e9 stays finite instead of turning into 0 and -inf.
        """
        # a Python scalar seen before needs no array (repr tells -0.0 from 0.0)
        scalar = (elem_type, type(value), repr(value)) if type(value) in (
            int, float, bool) else None
        if scalar in self._constants:
            return self._constants[scalar]
        array = _saturating_array(value, elem_type_to_numpy(elem_type))
        key = (elem_type, array.shape, array.tobytes())
        if key not in self._constants:
            name = self.unique_name("const")
            self.initializers.append(numpy_helper.from_array(array, name))
            self.set_type(name, elem_type, array.shape)
            self._constants[key] = name
        if scalar is not None:
            self._constants[scalar] = self._constants[key]
        return self._constants[key]

    def scatter_add(self, op_type, data, indices, updates, elem_type, **attrs):
        """``op_type`` (ScatterElements or ScatterND) with ``reduction='add'``.

        float16 and bfloat16 tensors (``elem_type``) are summed in float32
        and the result cast back: onnxruntime's CPU kernels have no float16
        'add' reduction (1.32: "MLFloat16 data type is not supported"), and
        float32 keeps the sum of many small gradients from rounding away.
        """
        if elem_type not in (TensorProto.FLOAT16, TensorProto.BFLOAT16):
            return self.op(op_type, data, indices, updates, reduction="add",
                           **attrs)
        wide = [self.cast(v, TensorProto.FLOAT) for v in (data, updates)]
        summed = self.op(op_type, wide[0], indices, wide[1], reduction="add",
                         **attrs)
        return self.cast(summed, elem_type)

    def int64s(self, values):
        """An int64 1-D constant (for shapes, axes, starts, ends)."""
        return self.const(np.asarray(values, dtype=np.int64).reshape(-1),
                          TensorProto.INT64)

    # opset-aware helpers ---------------------------------------------------
    def _axes_op(self, op_type, x, axes, **attrs):
        """Emit ``op_type`` with ``axes`` as attribute or input by opset."""
        if axes is None:
            return self.op(op_type, x, **attrs)
        axes = [int(a) for a in axes]
        if self.opset >= _reduce_axes_as_input_since(op_type):
            return self.op(op_type, x, self.int64s(axes), **attrs)
        return self.op(op_type, x, axes=axes, **attrs)

    def reduce(self, op_type, x, axes=None, keepdims=1):
        """``op_type`` (ReduceSum, ReduceMean...) over ``axes`` (None = all)."""
        return self._axes_op(op_type, x, axes, keepdims=int(keepdims))

    def reduce_sum(self, x, axes=None, keepdims=1):
        """ReduceSum over static ``axes`` (None: every axis)."""
        return self.reduce("ReduceSum", x, axes, keepdims)

    def unsqueeze(self, x, axes):
        """Unsqueeze at static ``axes``."""
        return self._axes_op("Unsqueeze", x, axes)

    def squeeze(self, x, axes=None):
        """Squeeze at static ``axes`` (None: every axis of size 1)."""
        return self._axes_op("Squeeze", x, axes)

    def shape_of(self, x):
        """Shape(x) as an int64 1-D tensor."""
        return self.op("Shape", x)

    def zeros_like(self, x, elem_type=None, outputs=None):
        """Zeros of the run-time shape of ``x``: Expand(0, Shape(x)).

        ``elem_type`` defaults to the element type of ``x`` (KeyError when
        unknown); ``outputs`` as in :meth:`op`.
        """
        if elem_type is None:
            elem_type = self.elem_type(x)
        return self.op("Expand", self.const(0, elem_type), self.shape_of(x),
                       outputs=outputs)

    def reshape_like(self, x, like):
        """Reshape ``x`` to the runtime shape of ``like``."""
        allowzero = 1 if self.opset >= 14 else None  # a 0 in Shape is a 0
        return self.op("Reshape", x, self.shape_of(like), allowzero=allowzero)

    def cast(self, x, elem_type):
        """Cast ``x`` to ``elem_type``."""
        return self.op("Cast", x, to=int(elem_type))

    def transpose(self, x, perm):
        """Transpose ``x`` by ``perm``, without a node where its producer
        allows:

        - ``x = Transpose(y, p)`` with ``p`` then ``perm`` the identity: y
          (the reverse pass of ``x @ W^T``, as exporters write a linear
          layer, transposes W^T back);
        - ``x = Gemm(A, B)`` emitted here, without C, and ``perm = [1, 0]``:
          the Gemm of B and A with the transpositions swapped, since
          (A' B')^T = B'^T A'^T (the weight gradient of such a layer); the
          first Gemm is left for the caller to drop if nothing else reads
          it (the reverse pass does).
        """
        perm = [int(p) for p in perm]
        emitted = self._producers.get(x)
        node = emitted or self._known.get(x)
        if node is not None and node.domain in ("", "ai.onnx"):
            if node.op_type == "Transpose":
                inner = _perm_of(node, len(perm))
                if all(inner[p] == i for i, p in enumerate(perm)):
                    return node.input[0]
            elif node.op_type == "Gemm" and perm == [1, 0] and emitted \
                    and (len(node.input) < 3 or not node.input[2]):
                attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
                return self.op("Gemm", node.input[1], node.input[0],
                               alpha=float(attrs.get("alpha", 1.0)),
                               transA=1 - int(attrs.get("transB", 0)),
                               transB=1 - int(attrs.get("transA", 0)))
        return self.op("Transpose", x, perm=perm)

    # output ----------------------------------------------------------------
    def make_graph(self, name, inputs, outputs, initializers=()):
        """A GraphProto from the collected nodes and initializers."""
        return helper.make_graph(self.nodes, name, inputs, outputs,
                                 list(initializers) + self.initializers)


def _perm_of(node, rank):
    """The perm of a Transpose node of output ``rank`` (default: reversed)."""
    for att in node.attribute:
        if att.name == "perm":
            return [int(p) for p in att.ints]
    return list(range(rank))[::-1]


def make_model(graph, opset_imports, ir_version=None, producer="onnxtrain"):
    """A ModelProto for ``graph`` at ``opset_imports`` (list of OperatorSetId).

    The IR version is the one onnx pairs with the highest default-domain
    opset, never newer than what onnxruntime reads.
    """
    model = helper.make_model(graph, opset_imports=list(opset_imports),
                              producer_name=producer)
    if ir_version is None:
        ir_version = default_ir_version(opset_imports)
    model.ir_version = ir_version
    return model


def with_nodes(model, nodes, initializers=()):
    """A copy of ``model`` whose graph runs ``nodes`` (in that order) and
    also holds ``initializers``: the end of a rewrite that replaced some
    nodes by others (``model`` is not modified)."""
    new = type(model)()
    new.CopyFrom(model)
    del new.graph.node[:]
    new.graph.node.extend(nodes)
    new.graph.initializer.extend(initializers)
    return new


def rewrite_nodes(model, g, rewrite, drop_unread=False):
    """``model`` with each node that ``rewrite`` replaced by what it wrote
    into the builder ``g``: ``rewrite(node)`` emits the replacement into
    ``g`` and returns True, or returns False (the node is kept as it is).
    ``model`` itself when no node was replaced, else :func:`with_nodes`'s
    copy holding ``g``'s initializers too; with ``drop_unread``, without
    every node whose outputs reach no graph output (what only the replaced
    nodes read, and any node the model already computed for nothing)."""
    nodes, replaced = [], False
    for node in model.graph.node:
        if rewrite(node):
            nodes.extend(g.nodes)
            g.nodes.clear()
            replaced = True
        else:
            nodes.append(node)
    if not replaced:
        return model
    if drop_unread:
        nodes, _ = without_unread(nodes, {o.name for o in model.graph.output})
    return with_nodes(model, nodes, g.initializers)


def constant_node_value(node):
    """numpy value of a Constant node (None for sparse or string values)."""
    for att in node.attribute:
        if att.name == "value":
            return numpy_helper.to_array(att.t)
        if att.name in ("value_float", "value_floats"):
            return np.asarray(helper.get_attribute_value(att), dtype=np.float32)
        if att.name in ("value_int", "value_ints"):
            return np.asarray(helper.get_attribute_value(att), dtype=np.int64)
    return None


def compact_model(model):
    """``model`` copied into memory of its own size, for a model kept long.

    The upb protobuf runtime frees a message's memory only with the whole
    message: the tensors a rewrite removes or replaces (``del
    graph.initializer[:]`` then ``extend``) stay allocated as long as the
    model lives (a training model can hold twice its serialized size);
    this copy (one serialization and one parse) holds only what is left.
    A model protobuf cannot serialize (2 GB or more) is returned as it is.
    onnxtrain's own rewrites copy only what they keep instead
    (:func:`copy_fields`), leaving nothing to compact."""
    try:
        data = model.SerializeToString()
    except (EncodeError, ValueError):  # upb raises EncodeError past 2 GB
        return model
    return onnx.load_model_from_string(data)


def without_initializer_values(model, names):
    """A copy of ``model`` whose initializers ``names`` keep their name, type
    and dims but not their values: for a model kept only to build graphs
    that take those initializers as inputs, their values living elsewhere
    (an engine's weights).

    Only what is kept is copied (:func:`copy_fields`): no full copy whose
    values are then cleared, which the upb protobuf runtime keeps allocated
    as long as the copy lives (then a compaction's serialization and parse,
    at the peak of a fit's build)."""
    names = set(names)
    light = onnx.ModelProto()
    copy_fields(light, model, skip=("graph",))
    copy_fields(light.graph, model.graph, skip=("initializer",))
    skip = VALUE_FIELDS + ("external_data", "data_location")
    for init in model.graph.initializer:
        if init.name in names:
            copy_fields(light.graph.initializer.add(), init, skip=skip)
        else:
            light.graph.initializer.append(init)  # a copy
    return light


#: Float initializers of more elements than this cross a fit's build
#: without their values (:func:`split_weight_values`); smaller ones (the
#: scalars the rewrites read) keep them.
LIGHT_MIN_ELEMENTS = 64


def split_weight_values(model, min_elements=LIGHT_MIN_ELEMENTS):
    """``model`` without the values of its float initializers of more than
    ``min_elements`` elements, and those initializers: a build's rewrites
    then copy value-less protos, and the values are read once, where they
    are needed (:func:`with_initializer_values`, an engine's weights).

    Parameters
    ----------
    model : onnx.ModelProto
        Not modified.
    min_elements : int, default=LIGHT_MIN_ELEMENTS

    Returns
    -------
    light : onnx.ModelProto
        ``model`` itself when no initializer holds such values, else a
        copy (:func:`without_initializer_values`).
    values : dict
        ``name -> onnx.TensorProto``: ``model``'s own initializers, not
        copies (they keep ``model``'s memory alive, none of their own).
    """
    values = {t.name: t for t in model.graph.initializer
              if t.data_type in FLOAT_TYPES and _holds_values(t)
              and int(np.prod(t.dims)) > min_elements}
    if not values:
        return model, {}
    return without_initializer_values(model, values), values


def _holds_values(tensor):
    return any(tensor.HasField(f) if f == "raw_data" else len(getattr(tensor, f))
               for f in VALUE_FIELDS) or tensor.data_location == TensorProto.EXTERNAL


def with_initializer_values(model, tensors):
    """A copy of ``model`` whose initializers named in ``tensors`` are copies
    of those tensors (their values back in a model that
    :func:`split_weight_values` left without them).

    Parameters
    ----------
    model : onnx.ModelProto
        Not modified.
    tensors : dict
        ``name -> onnx.TensorProto``; names that are not initializers of
        ``model`` are ignored.

    Returns
    -------
    onnx.ModelProto
    """
    full = onnx.ModelProto()
    copy_fields(full, model, skip=("graph",))
    copy_fields(full.graph, model.graph, skip=("initializer",))
    full.graph.initializer.extend(tensors.get(init.name, init)
                                  for init in model.graph.initializer)
    return full


def copy_fields(target, source, skip=()):
    """Copy every field set in the protobuf message ``source`` but those
    named in ``skip`` into ``target``, an empty message of the same type:
    a copy of part of a message without copying the rest first.

    A ``source`` holding fields this protobuf schema does not know (a model
    written by a newer onnx) or extensions is copied whole and the
    ``skip`` fields cleared, so that nothing of it is lost (the cleared
    fields then stay allocated with ``target``: upb frees a message's
    memory only with the whole message).

    Parameters
    ----------
    target, source : google.protobuf.message.Message
    skip : tuple of str, default=()
        Field names left out.

    Returns
    -------
    target
    """
    fields = source.ListFields()
    if _has_unknown_fields(source) or any(f.is_extension for f, _ in fields):
        target.CopyFrom(source)
        for name in skip:
            target.ClearField(name)
        return target
    for field, value in fields:
        if field.name in skip:
            continue
        if _is_repeated(field):
            container = getattr(target, field.name)
            entry = field.message_type
            if entry is not None and entry.GetOptions().map_entry:
                if entry.fields_by_name["value"].message_type is None:
                    container.update(value)
                else:
                    for key, item in value.items():
                        container[key].CopyFrom(item)
            else:  # repeated scalars, or messages (extend copies them)
                container.extend(value)
        elif field.message_type is not None:
            getattr(target, field.name).CopyFrom(value)
        else:
            setattr(target, field.name, value)
    return target


def _is_repeated(field):
    repeated = getattr(field, "is_repeated", None)  # protobuf >= 6
    return field.label == field.LABEL_REPEATED if repeated is None else repeated


def _has_unknown_fields(message):
    """Whether ``message`` itself holds fields its schema does not know
    (True when this protobuf cannot tell: the caller then copies whole)."""
    try:
        from google.protobuf import unknown_fields
    except ImportError:  # an older protobuf
        try:
            return len(message.UnknownFields()) > 0
        except (AttributeError, NotImplementedError):
            return True
    return len(unknown_fields.UnknownFieldSet(message)) > 0


def default_ir_version(opset_imports):
    """IR version matching the default-domain opset of ``opset_imports``."""
    version = 9
    for op in opset_imports:
        if op.domain in ("", "ai.onnx"):
            version = op.version
    try:
        ir = helper.find_min_ir_version_for([helper.make_opsetid("", version)])
    except Exception:  # pragma: no cover - very new opsets
        ir = onnx.IR_VERSION
    return max(ir, 7)


def opset_of(model, domain=""):
    """Opset version of ``domain`` imported by ``model`` (None if absent)."""
    for op in model.opset_import:
        if op.domain == domain or (domain == "" and op.domain == "ai.onnx"):
            return op.version
    return None
