"""Checking the ONNX models users give before onnxruntime runs them, with
errors that name the file, tensor, node or opset at fault."""
from __future__ import annotations

import collections
import math
import os

import onnx
from google.protobuf.message import EncodeError
from onnx import TensorProto, helper, numpy_helper

from .._utils.files import load_onnx_file_deferred, read_onnx_model
from ..graph.shapes import initializers_as_inputs
from ..exceptions import InvalidModelError
from .opsets import check_runtime_opsets

__all__ = ["check_onnx_model", "load_checked_model",
           "load_checked_model_deferred"]


def check_onnx_model(model, what="the model", held=()):
    """Refuse a model onnxruntime would refuse with an internal error, naming
    the culprit, before any work is done.

    Runs onnx's checker (nodes out of topological order, a name two nodes
    output, an initializer whose data is shorter than its declared shape,
    ops unknown to their domain...), refuses graph inputs or outputs listed
    twice and opsets beyond what the installed onnxruntime runs
    (:func:`onnxtrain.runtime.opsets.check_runtime_opsets`).

    Parameters
    ----------
    model, what
        As in :func:`onnxtrain.runtime.opsets.check_runtime_opsets`.
    held : collection of str, default=()
        Initializers whose values ``model`` lacks, held elsewhere and
        checked there (the external data
        :func:`onnxtrain._utils.files.load_onnx_file_deferred` leaves in
        their files): checked as typed graph inputs.

    Raises
    ------
    onnxtrain.exceptions.InvalidModelError
        A ValueError naming the node, tensor, initializer or opset at fault.
    """
    check_runtime_opsets(model, what)
    for field in ("input", "output"):
        counts = collections.Counter(v.name for v in getattr(model.graph, field))
        repeated = sorted(n for n, count in counts.items() if count > 1)
        if repeated:
            raise InvalidModelError(f"{what} lists the graph {field}s "
                                    f"{repeated} more than once.")
    try:
        data = _checked_bytes(model, held)
    except (EncodeError, ValueError):  # 2 GiB or more: protobuf's limit
        return  # onnxruntime reads such a model from its path, not checked here
    try:
        onnx.checker.check_model(data)
    except onnx.checker.ValidationError as exc:
        short = _short_initializer(model.graph, held)
        if short is not None:
            raise InvalidModelError(f"{what}: {short}") from exc
        text = " ".join(str(exc).split())  # the checker's lines in one
        raise InvalidModelError(f"{what} is not a valid ONNX model: "
                                f"{text}") from exc


#: Initializers of more elements than this reach onnx's checker as typed
#: graph inputs once their data passed :func:`_holds_its_data` (see
#: :func:`_checked_bytes`).
_HEAVY_ELEMENTS = 64

_VALUE_FIELDS = ("raw_data", "float_data", "int32_data", "string_data",
                 "int64_data", "double_data", "uint64_data")


def _holds_its_data(tensor):
    """What onnx's checker verifies of an initializer's data, read from its
    sizes only: a defined numeric type, exactly one value field, the type's
    own, holding at least its declared shape's values."""
    if tensor.data_type in (TensorProto.UNDEFINED, TensorProto.STRING) or \
            tensor.data_location == TensorProto.EXTERNAL:
        return False
    try:
        field = helper.tensor_dtype_to_field(tensor.data_type)
        itemsize = helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except (KeyError, TypeError, ValueError):
        return False
    held = [f for f in _VALUE_FIELDS if len(getattr(tensor, f))]
    count = math.prod(tensor.dims)
    if held == ["raw_data"]:
        # 4-bit types pack two values a byte: left to the checker
        return itemsize >= 1 and len(tensor.raw_data) >= count * itemsize and \
            tensor.data_type not in _PACKED_TYPES
    per_value = 2 if tensor.data_type in (TensorProto.COMPLEX64,
                                          TensorProto.COMPLEX128) else 1
    return held == [field] and len(getattr(tensor, field)) >= count * per_value


_PACKED_TYPES = frozenset(getattr(TensorProto, name) for name in (
    "INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2") if hasattr(TensorProto, name))


