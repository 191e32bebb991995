"""VJP rules of control flow: If, Scan and Loop.

The branches of an ``If`` read outer-scope values (its implicit inputs, see
:func:`onnxtrain.autodiff.backward.implicit_inputs`); their gradients are
those of the branch taken. The rule builds, for each branch, a gradient
graph by running onnxtrain's own reverse pass on the branch seen as a small
model whose inputs are the outer values it reads: the branch's forward
nodes are recomputed inside the gradient branch under fresh names (so that
nothing crosses scopes but outer values and the incoming gradients), then
the gradient nodes follow. An ``If`` on the same condition selects the
gradients of the branch taken; a branch that does not use a value (or not
differentiably) gives it a zero gradient.

Scan: a first Scan recomputes the states entering each iteration (stacked
as scan outputs, in iteration order); a second Scan walks the iterations
backwards with the body's gradient graph (the body recomputed, then the
reverse pass): it carries the gradients of the float states and the
accumulated gradients of the outer values the body reads, reads each scan
input and the gradient of each scan output along its own axis in the
opposite direction, and stacks the gradients of the scan inputs along their
axes in the opposite direction, which puts them in place. Scan-8 (opset 8:
sequence_lens first, a batch axis 0, scans along axis 1) runs the same
Scans with its batch: the gradients of the outer values are accumulated per
batch element and summed at the end, and since Scan-8 stacks its outputs in
iteration order, the gradients of the inputs read forwards go through a
Scan-8 walking them backwards (sequence_lens respected: the padding steps
get a zero gradient). backward() refuses models below opset 8.

Loop: the reverse Loop runs the body's gradient graph for the forward
iteration i = N - 1 - iter (the body's iteration number input gets i; its
condition input true, as in every iteration run; the carried values
entering it and the gradients of the scan outputs are gathered at [i]),
carrying the gradients of the float carried values and the accumulated
gradients of the outer values the body reads. A first Loop recomputes the
carried values entering each iteration that the gradient reads (stacked as
scan outputs). N is the trip count M when the condition is absent or kept
true (the body's condition output is its condition input passed through
Identity, or a constant true): the reverse Loop then takes M and the
initial condition. Otherwise (no trip count, or a condition the body
computes) the forward recompute also carries an int64 counter incremented
each iteration, and N is its final value: the number of iterations run.

Not supported (a clear error): control flow nested inside a branch or a
body, sparse initializers in a subgraph, outer values of unknown type,
sequences or optionals carried by a body.
"""
from collections import ChainMap

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ...graph import FLOAT_TYPES, clean_shape
from ...graph.builder import constant_node_value
from ...graph.scopes import subgraphs
from ..backward import _accumulate, fold_output_identities, implicit_inputs
from ..expansion import (differentiate_nodes, outer_reads, prune_unread,
                         record_types, sub_builder)
from ..registry import register_vjp
from .recurrent import gru_scan_vjp, is_gru_scan, is_lstm_scan, lstm_scan_vjp


def _recomputed(ctx, sg, graph, what):
    """The nodes of ``graph`` with fresh names for its local values (its
    initializers become Constant nodes); returns ``(nodes, rename,
    constants)`` where ``rename`` maps a name of ``graph`` to its copy's
    (outer names map to themselves)."""
    if len(graph.sparse_initializer):
        ctx.fail(f"the {what} holds sparse initializers")
    renamed, nodes, constants = {}, [], {}

    def rename(name):
        return renamed.get(name, name)

    def fresh(name):
        renamed[name] = sg.unique_name(f"{name}_recomputed")
        return renamed[name]

    for init in graph.initializer:
        value = numpy_helper.to_array(init)
        name = fresh(init.name)
        constants[name] = value
        nodes.append(helper.make_node(
            "Constant", [], [name], name=sg.unique_name("Constant_node"),
            value=numpy_helper.from_array(value, name)))
    for node in graph.node:
        if subgraphs(node):
            ctx.fail(f"the {what} holds a {node.op_type} node "
                     f"({node.name!r}) with subgraphs: nested control flow "
                     "is not differentiated")
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.name = sg.unique_name(f"{node.op_type}_recomputed")
        del copy.input[:]
        copy.input.extend(rename(i) if i else "" for i in node.input)
        del copy.output[:]
        copy.output.extend(fresh(o) if o else "" for o in node.output)
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            value = constant_node_value(node)
            if value is not None:
                constants[copy.output[0]] = value
        nodes.append(copy)
    return nodes, rename, constants


