"""Assemble the training and eval models from a base model and a loss.

The artifacts' builder over the assembly pipeline
(:mod:`onnxtrain.assembly.pipeline`: prepare, one reverse pass, finish), as
the fused step's: the loss gradient seeded with ones inside the graph
(:func:`onnxtrain.autodiff.gradient_graphs.seed_with_ones`: the training
model has no ``<loss>_grad`` input), gradient accumulation, and the
parameters as graph inputs.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from ..assembly.models import check_weights_reach_outputs
from ..assembly.pipeline import finish, forward_nodes, prepare, reverse
from ..autodiff.gradient_graphs import move_to_inputs, seed_with_ones
from ..graph import FLOAT_TYPES, default_ir_version, infer_value_types
from ..graph.builder import tensor_value_info
from ..graph.training_mode import batchnorm_buffers, running_statistics

__all__ = ["TrainingResult", "build_training_models", "set_graph_outputs",
           "LAZY_RESET_GRAD", "buffer_name", "accumulated_name",
           "TRAINING_METADATA", "EVAL_METADATA"]

#: Name of the bool input choosing between overwriting and accumulating.
LAZY_RESET_GRAD = "lazy_reset_grad"
#: metadata_props keys describing the layout of the models (JSON).
TRAINING_METADATA = "onnxtrain.training_model"
EVAL_METADATA = "onnxtrain.eval_model"


def buffer_name(param):
    """Name of the gradient-accumulation buffer input of ``param``."""
    return f"{param}_grad.accumulation.buffer"


def accumulated_name(param):
    """Name of the accumulated-gradient output of ``param``."""
    return f"{param}_grad.accumulation.out"


@dataclass
class TrainingResult:
    """What :func:`build_training_models` returns."""

    training_model: onnx.ModelProto
    eval_model: onnx.ModelProto
    trainable: list
    frozen: list


def _clean(shape):
    if shape is None:
        return None
    return [None if isinstance(d, str) and d.startswith("unk__") else d
            for d in shape]


def _value_info(name, types):
    elem_type, shape = types.get(name, (0, None))
    if not elem_type:
        raise ValueError(f"The element type of {name!r} cannot be inferred; "
                         "add value_info or input types to the model.")
    return helper.make_tensor_value_info(name, elem_type, _clean(shape))


def _sequence_value_infos(model, names):
    """name -> ValueInfoProto of the values among ``names`` that shape
    inference types as sequences (e.g. ClipGradNorm on a gradient
    sequence)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # pragma: no cover - inference failing on exotic ops
        return {}
    graph = inferred.graph
    return {vi.name: vi for vi in list(graph.input) + list(graph.value_info)
            + list(graph.output)
            if vi.name in names and vi.type.HasField("sequence_type")}


def _untyped_outputs_message(graph, missing):
    """Why the outputs ``missing`` have no type: no value of that name, or
    a node reading names nothing defines (a ForwardBlock built on an empty
    base with inputs never added), or none shape inference found."""
    defined = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    producers = {}
    for node in graph.node:
        defined.update(o for o in node.output if o)
        producers.update((o, node) for o in node.output if o)
    absent = [n for n in missing if n not in defined]
    if absent:
        return f"Outputs {absent} are not values of the base model."
    undefined = sorted({i for n in missing for i in producers[n].input
                        if i and i not in defined}) if all(
                            n in producers for n in missing) else []
    if undefined:
        return (f"Outputs {missing} have no type: the nodes computing them read "
                f"{undefined}, which no graph input, initializer or node of the "
                "base model defines (add them as inputs of the base model).")
    return f"Outputs {missing} have no type shape inference could find."


def set_graph_outputs(state, names, types=None):
    """Make ``names`` the graph outputs of the base model, typed by
    ``types`` (the model's :func:`~onnxtrain.graph.infer_value_types`) when
    given and it knows them, else by shape inference."""
    graph = state.model.graph
    known = types or {}
    types = {n: known[n] if known.get(n, (0, None))[1] is not None
             else state.value_type(n) for n in names}
    missing = [n for n in names if types[n] is None]
    sequences = _sequence_value_infos(state.model, missing) if missing else {}
    missing = [n for n in missing if n not in sequences]
    if missing:
        raise ValueError(_untyped_outputs_message(graph, missing))
    outputs = [sequences[n] if n in sequences else _value_info(n, types)
               for n in names]
    del graph.output[:]
    graph.output.extend(outputs)
    state.sync()


