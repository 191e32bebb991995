"""Reading the ONNX models users give (a path, bytes or a ModelProto), with
errors that name the file or tensor at fault (the checks before onnxruntime
runs them: :mod:`onnxtrain.runtime.checks`)."""
from __future__ import annotations

import math
import os
import sys

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto, external_data_helper, helper, numpy_helper

from ..exceptions import InvalidModelError

__all__ = ["ExternalTensor", "load_onnx_file", "load_onnx_file_deferred",
           "read_onnx_model"]

#: The element types whose external bytes are read as they are into an
#: array of the type (no conversion): little-endian IEEE floats.
_DIRECT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.DOUBLE,
                           TensorProto.FLOAT16})


def load_onnx_file(path):
    """Load the ONNX model stored at ``path``, with its external data.

    Parameters
    ----------
    path : str or os.PathLike

    Returns
    -------
    onnx.ModelProto

    Raises
    ------
    FileNotFoundError, IsADirectoryError
        If ``path`` is missing or a directory.
    onnxtrain.exceptions.InvalidModelError
        A ValueError: the file is not a serialized ONNX model (protobuf
        cannot parse it, or it parses to a message without a graph, as an
        empty file does), or an initializer's external data is missing, is
        not a regular file (a link, a device) or lies outside the model's
        folder; the message names the file (and the initializer).
    """
    return _parse_onnx_file(os.fspath(path))


def _parse_onnx_file(path, load_external_data=True):
    try:
        model = onnx.load(path, load_external_data=load_external_data)
    except DecodeError as exc:
        raise InvalidModelError(f"{path} is not an ONNX model (protobuf could "
                                f"not parse it: {exc}).") from exc
    except onnx.checker.ValidationError as exc:
        # onnx refuses the external data before reading it; its message
        # names the initializer and the location
        raise _refused_external_data(path, exc) from exc
    if not model.HasField("graph"):
        raise InvalidModelError(f"{path} is not an ONNX model (no graph in "
                                "it).")
    return model


class ExternalTensor:
    """The external data of one initializer, checked and not read: where it
    lies (a regular file inside the model's folder, at an offset) and what
    it holds (element type, shape).

    Parameters
    ----------
    name : str
        The initializer's name.
    folder : str
        The model's folder.
    location : str
        The data file, relative to ``folder`` (checked again at each read,
        as onnx checks it: a regular file inside ``folder``, no link).
    offset : int
    dtype : numpy.dtype
    shape : tuple of int
    """

    __slots__ = ("name", "folder", "location", "offset", "dtype", "shape")

    def __init__(self, name, folder, location, offset, dtype, shape):
        self.name, self.folder, self.location = name, folder, location
        self.offset, self.dtype, self.shape = offset, np.dtype(dtype), tuple(shape)

    @property
    def path(self):
        """str: the data file."""
        return os.path.join(self.folder, self.location)

    def read_into(self, array):
        """Fill ``array`` (C-contiguous, of :attr:`shape` and :attr:`dtype`)
        with the data, read from the file straight into its memory.

        Returns
        -------
        array

        Raises
        ------
        onnxtrain.exceptions.InvalidModelError
            The file no longer passes the checks or holds fewer bytes (it
            changed since the model was loaded).
        """
        view = memoryview(array.reshape(-1).view(np.uint8))
        try:
            fd = external_data_helper._open_external_data_fd(
                self.folder, self.location, self.name, True)
        except onnx.checker.ValidationError as exc:
            raise InvalidModelError(
                f"{self.path}: the external data of initializer {self.name!r} "
                f"can no longer be read (the file changed since the model was "
                f"loaded): {exc}") from exc
        with os.fdopen(fd, "rb") as f:
            f.seek(self.offset)
            done = 0
            while done < len(view):
                count = f.readinto(view[done:])
                if not count:
                    raise InvalidModelError(
                        f"{self.path}: the external data of initializer "
                        f"{self.name!r} ends after {done} of its "
                        f"{len(view)} bytes (the file changed since the "
                        "model was loaded).")
                done += count
        return array

    def to_array(self):
        """numpy.ndarray: the data, in a new writable array."""
        return self.read_into(np.empty(self.shape, self.dtype))

    def to_tensor_proto(self):
        """onnx.TensorProto: the initializer with its data in it."""
        return numpy_helper.from_array(self.to_array(), self.name)

    def __array__(self, dtype=None, copy=None):
        # numpy's protocol: np.asarray reads the file when the value is
        # needed (a checkpoint writing one weight at a time)
        array = self.to_array()
        return array if dtype is None else array.astype(dtype, copy=False)

    def __repr__(self):
        return (f"ExternalTensor({self.name!r}, {self.path!r}, offset="
                f"{self.offset}, dtype={self.dtype}, shape={self.shape})")


def _refused_external_data(path, exc):
    folder = os.path.dirname(os.path.abspath(path))
    return InvalidModelError(
        f"{path}: the external data of an initializer cannot be read: "
        f"{exc} External data must be regular files inside the model's "
        f"folder {folder}, named by relative paths.")


