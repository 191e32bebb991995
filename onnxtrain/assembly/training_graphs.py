"""The assembly of training graphs: one module builds the graphs of every
training path from one reverse pass each, only for the path chosen.

- split (the seed's four graphs): :func:`build_split_models` (forward model
  saving intermediates, backward model), built lazily by the engine when a
  step first runs;
- fused: one ONNX graph per training step (:func:`build_training_step`),
  forward, loss and dE/dY, backward, update;
- loop: one ONNX ``Loop`` running every step of an epoch
  (:func:`build_training_loop`, :func:`build_epochs_loop`), from the step;
- artifacts: the training model of :mod:`onnxtrain.onnxblock`
  (:func:`onnxtrain.onnxblock._training.build_training_models`).

Every variant goes through :mod:`.pipeline` (prepare, one reverse pass,
finish). The fused step writes the loss (its value and dE/dY, the seed of
the backward's ``<prediction>_grad``) and the update rule with its penalty
straight into the reverse pass's builder (:func:`loss_emitter`,
:func:`update_emitter`); nothing leaves a fused graph but the new weights,
the new optimizer state and the loss. :class:`TrainingGraphs` chooses and
caches them for a trainer, from the one model the trainer prepared (its
types inferred once) and passed down.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import onnx
from onnx import TensorProto

from .._utils.gc import gc_frozen
from ..autodiff.gradient_graphs import gradient_models_from
from ..autodiff.backward import rename_many_reads
from ..graph import GraphBuilder, infer_value_types, make_model, opset_of
from ..graph.builder import tensor_value_info
from ..graph.scopes import rename_values, subgraphs
from ..graph.training_mode import updated_name
from .in_place import renamed_value_info as _renamed_value_info
from .in_place import update_in_place
from .pipeline import Prepared, finish, forward_nodes, prepare, reverse

__all__ = ["TrainingStep", "TrainingGraphs", "LossGraphs", "build_training_step",
           "build_split_models",
           "loss_emitter", "update_emitter",
           "build_training_loop", "build_epochs_loop", "final_activation",
           "small_graph_opset"]

#: Lowest opset of the fused graphs (the loss and the update rule write
#: their nodes at the model's opset).
FUSED_MIN_OPSET = 13


@dataclass
class TrainingStep:
    """A training-step (or training-loop) graph and its interface.

    Attributes
    ----------
    model : onnx.ModelProto
    data_inputs : list of str
        Features (``n_features`` inputs), targets (and sample weights): one
        batch for the step graph, every row for the loop graph.
    scalar_inputs : list of str
        Rank-0 inputs of the update rule (``learning_rate``, ``step``...),
        then ``penalty_scale`` (step graph only).
    weights : list of str
        Weight inputs; ``states[i]`` are the optimizer-state inputs of
        weight i. Outputs: ``loss`` (the loop: one loss per batch), then for
        each weight its new value and new states, in input order, then the
        new value of each buffer.
    buffers : list of str
        Running statistics (inputs after the states) that every step
        updates without gradient (:mod:`onnxtrain.graph.training_mode`).
    n_features : int
        Number of feature inputs at the head of ``data_inputs``.
    update_values : frozenset of str
        The names the update graph's nodes write (the step graph only):
        :func:`update_in_place` moves the nodes that only the new
        parameters read into its ``If``.
    in_place : frozenset of str
        The parameter outputs a run may write into the memory of the
        parameter input at the same place (:func:`update_in_place`); empty:
        every output needs a buffer of its own.
    deferred : list of str
        Weights the graph reads but does not update (the step graph only):
        it outputs the gradient of each, ``<weight>__grad``, after the
        buffers, and the runner applies their update
        (:mod:`onnxtrain.runtime.segmented_update`). They are not in
        ``weights``; their states are no inputs.
    """

    model: object
    data_inputs: list
    scalar_inputs: list
    weights: list
    states: list
    buffers: list = field(default_factory=list)
    n_features: int = 1
    update_values: frozenset = frozenset()
    in_place: frozenset = frozenset()
    deferred: list = field(default_factory=list)

    @property
    def parameter_inputs(self):
        """list of str: the inputs the parameter outputs replace, in the
        outputs' order (each weight, its states, then the buffers)."""
        return [n for w, group in zip(self.weights, self.states)
                for n in [w, *group]] + list(self.buffers)


def loss_emitter(loss, elem_type, rank):
    """``emit(g, expected, predicted, weight, outputs)`` writing ``loss``
    (a :class:`~onnxtrain.losses.BaseLearningLoss`) into a step's builder."""
    def emit(g, expected, predicted, weight, outputs):
        return loss.emit(g, expected, predicted, weight, outputs, elem_type, rank)
    return emit


