"""Training artifacts: training, eval and optimizer models and a checkpoint.

:func:`generate_artifacts` has the signature and meaning of
``onnxruntime.training.artifacts.generate_artifacts``; the models it writes
use standard ONNX ops only and run on the plain onnxruntime package
(through :mod:`onnxtrain.api`, or any ``onnxruntime.InferenceSession``).
"""
from __future__ import annotations

import enum
import functools
import inspect
import os
import pathlib

import onnx
from onnx import helper, numpy_helper

from .. import onnxblock
from .._utils.gc import gc_frozen
from ..checkpoint.format import (check_checkpoint_entries, checkpoint_to_bytes,
                                 write_checkpoint)
from ..graph import FLOAT_TYPES, opset_of
from ..graph.builder import without_initializer_values
from ..graph.training_mode import running_statistics
from ..optim.update_rules import UpdateRule
from ..runtime.checks import load_checked_model_deferred
from ..runtime.ort_format import save_ort_format
from ._base import owned_base, read_model
from .optim import build_optimizer_model

__all__ = ["LossType", "OptimType", "generate_artifacts"]


class LossType(enum.Enum):
    """Built-in losses (each applied to one model output)."""

    MSELoss = 1
    CrossEntropyLoss = 2
    BCEWithLogitsLoss = 3
    L1Loss = 4


class OptimType(enum.Enum):
    """Built-in optimizers."""

    AdamW = 1
    SGD = 2


_LOSSES = {LossType.MSELoss: onnxblock.loss.MSELoss,
           LossType.CrossEntropyLoss: onnxblock.loss.CrossEntropyLoss,
           LossType.BCEWithLogitsLoss: onnxblock.loss.BCEWithLogitsLoss,
           LossType.L1Loss: onnxblock.loss.L1Loss}
_OPTIMIZERS = {OptimType.AdamW: onnxblock.optim.AdamW,
               OptimType.SGD: onnxblock.optim.SGD}
_BUILTIN_LOSSES = tuple(_LOSSES.values())


class _ArtifactsTrainingBlock(onnxblock.TrainingBlock):
    """The loss (or the given loss output) plus the additional outputs."""

    def __init__(self, loss, additional_output_names):
        super().__init__()
        self._loss = loss
        self._additional = list(additional_output_names)

    def build(self, *loss_inputs):
        output = loss_inputs[0] if self._loss is None else self._loss(*loss_inputs)
        if not (isinstance(output, str) or (
                isinstance(output, (list, tuple)) and output
                and isinstance(output[0], str))):
            raise TypeError(
                f"The loss block {type(self._loss).__name__}.build() returned "
                f"{output!r}; it must return the name of the loss tensor (a "
                "str, e.g. the output of its last node).")
        loss_name = output if isinstance(output, str) else list(output)[0]
        return (loss_name, *self._additional)


def _names(model):
    graph = model.graph
    names = {v.name for v in list(graph.input) + list(graph.output)}
    names |= {i.name for i in graph.initializer}
    for node in graph.node:
        names |= {o for o in node.output if o}
    return names


def _resolve_block(value, table, block_type, what):
    """``value`` when None or a ``block_type``, a new block for a member of
    ``table``'s enum; TypeError naming ``what`` otherwise."""
    if value is None or isinstance(value, block_type):
        return value
    if isinstance(value, enum.Enum) and value in table:
        return table[value]()
    raise TypeError(f"{what} or None, not {value!r}.")


def _resolve_loss(loss):
    return _resolve_block(loss, _LOSSES, onnxblock.Block,
                          "loss must be a LossType, an onnxblock.Block")


def _resolve_optimizer(optimizer):
    if isinstance(optimizer, UpdateRule):  # a chain of links included
        return onnxblock.optim.RuleOptimizer(optimizer)
    return _resolve_block(optimizer, _OPTIMIZERS, onnxblock.optim._OptimizerBlock,
                          "optimizer must be an OptimType, an UpdateRule, "
                          "onnxblock.optim.SGD/AdamW/RuleOptimizer")


def _name_list(names):
    """None -> [], a str -> [names] (one name, as the estimators'
    ``weights_to_train``), other iterables -> a list."""
    if names is None:
        return []
    return [names] if isinstance(names, str) else list(names)


