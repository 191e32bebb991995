"""Optimizer blocks (SGD, AdamW, ClipGradNorm) and the optimizer model.

An optimizer block emits one parameter update with standard ONNX ops.
:func:`build_optimizer_model` wraps it into the optimizer model that
:class:`onnxtrain.api.Optimizer` runs:

inputs
    ``learning_rate`` (rank-0 double), ``step`` (rank-0 int64, the number of
    the step being taken, 1 for the first), then for each parameter ``p``:
    ``p``, ``p_grad`` and one ``p.<state>`` per optimizer state
    (AdamW: ``exp_avg``, ``exp_avg_sq``).
outputs
    for each parameter: ``p.updated`` then ``p.<state>.updated``.
"""
from __future__ import annotations

import json

import onnx
from onnx import TensorProto, helper

from ..graph import default_ir_version
from ._base import DEFAULT_OPSET, current_base, empty_base
from ._block import Block

__all__ = ["SGD", "AdamW", "ClipGradNorm", "build_optimizer_model",
           "OPTIMIZER_METADATA"]

#: metadata_props key describing the optimizer model (JSON).
OPTIMIZER_METADATA = "onnxtrain.optimizer_model"


class ClipGradNorm(Block):
    """Scale all gradients so that their joint L2 norm is at most ``max_norm``.

    Follows ``torch.nn.utils.clip_grad_norm_``: with ``n`` the L2 norm of all
    gradients together (computed in double), every gradient is multiplied by
    ``min(1, max_norm / (n + 1e-6))``.

    Parameters
    ----------
    max_norm : float
    """

    def __init__(self, max_norm):
        super().__init__()
        self._max_norm = float(max_norm)

    def build(self, gradient_names):
        """``gradient_names``: list of str; returns the clipped names."""
        state = current_base()
        op = state.op
        double = TensorProto.DOUBLE
        total = None
        for grad in gradient_names:
            square = state.builder.reduce_sum(op("Mul", grad, grad), None,
                                              keepdims=0)
            state._flush()
            square = op("Cast", square, to=double)
            total = square if total is None else op("Add", total, square)
        norm = op("Sqrt", total)
        coef = op("Div", state.const(self._max_norm, double),
                  op("Add", norm, state.const(1e-6, double)))
        factor = op("Min", coef, state.const(1.0, double))
        return [op("Mul", g, op("Cast", factor, to=state.elem_type(g)))
                for g in gradient_names]


class _OptimizerBlock(Block):
    """Apply one update rule to every parameter."""

    #: Names of the per-parameter optimizer states.
    state_names = ()

    def __init__(self, clip_grad=None):
        super().__init__()
        self._clip_grad = clip_grad

    def build(self, learning_rate, step, parameters, gradients, states=None):
        """Emit the update of each parameter.

        Parameters
        ----------
        learning_rate : str
            Rank-0 double value.
        step : str
            Rank-0 int64 value, 1 for the first step.
        parameters, gradients : list of str
        states : list of tuple of str, default=None
            One tuple of :attr:`state_names` values per parameter.

        Returns
        -------
        new_parameters : list of str
        new_states : list of tuple of str
        """
        state = current_base()
        if self._clip_grad is not None:
            gradients = self._clip_grad(list(gradients))
        states = states or [()] * len(parameters)
        new_params, new_states = [], []
        for param, grad, param_states in zip(parameters, gradients, states):
            elem = state.elem_type(param)
            lr = state.op("Cast", learning_rate, to=int(elem))
            new_param, new_state = self._update(state, elem, lr, step, param,
                                                grad, param_states)
            new_params.append(new_param)
            new_states.append(tuple(new_state))
        return new_params, new_states

    def _update(self, state, elem, lr, step, param, grad, states):
        raise NotImplementedError

    def hyperparameters(self):
        """dict of the values defining the rule (written to the model's
        metadata)."""
        return {}


class SGD(_OptimizerBlock):
    """Plain stochastic gradient descent, ``p <- p - lr * g``.

    Parameters
    ----------
    clip_grad : ClipGradNorm, default=None
        Applied to the gradients first.
    """

    def _update(self, state, elem, lr, step, param, grad, states):
        return state.op("Sub", param, state.op("Mul", lr, grad)), ()