def update_emitter(learning_rate, weights, elem_type, penalty=None, penalized=()):
    """``emit(g, names)`` writing the update of ``learning_rate`` (a
    :class:`~onnxtrain.optim.BaseLearningRate`) into a step's builder;
    ``names`` maps the names of its ``axpy_onnx_`` to the step's."""
    def emit(g, names):
        learning_rate.emit_update(g, list(weights), elem_type, penalty,
                                  penalized, names)
    return emit


def _shape_of(value):
    """The shape of a tensor ValueInfoProto as a list (None: unknown)."""
    tensor = value.type.tensor_type
    if not tensor.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else
            (d.dim_param or None) for d in tensor.shape.dim]


def _check_free(names, taken):
    clash = sorted(set(names) & taken)
    if clash:
        raise ValueError(f"Training graph names {clash} collide with names of "
                         "the model; rename them in the model.")


def build_training_step(model, wrt, loss_model, update_model, state_names,
                        scalar_names, weighted=False, target_name="target__",
                        weight_name="sample_weight__", buffers=(), types=None,
                        statistics=None):
    """One graph: forward, loss and dE/dY, backward, update.

    Parameters
    ----------
    model : onnx.ModelProto
        Prediction graph (first output = prediction); its inputs that are
        neither weights nor buffers are the features.
    wrt : list of str
        Weights to train.
    loss_model : callable
        ``emit(g, expected, predicted, weight, outputs)`` writing the loss
        and dE/dY into the step's builder (:func:`loss_emitter`).
    update_model : callable
        ``emit(g, names)`` writing the update into the step's builder
        (:func:`update_emitter`).
    state_names, scalar_names : tuple of str
        From the learning-rate object.
    weighted : bool, default=False
        Whether the step takes sample weights.
    target_name, weight_name : str
        Names of the target and sample-weight inputs.
    buffers : list of str, default=()
        Inputs of ``model`` updated by each step without gradient: the
        model outputs their new values as ``updated_name(buffer)``
        (:func:`onnxtrain.graph.training_mode.with_running_statistics_updates`).
    types : dict, default=None
        ``model``'s :func:`~onnxtrain.graph.infer_value_types` if known
        (the reverse pass and the step then run no shape inference).
    statistics : dict, default=None
        Keyword arguments of the running statistics' rewrite
        (:func:`onnxtrain.assembly.pipeline.prepare`), which then finds
        ``buffers``; None: ``model`` has them already.

    Returns
    -------
    TrainingStep

    Raises
    ------
    TypeError
        A loss or update given as a graph (a ModelProto): the loss and the
        update rule write their nodes into the step's builder.
    ValueError
        Name collisions, or a model without feature input.
    """
    for name, emitter in (("loss_model", loss_model), ("update_model", update_model)):
        if not callable(emitter):
            raise TypeError(f"{name} must be an emitter writing into the step's "
                            "builder (loss_emitter, update_emitter), got "
                            f"{type(emitter).__name__}.")
    prepared = prepare(model, wrt, types, statistics=statistics)
    if statistics is None:
        prepared.buffers = list(buffers)
    return _training_step(prepared, wrt, loss_model, update_model, state_names,
                          scalar_names, weighted, target_name, weight_name)