def _check_parameters(model, requires_grad, frozen_params):
    both = sorted(set(requires_grad) & set(frozen_params))
    if both:
        raise ValueError(f"Parameters {both} are in both requires_grad and "
                         "frozen_params.")
    inits = [i.name for i in model.graph.initializer]
    unknown = [n for n in list(requires_grad) + list(frozen_params)
               if n not in set(inits)]
    if unknown:
        raise ValueError(f"Parameters {unknown} are not initializers of the "
                         f"model; initializers: {inits}.")


def _build_arity(block):
    """(min, max) number of positional inputs ``block.build`` accepts."""
    try:
        params = inspect.signature(block.build).parameters.values()
    except (TypeError, ValueError):  # pragma: no cover - builtins
        return 0, None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY,
                                                   p.POSITIONAL_OR_KEYWORD)]
    required = sum(p.default is p.empty for p in positional)
    varargs = any(p.kind == p.VAR_POSITIONAL for p in params)
    return required, None if varargs else len(positional)


def _loss_inputs(model, loss, loss_input_names):
    """The names the loss receives; checked against the loss signature."""
    outputs = [o.name for o in model.graph.output]
    if loss_input_names is None:
        names = outputs
        if len(outputs) > 1 and (loss is None or isinstance(loss, _BUILTIN_LOSSES)):
            what = "the first output is the loss" if loss is None else \
                f"{type(loss).__name__} takes one output"
            if loss is not None:
                raise ValueError(
                    f"The model has {len(outputs)} outputs {outputs} and "
                    f"{what}: pass loss_input_names=[...] to choose it.")
            names = outputs[:1]
    else:
        names = list(loss_input_names)
        unknown = [n for n in names if n not in _names(model)]
        if unknown:
            raise ValueError(f"loss_input_names {unknown} are not values of the "
                             f"model (outputs: {outputs}).")
    if loss is not None:
        low, high = _build_arity(loss)
        if isinstance(loss, _BUILTIN_LOSSES):
            high = 1  # the second positional argument is the target name
        if len(names) < low or (high is not None and len(names) > high):
            takes = f"{low}" if low == high else \
                f"{low} to {high if high is not None else 'any'}"
            raise ValueError(
                f"{type(loss).__name__}.build() takes {takes} input(s) but the "
                f"loss receives {len(names)}: {names}. Pass loss_input_names "
                "to choose the outputs the loss receives.")
    return names


def _check_targets(model, loss):
    """Built-in losses read their target from a graph input of a default
    name: the model's own input of that name (as onnxruntime-training and
    TrainingBlock take it), else a new one; it must not be another value
    of the model (computed in it, possibly from the prediction)."""
    if not isinstance(loss, _BUILTIN_LOSSES):
        return
    target = "labels" if isinstance(loss, onnxblock.loss.CrossEntropyLoss) \
        else "target"
    graph = model.graph
    plain_inputs = {i.name for i in graph.input} - {i.name for i in graph.initializer}
    if target in _names(model) and target not in plain_inputs:
        raise ValueError(
            f"{type(loss).__name__} reads its target from the input {target!r}, "
            "a name the model gives a value it computes or stores; rename that "
            "value in the model or pass a custom loss block calling the loss "
            "with another target name.")