def _check_parameters(graph, trainable, frozen):
    """The initializers by name; checks the names marked by requires_grad.

    Trainable names may be float graph inputs (their gradient is output too);
    frozen names that are graph inputs mean nothing and are ignored. No
    trainable name at all is allowed (onnxruntime: none requires gradient by
    default): the training model then computes the outputs only.
    """
    inits = {i.name: i for i in graph.initializer}
    inputs = {i.name: i for i in graph.input if i.name not in inits}
    unknown = [n for n in trainable + frozen if n not in inits and n not in inputs]
    if unknown:
        raise ValueError(
            f"Parameters {unknown} are neither initializers nor inputs of the "
            f"model; initializers: {sorted(inits)}, inputs: {sorted(inputs)}.")
    not_float = [n for n in trainable if n in inits and
                 inits[n].data_type not in FLOAT_TYPES]
    not_float += [n for n in trainable if n in inputs and
                  inputs[n].type.tensor_type.elem_type not in FLOAT_TYPES]
    if not_float:
        raise ValueError(f"Trainable names {not_float} are not float "
                         "tensors; only float tensors have gradients.")
    return inits


#: Element types up to bfloat16 (16) exist since IR version 4; float8,
#: 4-bit and 2-bit types came with IR versions 9 and later.
_LAST_OLD_TYPE = onnx.TensorProto.BFLOAT16


def _newer_types(graph):
    """Whether ``graph`` (its subgraphs included) uses an element type after
    :data:`_LAST_OLD_TYPE`, in a value, an initializer or an attribute."""
    values = list(graph.input) + list(graph.output) + list(graph.value_info)
    if any(v.type.tensor_type.elem_type > _LAST_OLD_TYPE for v in values) or \
            any(t.data_type > _LAST_OLD_TYPE for t in graph.initializer):
        return True
    for node in graph.node:
        for att in node.attribute:
            if att.type == onnx.AttributeProto.TENSOR and att.t.data_type > _LAST_OLD_TYPE:
                return True
            if att.type == onnx.AttributeProto.INT and \
                    att.name in ("to", "dtype", "output_dtype") and att.i > _LAST_OLD_TYPE:
                return True
            subgraphs = [att.g] if att.type == onnx.AttributeProto.GRAPH else list(att.graphs)
            if any(_newer_types(g) for g in subgraphs):
                return True
    return False


def _ir_version(model):
    """IR version of the models built from ``model``: the lowest its opsets
    need, for the runtimes of an older IR (onnx's make_model writes its
    newest, which onnxruntime-node or -web of an earlier release refuse),
    unless the model has local functions or element types of a newer IR
    (then its own)."""
    needed = default_ir_version(model.opset_import)
    if model.ir_version <= needed:
        return needed
    if model.functions or _newer_types(model.graph):
        return model.ir_version
    return needed


def _model_like(model, graph):
    new = helper.make_model(graph, opset_imports=list(model.opset_import),
                            producer_name="onnxtrain")
    new.ir_version = _ir_version(model)
    new.functions.extend(model.functions)
    return new


def _inference_mode(nodes):
    """Copies of ``nodes`` with Dropout and BatchNormalization in inference
    mode."""
    result = []
    for node in nodes:
        new = onnx.NodeProto()
        new.CopyFrom(node)
        if node.op_type == "Dropout" and node.domain in ("", "ai.onnx"):
            if len(new.input) >= 3:
                new.input[2] = ""
        elif node.op_type == "BatchNormalization" and \
                node.domain in ("", "ai.onnx"):
            for att in new.attribute:
                if att.name == "training_mode":
                    att.i = 0
            del new.output[1:]
        result.append(new)
    return result


def _accumulate(g, trainable, grad_names, types):
    """Where(lazy_reset_grad, grad, buffer + grad) for each name, or a
    gradient's own Gemm adding ``Where(lazy_reset_grad, 0, buffer)`` as its
    C (:func:`_fold_into_gemm`); ``types``: name -> (elem_type, shape) of
    the buffers."""
    lazy = g.reserve(LAZY_RESET_GRAD)
    gemms = _foldable_gemms(g, grad_names)
    buffers, outputs, masks, small = [], [], {}, {}
    for param, grad in zip(trainable, grad_names):
        buffer = g.reserve(buffer_name(param))
        out = g.reserve(accumulated_name(param))
        elem, shape = types[param]
        if grad in gemms:
            _fold_into_gemm(g, gemms[grad], lazy, buffer, out, elem)
            masks[id(gemms[grad])] = g.nodes.pop()  # placed before its Gemm below
        elif _small_vector(shape):
            small.setdefault(elem, []).append((grad, buffer, out, shape[0]))
        else:
            g.op("Where", lazy, grad, g.op("Add", buffer, grad), outputs=[out])
        buffers.append(tensor_value_info(buffer, elem, shape))
        outputs.append(tensor_value_info(out, elem, shape))
    for group in small.values():
        _accumulate_together(g, lazy, group)
    if masks:
        nodes = list(g.nodes)
        del g.nodes[:]
        for node in nodes:
            if id(node) in masks:
                g.nodes.append(masks[id(node)])
            g.nodes.append(node)
    lazy_vi = helper.make_tensor_value_info(lazy, onnx.TensorProto.BOOL, [])
    return buffers, lazy_vi, outputs