def _grad_value_info(ctx, name, like):
    elem_type, shape = ctx.g.types[like]
    return helper.make_tensor_value_info(name, elem_type, clean_shape(shape))


def _branch_gradient(ctx, graph, grad_outputs, wrt, what):
    """A graph (no inputs) whose outputs are the gradients of ``wrt`` (outer
    values) through ``graph`` for the incoming ``grad_outputs``."""
    if len(graph.input):
        ctx.fail(f"the {what} has inputs")
    sg = sub_builder(ctx)
    nodes, rename, local_constants = _recomputed(ctx, sg, graph, what)
    outputs = [rename(o.name) for o in graph.output]
    record_types(sg, nodes, outer_reads(nodes), outputs, ctx.constants)
    grads = {}
    for out, gy in zip(outputs, grad_outputs):
        if gy:
            grads.setdefault(out, []).append(gy)
    constants = ChainMap(dict(local_constants), ctx.constants)
    # the branch, recomputed from the outer values, then its gradient
    grads = differentiate_nodes(sg, nodes, grads, wrt, constants)
    names = []
    for w in wrt:
        total = _accumulate(sg, grads, w)
        name = sg.unique_name(f"{w}_grad_{what.replace(' ', '_')}")
        if total is None:  # the branch does not use w differentiably
            total = sg.zeros_like(w)
        sg.op("Identity", total, outputs=[name])
        names.append(name)
    fold_output_identities(sg.nodes, names)  # see there: onnxruntime 1.32
    return sg.make_graph(
        f"{graph.name or what}_gradient", [],
        [_grad_value_info(ctx, n, w) for n, w in zip(names, wrt)])


@register_vjp("If")
def _if(ctx, *grad_outputs):
    wrt = [name for name, need in zip(ctx.implicit_inputs,
                                      ctx.implicit_needs_grad) if need]
    if not wrt:
        return None
    missing = [w for w in wrt if w not in ctx.g.types]
    if missing:
        ctx.fail(f"the types of the outer values {missing} are unknown")
    branches = {a.name: a.g for a in ctx.node.attribute}
    then_graph = _branch_gradient(ctx, branches["then_branch"], grad_outputs,
                                  wrt, "then branch")
    else_graph = _branch_gradient(ctx, branches["else_branch"], grad_outputs,
                                  wrt, "else branch")
    outs = [ctx.g.unique_name(f"{w}_grad_if") for w in wrt]
    ctx.g.op("If", ctx.inputs[0], outputs=outs, then_branch=then_graph,
             else_branch=else_graph)
    for name, w in zip(outs, wrt):
        elem_type, shape = ctx.g.types[w]
        ctx.g.set_type(name, elem_type, shape)
    grads = iter(outs)
    return tuple([None] * len(ctx.inputs)
                 + [next(grads) if need else None
                    for need in ctx.implicit_needs_grad])


# ---------------------------------------------------------------------------
# Scan
# ---------------------------------------------------------------------------

def _tensor_type(info):
    return helper.make_tensor_type_proto(info[0], clean_shape(info[1]))


def _slice_type(info, axes=(0,)):
    """Type of one element of a value of type ``info`` along ``axes`` (the
    scan axis, and the batch axis 0 of Scan-8): those dims are dropped."""
    if info is None:
        return None
    if info[1] is None:
        return (info[0], None)
    rank = len(info[1])
    drop = {int(a) + rank if int(a) < 0 else int(a) for a in axes}
    return (info[0], tuple(d for k, d in enumerate(info[1]) if k not in drop))


def _identity_outputs(sg, names, base):
    """Fresh names, each the Identity of one of ``names`` (graph outputs
    must be produced by a node of the graph). Once the graph is complete,
    :func:`fold_output_identities` drops those copying a value a node of
    the graph produces (onnxruntime 1.32 may otherwise break the graph)."""
    return [sg.op("Identity", n, outputs=[sg.unique_name(f"{base}_{i}")])
            for i, n in enumerate(names)]


