"""Module: run the training and eval models of ``generate_artifacts``."""
from __future__ import annotations

import json
import threading

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .._utils.casting import cast_within_range
from ..graph import elem_type_to_numpy, infer_value_types
from ..graph.aliasing import writes_after_reads
from ..graph.scopes import node_reads
from ..onnxblock._training import EVAL_METADATA, TRAINING_METADATA
from ..runtime import (SessionRunError, SessionRunner, is_ortvalue,
                       ortvalue_dtype, parse_device, to_numpy, to_ortvalue)
from ..runtime.checks import check_onnx_model, load_checked_model
from ..runtime.ort_format import OrtFormatModel, is_ort_format
from ..runtime.sessions import (check_session_options, default_session_options,
                                with_user_options)
from ..runtime.threads import check_n_threads
from ._plain_step import unreshaped_outputs, without_accumulation

__all__ = ["Module"]


def load_model(uri):
    """A ModelProto from a path (str, pathlib.Path) or a ModelProto (copied);
    an ORT-format file (``ort_format=True`` artifacts) gives an
    :class:`~onnxtrain.runtime.ort_format.OrtFormatModel`.

    Raises
    ------
    onnxtrain.exceptions.InvalidModelError
        As :func:`onnxtrain.runtime.checks.load_checked_model`.
    """
    if isinstance(uri, onnx.ModelProto):
        check_onnx_model(uri)
        copy = onnx.ModelProto()
        copy.CopyFrom(uri)
        return copy
    if is_ort_format(str(uri)):
        return OrtFormatModel(str(uri))
    return load_checked_model(uri)


def read_layout(model, key, what):
    """The JSON layout onnxtrain wrote in ``model``'s metadata under ``key``.

    Raises
    ------
    ValueError
        If the model has none (it was not written by onnxtrain.onnxblock.artifacts).
    """
    for prop in model.metadata_props:
        if prop.key == key:
            return json.loads(prop.value)
    raise ValueError(f"The {what} has no {key!r} metadata: it was not written "
                     "by onnxtrain.artifacts.generate_artifacts.")


def input_specs(model, names):
    """``name -> (numpy dtype, shape, onnxruntime type)`` of the tensor
    inputs ``names`` of ``model``: shape is None when undeclared, else a
    tuple of int (static dims), str (symbolic dims) or None (unknown dims);
    the onnxruntime type is the string ``OrtValue.data_type()`` returns
    ("tensor(float)"...)."""
    infos = {vi.name: vi.type for vi in model.graph.input}
    specs = {}
    for name in names:
        if name not in infos or not infos[name].HasField("tensor_type"):
            continue
        tensor = infos[name].tensor_type
        shape = None
        if tensor.HasField("shape"):
            shape = tuple(d.dim_value if d.dim_value > 0 else (d.dim_param or None)
                          for d in tensor.shape.dim)
        ort_type = f"tensor({onnx.TensorProto.DataType.Name(tensor.elem_type).lower()})"
        specs[name] = (elem_type_to_numpy(tensor.elem_type), shape, ort_type)
    return specs


