"""The graphs of a multi-layer perceptron, built from its layer weights.

Every graph computes the layers as scikit-learn's MLP does
(``sklearn/neural_network/_multilayer_perceptron.py``, ``_forward_pass``):
``a_{i+1} = f(a_i @ coef_i + intercept_i)`` with ``f`` the hidden activation
for the hidden layers; only the head differs:

- the training graph ends on the last layer's pre-activation ``z`` (the
  logits), or ``exp(z)`` for the Poisson loss, so that the losses of
  :mod:`onnxtrain.losses` give the gradient scikit-learn back-propagates,
  ``activation(z) - y``, without going through a probability;
- the regressor's inference graph outputs ``variable`` (n, n_outputs), as
  skl2onnx's converter names it;
- the classifier's inference graph outputs ``label`` and ``probabilities``
  (skl2onnx's names with ``options={'zipmap': False}``).

The weights are initializers named ``coefficient{i}`` and ``intercept{i}``
in every graph, so trained values move from one graph to the other by name.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper
from scipy.special import expit

from ..graph import GraphBuilder, make_model, numpy_to_elem_type

__all__ = ["HIDDEN_ACTIVATIONS", "OUTPUT_FUNCTIONS", "init_layers",
           "weight_names", "training_graph", "regressor_graph",
           "classifier_graph"]

_OPSET = 17

#: Hidden activation -> ONNX op (None: no node), scikit-learn's names.
HIDDEN_ACTIVATIONS = {"identity": None, "logistic": "Sigmoid", "tanh": "Tanh",
                      "relu": "Relu"}


def _softmax(z):
    """scikit-learn's ``inplace_softmax`` (``sklearn/neural_network/_base.py``)."""
    exp = np.exp(z - z.max(axis=1)[:, np.newaxis])
    return exp / exp.sum(axis=1)[:, np.newaxis]


#: Output activation -> numpy function from the training graph's output to
#: the prediction, in the output's dtype. The training graph already
#: applies 'exp', so it is the identity here.
OUTPUT_FUNCTIONS = {"identity": lambda z: z, "exp": lambda z: z,
                    "logistic": expit, "softmax": _softmax}


def init_layers(layer_units, activation, random_state, dtype):
    """Initial weights, drawn as scikit-learn's MLP ``_init_coef`` draws them.

    For each layer, in order: the coefficients then the intercepts, both
    uniform in ``[-b, b]`` with ``b = sqrt(factor / (fan_in + fan_out))``,
    ``factor = 2`` for ``activation='logistic'`` and 6 otherwise (Glorot &
    Bengio, 2010), drawn in float64 then cast to ``dtype``.

    Parameters
    ----------
    layer_units : list of int
        ``[n_features, *hidden_layer_sizes, n_outputs]``.
    activation : str
        The hidden activation (only 'logistic' changes the factor, even
        without hidden layers, as in scikit-learn).
    random_state : numpy.random.RandomState
        Advanced by the draws (the caller goes on using it).
    dtype : numpy dtype

    Returns
    -------
    coefs : list of ndarray of shape (fan_in, fan_out)
    intercepts : list of ndarray of shape (fan_out,)
    """
    factor = 2.0 if activation == "logistic" else 6.0
    coefs, intercepts = [], []
    for fan_in, fan_out in zip(layer_units[:-1], layer_units[1:]):
        bound = np.sqrt(factor / (fan_in + fan_out))
        coef = random_state.uniform(-bound, bound, (fan_in, fan_out))
        intercept = random_state.uniform(-bound, bound, fan_out)
        coefs.append(coef.astype(dtype, copy=False))
        intercepts.append(intercept.astype(dtype, copy=False))
    return coefs, intercepts


def weight_names(n_layers):
    """``['coefficient0', 'intercept0', 'coefficient1', ...]``: the trained
    initializers, in scikit-learn's draw order."""
    return [name for i in range(n_layers)
            for name in (f"coefficient{i}", f"intercept{i}")]


def _layers(coefs, intercepts, activation):
    """A builder holding the layers; returns (builder, initializers, inputs,
    name of the last pre-activation)."""
    if activation not in HIDDEN_ACTIVATIONS:
        raise ValueError(f"Unknown activation {activation!r}; expected one of "
                         f"{sorted(HIDDEN_ACTIVATIONS)}.")
    dtype = np.asarray(coefs[0]).dtype
    elem_type = numpy_to_elem_type(dtype)
    g = GraphBuilder(_OPSET)
    g.reserve("X")
    inputs = [helper.make_tensor_value_info("X", elem_type,
                                            [None, coefs[0].shape[0]])]
    initializers, hidden = [], "X"
    last = len(coefs) - 1
    for i, (coef, intercept) in enumerate(zip(coefs, intercepts)):
        names = (g.reserve(f"coefficient{i}"), g.reserve(f"intercept{i}"))
        initializers += [numpy_helper.from_array(np.asarray(coef, dtype), names[0]),
                         numpy_helper.from_array(np.asarray(intercept, dtype),
                                                 names[1])]
        z = g.op("Add", g.op("MatMul", hidden, names[0]), names[1])
        op_type = HIDDEN_ACTIVATIONS[activation]
        hidden = g.op(op_type, z) if i < last and op_type else z
    return g, initializers, inputs, hidden