class _ScanLayout:
    """Where a Scan node keeps its states and scan inputs, and how it walks
    them.

    Scan-8 (opset 8) takes ``sequence_lens`` first and every tensor has a
    leading batch axis: the body runs on each batch element, along axis 1,
    in the ``directions`` of its scan inputs; its scan outputs are stacked
    in iteration order. Scan-9 and later have no batch axis and walk
    ``scan_input_axes`` in ``scan_input_directions`` and stack along
    ``scan_output_axes`` in ``scan_output_directions`` (1: reverse).

    Attributes
    ----------
    body : onnx.GraphProto
    batched : bool
        True for Scan-8.
    first : int
        Index in the node's inputs of its first state (1 for Scan-8).
    seq_lens : str
        ``sequence_lens`` ('' when omitted or for Scan-9+).
    n_state, n_scan, n_scan_out : int
    in_axes, in_dirs : list of int
        Axis (of the outer tensor) and direction of each scan input.
    out_axes, out_dirs : list of int
        Axis and direction of each scan output.
    """

    def __init__(self, ctx):
        body = ctx.attributes["body"]
        n_scan = ctx.attr("num_scan_inputs")
        self.body, self.batched = body, ctx.opset < 9
        self.first = 1 if self.batched else 0
        self.seq_lens = (ctx.input(0) or "") if self.batched else ""
        self.n_state = len(ctx.inputs) - self.first - n_scan
        self.n_scan, self.n_scan_out = n_scan, len(body.output) - self.n_state
        if len(body.input) != self.n_state + n_scan or self.n_scan_out < 0:
            ctx.fail("the body's inputs and outputs do not match the node's")
        if self.batched:
            self.in_axes, self.out_axes = [1] * n_scan, [1] * self.n_scan_out
            self.in_dirs = self._ints(ctx, "directions", n_scan)
            self.out_dirs = [0] * self.n_scan_out
            return
        self.in_axes = self._ints(ctx, "scan_input_axes", n_scan)
        self.in_dirs = self._ints(ctx, "scan_input_directions", n_scan)
        self.out_axes = self._ints(ctx, "scan_output_axes", self.n_scan_out)
        self.out_dirs = self._ints(ctx, "scan_output_directions",
                                   self.n_scan_out)

    @staticmethod
    def _ints(ctx, name, count):
        values = [int(v) for v in ctx.attr(name, None) or [0] * count]
        if len(values) != count:
            ctx.fail(f"{name} has {len(values)} values for {count} scans")
        return values

    def element_axes(self, axis):
        """Axes of an outer tensor dropped in the body's element."""
        return (0, axis) if self.batched else (axis,)

    def scan_attributes(self, in_axes, in_dirs, out_axes=(), out_dirs=()):
        """Keyword attributes of a Scan of this form (defaults omitted)."""
        if self.batched:
            return {"directions": list(in_dirs) if any(in_dirs) else None}
        return {name: list(v) if any(v) else None for name, v in (
            ("scan_input_axes", in_axes), ("scan_input_directions", in_dirs),
            ("scan_output_axes", out_axes),
            ("scan_output_directions", out_dirs))}


def _body_input_types(ctx, body, fallback):
    """``(elem_type, shape)`` of each body input (from the body, else from
    ``fallback``: the types the node gives them)."""
    types = []
    for vi, info in zip(body.input, fallback):
        if vi.type.HasField("sequence_type") or vi.type.HasField(
                "optional_type"):
            ctx.fail(f"the body input {vi.name!r} is a sequence or an "
                     "optional: only tensors are differentiated")
        t = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and t.elem_type:
            shape = None
            if t.HasField("shape"):
                shape = tuple(d.dim_value if d.HasField("dim_value") else
                              (d.dim_param or None) for d in t.shape.dim)
            if info is None or (shape is not None and None not in shape):
                info = (t.elem_type, shape)
        if info is None:
            ctx.fail(f"the type of the body input {vi.name!r} is unknown")
        types.append(info)
    return types


def _scan_input_types(ctx, lay):
    states = ctx.inputs[lay.first:lay.first + lay.n_state]
    xs = ctx.inputs[lay.first + lay.n_state:]
    fallback = [_slice_type(ctx.g.types.get(name), (0,) if lay.batched else ())
                for name in states]
    fallback += [_slice_type(ctx.g.types.get(name), lay.element_axes(axis))
                 for name, axis in zip(xs, lay.in_axes)]
    return _body_input_types(ctx, lay.body, fallback)