@gc_frozen
def generate_artifacts(model, requires_grad=None, frozen_params=None, loss=None,
                       optimizer=None, artifact_directory=None, prefix="",
                       ort_format=False, custom_op_library=None,
                       additional_output_names=None, nominal_checkpoint=False,
                       loss_input_names=None, overwrite=True):
    """Write the training artifacts of ``model``.

    Parameters
    ----------
    model : onnx.ModelProto, str or pathlib.Path
        The forward model; never modified. A path's external data is read
        with the graph, except (built-in loss or none) that of the float
        weights in ``requires_grad``, read from their files, checked, when
        the checkpoint is written.
    requires_grad : str or list of str, default=None
        Initializers to train; a str is one name (``"weight1"``, not its
        characters). They become inputs of the training and eval models and
        are stored in the checkpoint. None or empty (as in onnxruntime,
        nothing requires gradient by default): the training model computes
        the loss without gradients, and no optimizer may be asked for.
    frozen_params : str or list of str, default=None
        Initializers that become inputs and checkpoint entries but are not
        trained (a str is one name). Other initializers stay constants of
        the graphs.
    loss : LossType or onnxblock.Block, default=None
        The loss applied to the model outputs (or ``loss_input_names``);
        None: the model's first output is the loss already.
    optimizer : OptimType, onnxblock.optim block or UpdateRule, default=None
        None: no optimizer model is written. An update rule, a chain
        (``onnxtrain.optim.chain(ClipByGlobalNorm(1.0), AdamRule())``)
        included, is written by ``onnxblock.optim.RuleOptimizer``.
    artifact_directory : str or pathlib.Path, default=None
        Created if missing; None: the current directory.
    prefix : str, default=""
        Prefix of the file names; a file name part only (no ``/`` or ``\\``,
        no ``..``, no ``:``), so every file lands in ``artifact_directory``.
    ort_format : bool, default=False
        Also write each model in ORT format (``{prefix}training_model.ort``
        ...), converted by stock onnxruntime (basic graph optimizations);
        :class:`onnxtrain.api.Module` and :class:`onnxtrain.api.Optimizer`
        load them.
    custom_op_library : str, default=None
        Custom op libraries are not supported (standard ONNX ops only).
    additional_output_names : list of str, default=None
        Values of the model output after the loss by the training and eval
        models.
    nominal_checkpoint : bool, default=False
        Also write ``{prefix}nominal_checkpoint`` (names, shapes and dtypes
        of the parameters only).
    loss_input_names : list of str, default=None
        The values the loss receives (default: every model output).
    overwrite : bool, default=True
        True (what onnxruntime-training does, so a ported script can run
        again): existing artifact files of the same ``prefix`` are replaced,
        and the ones this call does not write (``optimizer_model.onnx`` of
        an earlier call with an optimizer, ``nominal_checkpoint``, external
        data files ``<model>.onnx.data``) are removed, so the directory never
        mixes two generations. False: if any of those files exists, raise
        before any work.

    Returns
    -------
    dict
        Paths written: keys "training_model", "eval_model",
        "optimizer_model" (if an optimizer), "checkpoint",
        "nominal_checkpoint" (if asked), and with ``ort_format`` the keys
        "training_model_ort", "eval_model_ort", "optimizer_model_ort".

    Raises
    ------
    NotImplementedError
        For a ``custom_op_library``.
    TypeError
        For an unknown loss or optimizer.
    FileExistsError
        ``overwrite=False`` and an artifact file of this ``prefix`` exists
        (the message lists them).
    ValueError
        A ``prefix`` with a path separator, ``..`` or ``:``; an
        ``artifact_directory`` that is a file, or holding a directory of an
        artifact's name; a name in both
        ``requires_grad`` and ``frozen_params``; parameter
        names that are not initializers; an optimizer without trainable
        parameters; a loss
        whose ``build`` takes another number of inputs than it receives
        (the message gives both numbers and the names); a model with several
        outputs, a built-in loss and no ``loss_input_names`` (with no loss,
        the first output is the loss); a built-in loss whose target name
        (``target``, ``labels`` for CrossEntropyLoss) is a value the model
        computes or an initializer (a graph input of that name is the
        target, as in onnxruntime-training); unknown
        ``additional_output_names`` or ``loss_input_names``.
        Every check runs before any file is written.

    Notes
    -----
    Files: ``{prefix}training_model.onnx``, ``{prefix}eval_model.onnx``,
    ``{prefix}optimizer_model.onnx``, ``{prefix}checkpoint``. Layouts: see
    :class:`onnxtrain.onnxblock.TrainingBlock` (training and eval models),
    :mod:`onnxtrain.onnxblock.optim` (optimizer model) and
    :mod:`onnxtrain.checkpoint` (checkpoint).
    """
    if custom_op_library is not None:
        raise NotImplementedError(
            "custom_op_library is not supported: onnxtrain's artifacts use "
            "standard ONNX ops only.")
    directory = _artifact_directory(artifact_directory, prefix, overwrite)
    requires_grad = _name_list(requires_grad)
    frozen_params = _name_list(frozen_params)
    loss_block = _resolve_loss(loss)
    builtin = loss_block is None or type(loss_block) in _BUILTIN_LOSSES
    source, external = _read_source(model, requires_grad if builtin else ())
    _check_parameters(source, requires_grad, frozen_params)
    # with a built-in loss (or none), the blocks edit a copy of the model
    # without the trained weights' values (they become graph inputs; no
    # rule reads a weight it differentiates as a constant), and the
    # checkpoint reads them from ``source``: one copy of the weights fewer,
    # and none of the copies the build makes of its model carries them. A
    # custom loss Block gets every value in
    # ``base``, as it did: it may read, check or edit the weights. Running
    # statistics keep theirs (frozen whatever the lists say, their update
    # reads their initial values)
    valueless = set()
    if builtin:
        valueless = (set(requires_grad) & {i.name for i in source.graph.initializer
                                           if i.data_type in FLOAT_TYPES}) \
            - set(running_statistics(source))
    base_model = without_initializer_values(source, valueless)
    optimizer_block = _resolve_optimizer(optimizer)
    if optimizer_block is not None and not requires_grad:
        raise ValueError("An optimizer model needs trainable parameters: "
                         "requires_grad is empty (pass optimizer=None to "
                         "write the training and eval models only).")
    inputs = _loss_inputs(base_model, loss_block, loss_input_names)
    _check_targets(base_model, loss_block)
    additional = list(additional_output_names or [])
    unknown = [n for n in additional if n not in _names(base_model)]
    if unknown:
        raise ValueError(f"additional_output_names {unknown} are not values of "
                         "the model.")

    block = _ArtifactsTrainingBlock(loss_block, additional)
    for name in requires_grad:
        block.requires_grad(name)
    for name in frozen_params:
        block.requires_grad(name, False)
    # base_model is this call's copy: the blocks edit it (no second copy)
    with owned_base(base_model):
        block(*inputs)
    training_model, eval_model = block.to_model_proto()
    trainable, frozen = block.parameters()
    order = {i.name: k for k, i in enumerate(base_model.graph.initializer)}
    params = sorted(trainable + frozen, key=lambda t: order[t.name])
    trainable_names = {t.name for t in trainable}
    files = {"training_model": training_model, "eval_model": eval_model}
    if optimizer_block is not None:
        opset = opset_of(base_model) or 0  # the base model's, as onnxruntime
        files["optimizer_model"] = build_optimizer_model(
            optimizer_block, trainable, opset if opset >= 9 else None)
    stored = {i.name: i for i in source.graph.initializer if i.name in valueless}
    # each value converted (or read from its file) when the checkpoint
    # writes it: one weight's array at a time, not a copy of them all
    entries = [(t.name, external.get(t.name) or _InitializerValue(stored.get(t.name, t)),
                t.name in trainable_names) for t in params]
    # streamed into its file by _write (no copy as bytes), its
    # arguments checked now, before any file is written
    check_checkpoint_entries(entries)
    files["checkpoint"] = functools.partial(write_checkpoint, parameters=entries)
    if nominal_checkpoint:
        files["nominal_checkpoint"] = checkpoint_to_bytes(entries, nominal=True)
    paths = _write(files, directory, prefix)
    if ort_format:
        paths.update(_write_ort_format(paths))
    return paths