def _training_step(prepared, wrt, emit_loss, emit_update, state_names,
                   scalar_names, weighted, target_name="target__",
                   weight_name="sample_weight__", deferred=()):
    """:func:`build_training_step` of a prepared model
    (:func:`~onnxtrain.assembly.pipeline.prepare`, its buffers found);
    ``emit_update`` updates the weights of ``wrt`` not in ``deferred``,
    whose gradients the step outputs instead (``TrainingStep.deferred``)."""
    model, types, buffers = prepared.model, prepared.types, prepared.buffers
    not_features = set(wrt) | set(buffers) | {i.name for i in model.graph.initializer}
    features = [i for i in model.graph.input if i.name not in not_features]
    if not features:
        raise ValueError("The fused training step needs a model with an input.")
    prediction = model.graph.output[0].name
    bg = reverse(prepared, wrt, [prediction])
    forward = forward_nodes(prepared, bg)
    wrt_set = set(wrt)
    forward_inits = [i for i in model.graph.initializer if i.name not in wrt_set]
    taken = {n for node in forward + bg.builder.nodes
             for n in list(node.input) + list(node.output)}
    taken |= {i.name for i in model.graph.input} | wrt_set
    taken |= set(bg.grad_output_names)
    taken |= {i.name for i in forward_inits + bg.builder.initializers}
    scalars = list(scalar_names) + ["penalty_scale"]
    deferred = [w for w in wrt if w in set(deferred)]
    updated = [w for w in wrt if w not in set(deferred)]
    states = [[f"{w}_{s}" for s in state_names] for w in updated]
    grad_outputs = [f"{w}__grad" for w in deferred]
    _check_free([target_name, weight_name, "loss"] + scalars + grad_outputs
                + [s for group in states for s in group], taken)

    elem_type, out_shape = types[prediction]
    target_shape = _free_shape(out_shape)
    inputs = features + [tensor_value_info(target_name, elem_type, target_shape)]
    if weighted:
        inputs.append(tensor_value_info(weight_name, elem_type, [None]))
    inputs += [tensor_value_info(s, elem_type, []) for s in scalars]
    outputs = [tensor_value_info("loss", elem_type, [])]
    for w, group in zip(updated, states):
        shape = types[w][1]
        inputs.append(tensor_value_info(w, elem_type, shape))
        inputs += [tensor_value_info(s, elem_type, shape) for s in group]
        outputs.append(tensor_value_info(f"{w}__new", elem_type, shape))
        outputs += [tensor_value_info(f"{s}__new", elem_type, shape) for s in group]
    by_name = {i.name: i for i in model.graph.input}
    for b in buffers:
        inputs.append(by_name[b])
        outputs.append(_renamed_value_info(by_name[b], updated_name(b)))
    for w, name in zip(deferred, grad_outputs):
        inputs.append(tensor_value_info(w, elem_type, types[w][1]))
        outputs.append(tensor_value_info(name, elem_type, types[w][1]))

    # the loss and the update write into the reverse pass's builder, after
    # the backward nodes; their names are this graph's from the start
    g = bg.builder
    buffer_outputs = {updated_name(b) for b in buffers}
    for value in inputs[len(features):] + outputs:
        if value.name not in wrt_set and value.name not in buffers \
                and value.name not in buffer_outputs:
            g.reserve(value.name)
            g.set_type(value.name, elem_type, _shape_of(value))
    n_backward = len(g.nodes)
    loss_value = g.unique_name("loss__Y")
    emit_loss(g, target_name, prediction, weight_name if weighted else None,
              [loss_value, bg.grad_output_names[0]])
    grad_of = dict(zip(wrt, bg.grad_names))
    # a deferred weight's gradient is written straight into its output
    # (the runner's buffer): its producer renamed, no copy
    produced = {o for node in g.nodes for o in node.output}
    for w, name in zip(deferred, grad_outputs):
        if grad_of[w] in produced:
            rename_values(g.nodes, {grad_of[w]: name})
        else:
            g.op("Identity", grad_of[w], outputs=[name])
    n_loss = len(g.nodes)
    names = {"loss": loss_value, "loss_total": "loss"}
    for w, group in zip(updated, states):
        names.update({f"{w}_grad": grad_of[w], f"{w}_new": f"{w}__new"})
        names.update({f"{s}_new": f"{s}__new" for s in group})
    emit_update(g, names)
    backward_nodes = g.nodes[:n_backward]
    loss_nodes = g.nodes[n_backward:n_loss]
    update_nodes = g.nodes[n_loss:]
    # not with deferred weights: their gradients leave the step unscaled
    if "learning_rate" in scalars and not deferred and _can_fold(
            backward_nodes + update_nodes, elem_type):
        backward_nodes, update_nodes = _fold_learning_rate(
            g, backward_nodes, update_nodes, bg.grad_output_names[0], bg.grad_names,
            "learning_rate")
    step = finish(forward + loss_nodes + backward_nodes + update_nodes,
                  forward_inits + list(g.initializers), inputs, outputs,
                  "training_step", model, forward_types=types)
    data = [x.name for x in features] + [target_name] + (
        [weight_name] if weighted else [])
    return TrainingStep(step, data, scalars, updated, states, list(buffers),
                        len(features),
                        frozenset(o for node in update_nodes for o in node.output),
                        deferred=deferred)


def _can_fold(nodes, elem_type):
    """Whether :func:`_fold_learning_rate` may run: not in float16/bfloat16
    (the per-row seed times a small learning rate would round to float16's
    subnormals or to zero before the batch sum; float32 and float64 keep
    it), and not when subgraphs (If, Loop, Scan bodies) may read the seed
    from the enclosing scope, which the renaming would not reach."""
    if elem_type in (TensorProto.FLOAT16, TensorProto.BFLOAT16):
        return False
    return not any(subgraphs(node) for node in nodes)