#: Gradients of at most this many elements, vectors (biases, normalization
#: scales), accumulate together (:func:`_accumulate_together`).
_SMALL_GRADIENT_SIZE = 1 << 16


def _small_vector(shape):
    return shape is not None and len(shape) == 1 and isinstance(shape[0], int) \
        and 0 < shape[0] <= _SMALL_GRADIENT_SIZE


def _accumulate_together(g, lazy, group):
    """``group`` of (gradient, buffer, output, size) vectors of one element
    type accumulated as one vector: ``Split(Where(lazy, G, B + G))`` with
    G and B the concatenated gradients and buffers. Five nodes instead of
    two per gradient (a transformer has ten such vectors per layer), the
    same values: the copies cost little on vectors."""
    if len(group) == 1:
        grad, buffer, out, _ = group[0]
        g.op("Where", lazy, grad, g.op("Add", buffer, grad), outputs=[out])
        return
    grads = g.op("Concat", *[grad for grad, _, _, _ in group], axis=0)
    stacked = g.op("Concat", *[buffer for _, buffer, _, _ in group], axis=0)
    total = g.op("Where", lazy, grads, g.op("Add", stacked, grads))
    sizes = [size for _, _, _, size in group]
    outs = [out for _, _, out, _ in group]
    if g.opset >= 13:
        g.op("Split", total, g.const(np.array(sizes, np.int64), onnx.TensorProto.INT64),
             axis=0, outputs=outs)
    else:
        g.op("Split", total, axis=0, split=sizes, outputs=outs)


def _foldable_gemms(g, grad_names):
    """Gradient name -> the Gemm node of ``g`` writing it, for the gradients
    written by a Gemm without C and read by no other node (a weight
    gradient ``dY^T X``)."""
    wanted = set(grad_names)
    found, reads = {}, {}
    for node in g.nodes:
        for name in node.input:
            reads[name] = reads.get(name, 0) + 1
        if node.op_type == "Gemm" and node.domain in ("", "ai.onnx") and \
                (len(node.input) == 2 or node.input[2:] == [""]) and \
                node.output[0] in wanted:
            found[node.output[0]] = node
    return {name: node for name, node in found.items() if name not in reads
            and grad_names.count(name) == 1}


def _fold_into_gemm(g, gemm, lazy, buffer, out, elem):
    """``gemm`` (its output a gradient) made to write the accumulated
    gradient ``out``: ``alpha A B + Where(lazy, 0, buffer)``. One node per
    gradient less than an Add and a Where after the Gemm; the product
    added to zeros is the product itself, so an overwriting call gives the
    gradient exactly (api/_plain_step.py drops C again)."""
    del gemm.input[2:]
    gemm.input.append(g.op("Where", lazy, g.const(0, elem), buffer))
    for att in gemm.attribute:
        if att.name == "beta":
            att.f = 1.0
    gemm.output[0] = out


def _gradient_nodes(prepared, wrt, loss, buffer_types):
    """Gradient and accumulation nodes of ``loss`` w.r.t. ``wrt`` (may be
    empty: then only the ``lazy_reset_grad`` input, unused, is made).

    Returns (forward nodes, gradient nodes, initializers, buffer inputs,
    lazy_reset_grad input, accumulated outputs). The forward nodes are the
    prepared model's, on which the reverse pass names the optional outputs
    the rules read (Dropout's mask, LayerNormalization's statistics)."""
    if not wrt:
        lazy_vi = helper.make_tensor_value_info(LAZY_RESET_GRAD,
                                                onnx.TensorProto.BOOL, [])
        return list(prepared.model.graph.node), [], [], [], lazy_vi, []
    bg = reverse(prepared, wrt, [loss])
    g = bg.builder
    seed_with_ones(g, loss, bg.grad_output_names[0], prepared.types[loss][0])
    buffers, lazy_vi, acc_outputs = _accumulate(g, wrt, bg.grad_names,
                                                buffer_types)
    return (forward_nodes(prepared, bg), g.nodes, g.initializers, buffers,
            lazy_vi, acc_outputs)