def _renamed_body(ctx, sg, body, names, types, what="Scan body"):
    """The body's nodes recomputed in ``sg`` with its inputs named
    ``names`` (typed ``types``); returns ``(nodes, rename, constants)``."""
    stripped = onnx.GraphProto()
    stripped.CopyFrom(body)
    del stripped.input[:]
    nodes, rename, constants = _recomputed(ctx, sg, stripped, what)
    mapping = {vi.name: n for vi, n in zip(body.input, names)}
    for name, info in zip(names, types):
        sg.types[name] = info
    for node in nodes:
        for i, name in enumerate(node.input):
            if name in mapping:
                node.input[i] = mapping[name]

    def full_rename(name):
        return mapping.get(name, rename(name))
    outputs = [full_rename(o.name) for o in body.output]
    record_types(sg, nodes, outer_reads(nodes), outputs, ctx.constants)
    return nodes, full_rename, constants


def _stacking_graph(ctx, body, types, keep, keep_types, stack, what,
                    counter=False):
    """The body recomputed, returning its first ``keep`` outputs (typed
    ``keep_types``) then, as scan outputs, its inputs at the indices
    ``stack`` (the values entering each iteration). With ``counter``, a
    Loop body also carries an int64 scalar (input after the body's inputs,
    output after the kept ones) incremented once per iteration: its final
    value is the number of iterations run."""
    sg = sub_builder(ctx)
    names = [sg.unique_name(f"{vi.name}_fwd") for vi in body.input]
    nodes, rename, _ = _renamed_body(ctx, sg, body, names, types, what)
    sg.nodes.extend(nodes)
    outs = _identity_outputs(
        sg, [rename(o.name) for o in body.output[:keep]], "kept_out")
    vis = [helper.make_value_info(n, _tensor_type(t))
           for n, t in zip(names, types)]
    out_infos = list(keep_types)
    if counter:
        count = (onnx.TensorProto.INT64, ())
        count_in = sg.unique_name("iterations_in")
        vis.append(helper.make_value_info(count_in, _tensor_type(count)))
        outs.append(sg.op("Add", count_in,
                          sg.const(np.array(1), onnx.TensorProto.INT64),
                          outputs=[sg.unique_name("iterations_out")]))
        out_infos.append(count)
    outs += _identity_outputs(sg, [names[k] for k in stack], "stacked_in")
    prune_unread(sg.nodes, 0, len(nodes))
    fold_output_identities(sg.nodes, outs)
    out_vis = [helper.make_value_info(n, _tensor_type(t)) for n, t in zip(
        outs, out_infos + [types[k] for k in stack])]
    return sg.make_graph(f"{what.replace(' ', '_')}_states", vis, out_vis)


def _states_stack(ctx, lay, types):
    """A Scan recomputing the forward one whose scan outputs are the states
    entering each iteration, stacked in iteration order along axis 0 (axis
    1 for Scan-8); returns their names."""
    graph = _stacking_graph(ctx, lay.body, types, lay.n_state,
                            types[:lay.n_state], range(lay.n_state),
                            "Scan body")
    states = ctx.inputs[lay.first:lay.first + lay.n_state]
    finals = [ctx.g.unique_name("scan_state_final") for _ in states]
    stacks = [ctx.g.unique_name(f"{name}_stack") for name in states]
    ctx.g.op("Scan", *ctx.inputs, outputs=finals + stacks, body=graph,
             num_scan_inputs=lay.n_scan,
             **lay.scan_attributes(lay.in_axes, lay.in_dirs))
    return stacks


def _body_gradient(ctx, sg, body, names, types, wrt, out_grads, params,
                   what):
    """The body recomputed in ``sg`` (its inputs named ``names``), then its
    gradient nodes for the incoming ``out_grads`` (pairs ``(index of a body
    output, gradient name)``). Returns the gradients of the body inputs at
    the indices ``wrt`` (zeros where none flows) and those of the outer
    values ``params`` (None where none flows)."""
    nodes, rename, local_constants = _renamed_body(ctx, sg, body, names,
                                                   types, what)
    grads = {}
    for j, gy in out_grads:
        grads.setdefault(rename(body.output[j].name), []).append(gy)
    constants = ChainMap(dict(local_constants), ctx.constants)
    grads = differentiate_nodes(sg, nodes, grads,
                                [names[k] for k in wrt] + list(params),
                                constants)
    totals = []
    for k in wrt:
        value = _accumulate(sg, grads, names[k])
        totals.append(sg.zeros_like(names[k]) if value is None else value)
    return totals, [_accumulate(sg, grads, p) for p in params]


