"""The forward/backward engine (what onnxruntime-training's TrainingAgent did)."""
from __future__ import annotations

import threading
from collections.abc import Mapping

import numpy as np
from onnx import numpy_helper
from onnxruntime import OrtValue

from .._utils.files import ExternalTensor
from ..assembly.models import load_model, select_weights
from ..autodiff import build_gradient_models, weights_as_inputs
from ..graph import elem_type_to_numpy
from ..graph.builder import with_initializer_values
from ..graph.training_mode import inference_mode
from .checks import load_checked_model_deferred
from .devices import parse_device
from .sessions import SessionRunner, to_ortvalue
from .threads import (current_session_threads, requested_session_threads,
                      session_threads)

__all__ = ["ForwardBackwardEngine", "OrtGradientForwardBackward",
           "check_weight_names", "copy_arrays", "load_deferring_weights"]


def check_weight_names(weights_to_train):
    """Raise a TypeError unless ``weights_to_train`` is None, a str or an
    iterable of str (initializer names); 42 would otherwise fail deep inside
    with "'int' object is not iterable"."""
    if weights_to_train is None or isinstance(weights_to_train, str):
        return
    try:
        names = list(weights_to_train)
    except TypeError:
        names = None
    if names is None or not all(isinstance(n, str) for n in names):
        raise TypeError("weights_to_train must be None or a list of "
                        f"initializer names (str), got {weights_to_train!r}.")


def copy_arrays(values, out=None):
    """Copies of the arrays ``values``, into ``out`` when it holds arrays
    of the same shapes and dtypes (writeable), new arrays otherwise.

    Parameters
    ----------
    values : list of numpy.ndarray
    out : list of numpy.ndarray, default=None

    Returns
    -------
    list of numpy.ndarray
        ``out`` itself when it was reused.
    """
    if out is not None and len(out) == len(values) and all(
            isinstance(a, np.ndarray) and a.shape == v.shape and a.dtype == v.dtype
            and a.flags.writeable for a, v in zip(out, values)):
        for a, v in zip(out, values):
            np.copyto(a, v)
        return out
    return [v.copy() for v in values]


def _array(value):
    """numpy value of a TensorProto (or an array, as it is)."""
    return value if isinstance(value, np.ndarray) else numpy_helper.to_array(value)


def _weight(value, device):
    """An OrtValue of its own on ``device`` holding ``value`` (a TensorProto,
    an array or an ExternalTensor). External data on the CPU is read from
    its file straight into the OrtValue's memory: no copy of the bytes
    beside the weight."""
    if isinstance(value, ExternalTensor):
        if device.type == "cpu":
            weight = OrtValue.ortvalue_from_shape_and_type(
                list(value.shape), value.dtype, device.type, device.index)
            value.read_into(weight.numpy())
            return weight
        value = value.to_array()
    return to_ortvalue(_array(value), device, owned=True)


def load_deferring_weights(model_onnx, what, weights_to_train, select):
    """``model_onnx`` loaded and checked, a path's float initializers that
    may be trained (those ``weights_to_train`` names; every one when None)
    left in their files when stored as external data
    (:func:`~onnxtrain.runtime.checks.load_checked_model_deferred`).

    Parameters
    ----------
    model_onnx : onnx.ModelProto, bytes, str or os.PathLike
    what : str
        The argument's name, for the messages.
    weights_to_train : None, str or list of str
    select : callable
        ``select(model) -> list of str``: the weights trained, chosen on the
        model without the deferred values.

    Returns
    -------
    model : onnx.ModelProto
        With the values of the deferred initializers not selected put back
        (constants of the graphs built from it).
    weights : list of str
        ``select(model)``.
    external : dict
        ``name -> ExternalTensor`` of the selected weights left in their
        files (empty for a ModelProto or bytes).
    """
    if weights_to_train is None:
        names = None
    else:
        names = {weights_to_train} if isinstance(weights_to_train, str) \
            else set(weights_to_train)
    model, external = load_checked_model_deferred(
        model_onnx, what, lambda tensor: names is None or tensor.name in names)
    weights = select(model)
    constants = {n: e.to_tensor_proto() for n, e in external.items()
                 if n not in set(weights)}
    if constants:
        model = with_initializer_values(model, constants)
    return model, weights, {n: e for n, e in external.items() if n not in constants}


