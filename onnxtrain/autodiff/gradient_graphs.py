"""Gradient graphs assembled from one :class:`BackwardGraph` (one reverse
pass): the split form (forward + backward models), the fused form, and the
two pieces every training graph shares, the weights turned into graph inputs
(:func:`weights_as_inputs`) and the seed of a loss computed in the graph
(:func:`seed_with_ones`). :mod:`onnxtrain.assembly.training_graphs` builds the
training graphs of every path from these (the artifacts' too, through
:func:`move_to_inputs`)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import helper, numpy_helper

from ..graph import clean_shape, elem_type_to_numpy
from ..graph.builder import tensor_value_info
from .backward import backward, implicit_inputs

__all__ = ["GradientModels", "build_gradient_models", "build_fused_model",
           "gradient_models_from", "fused_model_from", "move_to_inputs",
           "weights_as_inputs", "seed_with_ones"]


@dataclass
class GradientModels:
    """The models of the split form.

    Attributes
    ----------
    inference_model : onnx.ModelProto
        The original graph with the weights (``wrt``) turned into inputs
        appended after the original inputs; outputs unchanged.
    forward_model : onnx.ModelProto
        ``inference_model`` plus one output per saved intermediate.
    backward_model : onnx.ModelProto
        Inputs: ``grad_output_names``, then ``backward_inputs`` (forward
        inputs, weights and saved intermediates the gradient needs).
        Outputs: ``grad_names`` (one ``<w>_grad`` per weight, same order).
    wrt, outputs, grad_output_names, grad_names : list of str
    saved_names : list of str
        Forward values the forward model outputs for the backward model.
    backward_inputs : list of str
        Forward values (inputs, weights, saved) the backward model reads.
    """

    inference_model: object
    forward_model: object
    backward_model: object
    wrt: list
    outputs: list
    grad_output_names: list
    grad_names: list
    saved_names: list
    backward_inputs: list


def _value_info(name, types):
    elem_type, shape = types.get(name, (None, None))
    shape = clean_shape(shape)
    if elem_type is None:
        raise ValueError(f"The element type of {name!r} cannot be inferred; "
                         "add value_info or input shapes to the model.")
    return tensor_value_info(name, elem_type, shape)


def move_to_inputs(graph, wrt, types, keep_initializer_inputs=True):
    """The weights ``wrt`` moved from initializers to graph inputs: the one
    surgery every training graph (split, fused, artifacts) makes.

    Parameters
    ----------
    graph : onnx.GraphProto
        Not modified.
    wrt : list of str
        Initializers (or inputs) to feed, typed from ``types``.
    types : dict
        name -> (elem_type, shape) (:func:`~onnxtrain.graph.infer_value_types`,
        or the initializers' own types).
    keep_initializer_inputs : bool, default=True
        Whether graph inputs that are also initializers (not in ``wrt``)
        stay inputs (an export with ``keep_initializers_as_inputs``).

    Returns
    -------
    inputs : list of ValueInfoProto
        The other inputs, then one per weight in ``wrt`` order.
    initializers : list of TensorProto
        The initializers but the weights.

    Raises
    ------
    ValueError
        A weight whose element type ``types`` lacks.
    """
    wrt_set = set(wrt)
    inits = {i.name for i in graph.initializer}
    inputs = [i for i in graph.input if i.name not in wrt_set
              and (keep_initializer_inputs or i.name not in inits)]
    inputs += [_value_info(w, types) for w in wrt]
    return inputs, [i for i in graph.initializer if i.name not in wrt_set]


def weights_as_inputs(model, wrt, types, extra_outputs=(), nodes=None,
                      extra_inputs=(), initializers=(), name=None,
                      opset_imports=None):
    """``model`` with the weights ``wrt`` moved from initializers to graph
    inputs (after the other inputs, :func:`move_to_inputs`).

    Parameters
    ----------
    model : onnx.ModelProto
        Not modified.
    wrt : list of str
        Initializers (or inputs) to feed; their value infos come from
        ``types``.
    types : dict
        name -> (elem_type, shape), :func:`~onnxtrain.graph.infer_value_types`.
    extra_outputs : list of str or ValueInfoProto, default=()
        Appended to the outputs (names are typed from ``types``).
    nodes : list of NodeProto, default=None
        The graph's nodes (default: ``model``'s).
    extra_inputs : list of ValueInfoProto, default=()
        Appended after the weights.
    initializers : list of TensorProto, default=()
        Appended to ``model``'s remaining initializers.
    name : str, default=None
        Graph name (default: ``model``'s).
    opset_imports : list, default=None
        Default: ``model``'s.

    Returns
    -------
    onnx.ModelProto
        Inputs: ``model``'s others, the weights in ``wrt`` order, then
        ``extra_inputs``; outputs: ``model``'s, then ``extra_outputs``.

    Raises
    ------
    ValueError
        A weight whose element type ``types`` lacks.
    """
    graph = model.graph
    inputs, inits = move_to_inputs(graph, wrt, types)
    outputs = list(graph.output) + [
        n if not isinstance(n, str) else _value_info(n, types)
        for n in extra_outputs]
    new_graph = helper.make_graph(
        list(graph.node) if nodes is None else list(nodes),
        graph.name if name is None else name, inputs + list(extra_inputs),
        outputs, inits + list(initializers), value_info=list(graph.value_info))
    new_graph.sparse_initializer.extend(graph.sparse_initializer)
    return _model_like(model, new_graph, opset_imports)


def seed_with_ones(g, loss, grad_output, elem_type):
    """Emit ``grad_output = ones_like(loss)`` at the head of ``g``'s nodes:
    the seed dE/dE of a loss the graph computes itself (the artifacts'
    training model, a graph whose first output is its loss), so that the
    graph needs no gradient input."""
    start = len(g.nodes)
    one = numpy_helper.from_array(np.ones(1, dtype=elem_type_to_numpy(elem_type)))
    g.op("ConstantOfShape", g.shape_of(loss), outputs=[grad_output], value=one)
    seed = g.nodes[start:]
    del g.nodes[start:]
    g.nodes[:0] = seed


def _model_like(model, graph, opset_imports=None):
    new = helper.make_model(
        graph, opset_imports=list(opset_imports or model.opset_import),
        producer_name="onnxtrain")
    new.ir_version = model.ir_version
    new.functions.extend(model.functions)
    return new


def _backward_reads(bg):
    """Forward names read by the gradient nodes (their subgraphs' outer
    reads included)."""
    produced = {o for n in bg.builder.nodes for o in n.output}
    produced |= {i.name for i in bg.builder.initializers}
    produced |= set(bg.grad_output_names)
    reads = []
    for node in bg.builder.nodes:
        for name in list(node.input) + implicit_inputs(node):
            if name and name not in produced and name not in reads:
                reads.append(name)
    return reads


def build_gradient_models(model, wrt, outputs=None, types=None):
    """Split form: a forward model saving intermediates and a backward model.

    Parameters
    ----------
    model : onnx.ModelProto
        Prediction graph; not modified.
    wrt : list of str
        Weights (initializers or inputs) to differentiate against.
    outputs : list of str, default=None
        Outputs to differentiate (default: float outputs depending on wrt).
    types : dict, default=None
        ``model``'s :func:`~onnxtrain.graph.infer_value_types` if known.

    Returns
    -------
    GradientModels

    Raises
    ------
    ValueError, MissingVJPRuleError
        See :func:`onnxtrain.autodiff.backward`.
    """
    return gradient_models_from(backward(model, wrt, outputs, types), model)


def gradient_models_from(bg, model):
    """The split form (:func:`build_gradient_models`) of the reverse pass
    ``bg`` of ``model``."""
    wrt = bg.wrt
    model = bg.model or model  # outputs a rule reads (Dropout's mask) named
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    wrt_set = set(wrt)
    graph_inputs = {i.name for i in graph.input}
    reads = _backward_reads(bg)
    constant_inits = [inits[n] for n in reads if n in inits and n not in wrt_set]
    fed = [n for n in reads if n not in inits or n in wrt_set]
    saved = [n for n in fed if n not in graph_inputs and n not in wrt_set]
    output_names = {o.name for o in graph.output}

    inference = weights_as_inputs(model, wrt, bg.types)
    forward = weights_as_inputs(
        model, wrt, bg.types, [n for n in saved if n not in output_names])

    types = dict(bg.types)
    types.update(bg.builder.types)
    g_inputs = [_value_info(n, types) for n in bg.grad_output_names]
    g_inputs += [_value_info(n, types) for n in fed]
    g_outputs = [_value_info_like(n, w, types)
                 for n, w in zip(bg.grad_names, wrt)]
    ggraph = bg.builder.make_graph(f"{graph.name}_gradient", g_inputs,
                                   g_outputs, constant_inits)
    # the default domain, and the others a rule emits nodes of (the
    # ai.onnx.ml ArrayFeatureExtractor of its own rule)
    used = {n.domain for n in ggraph.node}
    default = [o for o in model.opset_import
               if o.domain in ("", "ai.onnx") or o.domain in used]
    backward_model = _model_like(model, ggraph, default)
    return GradientModels(inference, forward, backward_model, list(wrt),
                          list(bg.outputs), list(bg.grad_output_names),
                          list(bg.grad_names), saved, fed)


def _value_info_like(name, like, types):
    elem_type, shape = types[like]
    return helper.make_tensor_value_info(name, elem_type, clean_shape(shape))


def build_fused_model(model, wrt, outputs=None, types=None):
    """Fused form: one model computing the outputs and the weight gradients.

    Inputs: the original inputs, then ``wrt``, then one ``<output>_grad``
    per differentiated output. Outputs: the original outputs, then one
    ``<w>_grad`` per weight. ``types``: ``model``'s
    :func:`~onnxtrain.graph.infer_value_types` if known.

    Returns
    -------
    (onnx.ModelProto, BackwardGraph)
    """
    bg = backward(model, wrt, outputs, types)
    return fused_model_from(bg, model), bg


def fused_model_from(bg, model):
    """The fused form (:func:`build_fused_model`) of the reverse pass ``bg``
    of ``model``."""
    wrt = bg.wrt
    model = bg.model or model
    types = dict(bg.types)
    types.update(bg.builder.types)
    grad_inputs = [_value_info(n, types) for n in bg.grad_output_names]
    grads = [_value_info_like(n, w, types) for n, w in zip(bg.grad_names, wrt)]
    return weights_as_inputs(
        model, wrt, types, grads, list(model.graph.node) + bg.builder.nodes,
        grad_inputs, bg.builder.initializers, f"{model.graph.name}_fused")