def _fold_learning_rate(g, backward, update, seed, grads, rate):
    """Scale the backward pass's seed by the learning rate instead of every
    weight gradient, when the update only ever reads ``rate * gradient``.

    The backward pass is linear in its seed dE/dY, so ``rate * dW`` equals
    the gradient of ``rate * dE/dY``: one Mul on the (batch, outputs) seed
    replaces one Mul per weight (SGD, momentum, Nesterov; not Adam, nor a
    penalty added to the gradient first). ``g`` is the step's builder,
    which names the scaled seed. Returns (backward, update) nodes, unchanged
    when the pattern does not hold."""
    readers = {}
    for node in backward + update:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    scaling = []
    for grad in grads:
        users = readers.get(grad, [])
        if (len(users) != 1 or users[0] not in update or users[0].op_type != "Mul"
                or sorted(users[0].input) != sorted([grad, rate])):
            return backward, update
        scaling.append(users[0])
    if any(node not in backward for node in readers.get(seed, [])):
        return backward, update
    # the builder ``g`` names the new Mul; its node goes to the head of the
    # backward nodes, not to g's list
    scaled = g.op("Mul", seed, rate, outputs=[g.unique_name(f"{seed}__scaled")])
    new_backward = [g.nodes.pop()]
    folded = {node.output[0]: grad for node, grad in zip(scaling, grads)}
    for node in backward:
        new_backward.append(_with_inputs(node, {seed: scaled}))
    new_update = [_with_inputs(node, folded) for node in update
                  if node not in scaling]
    return new_backward, new_update


def _with_inputs(node, rename):
    """``node``, or a copy reading ``rename[name]`` instead of ``name``."""
    if not any(i in rename for i in node.input):
        return node
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    del copy.input[:]
    copy.input.extend(rename.get(i, i) for i in node.input)
    return copy


def _free_shape(shape):
    if shape is None:
        return None
    return [d if isinstance(d, int) and d > 0 else None for d in shape[:1]] + [
        d if isinstance(d, int) else None for d in shape[1:]]


def build_training_loop(step):
    """Every step of an epoch in one ONNX ``Loop`` over device-resident data.

    The loop slices batch ``i`` as rows ``[i * batch_size, min((i + 1) *
    batch_size, n))`` (the last batch may be smaller), feeds ``step`` as
    ``step0 + i`` and ``penalty_scale`` as 1 / rows (1 / sum of the batch's
    sample weights), and carries the weights and optimizer state.

    Parameters
    ----------
    step : TrainingStep
        The flat step of :func:`build_training_step` (no ``If``): its nodes
        are the body of the ``Loop``, reading the batch's slice.

    Returns
    -------
    TrainingStep
        Inputs: every row of the data inputs, then the scalar inputs except
        ``penalty_scale`` (``step`` is the first step's number), then
        ``batch_size`` (int64, rank 0), then the weights and states.
        Outputs: ``losses`` (one per batch), then the final weights and
        states.
    """
    model = step.model
    graph = model.graph
    opset = opset_of(model)
    carried = [name for w, group in zip(step.weights, step.states)
               for name in [w] + group] + list(step.buffers)
    g = GraphBuilder(opset, {n.name for n in graph.input} | {"losses", "batch_size"},
                     prefix="epochloop__")
    by_name = {i.name: i for i in graph.input}
    target = step.data_inputs[step.n_features]
    elem_type = by_name[target].type.tensor_type.elem_type
    # everything the steps need that does not depend on the weights is
    # computed once, before the Loop: a step reads its batch bounds, its
    # step number and its penalty scale with one Gather each (fewer, and
    # cheaper, kernels per step than computing them in the body)
    int64 = TensorProto.INT64
    rows = g.op("Gather", g.shape_of(step.data_inputs[0]), g.const(0, int64))
    starts = g.op("Range", g.const(0, int64), rows, "batch_size")
    ends = g.op("Min", g.op("Add", starts, "batch_size"), rows)
    n_batches = g.op("Gather", g.shape_of(starts), g.const(0, int64))
    per_step = {"starts": g.unsqueeze(starts, [1]), "ends": g.unsqueeze(ends, [1])}
    # a step rule without a schedule or a penalty reads neither: no kernel
    # computes them then
    read = {name for node in graph.node for name in node.input}
    if "step" in read:
        per_step["step"] = g.op("Add", "step", g.cast(
            g.op("Range", g.const(0, int64), n_batches, g.const(1, int64)),
            elem_type))
    if "penalty_scale" in read and len(step.data_inputs) <= step.n_features + 1:
        per_step["penalty_scale"] = g.op("Reciprocal", g.cast(
            g.op("Sub", ends, starts), elem_type))
    body = _loop_body(step, opset, carried, per_step, g.used_names)
    finals = [f"{c}__final" for c in carried]
    g.op("Loop", n_batches, "", *carried, body=body,
         outputs=finals + ["losses"])
    scalars = [s for s in step.scalar_inputs if s != "penalty_scale"]
    inputs = [by_name[n] for n in step.data_inputs + scalars]
    inputs.append(tensor_value_info("batch_size", TensorProto.INT64, []))
    inputs += [by_name[c] for c in carried]
    outputs = [tensor_value_info("losses", elem_type, [None])]
    outputs += [_renamed_value_info(by_name[c], f)
                for f, c in zip(finals, carried)]
    loop_graph = g.make_graph("training_loop", inputs, outputs)
    loop = make_model(loop_graph, list(model.opset_import), ir_version=model.ir_version)
    states = [[f"{s}" for s in group] for group in step.states]
    return TrainingStep(loop, list(step.data_inputs), scalars + ["batch_size"],
                        list(step.weights), states, list(step.buffers),
                        step.n_features)