def check_inputs(specs, names, values, what):
    """Check ``values`` against the declared types of the inputs ``names``
    (see :func:`input_specs`); returns them, arrays as numpy arrays.

    An array may differ from the input's dtype only by a cast within its
    kind or to a wider kind (``np.can_cast(..., 'same_kind')``: float64 to
    float32, int to float, not float to int), done here, within the range
    of the input's float type; an OrtValue is fed as it is,
    so its dtype must be the input's. ``what`` names the model in messages.

    Raises
    ------
    TypeError
        A dtype that does not cast to the input's.
    ValueError
        A rank or a static dimension other than the declared one, a
        symbolic dimension of different sizes in two inputs, or an array
        with values beyond the range of the input's float type (float64
        values beyond float32's, which the cast would turn into infinity).
    """
    checked, sizes = [], {}
    for name, value in zip(names, values):
        if is_ortvalue(value):
            shape = tuple(value.shape())
            if name in specs and value.data_type() != specs[name][2]:
                raise TypeError(f"Input {name!r} of the {what} is "
                                f"{specs[name][0]}; got an OrtValue of "
                                f"{ortvalue_dtype(value)} (OrtValues are not cast).")
        else:
            value = np.asarray(value)
            dtype, shape = value.dtype, value.shape
            if name in specs and dtype != specs[name][0] \
                    and not np.can_cast(dtype, specs[name][0], "same_kind"):
                raise TypeError(f"Input {name!r} of the {what} is "
                                f"{specs[name][0]}; got {dtype}, which is not "
                                "cast to it (arrays are cast between floats, "
                                "between ints, and from bool or int to float).")
            if name in specs and dtype != specs[name][0] \
                    and specs[name][0].kind == "f":
                # float64 beyond float32's range would become inf silently
                value = cast_within_range(value, specs[name][0],
                                          f"Input {name!r} of the {what}",
                                          "that input")
        checked.append(value)
        expected = specs[name][1] if name in specs else None
        if expected is None:
            continue
        if len(shape) != len(expected) or any(
                isinstance(e, int) and e != g for e, g in zip(expected, shape)):
            raise ValueError(f"Input {name!r} of the {what} has shape "
                             f"{expected}; got shape {tuple(shape)}."
                             + _fixed_batch_hint(name, expected, shape))
        for dim, size in zip(expected, shape):
            if isinstance(dim, str):
                first, seen = sizes.setdefault(dim, (name, size))
                if seen != size:
                    raise ValueError(
                        f"Inputs {first!r} and {name!r} of the {what} share "
                        f"dimension {dim!r}; got sizes {seen} and {size}.")
    return checked


def _fixed_batch_hint(name, expected, shape):
    """What to do when a model fixed to batches of one row gets more."""
    if len(expected) == len(shape) and len(shape) and expected[0] == 1 \
            and shape[0] != 1:
        return (" The model's batch dimension is fixed to 1: export it with a "
                "dynamic batch dimension (torch.onnx.export(..., dynamic_axes="
                f"{{{name!r}: {{0: 'batch'}}}}) or dynamic_shapes) and "
                "generate the artifacts again.")
    return ""


def check_batch(specs, names, values, what):
    """Check that the inputs with a batch dimension agree on its size.

    An input has a batch dimension when its declared first dimension is
    symbolic or unknown (not a fixed size). Two such inputs must have the
    same number of rows unless both first dimensions are named and the names
    differ (the model then says they may differ: a sequence-first input and
    a batch-first target): an unnamed one agrees with every other, so that
    a target of one row is not broadcast against a batch of ten. Every
    batch needs at least one row.

    Raises
    ------
    ValueError
        Two inputs with different numbers of rows, or a batch of 0 rows (the
        mean loss over no rows is not defined).
    """
    seen = []
    for name, value in zip(names, values):
        expected = specs[name][1] if name in specs else None
        if not expected or isinstance(expected[0], int):
            continue
        rows = int(value.shape()[0] if is_ortvalue(value) else value.shape[0])
        if rows == 0:
            raise ValueError(f"Input {name!r} of the {what} has 0 rows: the "
                             "loss of an empty batch is not defined.")
        for other, other_dim, other_rows in seen:
            named_apart = isinstance(expected[0], str) and \
                isinstance(other_dim, str) and expected[0] != other_dim
            if rows != other_rows and not named_apart:
                raise ValueError(
                    f"Inputs {other!r} and {name!r} of the {what} are batches "
                    f"of {other_rows} and {rows} rows: inputs whose first "
                    "dimension is not fixed need the same number of rows "
                    "(nothing is broadcast) unless the model names their "
                    "first dimensions apart.")
        seen.append((name, expected[0], rows))


def _shapes(names, values):
    return ", ".join(f"{n} {tuple(v.shape()) if is_ortvalue(v) else v.shape}"
                     for n, v in zip(names, values))


def _has_string_inputs(model):
    return any(vi.type.tensor_type.elem_type == onnx.TensorProto.STRING
               for vi in model.graph.input if vi.type.HasField("tensor_type"))