class AdamW(_OptimizerBlock):
    """Adam with decoupled weight decay, as in HuggingFace transformers'
    ``transformers.AdamW`` (Loshchilov & Hutter, "Decoupled Weight Decay
    Regularization", 2019).

    With ``t`` the step (1 for the first), ``g`` the gradient::

        m <- beta1 m + (1 - beta1) g
        v <- beta2 v + (1 - beta2) g^2
        s = lr sqrt(1 - beta2^t) / (1 - beta1^t)   (bias_correction, else lr)
        p <- p - s m / (sqrt(v) + eps)
        p <- p - lr weight_decay p                 (on the updated p)

    Parameters
    ----------
    bias_correction : bool, default=True
    betas : tuple of float, default=(0.9, 0.999)
    eps : float, default=1e-6
    weight_decay : float, default=0.0
    clip_grad : ClipGradNorm, default=None
        Applied to the gradients first.
    """

    state_names = ("exp_avg", "exp_avg_sq")

    def __init__(self, bias_correction=True, betas=(0.9, 0.999), eps=1e-6,
                 weight_decay=0.0, clip_grad=None):
        super().__init__(clip_grad)
        self._bias_correction = bool(bias_correction)
        self._betas = (float(betas[0]), float(betas[1]))
        self._eps = float(eps)
        self._weight_decay = float(weight_decay)

    def hyperparameters(self):
        return {"bias_correction": self._bias_correction,
                "betas": list(self._betas), "eps": self._eps,
                "weight_decay": self._weight_decay}

    def _update(self, state, elem, lr, step, param, grad, states):
        op, c = state.op, (lambda v: state.const(v, elem))
        (b1, b2), (m, v) = self._betas, states
        m = op("Add", op("Mul", c(b1), m), op("Mul", c(1 - b1), grad))
        v = op("Add", op("Mul", c(b2), v),
               op("Mul", c(1 - b2), op("Mul", grad, grad)))
        step_size = lr
        if self._bias_correction:
            t = op("Cast", step, to=int(elem))
            correction1 = op("Sub", c(1.0), op("Pow", c(b1), t))
            correction2 = op("Sub", c(1.0), op("Pow", c(b2), t))
            step_size = op("Div", op("Mul", lr, op("Sqrt", correction2)),
                           correction1)
        denom = op("Add", op("Sqrt", v), c(self._eps))
        param = op("Sub", param, op("Mul", step_size, op("Div", m, denom)))
        if self._weight_decay > 0:
            decay = op("Mul", lr, c(self._weight_decay))
            param = op("Sub", param, op("Mul", decay, param))
        return param, (m, v)


def _param_spec(param):
    if isinstance(param, onnx.TensorProto):
        return param.name, param.data_type, list(param.dims)
    name, elem_type, shape = param
    return name, int(elem_type), list(shape)


def build_optimizer_model(optimizer, parameters, opset_version=None):
    """The optimizer model of ``optimizer`` for ``parameters``.

    Parameters
    ----------
    optimizer : SGD or AdamW
    parameters : list of onnx.TensorProto or (name, elem_type, shape)
        The trainable parameters.
    opset_version : int, default=None
        Default-domain opset (None: the onnxblock default). The IR version is
        the lowest that opset needs, which onnxruntime reads.

    Returns
    -------
    onnx.ModelProto
        Layout in the module docstring; metadata key
        :data:`OPTIMIZER_METADATA` holds the parameter and state names.

    Raises
    ------
    TypeError
        If ``optimizer`` is not an optimizer block.
    ValueError
        If a generated input or output name collides with a parameter name.
    """
    if not isinstance(optimizer, _OptimizerBlock):
        raise TypeError(f"optimizer must be onnxblock.optim.SGD or AdamW, not "
                        f"{type(optimizer).__name__}.")
    specs = [_param_spec(p) for p in parameters]
    with empty_base(opset_version or DEFAULT_OPSET) as model:
        state = current_base()
        lr = state.add_input("learning_rate", TensorProto.DOUBLE, ())
        step = state.add_input("step", TensorProto.INT64, ())
        names, grads, states = [], [], []
        for name, elem, shape in specs:
            names.append(state.add_input(name, elem, shape))
            grads.append(state.add_input(f"{name}_grad", elem, shape))
            states.append(tuple(state.add_input(f"{name}.{s}", elem, shape)
                                for s in optimizer.state_names))
        new_params, new_states = optimizer(lr, step, names, grads, states)
        outputs = []
        for (name, elem, shape), p, ss in zip(specs, new_params, new_states):
            targets = [f"{name}.updated"] + [f"{name}.{s}.updated"
                                             for s in optimizer.state_names]
            for target, value in zip(targets, (p,) + tuple(ss)):
                state.builder.reserve(target)
                state.op("Identity", value, outputs=[target])
                outputs.append(helper.make_tensor_value_info(target, elem, shape))
        model.graph.output.extend(outputs)
        result = onnx.ModelProto()
        result.CopyFrom(model)
    result.ir_version = default_ir_version(result.opset_import)
    entry = result.metadata_props.add()
    entry.key = OPTIMIZER_METADATA
    entry.value = json.dumps({
        "optimizer": type(optimizer).__name__,
        "parameters": [s[0] for s in specs],
        "states": list(optimizer.state_names),
        "hyperparameters": optimizer.hyperparameters()})
    onnx.checker.check_model(result, full_check=True)
    return result