def _loop_body(step, opset, carried, per_step, outer_names):
    """The Loop body: gather the step's values, slice batch i, run the step.

    ``per_step`` maps ``starts``/``ends`` (shape (n_batches, 1)) and, when
    the step reads them, ``step`` and (without sample weights)
    ``penalty_scale`` (shape (n_batches,)) to the outer-scope vectors
    holding them."""
    graph = step.model.graph
    by_name = {i.name: i for i in graph.input}
    taken = {n for node in graph.node for n in list(node.input) + list(node.output)}
    taken |= set(by_name) | {i.name for i in graph.initializer} | set(outer_names)
    taken |= {f"{c}__in" for c in carried}
    g = GraphBuilder(opset, taken | {"iter__", "cond__"}, prefix="loop__")
    starts = g.op("Gather", per_step["starts"], "iter__")  # shape (1,)
    ends = g.op("Gather", per_step["ends"], "iter__")
    rename = {}
    for name in step.data_inputs:
        rename[name] = g.op("Slice", name, starts, ends, g.int64s([0]))
    elem_type = by_name[step.data_inputs[step.n_features]].type.tensor_type.elem_type
    read = {name for node in graph.node for name in node.input}
    if "penalty_scale" in per_step:
        rename["penalty_scale"] = g.op("Gather", per_step["penalty_scale"], "iter__")
    elif "penalty_scale" in read:  # 1 / the sum of the batch's sample weights
        rename["penalty_scale"] = g.op("Reciprocal", g.reduce_sum(
            rename[step.data_inputs[step.n_features + 1]], None, keepdims=0))
    if "step" in per_step:
        rename["step"] = g.op("Gather", per_step["step"], "iter__")
    rename.update({c: f"{c}__in" for c in carried})  # no outer-name shadowing
    g.nodes.extend(_renamed_nodes(graph.node, rename))
    g.op("Identity", "cond__", outputs=["cond__out"])
    outputs = [tensor_value_info("cond__out", TensorProto.BOOL, [])]
    outputs += [_renamed_value_info(by_name[c], f"{c}__new") for c in carried]
    outputs.append(tensor_value_info("loss", elem_type, []))
    inputs = [tensor_value_info("iter__", TensorProto.INT64, []),
              tensor_value_info("cond__", TensorProto.BOOL, [])]
    inputs += [_renamed_value_info(by_name[c], f"{c}__in") for c in carried]
    return g.make_graph("training_step_body", inputs, outputs, graph.initializer)


def _renamed_nodes(nodes, rename):
    """Copies of ``nodes`` reading ``rename[name]`` instead of ``name``,
    in the subgraphs they hold too (If branches, Loop and Scan bodies read
    the batch and the parameters from the enclosing scope), except where a
    subgraph defines the name itself."""
    out = []
    for node in nodes:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        out.append(copy)
    rename_many_reads(out, rename)  # the new names are all fresh
    return out