def build_training_models(state, output_names, trainable, frozen):
    """Training and eval models of the base model in ``state``.

    Parameters
    ----------
    state : BaseState
        Its model holds the forward graph with the loss; its graph outputs
        are replaced by ``output_names``.
    output_names : list of str
        The loss (first; any shape, float) and further outputs.
    trainable, frozen : list of str
        Initializer names (trainable: also float graph inputs, whose
        gradient becomes an output; either may be empty).

    Returns
    -------
    TrainingResult

    Raises
    ------
    ValueError
        Unknown or non-float parameters, a loss that is not float, a loss
        that does not depend on the trainable parameters, or names
        (``lazy_reset_grad``, buffers) already taken.
    """
    # one shape inference of the base model with its loss serves the
    # outputs' types and the reverse pass (each inference is costly)
    types = infer_value_types(state.model)
    set_graph_outputs(state, output_names, types)
    base = state.model
    trainable, frozen = classify_running_statistics(base, trainable, frozen)
    inits = _check_parameters(base.graph, trainable, frozen)
    # the Conv lowering is the training graph's only: the eval model keeps
    # the Conv nodes
    prepared = prepare(base, trainable, types, statistics={"as_inputs": False},
                       drop_identity_dropouts=True)
    model, types, updated = prepared.model, prepared.types, prepared.buffers
    graph = model.graph
    params = [i.name for i in graph.initializer if i.name in set(trainable + frozen)]
    input_grads = [i.name for i in graph.input
                   if i.name in set(trainable) and i.name not in inits]
    trainable = [p for p in params if p in set(trainable)]
    loss = output_names[0]
    if types.get(loss, (0,))[0] not in FLOAT_TYPES:
        raise ValueError(f"The loss {loss!r} must be a float tensor.")
    if trainable:
        check_weights_reach_outputs(model, trainable, [loss],
                                    "Trainable parameters",
                                    f"the loss {loss!r}", types)
    buffer_types = {p: (inits[p].data_type, list(inits[p].dims)) for p in trainable}
    buffer_types.update({n: (types[n][0], _clean(types[n][1])) for n in input_grads})
    forward, nodes, grad_inits, buffers, lazy_vi, acc_outputs = _gradient_nodes(
        prepared, trainable + input_grads, loss, buffer_types)

    param_types = {p: (inits[p].data_type, tuple(inits[p].dims)) for p in params}
    inputs, constants = move_to_inputs(graph, params, param_types,
                                       keep_initializer_inputs=False)
    user_inputs = inputs[:len(inputs) - len(params)]
    outputs = list(graph.output)[:len(base.graph.output)]
    update_outputs = list(graph.output)[len(base.graph.output):]

    # the accumulation's Where nodes read lazy_reset_grad itself
    # (api/_plain_step.py drops them by that)
    training = finish(forward + nodes, constants + grad_inits,
                      inputs + buffers + [lazy_vi],
                      outputs + acc_outputs + update_outputs,
                      f"{graph.name}_training", model,
                      ir_version=_ir_version(model), keep=[LAZY_RESET_GRAD],
                      forward_types=types, check=True)
    eval_inputs, eval_constants = move_to_inputs(
        base.graph, params, param_types, keep_initializer_inputs=False)
    eval_graph = helper.make_graph(
        _inference_mode(base.graph.node), f"{graph.name}_eval",
        eval_inputs, outputs, eval_constants)
    evaluation = _model_like(model, eval_graph)

    layout = {"user_inputs": [i.name for i in user_inputs],
              "user_outputs": [o.name for o in outputs],
              "parameters": params, "trainable": trainable}
    _set_metadata(evaluation, EVAL_METADATA, layout)
    n_params = len(trainable)
    layout = dict(layout, lazy_reset_grad=LAZY_RESET_GRAD,
                  buffers=[b.name for b in buffers[:n_params]],
                  gradients=[o.name for o in acc_outputs[:n_params]],
                  running_statistics={b: o.name for b, o in
                                      zip(updated, update_outputs)})
    if input_grads:
        layout.update(input_gradients=input_grads,
                      input_gradient_buffers=[b.name for b in buffers[n_params:]])
    _set_metadata(training, TRAINING_METADATA, layout)
    onnx.checker.check_model(evaluation)
    return TrainingResult(training, evaluation,
                          [_copy(inits[p]) for p in trainable],
                          [_copy(inits[p]) for p in params if p not in set(trainable)])


def classify_running_statistics(model, trainable, frozen):
    """(trainable, frozen) with the running statistics of BatchNormalization
    nodes moved to ``frozen`` whatever the lists said, as
    onnxruntime-training classifies them: they are never trained by
    gradient. Those of nodes in training mode
    (:func:`~onnxtrain.graph.training_mode.batchnorm_buffers`) are also frozen
    parameters when the lists leave them out, since each training step
    updates them (a training-model output written back into the state)."""
    statistics = running_statistics(model)
    updated = set(batchnorm_buffers(model))
    listed = set(trainable)
    frozen = list(frozen) + [n for n in statistics if n not in set(frozen) and (
        n in updated or n in listed)]
    return [n for n in trainable if n not in set(statistics)], frozen


def _copy(tensor):
    new = onnx.TensorProto()
    new.CopyFrom(tensor)
    return new


def _set_metadata(model, key, value):
    entry = model.metadata_props.add()
    entry.key = key
    entry.value = json.dumps(value)
