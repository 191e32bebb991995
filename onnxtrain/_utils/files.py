"""Reading the ONNX models users give (a path, bytes or a ModelProto), with
errors that name the file or tensor at fault (the checks before onnxruntime
runs them: :mod:`onnxtrain.runtime.checks`)."""
from __future__ import annotations

import os

import onnx
from google.protobuf.message import DecodeError

from ..exceptions import InvalidModelError

__all__ = ["load_onnx_file", "read_onnx_model"]

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
    path = os.fspath(path)
    try:
        model = onnx.load(path)
    except DecodeError as exc:
        raise InvalidModelError(f"{path} is not an ONNX model (protobuf could "
                                f"not parse it: {exc}).") from exc
    except onnx.checker.ValidationError as exc:
        # onnx refuses the external data before reading it; its message
        # names the initializer and the location
        folder = os.path.dirname(os.path.abspath(path))
        raise InvalidModelError(
            f"{path}: the external data of an initializer cannot be read: "
            f"{exc} External data must be regular files inside the model's "
            f"folder {folder}, named by relative paths.") from exc
    if not model.HasField("graph"):
        raise InvalidModelError(f"{path} is not an ONNX model (no graph in "
                                "it).")
    return model


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