def _scan_gradient_graph(ctx, lay, types, states, xs, gz, params):
    """The body of the reverse Scan. States: the gradients of the float
    states (``states``: body input indices) and the accumulated gradients
    of the outer values ``params``; scan inputs: the states entering the
    iteration, the scan inputs and the gradients of the scan outputs ``gz``
    (indices among the scan outputs); scan outputs: the gradients of the
    scan inputs ``xs`` (body input indices)."""
    body, n_state, g = lay.body, lay.n_state, ctx.g
    sg = sub_builder(ctx)
    gs_in = [sg.unique_name(f"{body.input[k].name}_grad_in") for k in states]
    gp_in = [sg.unique_name(f"{p}_grad_acc") for p in params]
    names = [sg.unique_name(f"{vi.name}_bwd") for vi in body.input]
    gz_in = [sg.unique_name(f"{body.output[n_state + j].name}_grad_in")
             for j in gz]
    out_types = [_slice_type(g.types.get(ctx.outputs[n_state + j]),
                             lay.element_axes(lay.out_axes[j])) for j in gz]
    if any(t is None for t in out_types):
        ctx.fail("the types of the scan outputs are unknown")
    for name, k in zip(gs_in, states):
        sg.set_type(name, *types[k])
    for name, t in zip(gz_in, out_types):
        sg.set_type(name, *t)
    out_grads = [(k, gs) for gs, k in zip(gs_in, states)]
    out_grads += [(n_state + j, gzn) for gzn, j in zip(gz_in, gz)]
    totals, gp_values = _body_gradient(ctx, sg, body, names, types,
                                       states + xs, out_grads, params,
                                       "Scan body")
    gs_out, gx_out = totals[:len(states)], totals[len(states):]
    gp_out = [acc if value is None else sg.op("Add", acc, value)
              for acc, value in zip(gp_in, gp_values)]
    outs = _identity_outputs(sg, gs_out + gp_out + gx_out, "scan_grad")
    in_infos = ([types[k] for k in states] + [g.types[p] for p in params]
                + list(types) + out_types)
    in_vis = [helper.make_value_info(n, _tensor_type(t)) for n, t in zip(
        gs_in + gp_in + names + gz_in, in_infos)]
    out_infos = ([types[k] for k in states] + [g.types[p] for p in params]
                 + [types[m] for m in xs])
    out_vis = [helper.make_value_info(n, _tensor_type(t))
               for n, t in zip(outs, out_infos)]
    fold_output_identities(sg.nodes, outs)
    return sg.make_graph("scan_gradient", in_vis, out_vis)


def _batched_zeros(g, like, batch_of):
    """Zeros of shape [batch] + shape(like), batch = dim 0 of ``batch_of``."""
    batch = g.op("Gather", g.shape_of(batch_of), g.int64s([0]), axis=0)
    shape = g.op("Concat", batch, g.shape_of(like), axis=0)
    return g.op("Expand", g.const(0, g.elem_type(like)), shape)


def _reversed_steps(ctx, lay, name, info):
    """Scan-8: ``name`` [batch, seq, ...] with the first sequence_lens[b]
    steps of each batch element in reverse order (an Identity body walked
    backwards; its outputs are stacked in iteration order). ``info``: the
    type of one step."""
    sg = sub_builder(ctx)
    element = _tensor_type(info)
    x_in = sg.unique_name("step_in")
    out = sg.op("Identity", x_in, outputs=[sg.unique_name("step_out")])
    graph = sg.make_graph("reversed_steps",
                          [helper.make_value_info(x_in, element)],
                          [helper.make_value_info(out, element)])
    return ctx.g.op("Scan", lay.seq_lens, name, body=graph,
                    num_scan_inputs=1, directions=[1])


