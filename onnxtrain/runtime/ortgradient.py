"""onnxcustom's forward/backward factory (``onnxcustom.training.ortgradient``):
a class built once per model whose instances run forward and backward with
the weights passed as inputs, and return the gradients of the inputs too."""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from onnx import TensorProto

from ..assembly.models import select_weights
from ..autodiff import build_gradient_models, trainable_initializers
from .devices import parse_device
from .engine import (OnnxcustomModelNames, check_weight_names,
                     load_deferring_weights)
from .sessions import SessionRunner, make_session, to_ortvalue

__all__ = ["OrtGradientForwardBackward", "OrtGradientForwardBackwardFunction"]

_FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE,
                TensorProto.BFLOAT16}


def _device_from_providers(providers, device_index):
    if providers is None:
        return parse_device("cpu")
    names = [p[0] if isinstance(p, tuple) else p for p in providers]
    if names and names[0] == "CUDAExecutionProvider":
        return parse_device(f"cuda:{int(device_index)}")
    if names and set(names) <= {"CPUExecutionProvider"}:
        return parse_device("cpu")
    raise ValueError(f"providers={providers!r}: onnxtrain runs on "
                     "'CPUExecutionProvider' or 'CUDAExecutionProvider' "
                     "(then 'CPUExecutionProvider').")


class OrtGradientForwardBackward(OnnxcustomModelNames):
    """Forward and backward passes of a model, the weights being inputs.

    The class onnxcustom's code builds once per model: :meth:`new_instance`
    returns an :class:`OrtGradientForwardBackwardFunction` whose ``forward``
    takes the model's inputs followed by the weights and whose ``backward``
    returns the gradients of those inputs and weights. For training with the
    weights kept on the device, use
    :class:`onnxtrain.runtime.ForwardBackwardEngine`.

    Parameters
    ----------
    onx : onnx.ModelProto, bytes or str
        Prediction graph (not modified).
    weights_to_train : list of str, default=None
        Float initializers to differentiate; None: every float initializer
        reaching an output (:func:`onnxtrain.get_train_initializer`), sorted
        by name as onnxcustom sorted them.
    input_names : list of str, default=None
        The model's inputs in the order ``forward`` takes them (default: the
        graph's order); gradients are computed for the float ones.
    output_names : list of str, default=None
        Outputs ``forward`` returns and ``backward`` receives gradients for
        (default: all of them).
    providers : list, default=None
        ``None`` or ``["CPUExecutionProvider"]``: CPU;
        ``["CUDAExecutionProvider", ...]``: CUDA device ``device_index``.
    device_index : int, default=0
    class_name, sess_options, provider_options, run_options, \
graph_builder_config, enable_logging, debug
        Accepted for onnxcustom's signature and not used (onnxtrain builds
        its graphs itself and logs to the "onnxtrain" logger).

    Attributes
    ----------
    cls_type_ : OrtGradientForwardBackward
        This object; onnxcustom's names for its parts are attributes:
        ``_onx_inp`` and ``_grad_input_names`` (inputs then weights),
        ``_onx_out`` and ``_bw_fetches_names`` (their ``<name>_grad``),
        ``_weights_to_train``, ``_input_names``, ``_output_names``,
        ``_sess_eval`` (an InferenceSession on the inference model),
        ``_trained_onnx`` (the gradient model), ``_optimized_pre_grad_model``
        (the inference model).

    Raises
    ------
    ValueError
        ``weights_to_train`` empty or unknown names, ``input_names`` not the
        model's inputs, unknown providers;
        :class:`~onnxtrain.exceptions.InvalidModelError` for a model that
        cannot be loaded or that onnxruntime would refuse
        (:func:`onnxtrain.runtime.checks.load_checked_model`).
    TypeError
        ``weights_to_train`` not a list of str.
    onnxtrain.exceptions.MissingVJPRuleError
        A node on the path has no gradient rule.
    """

    def __init__(self, onx, weights_to_train=None, input_names=None,
                 output_names=None, class_name=None, sess_options=None,
                 providers=None, provider_options=None, run_options=None,
                 graph_builder_config=None, device_index=0,
                 enable_logging=False, debug=False):
        check_weight_names(weights_to_train)
        if isinstance(weights_to_train, str):
            weights_to_train = [weights_to_train]
        # the weights are given at each call: a path's external data of
        # those trained is never read
        model, chosen, _ = load_deferring_weights(
            onx, "onx", weights_to_train,
            lambda loaded: sorted(trainable_initializers(loaded))
            if weights_to_train is None else list(weights_to_train))
        weights_to_train = chosen
        if len(weights_to_train) == 0:
            raise ValueError("weights_to_train must name at least one "
                             "initializer (onnxcustom refused an empty list).")
        self._args = dict(
            weights_to_train=list(weights_to_train), input_names=input_names,
            output_names=output_names, class_name=class_name,
            providers=providers, device_index=device_index,
            enable_logging=enable_logging, debug=debug)
        self.device = _device_from_providers(providers, device_index)
        self._onnx = model
        self._weights_to_train = select_weights(model, list(weights_to_train))
        weights = set(self._weights_to_train)
        graph_inputs = [i for i in model.graph.input if i.name not in weights]
        self._input_names = list(input_names or [i.name for i in graph_inputs])
        if sorted(self._input_names) != sorted(i.name for i in graph_inputs):
            raise ValueError(f"input_names={input_names!r} must name every input "
                             f"of the model but the weights, "
                             f"{[i.name for i in graph_inputs]} (in any order).")
        self._output_names = list(output_names or
                                  [o.name for o in model.graph.output])
        float_inputs = [i.name for i in graph_inputs
                        if i.name in self._input_names
                        and i.type.tensor_type.elem_type in _FLOAT_TYPES]
        self._grad_input_names = self._input_names + self._weights_to_train
        self.models = build_gradient_models(
            model, float_inputs + self._weights_to_train, self._output_names)
        self._onx_inp = list(self._grad_input_names)
        self._onx_out = list(self.models.grad_names)
        self._bw_fetches_names = list(self._onx_out)
        self._sess_eval = make_session(self.models.inference_model, self.device)
        self._forward = SessionRunner(self.models.forward_model, self.device)
        self._gradient = SessionRunner(self.models.backward_model, self.device)
        self._eval = SessionRunner(self.models.inference_model, self.device)
        self._weight_shapes = {i.name: tuple(i.dims) for i in model.graph.initializer
                               if i.name in weights}

    def new_instance(self):
        """A new :class:`OrtGradientForwardBackwardFunction` (its own saved
        tensors between ``forward`` and ``backward``)."""
        return OrtGradientForwardBackwardFunction(self)

    def __repr__(self):
        return f"{type(self).__name__}(...)"

    def __getstate__(self):
        return {"onnx": self._onnx.SerializeToString(), "args": self._args}

    def __setstate__(self, state):
        self.__init__(state["onnx"], **state["args"])


