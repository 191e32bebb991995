"""The onnxtrain checkpoint file: parameters, optimizer state, properties.

Format (version 1)
------------------
A checkpoint is one ZIP archive (entries stored uncompressed) holding

``header.json``
    UTF-8 JSON object::

        {"format": "onnxtrain.checkpoint", "version": 1,
         "nominal": false,
         "parameters": [{"name": str, "dtype": str, "shape": [int, ...],
                         "requires_grad": bool, "data": str | null}, ...],
         "properties": {key: {"type": "int" | "float" | "str",
                              "value": int | str}},
         "optimizer": null | {"step": int, "learning_rate": str,
                              "states": {param: {state: {"dtype": str,
                                  "shape": [int, ...], "data": str}}}}}

    ``dtype`` is a numpy dtype string in little-endian order (``"<f4"``,
    ``"<f8"``, ``"<f2"``, ``"<i8"``, ``"|b1"``); floats (property values, the
    learning rate) are written with :meth:`float.hex`, so they read back
    bit for bit; ``data`` names the archive entry holding the array.
``arrays/<k>.bin``
    The raw bytes of one array in C order, in the dtype of its record.

Parameters keep their order. A nominal checkpoint has ``"nominal": true``
and ``"data": null`` for every parameter: names, shapes and dtypes only.
Reading never executes code (no pickle): only JSON and raw numeric bytes of
boolean, integer or float dtypes are accepted.
"""
from __future__ import annotations

import io
import json
import zipfile

import numpy as np

__all__ = ["FORMAT", "VERSION", "checkpoint_to_bytes", "read_checkpoint",
           "write_checkpoint", "encode_property", "decode_property"]

FORMAT = "onnxtrain.checkpoint"
VERSION = 1
_HEADER = "header.json"
_KINDS = "biuf"


def _dtype_str(dtype):
    dtype = np.dtype(dtype)
    if dtype.kind not in _KINDS:
        raise TypeError(f"A checkpoint stores bool, int and float arrays, "
                        f"not {dtype}.")
    return dtype.newbyteorder("<").str if dtype.itemsize > 1 else dtype.str


def encode_property(key, value):
    """JSON record of one property.

    Raises
    ------
    TypeError
        If ``key`` is not a str or ``value`` is not an int, float or str
        (bool is refused: it would read back as an int).
    """
    if not isinstance(key, str):
        raise TypeError(f"Property names are str, not {type(key).__name__}.")
    if isinstance(value, bool) or not isinstance(value, (int, float, str,
                                                         np.integer, np.floating)):
        raise TypeError(f"Property {key!r}: values are int, float or str, "
                        f"not {type(value).__name__}.")
    if isinstance(value, (int, np.integer)):
        return {"type": "int", "value": int(value)}
    if isinstance(value, (float, np.floating)):
        return {"type": "float", "value": float(value).hex()}
    return {"type": "str", "value": value}


def decode_property(record):
    """Inverse of :func:`encode_property`."""
    kind, value = record["type"], record["value"]
    if kind == "int":
        return int(value)
    if kind == "float":
        return float.fromhex(value)
    if kind == "str":
        return str(value)
    raise ValueError(f"Unknown property type {kind!r} in the checkpoint.")


class _Writer:
    def __init__(self, archive):
        self.archive = archive
        self.count = 0

    def array(self, value, dtype=None):
        array = np.ascontiguousarray(value, dtype=dtype)
        dtype = _dtype_str(array.dtype)
        entry = f"arrays/{self.count}.bin"
        self.count += 1
        self.archive.writestr(entry, array.astype(dtype, copy=False).tobytes())
        return {"dtype": dtype, "shape": list(array.shape), "data": entry}