def build_epochs_loop(loop):
    """Several epochs in one ONNX ``Loop`` around the epoch loop.

    Every scalar input of the epoch loop but ``step`` and ``batch_size``
    becomes a vector ``<name>__per_epoch`` indexed by the epoch (schedules
    known in advance: constant, invscaling, optimal); ``step`` is the number
    of the very first step and advances by the number of batches per epoch.

    Parameters
    ----------
    loop : TrainingStep
        From :func:`build_training_loop`.

    Returns
    -------
    TrainingStep
        Inputs: data, ``n_epochs`` (int64, rank 0), the per-epoch vectors,
        ``step__first`` (the first step's number), ``batch_size``, the
        parameters. Outputs: ``epoch_losses`` of
        shape (n_epochs, n_batches), then the final parameters.
    """
    model = loop.model
    graph = model.graph
    opset = opset_of(model)
    by_name = {i.name: i for i in graph.input}
    carried = [name for w, group in zip(loop.weights, loop.states)
               for name in [w] + group] + list(loop.buffers)
    varying = [s for s in loop.scalar_inputs if s not in ("step", "batch_size")]
    taken = {n for node in graph.node for n in list(node.input) + list(node.output)}
    taken |= set(by_name) | {"epoch__", "econd__", "n_epochs", "step__first"}
    taken |= {f"{c}__ein" for c in carried}
    taken -= {"step"} | set(varying)  # inputs of the epoch loop, not of this graph
    g = GraphBuilder(opset, taken, prefix="epoch__")
    int64 = TensorProto.INT64
    elem_type = by_name[loop.data_inputs[loop.n_features]].type.tensor_type.elem_type
    rows = g.op("Gather", g.shape_of(loop.data_inputs[0]), g.const(0, int64))
    n_batches = g.op("Div", g.op("Add", rows, g.op("Sub", "batch_size",
                                                   g.const(1, int64))), "batch_size")
    # the epoch loop's nested body reads these names from the enclosing
    # scope: define them here (the outer graph names them differently)
    for name in varying:
        g.reserve(name)
        g.op("Gather", f"{name}__per_epoch", "epoch__", outputs=[name])
    offset = g.cast(g.op("Mul", "epoch__", n_batches), elem_type)
    g.reserve("step")
    g.op("Add", "step__first", offset, outputs=["step"])
    rename = {c: f"{c}__ein" for c in carried}
    g.nodes.extend(_renamed_nodes(graph.node, rename))
    g.op("Identity", "econd__", outputs=["econd__out"])
    finals = [o.name for o in graph.output[1:]]
    outputs = [tensor_value_info("econd__out", TensorProto.BOOL, [])]
    outputs += [_renamed_value_info(by_name[c], f)
                for f, c in zip(finals, carried)]
    outputs.append(tensor_value_info("losses", elem_type, [None]))
    inputs = [tensor_value_info("epoch__", int64, []),
              tensor_value_info("econd__", TensorProto.BOOL, [])]
    inputs += [_renamed_value_info(by_name[c], f"{c}__ein") for c in carried]
    body = g.make_graph("training_epoch_body", inputs, outputs, graph.initializer)
    outer = GraphBuilder(opset, taken | {f"{c}__all" for c in carried}
                         | {"epoch_losses"}, prefix="epochs__")
    outer.op("Loop", "n_epochs", "", *carried, body=body,
             outputs=[f"{c}__all" for c in carried] + ["epoch_losses"])
    inputs = [by_name[n] for n in loop.data_inputs]
    inputs.append(tensor_value_info("n_epochs", int64, []))
    inputs += [tensor_value_info(f"{s}__per_epoch", elem_type, [None])
               for s in varying]
    inputs += [tensor_value_info("step__first", elem_type, []),
               by_name["batch_size"]]
    inputs += [by_name[c] for c in carried]
    outputs = [tensor_value_info("epoch_losses", elem_type,
                                             [None, None])]
    outputs += [_renamed_value_info(by_name[c], f"{c}__all") for c in carried]
    epochs_graph = outer.make_graph("training_epochs", inputs, outputs)
    epochs = make_model(epochs_graph, list(model.opset_import),
                        ir_version=model.ir_version)
    return TrainingStep(epochs, list(loop.data_inputs),
                        ["n_epochs"] + [f"{s}__per_epoch" for s in varying]
                        + ["step__first", "batch_size"], list(loop.weights),
                        loop.states, list(loop.buffers), loop.n_features)


def final_activation(model):
    """(op_type, input name) of the node computing ``model``'s first output
    (seen through Identity nodes) when it is a Sigmoid or a Softmax over
    axis -1 or 1 (the class axis of an (N, C) output); (None, None)
    otherwise."""
    producers = {o: n for n in model.graph.node for o in n.output}
    node = producers.get(model.graph.output[0].name)
    while node is not None and node.op_type == "Identity":
        node = producers.get(node.input[0])
    if node is None or node.domain not in ("", "ai.onnx"):
        return None, None
    if node.op_type == "Sigmoid":
        return "Sigmoid", node.input[0]
    axis = next((a.i for a in node.attribute if a.name == "axis"), -1)
    if node.op_type == "Softmax" and axis in (-1, 1):
        return "Softmax", node.input[0]
    return None, None