@register_vjp("Scan")
def _scan(ctx, *grad_outputs):
    """A forward Scan recomputes the states entering each iteration; a
    reverse Scan walks the iterations backwards with the body's gradient
    graph (see the module docstring). Each scan input is read by the
    reverse Scan along its own axis in the opposite direction, and so is
    the gradient of each scan output; the gradients of the scan inputs are
    stacked in the opposite direction, which puts them in place (Scan-8,
    whose scan outputs always follow the iterations, reverses the steps of
    those whose input ran forward)."""
    if is_lstm_scan(ctx, grad_outputs):  # an LSTM direction emitting its gates
        return lstm_scan_vjp(ctx, *grad_outputs)
    if is_gru_scan(ctx, grad_outputs):  # a GRU direction emitting its gates
        return gru_scan_vjp(ctx, *grad_outputs)
    lay = _ScanLayout(ctx)
    types = _scan_input_types(ctx, lay)
    g, n_state, first = ctx.g, lay.n_state, lay.first
    floats = [t[0] in FLOAT_TYPES for t in types]
    states = [k for k in range(n_state) if floats[k]]  # carried gradients
    params = [p for p, need in zip(ctx.implicit_inputs,
                                   ctx.implicit_needs_grad) if need]
    missing = [p for p in params if p not in g.types]
    if missing:
        ctx.fail(f"the types of the outer values {missing} are unknown")
    xs = [k for k in range(n_state, n_state + lay.n_scan)
          if ctx.needs_grad[first + k] and floats[k]]
    gz = [j for j in range(lay.n_scan_out) if grad_outputs[n_state + j]]
    graph = _scan_gradient_graph(ctx, lay, types, states, xs, gz, params)
    # a Scan without states (a map) recomputes nothing: no stack to read
    stacks = _states_stack(ctx, lay, types) if lay.n_state else []

    init_gs = [grad_outputs[k] or g.zeros_like(ctx.inputs[first + k])
               for k in states]
    batch_of = ctx.inputs[first]
    init_gp = [_batched_zeros(g, p, batch_of) if lay.batched
               else g.zeros_like(p) for p in params]
    scan_inputs = stacks + list(ctx.inputs[first + n_state:]) + [
        grad_outputs[n_state + j] for j in gz]
    final_gs = [g.unique_name(f"{ctx.inputs[first + k]}_grad_scan")
                for k in states]
    final_gp = [g.unique_name(f"{p}_grad_scan") for p in params]
    gx = [g.unique_name(f"{ctx.inputs[first + m]}_grad_scan") for m in xs]
    in_dirs = [1 - d for d in lay.in_dirs]
    g.op("Scan", *([lay.seq_lens] if lay.batched else []), *init_gs,
         *init_gp, *scan_inputs, outputs=final_gs + final_gp + gx,
         body=graph, num_scan_inputs=len(scan_inputs),
         **lay.scan_attributes(
             [0] * len(stacks) + lay.in_axes + [lay.out_axes[j] for j in gz],
             [1] * len(stacks) + in_dirs + [1 - lay.out_dirs[j] for j in gz],
             [lay.in_axes[m - n_state] for m in xs],
             [in_dirs[m - n_state] for m in xs]))
    if lay.batched:  # one sum per batch element
        final_gp = [g.reduce_sum(name, [0], keepdims=0) for name in final_gp]
    for name, p in zip(final_gp, params):
        g.set_type(name, *g.types[p])
    result = [None] * len(ctx.inputs)
    for name, k in zip(final_gs, states):
        result[first + k] = name if ctx.needs_grad[first + k] else None
    for name, m in zip(final_gs + gx, states + xs):
        if lay.batched and m >= n_state and lay.in_dirs[m - n_state] == 0:
            name = _reversed_steps(ctx, lay, name, types[m])
        if ctx.inputs[first + m] in g.types:
            g.set_type(name, *g.types[ctx.inputs[first + m]])
        if m >= n_state:
            result[first + m] = name
    grads_p = iter(final_gp)
    return tuple(result + [next(grads_p) if need else None
                           for need in ctx.implicit_needs_grad])


# ---------------------------------------------------------------------------
# Loop
# ---------------------------------------------------------------------------

def _is_true(value):
    return (value is not None and value.dtype == bool and value.size == 1
            and bool(value.reshape(-1)[0]))