def _checked_bytes(model, held=()):
    """``model`` serialized for onnx's checker, its big initializers as
    typed graph inputs once :func:`_holds_its_data` checked their data: the
    checker reads a weight's data for its size only, and serializing the
    weights (and parsing them again in C++) was most of the check's time
    and memory. Any other initializer goes as it is, and a model with one
    that fails (or names repeated) is serialized whole, so that the
    checker's message names the fault as before."""
    graph = model.graph
    held = set(held)
    heavy = [t for t in graph.initializer
             if math.prod(t.dims) > _HEAVY_ELEMENTS or t.name in held]
    names = [t.name for t in graph.initializer]
    if not heavy or len(set(names)) != len(names) or \
            not all(t.name in held or _holds_its_data(t) for t in heavy):
        return model.SerializeToString()
    return initializers_as_inputs(model, heavy).SerializeToString()


def load_checked_model(model, what="model"):
    """:func:`read_onnx_model` then :func:`check_onnx_model`: the one
    entry of the models users give to the estimators, the engine, the
    artifacts, onnxblock, the api and the command line.

    Parameters, return value and errors are those of
    :func:`read_onnx_model` (a ModelProto is returned as is: not copied, not
    modified), with :func:`check_onnx_model`'s InvalidModelError too, and
    an InvalidModelError for a ModelProto or bytes whose initializers keep
    their data in external files (no folder says where they are).
    """
    proto = read_onnx_model(model, what)
    source = os.fspath(model) if isinstance(model, (str, os.PathLike)) else what
    if not isinstance(model, (str, os.PathLike)):
        _refuse_unloaded_external_data(proto, what)
    check_onnx_model(proto, source)
    return proto


def _all_tensors(graph):
    """The initializers, sparse initializers' values and tensor attributes
    of ``graph`` and its subgraphs."""
    yield from graph.initializer
    yield from (t.values for t in graph.sparse_initializer)
    for node in graph.node:
        for att in node.attribute:
            if att.HasField("t"):
                yield att.t
            yield from att.tensors
            for sub in ([att.g] if att.HasField("g") else []) + list(att.graphs):
                yield from _all_tensors(sub)


def _refuse_unloaded_external_data(proto, what):
    """A ModelProto or bytes has no folder its external data is relative
    to: onnx's checker looked in the current directory and onnxruntime,
    given the bytes, in none (an internal error at the first run)."""
    external = [t for t in _all_tensors(proto.graph)
                if t.data_location == TensorProto.EXTERNAL]
    if not external:
        return
    files = sorted({e.value for t in external for e in t.external_data
                    if e.key == "location"})
    raise InvalidModelError(
        f"{what}: initializers {[t.name for t in external][:5]} keep their data "
        f"in external files {files} that were not loaded, and a ModelProto or "
        "bytes says no folder to read them from: give the model's path, or "
        "load the data first (onnx.load(path), or "
        "onnx.load_external_data_for_model(model, folder)).")


def load_checked_model_deferred(model, what, defer):
    """:func:`load_checked_model` leaving in their files the external data
    of the initializers ``defer`` selects, when ``model`` is a path
    (:func:`onnxtrain._utils.files.load_onnx_file_deferred`).

    Returns
    -------
    model : onnx.ModelProto
        Without the values deferred.
    external : dict
        ``name -> onnxtrain._utils.files.ExternalTensor`` of those (empty
        for a model given as a ModelProto or bytes).
    """
    if not isinstance(model, (str, os.PathLike)):
        return load_checked_model(model, what), {}
    proto, external = load_onnx_file_deferred(model, defer)
    check_onnx_model(proto, os.fspath(model), held=external)
    return proto, external


def _short_initializer(graph, held=()):
    """A message naming the first initializer of ``graph`` (but ``held``)
    whose data does not fill its declared shape, or None (only called once
    the checker refused the model: it converts every initializer)."""
    for tensor in graph.initializer:
        if tensor.data_location == TensorProto.EXTERNAL or tensor.name in held:
            continue
        try:
            numpy_helper.to_array(tensor)
        except (ValueError, TypeError):
            pass
        else:
            continue
        if tensor.HasField("raw_data"):
            held = f"{len(tensor.raw_data)} bytes"
        else:
            field = helper.tensor_dtype_to_field(tensor.data_type)
            held = f"{len(getattr(tensor, field))} values in {field}"
        type_name = TensorProto.DataType.Name(tensor.data_type).lower()
        return (f"initializer {tensor.name!r} declares shape "
                f"{tuple(tensor.dims)} ({math.prod(tensor.dims)} {type_name} "
                f"values) but its data holds {held}.")
    return None