def loss_on_logits(model, loss, types=None):
    """A loss on the probabilities of a final Softmax (cross-entropy) or
    Sigmoid (log loss), rewritten as the same loss on the logits for the
    fused paths: the activation's VJP is skipped (the gradient w.r.t. the
    logits is p - y per row where nothing is clipped), and the value and
    gradient are those of the clipped probabilities, as on the split path.
    Returns (model, loss): the arguments themselves when nothing is
    rewritten, new objects otherwise (the model's other outputs, the
    running statistics' updates, kept). ``types``: ``model``'s
    :func:`~onnxtrain.graph.infer_value_types` if known."""
    from ..losses.learning_losses import (CrossEntropyLearningLoss, NegLogLearningLoss,
                                          _CrossEntropyOfSoftmax, _LogLossOfSigmoid)
    from .rewrite import with_first_output

    kind, logits = final_activation(model)
    if kind == "Softmax" and isinstance(loss, CrossEntropyLearningLoss) \
            and not loss.from_logits:
        return with_first_output(model, logits, types), _CrossEntropyOfSoftmax(
            **loss.get_params())
    if kind == "Sigmoid" and isinstance(loss, NegLogLearningLoss) \
            and loss.probability_function in (None, "none"):
        return with_first_output(model, logits, types), _LogLossOfSigmoid(
            **loss.get_params())
    return model, loss


def build_split_models(prepared, wrt, outputs=None):
    """The split path's graphs of a prepared model: its one reverse pass
    (:func:`~onnxtrain.assembly.pipeline.reverse`), a forward model saving
    what the backward model reads, and the backward model through
    :func:`~onnxtrain.assembly.pipeline.finish` (one node per value, slow
    broadcasts avoided), as the fused step's nodes go.

    Parameters
    ----------
    prepared : Prepared
        From :func:`~onnxtrain.assembly.pipeline.prepare`.
    wrt : list of str
        Weights to differentiate against.
    outputs : list of str, default=None
        Outputs to differentiate (default: the float outputs depending on
        ``wrt``).

    Returns
    -------
    GradientModels
        As :func:`onnxtrain.autodiff.build_gradient_models` gives them (same
        interface and values, up to rounding).
    """
    models = gradient_models_from(reverse(prepared, wrt, outputs), prepared.model)
    gradient = models.backward_model
    graph = gradient.graph
    models.backward_model = finish(graph.node, graph.initializer, graph.input,
                                   graph.output, graph.name, gradient,
                                   forward_types=prepared.types)
    return models


