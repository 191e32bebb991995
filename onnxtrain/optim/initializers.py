"""Initial weights drawn as scikit-learn's MLP draws them."""
from __future__ import annotations

import numpy as np
from onnx import helper
from sklearn.utils import check_random_state

__all__ = ["glorot_uniform_weights", "bias_weights"]

_MATRIX_OPS = ("MatMul", "Gemm")


def _roles(model, names):
    """For each weight: ("matrix", fan_in, fan_out) or ("bias",)."""
    roles = {}
    for node in model.graph.node:
        if node.op_type not in _MATRIX_OPS:
            continue
        trans_b = any(a.name == "transB" and a.i for a in node.attribute)
        for index, name in enumerate(node.input[:2]):
            if name in names and name not in roles:
                roles[name] = ("matrix", index == 1 and trans_b)
    return roles


def _has_hidden_logistic(model):
    """True when a Sigmoid feeds a MatMul/Gemm (scikit-learn's
    activation='logistic', which uses factor 2 instead of 6)."""
    sigmoid_outputs = {n.output[0] for n in model.graph.node if n.op_type == "Sigmoid"}
    return any(i in sigmoid_outputs for n in model.graph.node
               if n.op_type in _MATRIX_OPS for i in n.input)


def glorot_uniform_weights(model, names, random_state=None):
    """Draw Glorot-uniform weights as scikit-learn's MLP ``_init_coef`` does.

    Weights are drawn in the order of ``names`` from one
    ``check_random_state(random_state)`` generator. A weight consumed by
    MatMul/Gemm as an operand is a matrix with fan_in, fan_out its last two
    dims (swapped for Gemm's transB=1): bound = sqrt(factor / (fan_in +
    fan_out)), factor = 2 if a Sigmoid feeds a MatMul/Gemm (hidden logistic
    layers) else 6 (Glorot & Bengio, 2010). Any other weight (a bias) uses
    the bound of the matrix drawn before it, as scikit-learn draws each
    layer's intercept right after its coefficients; a bias with no matrix
    before it uses fan_in = fan_out = its size.

    Parameters
    ----------
    model : onnx.ModelProto
    names : list of str
        Float initializers to draw.
    random_state : int, RandomState instance or None

    Returns
    -------
    dict
        ``name -> numpy.ndarray`` in each initializer's dtype and shape.
    """
    rng = check_random_state(random_state)
    inits = {i.name: i for i in model.graph.initializer}
    roles = _roles(model, set(names))
    factor = 2.0 if _has_hidden_logistic(model) else 6.0
    bound, result = None, {}
    for name in names:
        init = inits[name]
        shape = tuple(init.dims)
        dtype = helper.tensor_dtype_to_np_dtype(init.data_type)
        role = roles.get(name)
        if role is not None and len(shape) >= 2:
            fan_in, fan_out = shape[-2], shape[-1]
            if role[1]:
                fan_in, fan_out = fan_out, fan_in
            bound = np.sqrt(factor / (fan_in + fan_out))
        elif bound is None or role is not None:
            size = max(int(np.prod(shape)), 1)
            bound = np.sqrt(factor / (2 * size))
        values = rng.uniform(-bound, bound, shape if role else int(np.prod(shape)))
        result[name] = values.reshape(shape).astype(dtype, copy=False)
    return result


def bias_weights(model, names):
    """The names among ``names`` that MatMul/Gemm do not consume as an
    operand (biases, scales): what penalties leave alone by default."""
    roles = _roles(model, set(names))
    return [name for name in names if name not in roles]
