"""Write parameters to a checkpoint and load a checkpoint into a model
(``onnxblock.save_checkpoint`` and ``onnxblock.load_checkpoint_to_model``).

The file is onnxtrain's checkpoint (:mod:`onnxtrain.checkpoint`), the
one :class:`onnxtrain.api.CheckpointState` loads.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from ..checkpoint import read_checkpoint, write_checkpoint

__all__ = ["save_checkpoint", "load_checkpoint_to_model"]


def save_checkpoint(parameters, path_to_checkpoint, nominal_checkpoint=False):
    """Write parameters to a checkpoint file.

    Parameters
    ----------
    parameters : tuple (trainable, frozen)
        Two lists of onnx.TensorProto, as
        :meth:`~onnxtrain.onnxblock.TrainingBlock.parameters` returns.
    path_to_checkpoint : str or pathlib.Path
    nominal_checkpoint : bool, default=False
        Write names, shapes and dtypes only.

    Raises
    ------
    TypeError
        If ``parameters`` is not a pair of lists of TensorProto.
    ValueError
        If a name appears twice.
    """
    try:
        trainable, frozen = parameters
    except (TypeError, ValueError):
        raise TypeError("parameters must be the pair (trainable, frozen) of "
                        "TrainingBlock.parameters().") from None
    entries = []
    for tensors, requires_grad in ((trainable, True), (frozen, False)):
        for tensor in tensors:
            if not isinstance(tensor, onnx.TensorProto):
                raise TypeError("parameters must hold onnx.TensorProto, not "
                                f"{type(tensor).__name__}.")
            entries.append((tensor.name, numpy_helper.to_array(tensor), requires_grad))
    names = [e[0] for e in entries]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"Parameters {twice} appear more than once.")
    write_checkpoint(str(path_to_checkpoint), entries, nominal=nominal_checkpoint)


def load_checkpoint_to_model(path_to_checkpoint, model):
    """Copy the parameters of a checkpoint into the initializers of ``model``
    (in place).

    Parameters
    ----------
    path_to_checkpoint : str or pathlib.Path
        A checkpoint written by :func:`save_checkpoint`,
        ``generate_artifacts`` or ``CheckpointState.save_checkpoint``.
    model : onnx.ModelProto
        Edited in place: each initializer named in the checkpoint takes its
        value.

    Raises
    ------
    ValueError
        If the checkpoint is nominal (it holds no values), or names a
        parameter that is not an initializer of ``model``, or holds one of
        another shape or element type. Nothing is changed then.
    """
    content = read_checkpoint(str(path_to_checkpoint))
    if content["nominal"]:
        raise ValueError(f"{path_to_checkpoint!s} is a nominal checkpoint: it "
                         "holds no parameter values.")
    inits = {i.name: i for i in model.graph.initializer}
    missing = [n for n, _, _ in content["parameters"] if n not in inits]
    if missing:
        raise ValueError(f"Checkpoint parameters {missing} are not initializers "
                         f"of the model (initializers: {sorted(inits)}).")
    for name, value, _ in content["parameters"]:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(inits[name].data_type)
        if tuple(inits[name].dims) != value.shape or np.dtype(dtype) != value.dtype:
            raise ValueError(
                f"Checkpoint parameter {name!r} is {value.dtype} of shape "
                f"{value.shape}; the model's initializer is {np.dtype(dtype)} "
                f"of shape {tuple(inits[name].dims)}.")
    for name, value, _ in content["parameters"]:
        inits[name].CopyFrom(numpy_helper.from_array(value, name))
