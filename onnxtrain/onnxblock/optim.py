"""Optimizer blocks (SGD, AdamW, ClipGradNorm, RuleOptimizer) and the
optimizer model.

An optimizer block emits one parameter update with standard ONNX ops: the
formula is an update rule of :mod:`onnxtrain.optim.update_rules` (the blocks
adapt the rules to onnxruntime-training's names and layouts).
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

import collections
import hashlib
import inspect
import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..graph import opset_of
from ..graph.builder import default_ir_version, tensor_value_info
from ..optim.links import AddPenalty, clip_factor
from ..optim.update_rules import AdamRule, SGDRule, UpdateRule
from ._base import DEFAULT_OPSET, current_base, empty_base
from ._block import Block

__all__ = ["SGD", "AdamW", "ClipGradNorm", "RuleOptimizer",
           "build_optimizer_model", "per_parameter_model", "OPTIMIZER_METADATA"]

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
        """Clip the gradients.

        Parameters
        ----------
        gradient_names : list of str or str
            The gradient tensors, or the name of one tensor sequence holding
            them (as onnxruntime's optimizer models take them; needs opset
            >= 17, for SequenceMap).

        Returns
        -------
        list of str or str
            The clipped tensors, or the name of the clipped sequence.
        """
        if isinstance(gradient_names, str):
            return _clip_sequence(current_base(), gradient_names, self._max_norm)
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
        factor = clip_factor(state, total, self._max_norm)
        return [op("Mul", g, op("Cast", factor, to=state.elem_type(g)))
                for g in gradient_names]


def _sequence_elem_type(state, name):
    """Element type of the tensor sequence ``name`` (an input, value_info or
    output of the base model, or inferred)."""
    graph = state.model.graph
    infos = list(graph.input) + list(graph.value_info) + list(graph.output)
    if not any(vi.name == name for vi in infos):
        inferred = onnx.shape_inference.infer_shapes(state.model)
        infos = list(inferred.graph.value_info)
    for vi in infos:
        if vi.name == name and vi.type.HasField("sequence_type"):
            return vi.type.sequence_type.elem_type.tensor_type.elem_type
    raise ValueError(f"ClipGradNorm: {name!r} is not a typed tensor sequence "
                     "of the base model.")


def _body(name, nodes, inputs, outputs):
    return helper.make_graph(
        nodes, name, [helper.make_tensor_value_info(n, e, None) for n, e in inputs],
        [helper.make_tensor_value_info(n, e, s) for n, e, s in outputs])


def _clip_sequence(state, sequence, max_norm):
    """ClipGradNorm over a tensor sequence: SequenceMap computes each
    tensor's sum of squares (in double) then scales every tensor."""
    if state.builder.opset < 17:
        raise ValueError("ClipGradNorm on a tensor sequence needs opset >= 17 "
                         f"(SequenceMap); the base model has opset "
                         f"{state.builder.opset}.")
    elem, double = _sequence_elem_type(state, sequence), TensorProto.DOUBLE
    squares_body = _body("sum_of_squares", [
        helper.make_node("Cast", ["g"], ["g64"], to=double),
        helper.make_node("Mul", ["g64", "g64"], ["sq"]),
        helper.make_node("ReduceSum", ["sq"], ["total"], keepdims=0)],
        [("g", elem)], [("total", double, [])])
    squares = state.op("SequenceMap", sequence, body=squares_body)
    total = state.op("ReduceSum", state.op("ConcatFromSequence", squares, axis=0,
                                           new_axis=1), keepdims=0)
    factor = state.op("Cast", clip_factor(state, total, max_norm), to=int(elem))
    scale_body = _body("scale", [helper.make_node("Mul", ["g", "c"], ["scaled"])],
                       [("g", elem), ("c", elem)], [("scaled", elem, None)])
    return state.op("SequenceMap", sequence, factor, body=scale_body)


