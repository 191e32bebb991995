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
boolean, integer or float dtypes are accepted. :func:`read_checkpoint`
checks the archive and the whole header (the rules are listed in
``docs/checkpoint_format.md``, "What reading validates") before it reads
any array, and an entry's size against its record before reading it.
"""
from __future__ import annotations

import collections
import io
import json
import math
import os
import secrets
import stat
import time
import zipfile
from typing import NamedTuple

import numpy as np

__all__ = ["FORMAT", "VERSION", "checkpoint_to_bytes", "read_checkpoint",
           "write_checkpoint", "check_checkpoint_entries", "encode_property",
           "decode_property"]

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
        # np.require keeps rank 0 (np.ascontiguousarray made it rank 1)
        array = np.require(np.asarray(value, dtype=dtype), requirements="C")
        dtype = _dtype_str(array.dtype)
        entry = f"arrays/{self.count}.bin"
        self.count += 1
        # C-contiguous as ``array``; flat, as a memoryview of no element
        # cannot be cast from a shape with a zero in it
        data = array.astype(dtype, copy=False).reshape(-1)
        # as ZipFile.writestr, without its bytes copy of the array
        info = zipfile.ZipInfo(entry, date_time=time.localtime(time.time())[:6])
        info.compress_type = zipfile.ZIP_STORED
        info.external_attr = 0o600 << 16
        info.file_size = data.nbytes
        with self.archive.open(info, "w") as dest:
            dest.write(memoryview(data).cast("B"))
        return {"dtype": dtype, "shape": list(array.shape), "data": entry}


def checkpoint_to_bytes(parameters, properties=None, optimizer=None,
                        nominal=False):
    """Serialize a checkpoint.

    Parameters
    ----------
    parameters : list of tuple
        ``(name, value, requires_grad)`` where ``value`` is an ndarray (or
        an object with ``dtype`` and ``shape`` that ``np.asarray``
        converts, converted only when written), or for a nominal
        checkpoint ``(name, (dtype, shape), requires_grad)``.
    properties : dict of str to int, float or str, default=None
    optimizer : dict, default=None
        ``{"step": int, "learning_rate": float, "states": {param: {state:
        ndarray}}}``.
    nominal : bool, default=False
        Write names, shapes and dtypes only.

    Returns
    -------
    bytes

    Raises
    ------
    TypeError
        An array of another dtype than bool, int or float; a property of
        another type than int, float or str.
    """
    buffer = io.BytesIO()
    _write_archive(buffer, parameters, properties, optimizer, nominal)
    return buffer.getvalue()


def _dtype_of(value):
    """The dtype of an array, or of a value converted by ``np.asarray``
    unless it declares a numpy dtype (a value that converts itself on
    demand, as :class:`onnxtrain._utils.files.ExternalTensor`, is not
    read here; a torch tensor's dtype is not numpy's: it is converted)."""
    dtype = getattr(value, "dtype", None)
    return dtype if isinstance(dtype, np.dtype) else np.asarray(value).dtype


def _shape_of(value):
    if isinstance(getattr(value, "dtype", None), np.dtype):
        return tuple(value.shape)
    return np.shape(np.asarray(value))


def check_checkpoint_entries(parameters, properties=None, optimizer=None,
                             nominal=False):
    """Raise the TypeError :func:`write_checkpoint` would raise for these
    arguments, before anything is written (same parameters)."""
    for _name, value, _ in parameters:
        if nominal and isinstance(value, tuple):
            dtype = value[0]
        else:
            dtype = _dtype_of(value)
        _dtype_str(dtype)
    for key, value in (properties or {}).items():
        encode_property(key, value)
    if optimizer is not None and not nominal:
        for states in optimizer["states"].values():
            for value in states.values():
                _dtype_str(np.asarray(value).dtype)


def _write_archive(file, parameters, properties, optimizer, nominal):
    """The checkpoint archive of :func:`checkpoint_to_bytes`'s arguments,
    written into the binary file object ``file``."""
    with zipfile.ZipFile(file, "w", zipfile.ZIP_STORED) as archive:
        writer = _Writer(archive)
        records = []
        for name, value, requires_grad in parameters:
            if nominal:
                dtype, shape = (value if isinstance(value, tuple)
                                else (_dtype_of(value), _shape_of(value)))
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
        # compact: json's C encoder (indented JSON takes its slower Python
        # one)
        archive.writestr(_HEADER, json.dumps(header, separators=(",", ":")))


def write_checkpoint(path, parameters, properties=None, optimizer=None,
                     nominal=False):
    """Write the checkpoint of :func:`checkpoint_to_bytes`'s arguments to
    ``path``.

    The arguments are checked first (:func:`check_checkpoint_entries`);
    the archive is then streamed into a new file in ``path``'s directory
    (``.checkpoint-<random>.partial``, with the permissions of the file it
    replaces), which replaces the file ``path`` names once complete
    (``os.replace``; through a symbolic link, its target): no copy of the
    archive in memory, and an error or an interruption never leaves a
    truncated checkpoint at ``path`` (an existing one stays as it was; a
    process killed while writing leaves its partial file).

    Raises
    ------
    TypeError
        As :func:`checkpoint_to_bytes`, before any file is created.
    OSError
        From the file system (naming ``path``).
    """
    parameters = list(parameters)  # read twice: checked, then written
    check_checkpoint_entries(parameters, properties, optimizer, nominal)
    target = os.path.realpath(os.fspath(path))
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        mode = None  # a new file: the process's umask applies, as to open()
    while True:
        partial = os.path.join(os.path.dirname(target),
                               f".checkpoint-{secrets.token_hex(6)}.partial")
        try:
            handle = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                             | getattr(os, "O_BINARY", 0), 0o666)
            break
        except FileExistsError:
            continue
        except OSError as exc:
            raise type(exc)(exc.errno, exc.strerror, os.fspath(path)) from exc
    try:
        with os.fdopen(handle, "wb") as f:
            _write_archive(f, parameters, properties, optimizer, nominal)
        if mode is not None:
            os.chmod(partial, mode)
        os.replace(partial, target)
    except BaseException:
        if os.path.exists(partial):
            os.remove(partial)
        raise


#: Bytes read at a time from an array's entry.
_READ_BLOCK = 1 << 20


class _Reader:
    """Validates a checkpoint archive and its header (the rules of
    ``docs/checkpoint_format.md``) before any array is read; every failure is
    a ValueError naming the file and the field."""

    def __init__(self, path, archive, file_size):
        self.path, self.archive = path, archive
        self.used_entries = set()
        self.total_bytes = 0
        self._check_entries(file_size)

    def fail(self, field, message):
        raise ValueError(f"{self.path!s}: checkpoint field {field}: {message}")

    def _check_entries(self, file_size):
        counts = collections.Counter(i.filename for i in self.archive.infolist())
        twice = sorted(name for name, count in counts.items() if count > 1)
        if twice:
            self.fail("archive", f"entries {_short(twice)} appear more than "
                      "once.")
        for info in self.archive.infolist():
            field = f"archive entry {info.filename!r}"
            if info.compress_type != zipfile.ZIP_STORED:
                self.fail(field, "is compressed; checkpoint entries are stored "
                          "uncompressed.")
            if info.flag_bits & 0x1:
                self.fail(field, "is encrypted.")
            if (info.compress_size != info.file_size
                    or info.header_offset + info.file_size > file_size):
                self.fail(field, f"declares {info.file_size} bytes, more than "
                          f"the file's {file_size}.")

    def entry(self, field, info):
        """The bytes of the entry of ZipInfo ``info`` (CRC checked)."""
        try:
            return self.archive.read(info)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError,
                NotImplementedError, RuntimeError) as exc:
            # RuntimeError: encrypted; NotImplementedError: a ZIP feature
            # (version, strong encryption) zipfile does not read
            self.fail(field, f"entry {info.filename!r} cannot be read "
                      f"({exc}).")

    def header(self):
        try:
            info = self.archive.getinfo(_HEADER)
        except KeyError:
            raise ValueError(f"{self.path!s} has no {_HEADER}: not an onnxtrain "
                             "checkpoint.") from None
        text = self.entry(_HEADER, info)
        try:
            header = json.loads(text.decode("utf-8"),
                                parse_constant=_refuse_constant)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            self.fail(_HEADER, f"is not valid JSON ({exc}).")
        if not isinstance(header, dict):
            self.fail(_HEADER, f"is a JSON {type(header).__name__}, not an "
                      "object.")
        for key in ("format", "version", "nominal", "parameters", "properties"):
            if key not in header:
                self.fail(key, "is missing.")
        if header["format"] != FORMAT:
            self.fail("format", f"{_short(header['format'])} is not "
                      f"{FORMAT!r}: not an onnxtrain checkpoint.")
        if _exact(header["version"], int) != VERSION:
            self.fail("version", f"{_short(header['version'])}: this "
                      f"onnxtrain reads version {VERSION}.")
        return header

    def typed(self, field, value, kind):
        if _exact(value, kind) is None:
            self.fail(field, f"{_short(value)} is not a JSON "
                      f"{_JSON_NAMES[kind]}.")
        return value

    def record(self, field, record, keys):
        self.typed(field, record, dict)
        for key in keys:
            if key not in record:
                self.fail(f"{field}.{key}", "is missing.")
        return record

    def dtype_shape(self, field, record):
        dtype = self.typed(f"{field}.dtype", record["dtype"], str)
        if dtype not in _DTYPES:
            self.fail(f"{field}.dtype", f"{_short(dtype)} is not one of "
                      f"{sorted(_DTYPES)}.")
        shape = self.typed(f"{field}.shape", record["shape"], list)
        for dim in shape:
            if _exact(dim, int) is None or dim < 0:
                self.fail(f"{field}.shape", f"{_short(shape)} is not a list "
                          "of non-negative integers.")
        if len(shape) > MAX_DIMS:
            self.fail(f"{field}.shape", f"{_short(shape)} has {len(shape)} "
                      f"dimensions; numpy arrays have at most {MAX_DIMS}.")
        dtype = np.dtype(dtype)
        nbytes = dtype.itemsize * math.prod(shape)
        self.total_bytes += nbytes
        if self.total_bytes > MAX_BYTES:
            self.fail(f"{field}.shape", f"{_short(shape)}: the arrays would take "
                      f"{self.total_bytes} bytes, more than {MAX_BYTES}.")
        return dtype, tuple(shape), nbytes

    def array(self, field, record):
        """Validates ``record`` and the size of its entry; the entry is read
        later (:meth:`load`), once the whole header is valid."""
        self.record(field, record, ("dtype", "shape", "data"))
        dtype, shape, nbytes = self.dtype_shape(field, record)
        name = self.typed(f"{field}.data", record["data"], str)
        try:
            info = self.archive.getinfo(name)
        except KeyError:
            self.fail(f"{field}.data", f"no archive entry {_short(name)}.")
        if name in self.used_entries or name == _HEADER:
            self.fail(f"{field}.data", f"entry {name!r} is used twice.")
        self.used_entries.add(name)
        if info.file_size != nbytes:
            self.fail(f"{field}.data", f"entry {name!r} has {info.file_size} "
                      f"bytes; shape {list(shape)} of {dtype} needs {nbytes}.")
        return _Pending(f"{field}.data", info, dtype, shape)

    def load(self, value):
        """The array of a :class:`_Pending` read (other values as they are):
        the entry is read into the array's memory a block at a time (no
        copy of it as bytes), to its end, where zipfile checks its CRC."""
        if not isinstance(value, _Pending):
            return value
        array = np.empty(value.shape, dtype=value.dtype)
        view = memoryview(array.reshape(-1).view(np.uint8))
        try:
            with self.archive.open(value.info) as f:
                done = 0
                while done < len(view):
                    block = f.read(min(_READ_BLOCK, len(view) - done))
                    if not block:
                        break
                    view[done:done + len(block)] = block
                    done += len(block)
                extra = f.read(1)  # at the end: the CRC is checked here
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError,
                NotImplementedError, RuntimeError) as exc:
            self.fail(value.field, f"entry {value.info.filename!r} cannot be "
                      f"read ({exc}).")
        if done != len(view) or extra:
            self.fail(value.field, f"entry {value.info.filename!r} does not "
                      f"hold the {len(view)} bytes its header declares.")
        return array.astype(value.dtype.newbyteorder("="), copy=False)

    def parameters(self, header):
        nominal = self.typed("nominal", header["nominal"], bool)
        records = self.typed("parameters", header["parameters"], list)
        parameters, names = [], set()
        for i, rec in enumerate(records):
            field = f"parameters[{i}]"
            self.record(field, rec, ("name", "dtype", "shape", "requires_grad",
                                     "data"))
            name = self.typed(f"{field}.name", rec["name"], str)
            if name in names:
                self.fail(f"{field}.name", f"{name!r} appears twice.")
            names.add(name)
            requires_grad = self.typed(f"{field}.requires_grad",
                                       rec["requires_grad"], bool)
            if nominal:
                if rec["data"] is not None:
                    self.fail(f"{field}.data", "is not null in a nominal "
                              "checkpoint.")
                dtype, shape, _ = self.dtype_shape(field, rec)
                value = (dtype.newbyteorder("="), shape)
            else:
                value = self.array(field, rec)
            parameters.append((name, value, requires_grad))
        return nominal, parameters

    def properties(self, header):
        records = self.typed("properties", header["properties"], dict)
        properties = {}
        for key, rec in records.items():
            field = f"properties[{key!r}]"
            self.record(field, rec, ("type", "value"))
            kind = rec["type"]
            if not isinstance(kind, str) or kind not in _PROPERTY_TYPES:
                self.fail(f"{field}.type", f"{_short(kind)} is not 'int', "
                          "'float' or 'str'.")
            value = self.typed(f"{field}.value", rec["value"],
                               _PROPERTY_TYPES[kind])
            properties[key] = (self.hex_float(f"{field}.value", value)
                               if kind == "float" else value)
        return properties

    def hex_float(self, field, value):
        self.typed(field, value, str)
        try:
            return float.fromhex(value)
        except ValueError:
            self.fail(field, f"{_short(value)} is not a float written by "
                      "float.hex.")

    def optimizer(self, header, parameters, nominal):
        optimizer = header.get("optimizer")
        if optimizer is None:
            return None
        if nominal:
            self.fail("optimizer", "is not null in a nominal checkpoint.")
        self.record("optimizer", optimizer, ("step", "learning_rate", "states"))
        step = self.typed("optimizer.step", optimizer["step"], int)
        if step < 0:
            self.fail("optimizer.step", f"{step} is negative.")
        if step >= MAX_STEP:
            self.fail("optimizer.step", f"{step} leaves no next step: the "
                      "optimizer model takes the next step's number as an "
                      f"int64, so the count is at most {MAX_STEP - 1}.")
        rate = self.hex_float("optimizer.learning_rate",
                              optimizer["learning_rate"])
        if not (math.isfinite(rate) and rate >= 0):
            self.fail("optimizer.learning_rate", f"{rate} is not a finite "
                      "non-negative number.")
        names = {name for name, _, _ in parameters}
        states = {}
        for param, records in self.typed("optimizer.states",
                                         optimizer["states"], dict).items():
            field = f"optimizer.states[{param!r}]"
            if param not in names:
                self.fail(field, f"{param!r} is not a parameter.")
            states[param] = {
                state: self.array(f"{field}[{state!r}]", rec)
                for state, rec in self.typed(field, records, dict).items()}
        return {"step": step, "learning_rate": rate, "states": states}


class _Pending(NamedTuple):
    field: str
    info: zipfile.ZipInfo
    dtype: np.dtype
    shape: tuple


def _short(value, limit=80):
    """repr of ``value``, cut to ``limit`` characters (a hostile header may
    hold a huge list)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _refuse_constant(name):
    raise ValueError(f"{name} is not JSON")


