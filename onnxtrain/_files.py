"""Reading ONNX files given by path, with errors that name the file."""
from __future__ import annotations

import os

import onnx
from google.protobuf.message import DecodeError

__all__ = ["load_onnx_file"]


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
    ValueError
        If the file is not a serialized ONNX model (protobuf cannot parse
        it, or it parses to a message without a graph, as an empty file
        does); the message names the file.
    """
    path = os.fspath(path)
    try:
        model = onnx.load(path)
    except DecodeError as exc:
        raise ValueError(f"{path} is not an ONNX model (protobuf could not "
                         f"parse it: {exc}).") from None
    if not model.HasField("graph"):
        raise ValueError(f"{path} is not an ONNX model (no graph in it).")
    return model