def checkpoint_to_bytes(parameters, properties=None, optimizer=None,
                        nominal=False):
    """Serialize a checkpoint.

    Parameters
    ----------
    parameters : list of tuple
        ``(name, value, requires_grad)`` where ``value`` is an ndarray, or for
        a nominal checkpoint ``(name, (dtype, shape), requires_grad)``.
    properties : dict of str to int, float or str, default=None
    optimizer : dict, default=None
        ``{"step": int, "learning_rate": float, "states": {param: {state:
        ndarray}}}``.
    nominal : bool, default=False
        Write names, shapes and dtypes only.

    Returns
    -------
    bytes
    """
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        writer = _Writer(archive)
        records = []
        for name, value, requires_grad in parameters:
            if nominal:
                dtype, shape = (value if isinstance(value, tuple)
                                else (np.asarray(value).dtype, np.shape(value)))
                record = {"dtype": _dtype_str(dtype),
                          "shape": [int(d) for d in shape], "data": None}
            else:
                record = writer.array(value)
            records.append(dict(name=str(name), requires_grad=bool(requires_grad),
                                **record))
        header = {"format": FORMAT, "version": VERSION, "nominal": bool(nominal),
                  "parameters": records,
                  "properties": {k: encode_property(k, v)
                                 for k, v in (properties or {}).items()},
                  "optimizer": None}
        if optimizer is not None and not nominal:
            header["optimizer"] = {
                "step": int(optimizer["step"]),
                "learning_rate": float(optimizer["learning_rate"]).hex(),
                "states": {p: {s: writer.array(v) for s, v in states.items()}
                           for p, states in optimizer["states"].items()}}
        archive.writestr(_HEADER, json.dumps(header, indent=1))
    return buffer.getvalue()


def write_checkpoint(path, *args, **kwargs):
    """Write :func:`checkpoint_to_bytes` ``(*args, **kwargs)`` to ``path``."""
    data = checkpoint_to_bytes(*args, **kwargs)
    with open(path, "wb") as f:
        f.write(data)


def _read_array(archive, record):
    dtype = np.dtype(record["dtype"])
    if dtype.kind not in _KINDS or dtype.hasobject:
        raise ValueError(f"Unsupported dtype {record['dtype']!r} in the checkpoint.")
    shape = tuple(int(d) for d in record["shape"])
    data = archive.read(record["data"])
    if len(data) != dtype.itemsize * int(np.prod(shape, dtype=np.int64)):
        raise ValueError(f"Entry {record['data']!r} of the checkpoint has "
                         f"{len(data)} bytes; shape {shape} of {dtype} needs "
                         "another size.")
    return np.frombuffer(data, dtype=dtype).reshape(shape).astype(
        dtype.newbyteorder("="), copy=True)


def read_checkpoint(path):
    """Read a checkpoint file.

    Returns
    -------
    dict
        ``nominal`` (bool), ``parameters`` (list of ``(name, value,
        requires_grad)``, ``value`` an ndarray, or ``(dtype, shape)`` for a
        nominal checkpoint), ``properties`` (dict), ``optimizer`` (None or
        ``{"step", "learning_rate", "states"}`` with ndarrays).

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        If the file is not an onnxtrain checkpoint or is inconsistent.
    """
    try:
        archive = zipfile.ZipFile(path, "r")
    except zipfile.BadZipFile as exc:
        raise ValueError(f"{path!s} is not an onnxtrain checkpoint "
                         "(not a ZIP archive).") from exc
    with archive:
        try:
            header = json.loads(archive.read(_HEADER).decode("utf-8"))
        except KeyError as exc:
            raise ValueError(f"{path!s} has no {_HEADER}: not an onnxtrain "
                             "checkpoint.") from exc
        if header.get("format") != FORMAT or header.get("version") != VERSION:
            raise ValueError(f"{path!s}: unsupported checkpoint format "
                             f"{header.get('format')!r} version "
                             f"{header.get('version')!r}.")
        nominal = bool(header["nominal"])
        parameters = []
        for rec in header["parameters"]:
            if nominal:
                value = (np.dtype(rec["dtype"]).newbyteorder("="),
                         tuple(int(d) for d in rec["shape"]))
            else:
                value = _read_array(archive, rec)
            parameters.append((rec["name"], value, bool(rec["requires_grad"])))
        optimizer = header.get("optimizer")
        if optimizer is not None:
            optimizer = {
                "step": int(optimizer["step"]),
                "learning_rate": float.fromhex(optimizer["learning_rate"]),
                "states": {p: {s: _read_array(archive, r) for s, r in st.items()}
                           for p, st in optimizer["states"].items()}}
    return {"nominal": nominal, "parameters": parameters,
            "properties": {k: decode_property(v)
                           for k, v in header["properties"].items()},
            "optimizer": optimizer}