def _exact(value, kind):
    """``value`` if its type is exactly ``kind`` (a bool is not an int),
    else None."""
    if kind is int:
        return value if isinstance(value, int) and not isinstance(value, bool) \
            else None
    return value if isinstance(value, kind) else None


_JSON_NAMES = {int: "integer", bool: "boolean (true or false)", str: "string",
               list: "array", dict: "object"}
_PROPERTY_TYPES = {"int": int, "float": str, "str": str}
# little-endian bool, int, uint and float dtypes, as _dtype_str writes them
_DTYPES = frozenset(_dtype_str(t) for t in "?bBhHiIqQefd")
#: The optimizer model's ``step`` input is an int64 (the next step's number).
MAX_STEP = int(np.iinfo(np.int64).max)
MAX_BYTES = 1 << 40  # 1 TiB: a bound on the arrays of one checkpoint
#: The most dimensions an array record may have: numpy's limit (32 before
#: numpy 2), beyond which the array could not be built.
MAX_DIMS = 64 if np.lib.NumpyVersion(np.__version__) >= "2.0.0" else 32


def read_checkpoint(path):
    """Read a checkpoint file, validating it first.

    The archive and the whole header are checked (rules in
    ``docs/checkpoint_format.md``) before any array is read, and each
    array's entry must have exactly the size its dtype and shape give
    before it is read: memory use is bounded by the file's size (a
    nominal checkpoint's shapes are bounded by :data:`MAX_BYTES`).

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
        If the file is not an onnxtrain checkpoint or breaks a rule of the
        format; the message names the file and the field.
    """
    file_size = os.stat(path).st_size
    try:
        archive = zipfile.ZipFile(path, "r")
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError,
            NotImplementedError, ValueError) as exc:
        raise ValueError(f"{path!s} is not an onnxtrain checkpoint "
                         f"(not a ZIP archive it can read: {exc}).") from None
    with archive:
        reader = _Reader(path, archive, file_size)
        header = reader.header()
        properties = reader.properties(header)
        nominal, parameters = reader.parameters(header)
        optimizer = reader.optimizer(header, parameters, nominal)
        # the header is valid: read the arrays
        parameters = [(name, reader.load(value), requires_grad)
                      for name, value, requires_grad in parameters]
        if optimizer is not None:
            optimizer["states"] = {
                p: {s: reader.load(v) for s, v in st.items()}
                for p, st in optimizer["states"].items()}
    return {"nominal": nominal, "parameters": parameters,
            "properties": properties, "optimizer": optimizer}