class _Emitter:
    """The base model's state seen as an update-rule emitter
    (:meth:`onnxtrain.optim.update_rules.UpdateRule.update`): it names the
    outputs itself. Nodes and constants go to the state's builder and join
    the model at :meth:`flush` (or at the state's next emission), not one
    by one (5,500 nodes for the AdamW updates of a 24-layer encoder)."""

    def __init__(self, state):
        self.state = state
        state.sync()

    def op(self, op_type, *inputs, outputs=None, **attributes):
        if outputs is not None:
            # the names the builder would have given are taken all the same:
            # the model is, byte for byte, the one earlier versions made by
            # renaming the outputs afterwards (api.Optimizer recognizes the
            # models it can run flat by their bytes, api/_flat.py)
            for _ in outputs:
                self.state.builder.unique_name(op_type.lower())
        return self.state.builder.op(op_type, *inputs, outputs=outputs, **attributes)

    def const(self, value, elem_type):
        return self.state.builder.const(value, elem_type)

    @property
    def opset(self):
        """Default-domain opset of the base model."""
        return self.state.builder.opset

    def flush(self):
        """Move the pending nodes and constants into the model."""
        self.state._flush()


def _accepts_outputs(method):
    """Whether ``method`` (a block's ``build``, a rule's ``update``) takes
    the ``outputs`` keyword (a subclass written before it did not)."""
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "outputs" or p.kind is inspect.Parameter.VAR_KEYWORD
               for p in parameters)