def _condition_kept(ctx, body):
    """Whether the body's condition output is its condition input passed
    through (a chain of Identity) or a constant true: the loop then runs
    M iterations when its initial condition holds, none otherwise."""
    cond_in = body.input[1].name
    producers = {o: n for n in body.node for o in n.output}
    inits = {i.name: i for i in body.initializer}
    name = body.output[0].name
    while True:
        if name == cond_in:
            return True
        if name in inits:
            return _is_true(numpy_helper.to_array(inits[name]))
        node = producers.get(name)
        if node is None:  # an outer value
            return _is_true(ctx.constant_value(name))
        if node.op_type == "Identity" and node.domain in ("", "ai.onnx"):
            name = node.input[0]
        elif node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            return _is_true(constant_node_value(node))
        else:
            return False


def _loop_attributes(ctx):
    """``(body, n_state, n_scan_out, counted)``; ``counted``: the number of
    iterations is not the trip count alone (no trip count, or a condition
    the body computes), so the forward recompute counts them."""
    body = ctx.attributes["body"]
    n_state = len(ctx.inputs) - 2
    if len(body.input) != n_state + 2:
        ctx.fail("the body's inputs do not match the node's")
    counted = ctx.input(0) is None or not _condition_kept(ctx, body)
    return body, n_state, len(body.output) - 1 - n_state, counted


def _to_front(sg, start):
    """Move the nodes appended to ``sg`` since ``start`` to its front."""
    moved = sg.nodes[start:]
    del sg.nodes[start:]
    sg.nodes[:0] = moved