class OnnxcustomModelNames:
    """The names onnxcustom's TrainingAgent wrapper reads the models by:
    ``cls_type_`` (the object itself, which holds them), ``_trained_onnx``
    (the backward model) and ``_optimized_pre_grad_model`` (the inference
    model), from the object's ``models``."""

    cls_type_ = property(lambda self: self)
    _trained_onnx = property(lambda self: self.models.backward_model)
    _optimized_pre_grad_model = property(lambda self: self.models.inference_model)


class ForwardBackwardEngine(OnnxcustomModelNames):
    """Forward and backward passes of an ONNX graph on onnxruntime.

    From a prediction graph and the names of the weights to train, builds
    (with :mod:`onnxtrain.autodiff`) a forward model that also returns the
    intermediates the gradient needs and a gradient model, and runs both on
    ``device`` with tensors kept there as OrtValues.

    Parameters
    ----------
    model_onnx : onnx.ModelProto, bytes or str
        Prediction graph (not modified). A path's float weights trained
        and stored as external data are not loaded with the graph: each is
        read from its file (checked as the graph's are) into its weight.
    weights_to_train : list of str, default=None
        Float initializers to train; None selects those that reach an output
        through differentiable ops (see
        :func:`onnxtrain.autodiff.trainable_initializers`).
    device : {"cpu", "cuda", "cuda:N"}, default="cpu"
    outputs : list of str, default=None
        Outputs whose gradients ``backward`` receives (default: the float
        outputs that depend on the weights).
    types : dict, default=None
        The model's :func:`~onnxtrain.graph.infer_value_types` when the
        caller has it (shape inference then does not run again). With
        ``gradient_models``, they only serve to check ``weights_to_train``,
        and the types of a model that ``model_onnx`` extends with new values
        do (a value they lack counts as a float: the check may find more
        weights reaching an output, never fewer).
    gradient_models : callable, default=None
        ``gradient_models(model)`` returns the
        :class:`~onnxtrain.autodiff.GradientModels` of the engine's
        ``model`` to run (:meth:`onnxtrain.assembly.training_graphs.TrainingGraphs.split`
        for a trainer), called at the first training step; None: the engine
        builds them with :func:`onnxtrain.autodiff.build_gradient_models`.
    checked : bool, default=False
        True when the caller built ``model_onnx`` from a model it checked
        with :func:`onnxtrain.runtime.checks.load_checked_model` (the estimators):
        the engine does not check it again.
    values : dict, default=None
        ``name -> onnx.TensorProto, numpy.ndarray or``
        :class:`~onnxtrain._utils.files.ExternalTensor`: the initial values of
        weights that ``model_onnx`` holds without them
        (:func:`onnxtrain.graph.builder.split_weight_values`), read once
        into ``weights`` and not kept; the model's own values otherwise.

    Attributes
    ----------
    weights : list of OrtValue
        Current weights on the device, in ``weights_to_train`` order; replace
        items to update them (see :meth:`set_weights`).
    input_names, output_names : list of str
        User inputs of the model and the outputs ``forward`` returns.
    model : onnx.ModelProto
        The model the engine was made from, which the split and inference
        graphs are built from, the trained weights as inputs: their values
        in it are not read after construction (they are ``weights``), so a
        caller may set a copy without them
        (:func:`onnxtrain.graph.without_initializer_values`).
    forward_model, gradient_model, inference_model : onnx.ModelProto
        The models the engine runs (see
        :class:`onnxtrain.autodiff.GradientModels`); ``forward(...,
        training=False)`` runs the inference graph
        (:func:`onnxtrain.graph.training_mode.inference_mode`: BatchNormalization
        on its running statistics, Dropout off).

    Raises
    ------
    ValueError
        Unknown weight names (the message lists the candidates).
    onnxtrain.exceptions.InvalidModelError
        A ValueError: a model that cannot be loaded or that onnxruntime
        would refuse (:func:`onnxtrain.runtime.checks.load_checked_model`).
    TypeError
        ``weights_to_train`` is not None, a str or a list of str.
    onnxtrain.exceptions.MissingVJPRuleError
        A node between the weights and the outputs has no VJP rule.
    onnxtrain.exceptions.DeviceError
        Unknown device or missing CUDA provider.
    """

    def __init__(self, model_onnx, weights_to_train=None, device="cpu",
                 outputs=None, types=None, gradient_models=None, *, checked=False,
                 values=None):
        self.device = parse_device(device)
        check_weight_names(weights_to_train)
        # a model the caller derived from one it checked is not checked
        # again (the check serializes the whole model); a path's float
        # weights stored as external data stay in their files, read below
        # straight into the weights trained
        def select(loaded):
            return select_weights(loaded, weights_to_train, types)
        if checked:
            model = load_model(model_onnx)
            self.weights_to_train, external = select(model), {}
        else:
            model, self.weights_to_train, external = load_deferring_weights(
                model_onnx, "model_onnx", weights_to_train, select)
        values = {**external, **(values or {})}
        self.model, self._outputs, self._types = model, outputs, types
        self._build_models = gradient_models
        # built on first use: a trainer running fused graphs, or predicting
        # only, never builds the split graphs nor their sessions
        self._models = self._inference_model = None
        self._forward_runner = self._gradient_runner = None
        self.input_names = [i.name for i in model.graph.input
                            if i.name not in set(self.weights_to_train)]
        self.output_names = [o.name for o in model.graph.output]
        self._input_dtypes = {
            i.name: elem_type_to_numpy(i.type.tensor_type.elem_type)
            for i in model.graph.input if i.type.HasField("tensor_type")}
        self._inference = None
        self._lock = threading.RLock()  # builds models and sessions once
        # sessions built later (at first use) take the threads in force now
        self._threads = current_session_threads()
        # an explicit count (an estimator's n_threads) overrides the
        # one-thread rule of small fused steps (FusedRunner)
        self._requested_threads = requested_session_threads()
        inits = {i.name: i for i in model.graph.initializer}
        inits.update(values or {})
        # copies of their own (numpy_helper gives read-only views), which
        # a fused step may update in place (StepRunner); one at a time
        self.weights = [_weight(inits[w], self.device) for w in self.weights_to_train]
        self._saved = None

    @property
    def models(self):
        """The :class:`~onnxtrain.autodiff.GradientModels` (split form),
        built at the first access (one reverse pass)."""
        if self._models is None:
            with self._lock:
                if self._models is None:
                    if self._build_models is not None:
                        models = self._build_models(self.model)
                    else:
                        models = build_gradient_models(
                            self.model, self.weights_to_train, self._outputs,
                            self._types)
                    models.inference_model = self.inference_model
                    self._models = models
        return self._models

    @models.setter
    def models(self, value):
        self._models = value
        self._forward_runner = self._gradient_runner = None

    def _new_runner(self, model):
        """A runner of ``model`` whose session uses the intra-op threads in
        force when this engine was made."""
        with session_threads(self._threads):
            return SessionRunner(model, self.device)

    @property
    def _forward(self):
        if self._forward_runner is None:
            self._forward_runner = self._new_runner(self.forward_model)
        return self._forward_runner

    @property
    def _gradient(self):
        if self._gradient_runner is None:
            self._gradient_runner = self._new_runner(self.gradient_model)
        return self._gradient_runner

    # the models -------------------------------------------------------------
    @property
    def forward_model(self):
        """Forward model: inputs + weights -> outputs + saved intermediates."""
        return self.models.forward_model

    @property
    def gradient_model(self):
        """Gradient model: grad_outputs + saved values -> ``<w>_grad``."""
        return self.models.backward_model

    @property
    def inference_model(self):
        """The prediction graph with the weights as inputs (no saved values),
        in inference mode (:func:`onnxtrain.graph.training_mode.inference_mode`);
        needs no reverse pass."""
        if self._inference_model is None:
            inits = {i.name: (i.data_type, tuple(i.dims))
                     for i in self.model.graph.initializer}
            self._inference_model = inference_mode(weights_as_inputs(
                self.model, self.weights_to_train, inits))
        return self._inference_model

    # the inference model alone, without the reverse pass ``models`` runs
    _optimized_pre_grad_model = property(lambda self: self.inference_model)

    # weights ----------------------------------------------------------------
    def get_weights(self, out=None):
        """Copies of the weights as numpy arrays (``weights_to_train`` order).

        ``OrtValue.numpy()`` on the CPU is a view of the device buffer: without
        the copy, editing the returned arrays would edit the weights.

        Parameters
        ----------
        out : list of numpy.ndarray, default=None
            Arrays to copy into and return when they have the weights'
            shapes and dtypes (a copy kept at every epoch reuses the memory
            of the last one: new arrays have their pages faulted in and
            zeroed, a copy into old ones does not); new arrays otherwise.

        Returns
        -------
        list of numpy.ndarray
        """
        return copy_arrays([w.numpy() for w in self.weights], out)  # views on the CPU

    def set_weights(self, weights):
        """Replace the weights by arrays or OrtValues (list or name mapping).

        Arrays are copied (an OrtValue made from a numpy array on the CPU
        shares its buffer), so later edits of the caller's arrays do not
        change the weights; OrtValues are used as they are.

        Raises
        ------
        ValueError
            Missing names, or a shape that differs from the current weight.
        """
        if isinstance(weights, Mapping):
            missing = [w for w in self.weights_to_train if w not in weights]
            if missing:
                raise ValueError(f"set_weights: missing weights {missing}.")
            weights = [weights[w] for w in self.weights_to_train]
        weights = list(weights)
        if len(weights) != len(self.weights):
            raise ValueError(f"set_weights: expected {len(self.weights)} "
                             f"tensors, got {len(weights)}.")
        new = []
        for name, old, value in zip(self.weights_to_train, self.weights, weights):
            if not isinstance(value, OrtValue):
                value = np.array(value, dtype=old.numpy().dtype, copy=True)
            value = to_ortvalue(value, self.device)
            if tuple(value.shape()) != tuple(old.shape()):
                raise ValueError(f"set_weights: {name!r} has shape "
                                 f"{tuple(value.shape())}, expected "
                                 f"{tuple(old.shape())}.")
            new.append(value)
        self.weights = new

    # passes ---------------------------------------------------------------
    def _feeds(self, inputs):
        if isinstance(inputs, Mapping):
            missing = [n for n in self.input_names if n not in inputs]
            if missing:
                raise ValueError(f"forward: missing inputs {missing}.")
            values = [inputs[n] for n in self.input_names]
        else:
            values = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
        if len(values) != len(self.input_names):
            raise ValueError(f"forward: the model takes {len(self.input_names)} "
                             f"inputs {self.input_names}, got {len(values)}.")
        feeds = {n: to_ortvalue(v, self.device, self._input_dtypes.get(n))
                 for n, v in zip(self.input_names, values)}
        feeds.update(zip(self.weights_to_train, self.weights))
        return feeds

    def forward(self, inputs, training=True):
        """Run the model.

        Parameters
        ----------
        inputs : list or dict of numpy.ndarray or OrtValue
            The model's inputs (not the weights), in ``input_names`` order or
            by name; numpy arrays are cast to the input's element type.
        training : bool, default=True
            Keep on the device what :meth:`backward` needs.

        Returns
        -------
        list of OrtValue
            The model outputs, on the device.
        """
        feeds = self._feeds(inputs)
        if not training:  # thread-safe (concurrent predictions)
            with self._lock:
                if self._inference is None:
                    self._inference = self._new_runner(self.inference_model)
            self._saved = None
            return self._inference(feeds)
        outputs = self._forward(feeds)
        named = dict(zip(self._forward.output_names, outputs))
        named.update(feeds)
        self._saved = {n: named[n] for n in self.models.backward_inputs}
        return outputs[:len(self.output_names)]

    def backward(self, grad_outputs):
        """Gradients of the weights given the gradients of the outputs.

        Parameters
        ----------
        grad_outputs : list of numpy.ndarray or OrtValue
            One per differentiated output (``models.outputs``), each of the
            output's shape.

        Returns
        -------
        list of OrtValue
            One gradient per weight, in ``weights_to_train`` order.

        Raises
        ------
        RuntimeError
            If :meth:`forward` was not called with ``training=True`` first.
        """
        if self._saved is None:
            raise RuntimeError("backward() needs a forward(..., training=True) "
                               "call first.")
        grad_outputs = list(grad_outputs) if isinstance(
            grad_outputs, (list, tuple)) else [grad_outputs]
        names = self.models.grad_output_names
        if len(grad_outputs) != len(names):
            raise ValueError(f"backward: expected {len(names)} grad_outputs "
                             f"for {self.models.outputs}, got {len(grad_outputs)}.")
        feeds = dict(self._saved)
        for name, value in zip(names, grad_outputs):
            feeds[name] = to_ortvalue(value, self.device,
                                      self._gradient.input_dtypes.get(name))
        return self._gradient(feeds)

    def __getstate__(self):
        raise TypeError("ForwardBackwardEngine holds onnxruntime sessions "
                        "and is not picklable; pickle the estimator instead.")


#: The engine's released name (``onnxtrain.OrtGradientForwardBackward``);
#: onnxcustom's class of that name is
#: :class:`onnxtrain.ortgradient.OrtGradientForwardBackward`.
OrtGradientForwardBackward = ForwardBackwardEngine