def _model(g, name, inputs, outputs, initializers):
    graph = g.make_graph(name, inputs, outputs, initializers)
    return make_model(graph, [helper.make_opsetid("", g.opset)])


def _one_output_model(coefs, intercepts, activation, exp, output, graph_name):
    """The layers, then Exp (``exp``) or Identity into ``output`` of shape
    (n, n_outputs)."""
    g, initializers, inputs, z = _layers(coefs, intercepts, activation)
    elem_type = numpy_to_elem_type(np.asarray(coefs[0]).dtype)
    g.reserve(output)
    g.op("Exp" if exp else "Identity", z, outputs=[output])
    outputs = [helper.make_tensor_value_info(output, elem_type,
                                             [None, coefs[-1].shape[1]])]
    return _model(g, graph_name, inputs, outputs, initializers)


def training_graph(coefs, intercepts, activation, exp_output=False):
    """The graph trained: input ``X`` (n, n_features), output ``output``
    (n, n_outputs), the last pre-activation, or its exponential when
    ``exp_output`` (the Poisson loss needs the mean).

    Parameters
    ----------
    coefs, intercepts : list of ndarray
        Initial weights (:func:`init_layers`), float32 or float64.
    activation : {'identity', 'logistic', 'tanh', 'relu'}
    exp_output : bool, default=False

    Returns
    -------
    onnx.ModelProto
    """
    return _one_output_model(coefs, intercepts, activation, exp_output,
                             "output", "mlp_training")


def regressor_graph(coefs, intercepts, activation, out_activation="identity"):
    """The regressor's inference graph: ``X`` -> ``variable`` (n, n_outputs).

    Parameters
    ----------
    coefs, intercepts : list of ndarray
    activation : {'identity', 'logistic', 'tanh', 'relu'}
    out_activation : {'identity', 'exp'}, default='identity'
        'exp' for ``loss='poisson'``.

    Returns
    -------
    onnx.ModelProto
    """
    return _one_output_model(coefs, intercepts, activation,
                             out_activation == "exp", "variable",
                             "mlp_regressor")


def _label_tensor(classes):
    """The classes as a tensor (int64, bool, float or string) and its type."""
    classes = np.asarray(classes)
    if classes.dtype.kind in "iu":
        classes = classes.astype(np.int64)
    elif classes.dtype.kind not in "bf":
        classes = np.array([str(c) for c in classes], dtype=object)
    elem_type = TensorProto.STRING if classes.dtype == object else \
        numpy_to_elem_type(classes.dtype)
    return classes, elem_type


def classifier_graph(coefs, intercepts, activation, out_activation, classes,
                     multilabel=False):
    """The classifier's inference graph: ``X`` -> ``label``, ``probabilities``.

    Parameters
    ----------
    coefs, intercepts : list of ndarray
    activation : {'identity', 'logistic', 'tanh', 'relu'}
    out_activation : {'logistic', 'softmax'}
    classes : ndarray of shape (n_classes,)
        Labels (ints, bools, floats or strings), in the column order.
    multilabel : bool, default=False

    Returns
    -------
    onnx.ModelProto
        Binary (one logistic output p): ``probabilities`` = [1 - p, p]
        (n, 2) and ``label`` = classes[argmax] (n,); multiclass:
        ``probabilities`` = softmax (n, C), ``label`` = classes[argmax];
        multilabel: ``probabilities`` = sigmoid (n, k) and ``label`` the
        int64 indicator ``probabilities > 0.5`` (n, k). Labels are int64
        for integer classes, strings for str/object ones, else the classes'
        own type.
    """
    g, initializers, inputs, z = _layers(coefs, intercepts, activation)
    elem_type = numpy_to_elem_type(np.asarray(coefs[0]).dtype)
    n_outputs = coefs[-1].shape[1]
    g.reserve("label"), g.reserve("probabilities")
    if multilabel:
        proba = g.op("Sigmoid", z, outputs=["probabilities"])
        g.op("Cast", g.op("Greater", proba, g.const(0.5, elem_type)),
             to=TensorProto.INT64, outputs=["label"])
        outputs = [helper.make_tensor_value_info("label", TensorProto.INT64,
                                                 [None, n_outputs]),
                   helper.make_tensor_value_info("probabilities", elem_type,
                                                 [None, n_outputs])]
        return _model(g, "mlp_classifier", inputs, outputs, initializers)
    if out_activation == "softmax":
        proba = g.op("Softmax", z, axis=1, outputs=["probabilities"])
    else:
        p = g.op("Sigmoid", z)
        proba = g.op("Concat", g.op("Sub", g.const(1.0, elem_type), p), p, axis=1,
                     outputs=["probabilities"])
    labels = list(classes) * (2 if len(classes) == 1 else 1)  # one class: always it
    labels, label_type = _label_tensor(labels)
    table = g.unique_name("classes")
    initializers.append(numpy_helper.from_array(labels, table))
    index = g.op("ArgMax", proba, axis=1, keepdims=0)
    g.op("Gather", table, index, axis=0, outputs=["label"])
    width = 2 if out_activation != "softmax" else n_outputs
    outputs = [helper.make_tensor_value_info("label", label_type, [None]),
               helper.make_tensor_value_info("probabilities", elem_type,
                                             [None, width])]
    return _model(g, "mlp_classifier", inputs, outputs, initializers)