class _OptimizerBlock(Block):
    """Apply one update rule to every parameter."""

    #: Names of the per-parameter optimizer states.
    state_names = ()

    def __init__(self, clip_grad=None):
        super().__init__()
        self._clip_grad = clip_grad

    def build(self, learning_rate, step=None, parameters=None, gradients=None,
              states=None, outputs=None):
        """Emit the update of each parameter.

        Called with one argument, the ``(trainable, frozen)`` pair of
        :meth:`TrainingBlock.parameters`, inside ``with
        onnxblock.empty_base():``, the block builds onnxruntime's optimizer
        model layout instead (see :meth:`build_sequence_model`).

        Parameters
        ----------
        learning_rate : str
            Rank-0 double value.
        step : str
            Rank-0 int64 value, 1 for the first step.
        parameters, gradients : list of str
        states : list of tuple of str, default=None
            One tuple of :attr:`state_names` values per parameter.
        outputs : list of tuple of str, default=None
            Per parameter, the names (reserved by the caller) of its new
            value then of its new states; None: the builder names them.

        Returns
        -------
        new_parameters : list of str
        new_states : list of tuple of str
        """
        if step is None and parameters is None:
            return self.build_sequence_model(learning_rate)
        state = current_base()
        if self._clip_grad is not None:
            gradients = self._clip_grad(list(gradients))
        states = states or [()] * len(parameters)
        outputs = outputs or [None] * len(parameters)
        rule, emitter = self.update_rule(), _Emitter(state)
        # a rule of onnxtrain's names the outputs itself; a custom rule
        # without the keyword gets its outputs renamed afterwards
        names_outputs = _accepts_outputs(getattr(rule, "rule", rule).update)
        if getattr(rule, "needs_all", False):
            return self._build_all(rule, emitter, learning_rate, step, parameters,
                                   gradients, states,
                                   outputs if names_outputs else None)
        # the scalars (rate, step, bias-corrected step size, decay) once per
        # element type, shared by every parameter's update
        scalars = {}
        new_params, new_states = [], []
        for param, grad, param_states, names in zip(parameters, gradients, states,
                                                    outputs):
            elem = state.elem_type(param)
            if elem not in scalars:
                scalars[elem] = self._scalars(rule, emitter, elem, learning_rate, step)
            named = {"outputs": names} if names and names_outputs else {}
            new_param, new_state = rule.update(emitter, elem, param, grad,
                                               param_states, scalars[elem], **named)
            new_params.append(new_param)
            new_states.append(tuple(new_state))
        emitter.flush()
        return new_params, new_states

    def _build_all(self, rule, emitter, learning_rate, step, parameters,
                   gradients, states, outputs):
        """The update of a rule reading every gradient at once (global-norm
        clipping): one element type, one ``update_all``."""
        state = emitter.state
        elems = sorted({state.elem_type(p) for p in parameters})
        if len(elems) != 1:
            raise ValueError(f"{rule!r} reads every gradient at once; the "
                             f"parameters have several element types {elems}.")
        scalars = self._scalars(rule, emitter, elems[0], learning_rate, step)
        new_params, new_states, _ = rule.update_all(
            emitter, elems[0], list(parameters), list(gradients), list(states),
            scalars, outputs)
        emitter.flush()
        return new_params, new_states

    def _scalars(self, rule, emitter, elem, learning_rate, step):
        """The rule's scalars in element type ``elem``."""
        scalars = {"learning_rate": emitter.op("Cast", learning_rate, to=int(elem))}
        if rule.reads_step:
            scalars["step"] = emitter.op("Cast", step, to=int(elem))
        self._adapt_scalars(rule, emitter, elem, scalars)
        return scalars

    def update_rule(self):
        """The :class:`~onnxtrain.optim.update_rules.UpdateRule` the block applies."""
        raise NotImplementedError

    def _adapt_scalars(self, rule, emitter, elem, scalars):
        """Complete ``scalars`` before the rule's update (adapters)."""

    #: Names of the state sequences of the onnxruntime layout, one per
    #: :attr:`state_names` entry.
    sequence_names = ()

    def build_sequence_model(self, parameters):
        """Build onnxruntime's optimizer model layout in the base model.

        Parameters
        ----------
        parameters : tuple (trainable, frozen)
            Lists of onnx.TensorProto, as :meth:`TrainingBlock.parameters`
            returns; only ``trainable`` is used (at least one, one element
            type).

        Returns
        -------
        str
            ``"updated_flag"``, a bool tensor of shape [1] (always true).

        Notes
        -----
        Inputs: ``learning_rate`` (float [1]), ``step`` (int64 [1], 1 for
        the first step), then tensor sequences ``params``, ``gradients``
        and the states (AdamW: ``first_order_moments``,
        ``second_order_moments``), in the order of ``trainable``. Outputs:
        ``updated_flag``, then the sequences ``params.updated`` and
        ``<state>.updated`` (stock onnxruntime has no in-place update, so
        the new values are outputs).

        Raises
        ------
        TypeError
            If ``parameters`` is not a (trainable, frozen) pair of lists of
            onnx.TensorProto.
        ValueError
            With no trainable parameter, or parameters of several element
            types.
        """
        if not (isinstance(parameters, (tuple, list)) and len(parameters) == 2
                and all(isinstance(t, onnx.TensorProto)
                        for part in parameters for t in part)):
            raise TypeError(f"{type(self).__name__}(parameters): parameters must "
                            "be the (trainable, frozen) pair of "
                            "TrainingBlock.parameters().")
        trainable = list(parameters[0])
        if not trainable:
            raise ValueError("The optimizer model needs at least one trainable "
                             "parameter (TrainingBlock.requires_grad).")
        elems = {t.data_type for t in trainable}
        if len(elems) > 1:
            raise ValueError("The trainable parameters have several element "
                             f"types {sorted(elems)}; one tensor sequence "
                             "holds one type.")
        state, elem = current_base(), elems.pop()
        graph = state.model.graph
        lr = state.add_input("learning_rate", TensorProto.FLOAT, (1,))
        step = state.add_input("step", TensorProto.INT64, (1,))
        sequences = ["params", "gradients", *self.sequence_names]
        for name in sequences:
            state.builder.reserve(name)
            graph.input.append(helper.make_tensor_sequence_value_info(name, elem, None))
        state.sync()
        unpacked = {name: [] for name in sequences}
        for i, tensor in enumerate(trainable):
            index = state.const(i, TensorProto.INT64)
            for name in sequences:
                value = state.op("SequenceAt", name, index)
                state.builder.set_type(value, elem, tuple(tensor.dims))
                unpacked[name].append(value)
        moments = list(zip(*(unpacked[n] for n in self.sequence_names))) or None
        new_params, new_states = self.build(
            lr, step,
            unpacked["params"], unpacked["gradients"], moments)
        flag = state.builder.reserve("updated_flag")
        state.op("Constant", outputs=[flag], value=helper.make_tensor(
            "updated_flag", TensorProto.BOOL, [1], [True]))
        graph.output.append(helper.make_tensor_value_info(flag, TensorProto.BOOL, [1]))
        columns = [new_params] + [list(c) for c in zip(*new_states)]
        for name, values in zip(["params", *self.sequence_names], columns):
            target = state.builder.reserve(f"{name}.updated")
            state.op("SequenceConstruct", *values, outputs=[target])
            graph.output.append(helper.make_tensor_sequence_value_info(target, elem, None))
        state.sync()
        # what api.Optimizer needs to run it (per_parameter_model): the
        # sequences do not name the parameters
        layout = {"optimizer": type(self).__name__, "layout": "sequence",
                  "parameters": [t.name for t in trainable],
                  "states": list(self.state_names),
                  "sequences": list(self.sequence_names),
                  "hyperparameters": self.hyperparameters()}
        entry = state.model.metadata_props.add()
        entry.key = OPTIMIZER_METADATA
        entry.value = json.dumps(layout)
        return flag

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

    def update_rule(self):
        return SGDRule()


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

    computed as :class:`onnxtrain.optim.update_rules.AdamRule` (PyTorch's
    decoupled decay) with the step size ``s (1 - lr weight_decay)``.

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
    sequence_names = ("first_order_moments", "second_order_moments")

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

    def update_rule(self):
        return AdamRule(self._betas[0], self._betas[1], self._eps,
                        self._weight_decay, self._bias_correction)

    def _adapt_scalars(self, rule, emitter, elem, scalars):
        """HuggingFace's AdamW decays the updated parameter: with d = lr *
        weight_decay, (p - s u)(1 - d) = p - d p - s (1 - d) u, the rule's
        formula with the step size s (1 - d)."""
        decay = rule.decay(emitter, elem, scalars)
        if decay is not None:
            size = rule.step_size(emitter, elem, scalars)
            scalars["step_size"] = emitter.op(
                "Mul", size, emitter.op("Sub", emitter.const(1.0, elem), decay))