class TrainingGraphs:
    """The training graphs of one prepared model, built on demand for the
    path a fit chooses and cached: the split models
    (:func:`build_split_models`) and the fused step and its loops, each from
    one reverse pass of the same prepared model with the same types.

    Parameters
    ----------
    model : onnx.ModelProto
        Prediction graph through :func:`~onnxtrain.assembly.pipeline.prepare`
        (the running statistics, ``buffer_names``, as inputs after the
        model's, their updates as outputs after its own), the trained
        weights among its initializers (their values are not read).
    weights : list of str
    learning_rate : BaseLearningRate
        Gives the state and scalar names, and writes the update into the
        step's builder.
    spec : dict or None
        ``loss`` (loss object, written into the step's builder),
        ``penalty``, ``penalized``, ``shapes`` (weight name -> shape),
        ``elem_type``, ``rank``; None: the graph computes its own loss and
        has no fused path.
    loss_graphs, update_graph : default=None
        Not used: accepted for the former signature (the split path's runner
        runs its own loss and update graphs).
    buffer_names : list of str, default=()
        The running statistics ``model`` updates (``Prepared.buffers``).
    types : dict, default=None
        ``model``'s :func:`~onnxtrain.graph.infer_value_types` (inferred
        here when None).
    in_place : bool, default=True
        Whether the 'step' graph updates in place (:func:`update_in_place`);
        False: the flat step. The trainer passes False off the CPU, where
        the If form has not been run (no GPU was at hand to test it), and
        for float16 weights (the If's inputs would be rounded to float16).
    deferred : list of str, default=()
        The weights whose update the 'step' graph leaves to its runner
        (``TrainingStep.deferred``,
        :func:`onnxtrain.runtime.segmented_update.deferred_weights`); the
        loops update every weight.
    """

    def __init__(self, model, weights, learning_rate, spec, loss_graphs=None,
                 update_graph=None, buffer_names=(), types=None, in_place=True,
                 deferred=()):
        types = infer_value_types(model) if types is None else types
        # shared with the runner's engine: the reverse passes name the
        # optional outputs their rules read on copies
        self.prepared = Prepared(model, types, list(buffer_names), owned=False)
        self.weights = list(weights)
        self.learning_rate = learning_rate
        self.spec = spec
        self.in_place = in_place
        self.deferred = list(deferred)
        self._cache = {}

    model = property(lambda self: self.prepared.model)
    types = property(lambda self: self.prepared.types)
    buffer_names = property(lambda self: self.prepared.buffers)

    def split(self, model=None, outputs=None):
        """The split path's :class:`~onnxtrain.autodiff.GradientModels` for
        the differentiated ``outputs`` (:func:`build_split_models`).

        Parameters
        ----------
        model : onnx.ModelProto, default=None
            None or :attr:`model` (what the runner's engine passes); another
            model is differentiated as it is, its types inferred, uncached.
        outputs : list of str, default=None
        """
        if model is not None and model is not self.model:
            return build_split_models(Prepared(model, infer_value_types(model)),
                                      self.weights, outputs)
        key = ("split", tuple(outputs or ()))
        if key not in self._cache:
            self._cache[key] = build_split_models(self.prepared, self.weights,
                                                  outputs)
        return self._cache[key]

    @gc_frozen
    def get(self, kind, weighted):
        """The graph ``kind`` as a :class:`TrainingStep`, or a str saying
        why it is unavailable: 'step' (:func:`update_in_place` of the flat
        step, what a runner runs step by step), 'flat step'
        (:func:`build_training_step`, whose nodes the loops hold), 'loop' or
        'epochs'."""
        key = (kind, bool(weighted))
        if key not in self._cache:
            if kind == "flat step":
                self._cache[key] = self._step(bool(weighted))
            elif kind == "step" and self.deferred:
                # its own reverse pass: the flat step (the loops') updates all
                step = self._step(bool(weighted), self.deferred)
                self._cache[key] = step if isinstance(step, str) or not self.in_place \
                    else update_in_place(step)
            else:
                step = self.get("flat step", weighted)
                if isinstance(step, str):
                    self._cache[key] = step
                elif kind == "step":
                    self._cache[key] = update_in_place(step) if self.in_place else step
                elif kind == "loop":
                    self._cache[key] = build_training_loop(step)
                else:
                    self._cache[key] = build_epochs_loop(self.get("loop", weighted))
        return self._cache[key]

    def _step(self, weighted, deferred=()):
        spec = self.spec
        if spec is None or spec.get("loss") is None:
            return "the graph computes its own loss"
        opset = opset_of(self.model)
        if opset is None or opset < FUSED_MIN_OPSET:
            return f"opset {opset} < {FUSED_MIN_OPSET}"
        model, loss = loss_on_logits(self.model, spec["loss"], self.types)
        # a rewrite on the logits is a copy of the step's own, and adds no
        # value: the types hold
        prepared = self.prepared if model is self.model else replace(
            self.prepared, model=model, owned=True)
        try:
            return _training_step(
                prepared, self.weights,
                loss_emitter(loss, spec["elem_type"], spec["rank"]),
                update_emitter(self.learning_rate,
                               [w for w in self.weights if w not in deferred],
                               spec["elem_type"], spec["penalty"], spec["penalized"]),
                self.learning_rate.state_names, self.learning_rate.scalar_names,
                weighted, deferred=deferred)
        except ValueError as exc:
            return str(exc)


class LossGraphs:
    """``(unweighted, weighted)`` loss graphs of a loss, each built at its
    first access (a fit without sample weights never builds the weighted
    one); the unweighted one ends as ``loss.loss_grad_onnx_``.

    Parameters
    ----------
    loss : BaseLearningLoss
    elem_type : int
    opset : int
    rank : int
    weight_name : str
        Sample-weight input of the weighted graph.
    """

    def __init__(self, loss, elem_type, opset, rank, weight_name):
        self.loss, self.elem_type, self.opset = loss, elem_type, opset
        self.rank, self.weight_name = rank, weight_name
        self._graphs = [None, None]

    def __len__(self):
        return 2

    def __getitem__(self, weighted):
        index = int(weighted)
        if self._graphs[index] is None:
            unweighted = getattr(self.loss, "loss_grad_onnx_", None)
            if index:
                self._graphs[1] = self.loss.build_onnx(
                    self.elem_type, self.opset, weight_name=self.weight_name,
                    rank=self.rank)
                if unweighted is not None:  # keep loss_grad_onnx_ unweighted
                    self.loss.loss_grad_onnx_ = unweighted
            else:
                self._graphs[0] = self.loss.build_onnx(
                    self.elem_type, self.opset, rank=self.rank)
        return self._graphs[index]


def small_graph_opset(model, default=17):
    """Opset of the loss and update graphs trained with ``model``: the
    model's (the ops the fused graphs write are the split path's) from
    :data:`FUSED_MIN_OPSET` on, ``default`` below."""
    opset = opset_of(model)
    return opset if opset is not None and opset >= FUSED_MIN_OPSET else default