def _read_source(model, deferred):
    """``(source, external)``: the model :func:`read_model` reads and, for
    a path, the external data of the float initializers named in
    ``deferred`` left in their files (``name -> ExternalTensor``, checked;
    :func:`~onnxtrain.runtime.checks.load_checked_model_deferred`), unless
    one of them is a running statistic (whose update reads its value: the
    model is then read whole)."""
    if not deferred or not isinstance(model, (str, pathlib.Path)):
        return read_model(model), {}
    names = set(deferred)
    source, external = load_checked_model_deferred(
        model, "model", lambda tensor: tensor.name in names)
    if external and set(external) & set(running_statistics(source)):
        return read_model(model), {}
    return source, external


class _InitializerValue:
    """An initializer's value, converted by ``np.asarray`` when the
    checkpoint writes it."""

    __slots__ = ("tensor", "dtype", "shape")

    def __init__(self, tensor):
        self.tensor = tensor
        self.dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
        self.shape = tuple(tensor.dims)

    def __array__(self, dtype=None, copy=None):
        array = numpy_helper.to_array(self.tensor)
        return array if dtype is None else array.astype(dtype, copy=False)


# every file generate_artifacts may write, without the prefix
_ARTIFACT_FILES = ("training_model.onnx", "eval_model.onnx",
                   "optimizer_model.onnx", "checkpoint", "nominal_checkpoint",
                   "training_model.ort", "eval_model.ort",
                   "optimizer_model.ort")
