"""Assemble gradient models from a :class:`BackwardGraph`: split and fused."""
from __future__ import annotations

from dataclasses import dataclass

from onnx import helper

from ..graph import clean_shape
from .backward import backward, implicit_inputs

__all__ = ["GradientModels", "build_gradient_models", "build_fused_model"]


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
    return helper.make_tensor_value_info(name, elem_type, shape)


def _with_weights_as_inputs(model, wrt, types, extra_outputs=()):
    graph = model.graph
    wrt_set = set(wrt)
    inputs = [i for i in graph.input if i.name not in wrt_set]
    inputs += [_value_info(w, types) for w in wrt]
    inits = [i for i in graph.initializer if i.name not in wrt_set]
    outputs = list(graph.output) + [_value_info(n, types) for n in extra_outputs]
    new_graph = helper.make_graph(list(graph.node), graph.name, inputs, outputs,
                                  inits, value_info=list(graph.value_info))
    new_graph.sparse_initializer.extend(graph.sparse_initializer)
    return _model_like(model, new_graph)


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


def build_gradient_models(model, wrt, outputs=None):
    """Split form: a forward model saving intermediates and a backward model.

    Parameters
    ----------
    model : onnx.ModelProto
        Prediction graph; not modified.
    wrt : list of str
        Weights (initializers or inputs) to differentiate against.
    outputs : list of str, default=None
        Outputs to differentiate (default: float outputs depending on wrt).

    Returns
    -------
    GradientModels

    Raises
    ------
    ValueError, MissingVJPRuleError
        See :func:`onnxtrain.autodiff.backward`.
    """
    bg = backward(model, wrt, outputs)
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

    inference = _with_weights_as_inputs(model, wrt, bg.types)
    forward = _with_weights_as_inputs(
        model, wrt, bg.types, [n for n in saved if n not in output_names])

    types = dict(bg.types)
    types.update(bg.builder.types)
    g_inputs = [_value_info(n, types) for n in bg.grad_output_names]
    g_inputs += [_value_info(n, types) for n in fed]
    g_outputs = [_value_info_like(n, w, types)
                 for n, w in zip(bg.grad_names, wrt)]
    ggraph = bg.builder.make_graph(f"{graph.name}_gradient", g_inputs,
                                   g_outputs, constant_inits)
    default = [o for o in model.opset_import if o.domain in ("", "ai.onnx")]
    backward_model = _model_like(model, ggraph, default)
    return GradientModels(inference, forward, backward_model, list(wrt),
                          list(bg.outputs), list(bg.grad_output_names),
                          list(bg.grad_names), saved, fed)


def _value_info_like(name, like, types):
    elem_type, shape = types[like]
    return helper.make_tensor_value_info(name, elem_type, clean_shape(shape))


def build_fused_model(model, wrt, outputs=None):
    """Fused form: one model computing the outputs and the weight gradients.

    Inputs: the original inputs, then ``wrt``, then one ``<output>_grad``
    per differentiated output. Outputs: the original outputs, then one
    ``<w>_grad`` per weight.

    Returns
    -------
    (onnx.ModelProto, BackwardGraph)
    """
    bg = backward(model, wrt, outputs)
    model = bg.model or model
    graph = model.graph
    wrt_set = set(wrt)
    types = dict(bg.types)
    types.update(bg.builder.types)
    inputs = [i for i in graph.input if i.name not in wrt_set]
    inputs += [_value_info(w, types) for w in wrt]
    inputs += [_value_info(n, types) for n in bg.grad_output_names]
    outputs_vi = list(graph.output) + [
        _value_info_like(n, w, types) for n, w in zip(bg.grad_names, wrt)]
    inits = [i for i in graph.initializer if i.name not in wrt_set]
    fused = helper.make_graph(list(graph.node) + bg.builder.nodes,
                              f"{graph.name}_fused", inputs, outputs_vi,
                              inits + bg.builder.initializers)
    return _model_like(model, fused), bg