class _HostRunner:
    """Runs a model with string inputs, which onnxruntime's IOBinding and
    OrtValues do not take: feeds and outputs are host arrays."""

    def __init__(self, runner):
        self.session = runner.session
        self.input_dtypes = runner.input_dtypes

    def __call__(self, feeds, output_names=None, into=None):
        """``into`` is ignored: outputs come back as new host arrays."""
        feeds = {name: to_numpy(value).astype(self.input_dtypes[name], copy=False)
                 if name in self.input_dtypes else to_numpy(value)
                 for name, value in feeds.items()}
        return self.session.run(output_names, feeds)


class Module:
    """Train and evaluate the model of a set of training artifacts.

    Parameters
    ----------
    train_model_uri : str, pathlib.Path or onnx.ModelProto
        ``training_model.onnx`` written by
        :func:`onnxtrain.onnxblock.artifacts.generate_artifacts` (or its
        ``training_model.ort``, written with ``ort_format=True``).
    state : CheckpointState
        Holds the parameters; the module reads and updates them in place.
    eval_model_uri : str, pathlib.Path or onnx.ModelProto, default=None
        ``eval_model.onnx`` (or ``.ort``); needed by :meth:`eval` mode
        calls and :meth:`export_model_for_inferencing` (which needs the
        ``.onnx`` one).
    device : str, default="cpu"
        "cpu", "cuda" or "cuda:N" (needs onnxruntime-gpu). Parameters,
        gradients and optimizer states stay on the device between calls.
    session_options : onnxruntime.SessionOptions, default=None
        As in onnxruntime-training: the options of the module's sessions
        (and its Optimizer's). onnxtrain's own options (full graph
        optimization, no memory pattern, threads that stop spinning after
        a run) take every property the caller's set to other than
        onnxruntime's default (:func:`onnxtrain.runtime.sessions.with_user_options`:
        threads, optimization level, logging, profiling...); its config
        entries are not read. Never modified.
    n_threads : int, default=None
        Intra-op threads of the module's sessions (and its Optimizer's),
        unless ``session_options`` sets ``intra_op_num_threads``. None:
        joblib's thread budget inside a joblib worker process,
        onnxruntime's default elsewhere (:mod:`onnxtrain.runtime.threads`).

    Raises
    ------
    ValueError
        If the state lacks a parameter of the model or holds one of another
        shape or dtype.
    DeviceError
        For an unknown or unavailable device.
    TypeError
        If ``session_options`` is not an onnxruntime.SessionOptions.
    """

    def __init__(self, train_model_uri, state, eval_model_uri=None, device="cpu",
                 session_options=None, *, n_threads=None):
        self._device = parse_device(device)
        self._n_threads = check_n_threads(n_threads)
        self._user_options = check_session_options(session_options)
        self._models = {"train": load_model(train_model_uri)}
        self._layouts = {"train": read_layout(self._models["train"],
                                              TRAINING_METADATA, "training model")}
        if eval_model_uri is not None:
            self._models["eval"] = load_model(eval_model_uri)
            self._layouts["eval"] = read_layout(self._models["eval"],
                                                EVAL_METADATA, "eval model")
        self._state = state
        for mode in self._models:
            self._check_parameters(mode)
        for name in self._layouts["train"]["trainable"]:
            self._state.parameters.raw(name)._zero_grad = True
        self._input_specs = {
            mode: input_specs(model, self._layouts[mode]["user_inputs"])
            for mode, model in self._models.items()}
        self._training = True
        self._in_place = {}  # mode -> gradient outputs written in place
        self._unreshaped = {}  # mode -> gradient output -> its declared shape
        self._reset_grad = True
        self._runners = {}
        # training calls read and write the gradient buffers: one at a time;
        # eval calls run concurrently (each thread binds its own IOBinding)
        self._lock = threading.RLock()

    def _check_parameters(self, mode):
        model, layout = self._models[mode], self._layouts[mode]
        types = {vi.name: vi.type.tensor_type for vi in model.graph.input}
        for name in layout["parameters"]:
            if name not in self._state.parameters:
                raise ValueError(f"The checkpoint state has no parameter {name!r} "
                                 f"needed by the {mode} model.")
            param = self._state.parameters.raw(name)
            dtype = elem_type_to_numpy(types[name].elem_type)
            shape = tuple(d.dim_value for d in types[name].shape.dim)
            if param.dtype != dtype or param.shape != shape:
                raise ValueError(
                    f"Parameter {name!r} of the state is {param.dtype} of shape "
                    f"{param.shape}; the {mode} model expects {dtype} of shape "
                    f"{shape}.")

    # modes -----------------------------------------------------------------
    def train(self, mode=True):
        """Set training mode (calls run the training model); returns self."""
        self._training = bool(mode)
        return self

    def eval(self):
        """Set eval mode (calls run the eval model); returns self."""
        return self.train(False)

    @property
    def training(self):
        """bool: whether the module is in training mode."""
        return self._training

    def _mode(self):
        if self._training:
            return "train"
        if "eval" not in self._models:
            raise RuntimeError("Eval mode needs the eval model: pass "
                               "eval_model_uri to Module.")
        return "eval"

    def _session_options(self, model=None):
        """Session options with the module's ``n_threads``, for ``model``,
        and what the caller's ``session_options`` set."""
        return with_user_options(default_session_options(self._n_threads, model=model),
                                 self._user_options)

    def _runner(self, mode):
        with self._lock:
            if mode not in self._runners:
                runner = SessionRunner(self._models[mode], self._device,
                                       self._session_options(self._models[mode]))
                if _has_string_inputs(self._models[mode]):
                    runner = _HostRunner(runner)
                self._runners[mode] = runner
            return self._runners[mode]

    def input_names(self):
        """Names of the user inputs of the current mode's model (model inputs
        and loss targets, in call order)."""
        return list(self._layouts[self._mode()]["user_inputs"])

    def output_names(self):
        """Names of the outputs a call returns (the loss first)."""
        return list(self._layouts[self._mode()]["user_outputs"])

    # parameters --------------------------------------------------------------
    def _device_value(self, param):
        """The parameter's value as an OrtValue on the module's device."""
        value = param._value
        if isinstance(value, np.ndarray):
            value = to_ortvalue(value, self._device)
            param._value = value
        return value

    def _parameters(self, trainable_only):
        layout = self._layouts["train"]
        names = layout["trainable"] if trainable_only else layout["parameters"]
        return [self._state.parameters.raw(n) for n in names]

    def _check_loaded(self):
        """RuntimeError while the state (from a nominal checkpoint) lacks
        parameter values."""
        missing = self._state.parameters.not_loaded()
        if missing:
            raise RuntimeError(
                "Please load the model parameters first. The checkpoint state "
                f"is nominal: parameters {missing[:5]} have no values yet "
                "(copy_buffer_to_parameters(buffer, trainable_only=False) "
                "loads them).")

    def get_parameters_size(self, trainable_only=True):
        """Number of parameter elements (int)."""
        return int(sum(int(np.prod(p.shape)) for p in self._parameters(trainable_only)))

    def get_contiguous_parameters(self, trainable_only=False):
        """All parameters flattened and concatenated in model order.

        Returns
        -------
        onnxruntime.OrtValue of shape (get_parameters_size(trainable_only),)
            On the module's device, in memory of its own (its ``numpy()``
            arrays stay valid after the OrtValue is dropped), as
            onnxruntime-training returns it.

        Raises
        ------
        TypeError
            If the parameters have different dtypes.
        RuntimeError
            For a state loaded from a nominal checkpoint whose parameters
            have no values yet.
        """
        self._check_loaded()
        params = self._parameters(trainable_only)
        dtypes = {p.dtype for p in params}
        if len(dtypes) > 1:
            raise TypeError(f"Parameters have several dtypes {sorted(map(str, dtypes))}; "
                            "they cannot share one buffer.")
        return to_ortvalue(np.concatenate([p.data.reshape(-1) for p in params]),
                           self._device, owned=True)

    def copy_buffer_to_parameters(self, buffer, trainable_only=True):
        """Copy a flat buffer (as from :meth:`get_contiguous_parameters`)
        into the parameters, in model order.

        Parameters
        ----------
        buffer : onnxruntime.OrtValue or ndarray
            Of :meth:`get_parameters_size` elements.
        trainable_only : bool, default=True
            Copy into the trainable parameters only. With False, this loads
            the values of a state from a nominal checkpoint.

        Raises
        ------
        ValueError
            If the buffer size differs from :meth:`get_parameters_size`.
        """
        flat = np.asarray(to_numpy(buffer)).reshape(-1)
        expected = self.get_parameters_size(trainable_only)
        if flat.size != expected:
            raise ValueError(f"The buffer has {flat.size} elements; the "
                             f"parameters have {expected}.")
        start = 0
        for param in self._parameters(trainable_only):
            size = int(np.prod(param.shape))
            param.data = flat[start:start + size].reshape(param.shape)
            start += size

    # running ---------------------------------------------------------------
    def lazy_reset_grad(self):
        """Make the next training call overwrite the gradients instead of
        adding to them (they are reset lazily, inside that call)."""
        self._reset_grad = True

    def __call__(self, *user_inputs):
        """Run the training model (train mode) or the eval model.

        Parameters
        ----------
        *user_inputs : ndarray or OrtValue
            One per :meth:`input_names`, in that order. Arrays are cast to
            the input's dtype within their kind or to a wider one (float64
            to float32, int to float, not float to int); OrtValues are fed
            as they are and must have the input's dtype.

        Returns
        -------
        ndarray or OrtValue, or a tuple of them
            The outputs of :meth:`output_names` (the loss first): one value
            when there is one, a tuple otherwise; OrtValues (on the module's
            device) when every input is an OrtValue, arrays otherwise (as
            onnxruntime-training). In train mode, each
            trainable parameter's ``grad`` receives the gradient (added to the
            previous one unless :meth:`lazy_reset_grad` was called).

        Raises
        ------
        ValueError
            If the number of inputs differs from :meth:`input_names`, or an
            input's rank or a static dimension differs from the model's
            declared shape, or two inputs sharing a symbolic dimension
            (the batch) have different sizes along it (the message names
            the input, the expected and the received shape); inputs whose
            first dimension is not fixed with different numbers of rows
            (unless the model names those dimensions apart, see
            :func:`check_batch`), or 0 rows; an array with values beyond
            the range of the input's float type (float64 values over
            float32's largest, 3.4e38, which the cast would turn into
            infinity and the loss into NaN); shapes onnxruntime refuses
            while running (a broadcast), with the shapes of the inputs.
        TypeError
            If an array's dtype does not cast to the input's within its kind
            (float64 to float32 and int to float do; float to int, strings
            and objects do not) or an OrtValue has another dtype.
        RuntimeError
            In eval mode without an eval model, or for a state loaded from a
            nominal checkpoint whose parameters have no values yet.

        Every check runs before the model runs; parameters and gradients
        are left as they were when one fails.
        """
        mode = self._mode()
        self._check_loaded()
        as_ortvalues = bool(user_inputs) and all(map(is_ortvalue, user_inputs))
        layout = self._layouts[mode]
        names = layout["user_inputs"]
        if len(user_inputs) != len(names):
            raise ValueError(f"The {mode} model takes {len(names)} inputs "
                             f"{names}; got {len(user_inputs)}.")
        user_inputs = check_inputs(
            self._input_specs[mode], names, user_inputs,
            "training model" if mode == "train" else "eval model")
        check_batch(self._input_specs[mode], names, user_inputs,
                    "training model" if mode == "train" else "eval model")
        feeds = dict(zip(names, user_inputs))
        n_user = len(layout["user_outputs"])
        try:
            if mode == "train":
                with self._lock:  # the gradients accumulate one at a time
                    outputs = self._run_training(feeds, layout, n_user)
            else:
                for name in layout["parameters"]:
                    feeds[name] = self._device_value(
                        self._state.parameters.raw(name))
                outputs = self._runner(mode)(feeds)
        except SessionRunError as exc:
            message = str(exc).strip().splitlines()[0]
            raise ValueError(
                f"onnxruntime could not run the {mode} model on inputs "
                f"{_shapes(names, user_inputs)}: {message}. The shapes of the "
                "inputs do not go together (e.g. a target whose columns "
                "differ from the prediction's) or an index is out of range "
                "(e.g. a class label >= the number of classes); parameters "
                "and gradients are unchanged.") from exc
        results = tuple(outputs[:n_user]) if as_ortvalues else \
            tuple(to_numpy(o) for o in outputs[:n_user])
        return results[0] if len(results) == 1 else results

    def _run_training(self, feeds, layout, n_user):
        """Run the training model and store the gradients; the caller holds
        the lock."""
        for name in layout["parameters"]:
            feeds[name] = self._device_value(self._state.parameters.raw(name))
        if self._overwrites_gradients(layout) and self._plain_model(layout):
            # no accumulation to do: the model without it (_plain_step)
            mode = "train_plain"
        else:
            self._feed_gradients(feeds, layout)
            mode = "train"
        into = self._gradient_buffers(mode, layout)
        views = self._bind_views(mode, layout, into)
        outputs = self._runner(mode)(feeds, into=into)
        for name, out, grad in zip(layout["trainable"], layout["gradients"],
                                   outputs[n_user:]):
            # a view's buffer, shaped as the parameter, is the gradient
            self._state.parameters.raw(name)._grad = views.get(out, grad)
        self._reset_grad = False
        n_grads = len(layout["trainable"]) + len(layout.get("input_gradients", ()))
        _write_running_statistics(self._state, layout,
                                  outputs[n_user + n_grads:])
        return outputs

    def _gradient_buffers(self, mode, layout):
        """output name -> the OrtValue the gradient output is written into:
        each parameter's gradient from the previous call (as
        onnxruntime-training, a module keeps one gradient buffer per
        parameter, written over by every call, not a new one per call). In
        the accumulating model, only where the accumulation may write over
        the buffer it reads (:func:`~onnxtrain.graph.aliasing.writes_after_reads`),
        else a new one. A parameter without a gradient yet writes into its
        ``_grad_buffer`` when an Optimizer gave it one (its view of the flat
        gradient buffer, :mod:`onnxtrain.api._flat`)."""
        if mode not in self._in_place:
            graph = self._models[mode].graph
            pairs = zip(layout["buffers"], layout["gradients"])
            self._in_place[mode] = set(layout["gradients"]) if mode == "train_plain" \
                else {out for _, out in writes_after_reads(graph, pairs)}
        into = {}
        for name, out in zip(layout["trainable"], layout["gradients"]):
            param = self._state.parameters.raw(name)
            if param._grad is not None:
                if out in self._in_place[mode]:
                    into[out] = param._grad
            elif param._grad_buffer is not None:  # not an input of this call
                into[out] = param._grad_buffer
        return into

    def _bind_views(self, mode, layout, into):
        """Bind, in ``into``, a view of the shape the plain model declares
        for each gradient it outputs unreshaped (:mod:`._plain_step`) over
        the parameter's gradient buffer (allocated when there is none yet);
        return output name -> that buffer, the parameter's gradient after
        the call."""
        shapes = self._unreshaped.get(mode, {}) if mode == "train_plain" else {}
        views = {}
        for name, out in zip(layout["trainable"], layout["gradients"]):
            if out not in shapes:
                continue
            param = self._state.parameters.raw(name)
            buffer = into.get(out)
            if buffer is None:
                buffer = to_ortvalue(np.empty(param.shape, param.dtype), self._device,
                                     owned=True)
            into[out] = to_ortvalue(to_numpy(buffer).reshape(shapes[out]), self._device)
            views[out] = buffer
        return views

    def _overwrites_gradients(self, layout):
        """Whether the next training call overwrites every gradient."""
        return self._reset_grad or any(
            self._state.parameters.raw(name)._grad is None
            for name in layout["trainable"])

    def _plain_model(self, layout):
        """The training model without accumulation (built once), or None
        when the training model is not laid out for it."""
        if "train_plain" not in self._models:
            # views of the buffers: host memory, bound through an IOBinding
            # (a model with string inputs runs without one, _HostRunner)
            views = self._device.type == "cpu" and \
                not _has_string_inputs(self._models["train"])
            model = without_accumulation(self._models["train"], layout, unreshape=views)
            if model is None:
                return None
            self._models["train_plain"] = model
            params = self._state.parameters
            self._unreshaped["train_plain"] = unreshaped_outputs(model, {
                out: params.raw(name).shape
                for name, out in zip(layout["trainable"], layout["gradients"])})
        return self._models["train_plain"]

    def _feed_gradients(self, feeds, layout):
        reset = self._reset_grad
        for name, buffer in zip(layout.get("input_gradients", ()),
                                layout.get("input_gradient_buffers", ())):
            feeds[buffer] = np.zeros_like(to_numpy(feeds[name]))
        for name, buffer in zip(layout["trainable"], layout["buffers"]):
            param = self._state.parameters.raw(name)
            if param._grad is None:
                reset = True
                feeds[buffer] = to_ortvalue(np.zeros(param.shape, param.dtype),
                                            self._device)
            else:
                feeds[buffer] = param._grad
        feeds[layout["lazy_reset_grad"]] = np.array(reset, dtype=np.bool_)

    # export ------------------------------------------------------------------
    def export_model_for_inferencing(self, inference_model_uri, graph_output_names):
        """Write an inference model: the eval model's graph cut at
        ``graph_output_names``, with the current parameters as initializers.

        Parameters
        ----------
        inference_model_uri : str or pathlib.Path
        graph_output_names : list of str
            Values of the eval model (typically the original model outputs).

        Returns
        -------
        onnx.ModelProto
            The model written.

        Raises
        ------
        RuntimeError
            Without an eval model.
        ValueError
            If a name is not a value of the eval model.
        """
        if "eval" not in self._models:
            raise RuntimeError("Exporting needs the eval model: pass "
                               "eval_model_uri to Module.")
        if isinstance(self._models["eval"], OrtFormatModel):
            raise ValueError("Exporting needs the eval model in ONNX format "
                             "(eval_model.onnx), not ORT format.")
        self._check_loaded()
        model = _inference_model(self._models["eval"], self._layouts["eval"],
                                 list(graph_output_names), self._state.parameters)
        onnx.save(model, str(inference_model_uri))
        return model