@register_vjp("Loop")
def _loop(ctx, *grad_outputs):
    """A forward Loop recomputes the carried values entering each iteration
    (stacked as scan outputs, only those the gradient reads) and, when the
    number of iterations is not the trip count alone, counts the
    iterations; a reverse Loop running that many iterations (forward index
    i = N - 1 - iter) runs the body's gradient graph, carrying the
    gradients of the float carried values and the accumulated gradients of
    the outer values, and reads the gradients of the scan outputs at [i]."""
    body, n_state, n_scan_out, counted = _loop_attributes(ctx)
    g = ctx.g
    n_out = n_state + n_scan_out  # trailing outputs may be omitted
    grad_outputs = list(grad_outputs) + [None] * (n_out - len(grad_outputs))
    outputs = list(ctx.outputs) + [""] * (n_out - len(ctx.outputs))
    fallback = [(onnx.TensorProto.INT64, ()), (onnx.TensorProto.BOOL, ())]
    fallback += [g.types.get(v) for v in ctx.inputs[2:]]
    types = _body_input_types(ctx, body, fallback)
    states = [k for k in range(n_state) if types[2 + k][0] in FLOAT_TYPES]
    params = [p for p, need in zip(ctx.implicit_inputs,
                                   ctx.implicit_needs_grad) if need]
    missing = [p for p in params if p not in g.types]
    if missing:
        ctx.fail(f"the types of the outer values {missing} are unknown")
    if not states and not params:
        return None
    gz = [j for j in range(n_scan_out) if grad_outputs[n_state + j]]
    out_types = [g.types.get(outputs[n_state + j]) for j in gz]
    if any(t is None for t in out_types):
        ctx.fail("the types of the scan outputs are unknown")
    # the number of iterations the reverse Loop runs: the trip count, or the
    # count the forward recompute records
    trip = g.unique_name("loop_iterations") if counted else ctx.inputs[0]

    # the reverse body: (iter, cond, gradients of the carried values,
    # accumulated gradients of the outer values)
    sg = sub_builder(ctx)
    it_in = sg.unique_name("loop_grad_iter")
    cond_in = sg.unique_name("loop_grad_cond")
    gs_in = [sg.unique_name(f"{body.input[2 + k].name}_grad_in")
             for k in states]
    gp_in = [sg.unique_name(f"{p}_grad_acc") for p in params]
    names = [sg.unique_name(f"{vi.name}_bwd") for vi in body.input]
    for name, k in zip(gs_in, states):
        sg.set_type(name, *types[2 + k])
    gz_at = [sg.unique_name(f"{body.output[1 + n_state + j].name}_grad_at")
             for j in gz]
    for name, t in zip(gz_at, out_types):
        sg.set_type(name, *_slice_type(t))
    out_grads = [(1 + k, gs) for gs, k in zip(gs_in, states)]
    out_grads += [(1 + n_state + j, name) for name, j in zip(gz_at, gz)]
    gs_out, gp_values = _body_gradient(
        ctx, sg, body, names, types, [2 + k for k in states], out_grads,
        params, "Loop body")
    gp_out = [acc if value is None else sg.op("Add", acc, value)
              for acc, value in zip(gp_in, gp_values)]
    outs = [sg.op("Identity", cond_in,
                  outputs=[sg.unique_name("loop_grad_cond_out")])]
    outs += _identity_outputs(sg, gs_out + gp_out, "loop_grad")
    read = {i for n in sg.nodes for i in list(n.input) + implicit_inputs(n)}
    stack = [k for k in range(n_state) if names[2 + k] in read]

    # the prelude (moved to the front): the forward index, the body's
    # condition input (true in every iteration run), the carried values
    # entering iteration i and the gradients of the scan outputs at i
    start = len(sg.nodes)
    index = sg.op("Sub", sg.op("Sub", trip, sg.int64s([1])), it_in)
    sg.op("Reshape", index, sg.int64s([]), outputs=[names[0]])
    if names[1] in read:
        sg.op("Identity", sg.const(True, onnx.TensorProto.BOOL),
              outputs=[names[1]])
    stacks = [g.unique_name(f"{ctx.inputs[2 + k]}_stack") for k in stack]
    for k, stacked in zip(stack, stacks):
        sg.op("Gather", stacked, names[0], axis=0, outputs=[names[2 + k]])
    for name, j in zip(gz_at, gz):
        if name not in read:  # the scan output does not depend on weights
            continue
        sg.op("Gather", grad_outputs[n_state + j], names[0], axis=0,
              outputs=[name])
    _to_front(sg, start)
    in_vis = [helper.make_value_info(it_in, _tensor_type(types[0])),
              helper.make_value_info(cond_in, _tensor_type(types[1]))]
    in_vis += [helper.make_value_info(n, _tensor_type(types[2 + k]))
               for n, k in zip(gs_in, states)]
    in_vis += [helper.make_value_info(n, _tensor_type(g.types[p]))
               for n, p in zip(gp_in, params)]
    out_infos = ([types[1]] + [types[2 + k] for k in states]
                 + [g.types[p] for p in params])
    out_vis = [helper.make_value_info(n, _tensor_type(t))
               for n, t in zip(outs, out_infos)]
    fold_output_identities(sg.nodes, outs)
    graph = sg.make_graph("loop_gradient", in_vis, out_vis)

    if stack or counted:  # the forward Loop stacking the carried values
        fwd = _stacking_graph(ctx, body, types, 1 + n_state,
                              [types[1]] + types[2:], [2 + k for k in stack],
                              "Loop body", counter=counted)
        finals = [g.unique_name("loop_state_final") for _ in range(n_state)]
        zero = ([g.const(np.array(0), onnx.TensorProto.INT64)] if counted
                else [])
        g.op("Loop", *ctx.inputs, *zero, body=fwd,
             outputs=finals + ([trip] if counted else []) + stacks)

    init_gs = []
    for k in states:
        gy = grad_outputs[k]
        like = outputs[k] or ctx.inputs[2 + k]
        init_gs.append(gy if gy else g.zeros_like(like))
    init_gp = [g.zeros_like(p) for p in params]
    final_gs = [g.unique_name(f"{ctx.inputs[2 + k]}_grad_loop")
                for k in states]
    final_gp = [g.unique_name(f"{p}_grad_loop") for p in params]
    g.op("Loop", trip, "" if counted else ctx.inputs[1], *init_gs, *init_gp,
         outputs=final_gs + final_gp, body=graph)
    for name, k in zip(final_gs, states):
        if ctx.inputs[2 + k] in g.types:
            g.set_type(name, *g.types[ctx.inputs[2 + k]])
    for name, p in zip(final_gp, params):
        g.set_type(name, *g.types[p])

    result = [None] * len(ctx.inputs)
    for name, k in zip(final_gs, states):
        result[2 + k] = name if ctx.needs_grad[2 + k] else None
    grads_p = iter(final_gp)
    return tuple(result + [next(grads_p) if need else None
                           for need in ctx.implicit_needs_grad])