class RuleOptimizer(_OptimizerBlock):
    """The optimizer block of any update rule, a chain of links included.

    ``generate_artifacts(optimizer=rule)`` and :func:`build_optimizer_model`
    wrap an :class:`~onnxtrain.optim.update_rules.UpdateRule` into this
    block, e.g. ``chain(ClipByGlobalNorm(1.0), AdamRule(weight_decay=0.01))``
    (:func:`onnxtrain.optim.chain`): the optimizer model then clips, decays
    and steps as the chain says, and :class:`onnxtrain.api.Optimizer` runs
    it as any optimizer model.

    Parameters
    ----------
    rule : UpdateRule
        Its state names (:attr:`UpdateRule.state_names`, e.g. ``m`` and
        ``v`` for Adam) name the optimizer states (``p.m``, ``p.v``).
    clip_grad : ClipGradNorm, default=None
        Applied to the gradients first.

    Raises
    ------
    TypeError
        ``rule`` is not an update rule.
    ValueError
        A link's parameter out of its range, or a penalty link
        (:class:`~onnxtrain.optim.links.AddPenalty`: the optimizer model
        has no loss to add its value to, nor the batch's size to scale it).
    """

    def __init__(self, rule, clip_grad=None):
        super().__init__(clip_grad)
        if not isinstance(rule, UpdateRule):
            raise TypeError(f"RuleOptimizer needs an UpdateRule "
                            f"(onnxtrain.optim.update_rules), not {rule!r}.")
        for link in getattr(rule, "links", ()):
            if isinstance(link, AddPenalty):
                raise ValueError("An optimizer model cannot hold a penalty link "
                                 "(AddPenalty): it has no loss to add the "
                                 "penalty to; add the penalty to the loss.")
            link.check()
        self._rule = rule

    @property
    def state_names(self):
        return tuple(self._rule.state_names)

    @property
    def sequence_names(self):
        return self.state_names

    def update_rule(self):
        return self._rule

    def hyperparameters(self):
        return {"rule": repr(self._rule)}


def _param_spec(param):
    if isinstance(param, onnx.TensorProto):
        return param.name, param.data_type, list(param.dims)
    name, elem_type, shape = param
    return name, int(elem_type), list(shape)


def _name_outputs(graph, pairs):
    """Make each value of ``pairs`` (target, value) the graph output
    ``target``: the node computing it writes the output itself, renamed
    everywhere (an Identity copy per output costs a copy at every step);
    an Identity only for a value that is a graph input or
    stands for several outputs."""
    produced = {o for node in graph.node for o in node.output}
    uses = collections.Counter(value for _, value in pairs)
    rename = {value: target for target, value in pairs
              if value in produced and uses[value] == 1}
    for node in graph.node:
        for field in (node.input, node.output):
            for i, name in enumerate(field):
                if name in rename:
                    field[i] = rename[name]
    graph.node.extend(helper.make_node("Identity", [value], [target],
                                       name=f"{target}_copy")
                      for target, value in pairs if value not in rename)