def _write_running_statistics(state, layout, values):
    """Store the running statistics a training call updated (BatchNorm in
    training mode: see :mod:`onnxtrain.graph.training_mode`) into the state."""
    for name, value in zip(layout.get("running_statistics", {}), values):
        state.parameters.raw(name)._value = value


def _inference_model(eval_model, layout, output_names, parameters):
    graph = eval_model.graph
    produced = {o for n in graph.node for o in n.output}
    available = produced | {i.name for i in graph.input} | \
        {i.name for i in graph.initializer}
    unknown = [n for n in output_names if n not in available]
    if unknown:
        raise ValueError(f"graph_output_names {unknown} are not values of the "
                         "eval model.")
    needed, nodes = set(output_names), []
    for node in reversed(graph.node):
        if needed & set(node.output):
            nodes.append(node)
            needed |= node_reads(node)
    nodes.reverse()
    params = set(layout["parameters"])
    types = infer_value_types(eval_model)
    inputs = [i for i in graph.input if i.name in needed and i.name not in params]
    inits = [i for i in graph.initializer if i.name in needed]
    inits += [numpy_helper.from_array(parameters[p].data, p)
              for p in layout["parameters"] if p in needed]
    outputs = []
    for name in output_names:
        elem, shape = types[name]
        shape = None if shape is None else [
            None if isinstance(d, str) and d.startswith("unk__") else d
            for d in shape]
        outputs.append(helper.make_tensor_value_info(name, elem, shape))
    new_graph = helper.make_graph(nodes, graph.name.replace("_eval", "") or "inference",
                                  inputs, outputs, inits)
    model = helper.make_model(new_graph, opset_imports=list(eval_model.opset_import),
                              producer_name="onnxtrain")
    model.ir_version = eval_model.ir_version
    model.functions.extend(eval_model.functions)
    onnx.checker.check_model(model)
    return model