class OrtGradientForwardBackwardFunction:
    """One forward/backward user of an :class:`OrtGradientForwardBackward`.

    Parameters
    ----------
    factory : OrtGradientForwardBackward
    """

    def __init__(self, factory):
        self.factory = factory
        self.saved_tensors = None

    def _feeds(self, inputs, runner):
        names = self.factory._grad_input_names
        if isinstance(inputs, Mapping):
            values = [inputs[n] for n in names]
        else:
            values = list(inputs)
        if len(values) != len(names):
            raise ValueError(f"forward takes {len(names)} inputs {names} (the "
                             f"model's inputs then the weights), got {len(values)}.")
        shapes = self.factory._weight_shapes
        return {n: to_ortvalue(
                    self._fit_shape(n, v, shapes[n]) if n in shapes else v,
                    self.factory.device, runner.input_dtypes.get(n))
                for n, v in zip(names, values)}

    def forward(self, inputs, training=False):
        """Run the model.

        Parameters
        ----------
        inputs : list, OrtValueVector or dict
            numpy arrays or OrtValues (C-level ones too) for the model's
            inputs then the weights (``_grad_input_names``); a weight with
            the initializer's number of elements in another shape (a (3,)
            intercept for a (1, 3) one, as onnxcustom's tests pass it) is
            reshaped to the initializer's shape.
        training : bool, default=False
            Keep what :meth:`backward` needs.

        Returns
        -------
        list of onnxruntime.OrtValue
            The outputs ``_output_names``.
        """
        factory = self.factory
        if not training:
            feeds = self._feeds(inputs, factory._eval)
            self.saved_tensors = None
            outputs = factory._eval(feeds)
            return outputs[:len(factory._output_names)]
        feeds = self._feeds(inputs, factory._forward)
        outputs = factory._forward(feeds)
        named = dict(zip(factory._forward.output_names, outputs))
        named.update(feeds)
        self.saved_tensors = {n: named[n] for n in factory.models.backward_inputs}
        self._shapes = [tuple(o.shape()) for o in outputs]
        return outputs[:len(factory._output_names)]

    def backward(self, grad_outputs):
        """Gradients of the inputs and weights (``_bw_fetches_names``).

        Parameters
        ----------
        grad_outputs : list or OrtValueVector
            One gradient per output of :meth:`forward`; one with the
            output's number of elements in another shape (onnxcustom's tests
            pass a (1, n) row for an (n, 1) output) is reshaped to the
            output's shape.

        Returns
        -------
        list of onnxruntime.OrtValue

        Raises
        ------
        RuntimeError
            No ``forward(..., training=True)`` before.
        ValueError
            Wrong number of gradients, or one whose size differs from its
            output's.
        """
        if self.saved_tensors is None:
            raise RuntimeError("backward() needs forward(..., training=True) "
                               "first.")
        factory = self.factory
        names = factory.models.grad_output_names
        grads = list(grad_outputs)
        if len(grads) != len(names):
            raise ValueError(f"backward: expected {len(names)} gradients for "
                             f"{factory.models.outputs}, got {len(grads)}.")
        feeds = dict(self.saved_tensors)
        for name, value, shape in zip(names, grads, self._shapes):
            dtype = factory._gradient.input_dtypes.get(name)
            feeds[name] = to_ortvalue(self._fit_shape(name, value, shape),
                                      factory.device, dtype)
        return factory._gradient(feeds)

    @staticmethod
    def _fit_shape(name, value, shape):
        if not isinstance(value, np.ndarray):
            value = to_ortvalue(value)
        got = tuple(value.shape) if isinstance(value, np.ndarray) \
            else tuple(value.shape())
        if got == shape:
            return value
        if int(np.prod(got)) != int(np.prod(shape)):
            raise ValueError(f"{name!r} has shape {got}, expected {shape} "
                             "(or as many elements).")
        array = value if isinstance(value, np.ndarray) else value.numpy()
        return np.ascontiguousarray(array).reshape(shape)