def graph_digest(model):
    """SHA-256 (hex) of ``model``'s graph serialized deterministically: its
    nodes, initializers (values included), inputs and outputs; not the
    model's metadata.

    Parameters
    ----------
    model : onnx.ModelProto

    Returns
    -------
    str
    """
    data = model.graph.SerializeToString(deterministic=True)
    return hashlib.sha256(data).hexdigest()


def build_optimizer_model(optimizer, parameters, opset_version=None):
    """The optimizer model of ``optimizer`` for ``parameters``.

    Parameters
    ----------
    optimizer : SGD, AdamW, RuleOptimizer or UpdateRule
        An update rule (a chain included, :func:`onnxtrain.optim.chain`)
        is wrapped into :class:`RuleOptimizer`.
    parameters : list of onnx.TensorProto or (name, elem_type, shape)
        The trainable parameters.
    opset_version : int, default=None
        Default-domain opset (None: the onnxblock default). The IR version is
        the lowest that opset needs, which onnxruntime reads.

    Returns
    -------
    onnx.ModelProto
        Layout in the module docstring; metadata key
        :data:`OPTIMIZER_METADATA` holds the parameter and state names and,
        for :class:`SGD` and :class:`AdamW` without clipping, the
        :func:`graph_digest` of its graph (``graph_digest``).

    Raises
    ------
    TypeError
        If ``optimizer`` is neither an optimizer block nor an update rule.
    ValueError
        If a generated input or output name collides with a parameter name;
        a rule that reads every gradient (global-norm clipping) with
        parameters of several element types; a penalty link or a link's
        parameter out of its range (:class:`RuleOptimizer`).
    """
    if isinstance(optimizer, UpdateRule):
        optimizer = RuleOptimizer(optimizer)
    if not isinstance(optimizer, _OptimizerBlock):
        raise TypeError(f"optimizer must be an onnxblock.optim block (SGD, AdamW, "
                        f"RuleOptimizer) or an UpdateRule, not "
                        f"{type(optimizer).__name__}.")
    specs = [_param_spec(p) for p in parameters]
    with empty_base(opset_version or DEFAULT_OPSET) as accessor:
        model = accessor.model
        state = current_base()
        lr = state.add_input("learning_rate", TensorProto.DOUBLE, ())
        step = state.add_input("step", TensorProto.INT64, ())
        names, grads, states, targets = [], [], [], []
        for name, elem, shape in specs:
            names.append(state.add_input(name, elem, shape))
            grads.append(state.add_input(f"{name}_grad", elem, shape))
            states.append(tuple(state.add_input(f"{name}.{s}", elem, shape)
                                for s in optimizer.state_names))
        for name, _, _ in specs:
            targets.append(tuple(state.builder.reserve(t) for t in [f"{name}.updated"] + [
                f"{name}.{s}.updated" for s in optimizer.state_names]))
        # the update nodes write the outputs themselves (an Identity copy per
        # output costs a copy at every step)
        named = {"outputs": targets} if _accepts_outputs(optimizer.build) else {}
        new_params, new_states = optimizer(lr, step, names, grads, states, **named)
        outputs, pairs = [], []
        for (name, elem, shape), p, ss, names_out in zip(specs, new_params,
                                                         new_states, targets):
            for target, value in zip(names_out, (p,) + tuple(ss)):
                pairs.append((target, value))
                outputs.append(tensor_value_info(target, elem, shape))
        model.graph.output.extend(outputs)
        result = onnx.ModelProto()
        result.CopyFrom(model)
    if any(target != value for target, value in pairs):  # a custom block or rule
        _name_outputs(result.graph, pairs)
    result.ir_version = default_ir_version(result.opset_import)
    layout = {"optimizer": type(optimizer).__name__,
              "parameters": [s[0] for s in specs],
              "states": list(optimizer.state_names),
              "hyperparameters": optimizer.hyperparameters()}
    if type(optimizer) in (SGD, AdamW) and optimizer._clip_grad is None:
        # a graph that its metadata alone defines, recognised later by this
        # digest (onnxtrain.api._flat): an edited graph no longer matches it
        layout["graph_digest"] = graph_digest(result)
    entry = result.metadata_props.add()
    entry.key = OPTIMIZER_METADATA
    entry.value = json.dumps(layout)
    # the structure only (tests check the types too: full_check, slow on
    # large models)
    onnx.checker.check_model(result)
    return result