# models larger than this are saved with external data (protobuf's 2 GiB limit)
_EXTERNAL_DATA_BYTES = 1_800_000_000


def _artifact_files(directory, prefix):
    """Paths of every file of a generation with ``prefix``: the artifacts
    and the models' external data files."""
    names = list(_ARTIFACT_FILES)
    names += [f"{n}.data" for n in names if n.endswith(".onnx")]
    return [directory / f"{prefix}{name}" for name in names]


def _artifact_directory(artifact_directory, prefix, overwrite):
    """The output directory after checking ``prefix``, the
    directory and, for ``overwrite=False``, that no artifact exists."""
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, not {type(prefix).__name__}.")
    bad = [s for s in ("/", "\\", "..", ":") if s in prefix]
    if bad:
        raise ValueError(f"prefix {prefix!r} contains {bad}: it must be a file "
                         "name part, artifacts are written inside "
                         "artifact_directory only.")
    directory = pathlib.Path(os.getcwd() if artifact_directory is None
                             else artifact_directory)
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"artifact_directory {directory} is a file, not a "
                         "directory.")
    existing = [str(p) for p in _artifact_files(directory, prefix) if p.exists()]
    folders = [p for p in existing if os.path.isdir(p)]
    if folders:
        raise ValueError(f"{folders} are directories where artifact files "
                         "go.")
    if existing and not overwrite:
        raise FileExistsError(f"overwrite=False and artifact files exist: "
                              f"{existing}.")
    return directory


def _write_ort_format(paths):
    """Convert the written .onnx models to ORT format (``<name>.ort`` beside
    them, :func:`~onnxtrain.runtime.ort_format.save_ort_format`). Returns
    ``{"<key>_ort": path}``."""
    written = {}
    for key, path in list(paths.items()):
        if path.endswith(".onnx"):
            written[f"{key}_ort"] = path[:-len(".onnx")] + ".ort"
            save_ort_format(path, written[f"{key}_ort"])
    return written


def _write(files, directory, prefix):
    """Write ``files`` (key -> ModelProto, bytes, or a function writing the
    file at the path it is given) and remove the files of
    an earlier generation with the same prefix that this one does not
    replace."""
    directory.mkdir(parents=True, exist_ok=True)
    paths, written = {}, set()
    # the files written by a function (the checkpoint) first: they may read
    # the given model's external data, which a model written here may
    # replace; a failure reading it leaves the earlier generation as it was
    for key in sorted(files, key=lambda k: not callable(files[k])):
        content = files[key]
        suffix = ".onnx" if key.endswith("model") else ""
        path = directory / f"{prefix}{key}{suffix}"
        if callable(content):  # writes the file itself (a checkpoint)
            content(path)
        elif isinstance(content, onnx.ModelProto):
            # onnx appends to an existing external data file: start afresh
            data = path.with_name(f"{path.name}.data")
            data.unlink(missing_ok=True)
            if content.ByteSize() > _EXTERNAL_DATA_BYTES:
                onnx.save_model(content, str(path), save_as_external_data=True,
                                location=data.name)
                written.add(data)
            else:  # onnx.save_model would walk every tensor for external data
                path.write_bytes(content.SerializeToString())
        else:
            path.write_bytes(content)
        paths[key] = str(path)
        written.add(path)
    for stale in _artifact_files(directory, prefix):
        if stale not in written:
            stale.unlink(missing_ok=True)
    return {key: paths[key] for key in files}
