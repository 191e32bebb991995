"""``save_onnx_graph``: write every ONNX graph an object holds, as
onnxcustom's objects did (estimators, learning rates, losses)."""
from __future__ import annotations

import os
import warnings

import onnx

from .builder import VALUE_FIELDS

__all__ = ["GraphSaverMixin", "save_onnx_graph"]

#: Shorter file names, as onnxcustom shortened them; the engine's files keep
#: the name of the class onnxcustom saved there.
_SHORT = {"ForwardBackwardEngine": "GradFB", "Learning": "L", "OrtGradient": "Grad",
          "ForwardBackward": "FB"}


def save_onnx_graph(obj, folder, prefix=None, suffix=None):
    """Save the ONNX graphs held by ``obj``'s attributes.

    Attributes holding an ``onnx.ModelProto`` are saved; a list or tuple of
    them gives a dict position -> result; an onnxtrain object (a learning
    rate, a loss, the training engine...) gives the dict of its own graphs.

    Parameters
    ----------
    obj : object
    folder : str or the type ``bytes``
        An existing folder, or ``bytes`` to get the serialized graphs
        instead of files.
    prefix, suffix : str, default=None
        Added around the class name in the file names
        ``{prefix}{class}{suffix}.{attribute}.onnx`` ('Learning' shortened
        to 'L', 'OrtGradient' to 'Grad', 'ForwardBackward' to 'FB').

    Returns
    -------
    dict
        attribute -> file name (or bytes), or a dict for the attributes
        holding several graphs or objects; attributes with no graph are
        left out, as is a graph kept without the values of some of its
        initializers (a training engine's model, whose trained weights'
        values live in the engine: that file would not load).

    Raises
    ------
    FileNotFoundError
        ``folder`` does not exist.

    Warns
    -----
    UserWarning
        When a file is overwritten.
    """
    if folder is not bytes and not os.path.isdir(folder):
        raise FileNotFoundError(f"Folder {folder!r} does not exist.")
    return _save(obj, folder, prefix or "", suffix or "", set())


def _save(obj, folder, prefix, suffix, seen):
    seen.add(id(obj))
    saved = {}
    for key, value in vars(obj).items():
        result = _save_value(obj, key, value, folder, prefix, suffix, seen)
        if result:
            saved[key] = result
    return saved


def _save_value(owner, key, value, folder, prefix, suffix, seen):
    if isinstance(value, onnx.ModelProto):
        if not _has_every_value(value):
            return None
        return _write(value, owner, key, folder, prefix, suffix)
    if isinstance(value, (list, tuple)):
        results = {i: _save_value(owner, f"{key}{i}", v, folder, prefix, suffix, seen)
                   for i, v in enumerate(value)}
        return {i: r for i, r in results.items() if r}
    if (type(value).__module__.split(".")[0] == "onnxtrain"
            and hasattr(value, "__dict__") and id(value) not in seen):
        return _save(value, folder, prefix, f"{suffix}.{key}", seen)
    return None


def _has_every_value(model):
    """Whether every initializer of ``model``'s main graph holding elements
    has a value (not a tensor of dims only, as
    :func:`onnxtrain.graph.without_initializer_values` leaves them)."""
    for init in model.graph.initializer:
        if any(d == 0 for d in init.dims) or init.data_location == onnx.TensorProto.EXTERNAL:
            continue
        if not any(getattr(init, field) for field in VALUE_FIELDS):
            return False
    return True


def _write(model, owner, key, folder, prefix, suffix):
    if folder is bytes:
        return model.SerializeToString()
    name = f"{prefix}{type(owner).__name__}{suffix}.{key}.onnx"
    for long, short in _SHORT.items():
        name = name.replace(long, short)
    path = os.path.join(folder, name)
    if os.path.exists(path):
        warnings.warn(f"{path!r} already exists; it is overwritten.")
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    return path


class GraphSaverMixin:
    """``save_onnx_graph`` as a method (learning rates, losses)."""

    def save_onnx_graph(self, folder, prefix=None, suffix=None):
        """Save the object's ONNX graphs: see :func:`save_onnx_graph`."""
        return save_onnx_graph(self, folder, prefix, suffix)