def _external_tensor(tensor, folder, path):
    """The :class:`ExternalTensor` of ``tensor`` once its location passed
    onnx's own checks (those of ``onnx.load``: relative, inside ``folder``,
    a regular file, no link) and its offset and length fit the file and
    the tensor's shape; InvalidModelError otherwise."""
    try:
        info = external_data_helper.ExternalDataInfo(tensor)
        fd = external_data_helper._open_external_data_fd(
            folder, info.location, tensor.name, True)
    except onnx.checker.ValidationError as exc:
        raise _refused_external_data(path, exc) from exc
    except ValueError as exc:  # a negative or unparsable offset or length
        raise InvalidModelError(
            f"{path}: the external data of initializer {tensor.name!r} "
            f"cannot be read: {exc}") from exc
    try:
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
    needed = math.prod(tensor.dims) * dtype.itemsize
    offset = info.offset or 0
    file = os.path.join(folder, info.location)
    if info.length is not None and info.length != needed:
        raise InvalidModelError(
            f"{path}: the external data of initializer {tensor.name!r} in "
            f"{file} is {info.length} bytes long, but its shape "
            f"{list(tensor.dims)} of {dtype} takes {needed}.")
    if offset + needed > size:
        raise InvalidModelError(
            f"{path}: the external data of initializer {tensor.name!r} in "
            f"{file} takes bytes {offset} to {offset + needed}, but the file "
            f"holds {size}.")
    return ExternalTensor(tensor.name, folder, info.location, offset, dtype,
                          tensor.dims)


def load_onnx_file_deferred(path, defer):
    """Load the ONNX model stored at ``path`` without the external data of
    the initializers ``defer`` selects: those data stay in their files,
    checked, to be read once where they are needed (a weight's memory).

    Parameters
    ----------
    path : str or os.PathLike
    defer : callable
        ``defer(tensor) -> bool`` on each initializer (a TensorProto
        without its data) stored as external data; the others selected
        are loaded as :func:`load_onnx_file` does. Only float16, float32
        and float64 tensors are deferred (their bytes are the array's).

    Returns
    -------
    model : onnx.ModelProto
        The initializers deferred keep their name, type and shape, not
        their data (as :func:`onnxtrain.graph.without_initializer_values`
        leaves them).
    external : dict
        ``name -> ExternalTensor`` of those.

    Raises
    ------
    FileNotFoundError, IsADirectoryError, onnxtrain.exceptions.InvalidModelError
        As :func:`load_onnx_file`, the external data deferred included;
        also when an offset or a length does not fit the file or the
        tensor's shape (the message names the initializer and the file).
    """
    path = os.fspath(path)
    if sys.byteorder != "little" or not hasattr(
            external_data_helper, "_open_external_data_fd"):
        # big-endian hosts, or an onnx without the location checks of its
        # own loader to reuse: everything loaded, as load_onnx_file does
        return load_onnx_file(path), {}
    model = _parse_onnx_file(path, load_external_data=False)
    folder = os.path.dirname(os.path.abspath(path))
    external = {}
    for tensor in model.graph.initializer:
        if external_data_helper.uses_external_data(tensor) and \
                tensor.data_type in _DIRECT_TYPES and \
                all(d >= 0 for d in tensor.dims) and defer(tensor):
            external[tensor.name] = _external_tensor(tensor, folder, path)
            tensor.ClearField("external_data")
            tensor.ClearField("data_location")
    # the rest (other initializers, tensors in attributes) as onnx.load does
    for tensor in external_data_helper._get_all_tensors(model):
        if not external_data_helper.uses_external_data(tensor):
            continue
        try:
            external_data_helper.load_external_data_for_tensor(tensor, folder)
        except onnx.checker.ValidationError as exc:
            raise _refused_external_data(path, exc) from exc
        except ValueError as exc:  # an offset or a length beyond the file
            raise InvalidModelError(
                f"{path}: the external data of initializer {tensor.name!r} "
                f"cannot be read: {exc}") from exc
    return model, external


def read_onnx_model(model, what="model"):
    """A ModelProto from a ModelProto (returned as is), serialized bytes or a
    path (loaded with its external data).

    Parameters
    ----------
    model : onnx.ModelProto, bytes, bytearray, memoryview, str or os.PathLike
    what : str, default='model'
        The parameter's name, for the messages.

    Returns
    -------
    onnx.ModelProto

    Raises
    ------
    TypeError
        For any other type.
    FileNotFoundError, IsADirectoryError
        As :func:`load_onnx_file`.
    onnxtrain.exceptions.InvalidModelError
        Bytes or a file that do not parse to an ONNX model, or external
        data that cannot be read (see :func:`load_onnx_file`).
    """
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray, memoryview)):
        data = bytes(model)
        try:
            proto = onnx.load_model_from_string(data)
        except DecodeError as exc:
            raise InvalidModelError(
                f"{what}: the {len(data)} bytes given are not a serialized "
                f"ONNX model (protobuf could not parse them: {exc}; truncated "
                "or not a model).") from exc
        if not proto.HasField("graph"):
            raise InvalidModelError(f"{what}: the {len(data)} bytes given are "
                                    "not a serialized ONNX model (no graph).")
        return proto
    if isinstance(model, (str, os.PathLike)):
        return load_onnx_file(model)
    raise TypeError(
        f"{what}: expected an onnx.ModelProto, serialized bytes or a path to "
        f"an ONNX file, got {type(model).__module__}."
        f"{type(model).__qualname__}")