def per_parameter_model(model, layout, specs):
    """The optimizer model of :func:`build_optimizer_model`'s layout running
    ``model``, an optimizer block's sequence layout
    (:meth:`_OptimizerBlock.build_sequence_model`, onnxruntime-training's
    manual workflow): the parameters, gradients and states are packed into
    its sequences and its updated sequences unpacked.

    Parameters
    ----------
    model : onnx.ModelProto
        The sequence-layout model; not modified.
    layout : dict
        Its :data:`OPTIMIZER_METADATA` (``"layout": "sequence"``).
    specs : list of (str, int, tuple)
        ``(name, elem_type, shape)`` of each parameter of
        ``layout["parameters"]``, in that order.

    Returns
    -------
    onnx.ModelProto
        Inputs and outputs as :func:`build_optimizer_model`'s, metadata
        :data:`OPTIMIZER_METADATA` with the parameter and state names.

    Raises
    ------
    ValueError
        If ``specs`` do not name ``layout``'s parameters in order.
    """
    names = [s[0] for s in specs]
    if names != list(layout["parameters"]):
        raise ValueError(f"The optimizer model updates {layout['parameters']}; "
                         f"the parameters given are {names}.")
    states, sequences = list(layout["states"]), list(layout["sequences"])
    inner = onnx.compose.add_prefix(model, "sequence/")
    elem = specs[0][1]
    with empty_base(opset_of(model) or DEFAULT_OPSET) as accessor:
        state = current_base()
        op = state.op
        lr = state.add_input("learning_rate", TensorProto.DOUBLE, ())
        step = state.add_input("step", TensorProto.INT64, ())
        one = state.const(np.array([1]), TensorProto.INT64)
        packed = {"learning_rate": op("Reshape", op("Cast", lr, to=TensorProto.FLOAT),
                                      one),
                  "step": op("Reshape", step, one)}
        columns = {"params": [], "gradients": [], **{q: [] for q in sequences}}
        for name, el, shape in specs:
            columns["params"].append(state.add_input(name, el, shape))
            columns["gradients"].append(state.add_input(f"{name}_grad", el, shape))
            for key, sequence in zip(states, sequences):
                columns[sequence].append(state.add_input(f"{name}.{key}", el, shape))
        for sequence, values in columns.items():
            packed[sequence] = op("SequenceConstruct", *values)
        state.sync()
        outer = onnx.ModelProto()
        outer.CopyFrom(accessor.model)
    for sequence, value in packed.items():
        outer.graph.output.append(
            helper.make_tensor_sequence_value_info(value, elem, None)
            if sequence in columns else
            helper.make_tensor_value_info(value, TensorProto.FLOAT if sequence ==
                                          "learning_rate" else TensorProto.INT64, [1]))
    joined = onnx.compose.merge_models(
        outer, inner, [(value, f"sequence/{key}") for key, value in packed.items()],
        outputs=[f"sequence/{q}.updated" for q in ["params", *sequences]])
    graph = joined.graph
    del graph.output[:]
    used = {n for node in graph.node for n in [*node.input, *node.output]}
    used.update(i.name for i in graph.initializer)
    for k, (name, el, shape) in enumerate(specs):
        index = f"sequence_index_{k}"
        while index in used:
            index += "_"
        graph.initializer.append(numpy_helper.from_array(np.array(k, dtype=np.int64),
                                                         index))
        for source, target in [("params", f"{name}.updated")] + [
                (q, f"{name}.{key}.updated") for key, q in zip(states, sequences)]:
            graph.node.append(helper.make_node(
                "SequenceAt", [f"sequence/{source}.updated", index], [target]))
            graph.output.append(tensor_value_info(target, el, shape))
    joined.ir_version = default_ir_version(joined.opset_import)
    del joined.metadata_props[:]
    entry = joined.metadata_props.add()
    entry.key = OPTIMIZER_METADATA
    entry.value = json.dumps({"optimizer": layout["optimizer"], "parameters": names,
                              "states": states,
                              "hyperparameters": layout.get("hyperparameters", {})})
    onnx.checker.check_model(joined)
    return joined
