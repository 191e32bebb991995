"""LSTMs of a training graph as one Scan per direction emitting its gates.

The gradient of an LSTM needs the activations of its gates at every step;
onnxruntime's LSTM kernel keeps them to itself, so a gradient reading only
its outputs computes them again (the input and recurrent products over the
whole sequence, a Scan for the cell states). :func:`lower_lstms` rewrites a
default LSTM (the specification's activations, no clip, peepholes,
input_forget, sequence_lens nor layout) whose inputs depend on a trained
weight into, per direction:

- the input projection of every step at once, ``X W^T + Wb + Rb``, one
  Gemm over the (time x batch) rows;
- a Scan over time (backwards for a reverse direction) whose body is one
  step: one Gemm ``h R^T + x_t``, the sigmoid of the i, o, f gates, the
  tanh of the c gate, the cell and hidden states; besides the states and
  the hidden state of every step (the LSTM's Y) it emits, as scan outputs
  in the order of time, the sigmoids of (i, o, f), tanh of the c gate,
  tanh of the cell state and the cell state entering every step.

The Scan is marked (``doc_string`` :data:`LSTM_SCAN_DOC`) so that the
reverse pass gives it the direct LSTM gradient, which reads those outputs
instead of recomputing them (:mod:`onnxtrain.autodiff.rules.recurrent`).
The directions' outputs are stacked into the node's Y, Y_h and Y_c; the
values are the kernel's up to rounding. Where W, R or B is a Concat along
axis 0 of one value per direction (torch's export of a bidirectional
layer), each direction reads its own value and the Concat leaves the graph
once nothing else reads it.

A GRU as torch exports it (``linear_before_reset``, the specification's
activations, no clip, sequence_lens nor layout) is lowered likewise: the
input projection ``X W^T + Wb`` in one Gemm, and a Scan per direction
whose step is one Gemm ``h R^T + Rb``, the sigmoid of z and r, the
candidate ``n = tanh(x_n + r . rec_n)`` and ``H = n + z (H_prev - n)``;
it emits, besides the state and Y, the sigmoids of (z, r), n and
``rec_n = H_prev Rh^T + Rbh``; it is marked :data:`GRU_SCAN_DOC`.
:func:`lower_recurrent` lowers both (the training graphs' preparation).
"""
from __future__ import annotations

from onnx import TensorProto, helper

from .builder import GraphBuilder, rewrite_nodes
from .scopes import graph_names, node_reads
from .shapes import infer_value_types

__all__ = ["GRU_SCAN_DOC", "GRU_SCAN_OUTPUTS", "LSTM_SCAN_DOC",
           "LSTM_SCAN_OUTPUTS", "is_default_gru", "is_default_lstm",
           "lower_lstms", "lower_recurrent"]

#: doc_string of the Scan of one lowered LSTM direction.
LSTM_SCAN_DOC = "onnxtrain: one LSTM direction, gates emitted"
#: The outputs of that Scan: the final states, then the scan outputs.
LSTM_SCAN_OUTPUTS = ("h_last", "c_last", "y", "ifo", "c_gate", "tanh_c", "c_prev")
#: doc_string of the Scan of one lowered GRU direction.
GRU_SCAN_DOC = "onnxtrain: one GRU direction, gates emitted"
#: The outputs of that Scan: the final state, then the scan outputs (the
#: sigmoids of z and r, the candidate n, the recurrent product's n part).
GRU_SCAN_OUTPUTS = ("h_last", "y", "zr", "n", "rec_n")


def _attr(node, name, default=None):
    for att in node.attribute:
        if att.name == name:
            return helper.get_attribute_value(att)
    return default


def _static_sizes(node, types):
    """(hidden, input size) when both are static, else None."""
    hidden = _attr(node, "hidden_size")
    w_shape = (types.get(node.input[1]) or (None, None))[1]
    r_shape = (types.get(node.input[2]) or (None, None))[1]
    x_shape = (types.get(node.input[0]) or (None, None))[1]
    if not hidden and r_shape is not None and len(r_shape) == 3:
        hidden = r_shape[2]
    size = w_shape[2] if w_shape is not None and len(w_shape) == 3 else None
    if not isinstance(size, int) and x_shape:
        size = x_shape[-1]  # W built in the graph (torch's dynamo export)
    if not isinstance(hidden, int) or not isinstance(size, int):
        return None
    return int(hidden), int(size)


def is_default_lstm(node, opset):
    """Whether ``node`` is an LSTM with the specification's activations,
    no clip, peepholes, input_forget, sequence_lens nor layout, its Y
    computed, at opset 13 or later (Split with sizes as an input)."""
    if node.op_type != "LSTM" or node.domain not in ("", "ai.onnx") or opset < 13:
        return False
    inputs = list(node.input) + [""] * 8
    names = [n.decode() if isinstance(n, bytes) else n
             for n in _attr(node, "activations", [])]
    return (bool(node.output and node.output[0]) and not inputs[4]
            and not inputs[7] and _attr(node, "clip") is None
            and not _attr(node, "input_forget", 0) and not _attr(node, "layout", 0)
            and not _attr(node, "activation_alpha")
            and not _attr(node, "activation_beta")
            and all(a.lower() == b for a, b in zip(
                names, ["sigmoid", "tanh", "tanh"] * 2)))


def is_default_gru(node, opset):
    """Whether ``node`` is a GRU as torch exports it: linear_before_reset,
    the specification's activations, no clip, sequence_lens nor layout,
    at opset 13 or later."""
    if node.op_type != "GRU" or node.domain not in ("", "ai.onnx") or opset < 13:
        return False
    inputs = list(node.input) + [""] * 6
    names = [n.decode() if isinstance(n, bytes) else n
             for n in _attr(node, "activations", [])]
    return (_attr(node, "linear_before_reset", 0) == 1 and not inputs[4]
            and _attr(node, "clip") is None and not _attr(node, "layout", 0)
            and not _attr(node, "activation_alpha")
            and not _attr(node, "activation_beta")
            and all(a.lower() == b for a, b in zip(names, ["sigmoid", "tanh"] * 2)))


def _depends_on(nodes, weights):
    """Names computed from ``weights`` (subgraph reads included)."""
    reached = set(weights)
    for node in nodes:
        if node_reads(node) & reached:
            reached.update(o for o in node.output if o)
    return reached


def _directions(g, x, n_dirs, stacked=None):
    """The slices of ``x`` along axis 0, that axis dropped (Split and
    Squeeze, whose gradients are a Concat and an Unsqueeze); ``stacked``:
    the values of one row each that a Concat along axis 0 joined into
    ``x``, squeezed instead (exporters stack the directions' weights so:
    no kernel then joins and splits them, nor their gradients)."""
    if stacked:
        return [g.squeeze(p, [0]) for p in stacked]
    if n_dirs == 1:
        return [g.squeeze(x, [0])]
    attrs = {"num_outputs": n_dirs} if g.opset >= 18 else {}
    parts = g.op("Split", x, axis=0, n_outputs=n_dirs, **attrs)
    return [g.squeeze(p, [0]) for p in parts]


def _step_body(g, dtype, hidden, r):
    """The Scan body of one step (``r``: the direction's R, outer)."""
    # names of their own: builders made later from the names of the main
    # graph (the reverse pass's) do not see those of a body
    sg = GraphBuilder(g.opset, value_types=g.types, prefix="lstm_step_")
    sg._used = g._used  # noqa: SLF001 - one namespace for all scopes
    h_in, c_in, x_t = (sg.unique_name(n) for n in ("h_in", "c_in", "x_t"))
    pre = sg.op("Gemm", h_in, r, x_t, transB=1)
    ifo, gate = sg.op("Split", pre, sg.int64s([3 * hidden, hidden]), axis=1,
                      n_outputs=2)
    sig, tg = sg.op("Sigmoid", ifo), sg.op("Tanh", gate)
    attrs = {"num_outputs": 3} if sg.opset >= 18 else {}
    i, o, f = sg.op("Split", sig, axis=1, n_outputs=3, **attrs)
    c = sg.op("Add", sg.op("Mul", f, c_in), sg.op("Mul", i, tg))
    tc = sg.op("Tanh", c)
    h = sg.op("Mul", o, tc)
    outs = [h, c, sg.op("Identity", h), sig, tg, tc, sg.op("Identity", c_in)]
    widths = [hidden, hidden, hidden, 3 * hidden, hidden, hidden, hidden]
    vis = [helper.make_tensor_value_info(n, dtype, (None, w))
           for n, w in zip((h_in, c_in, x_t), (hidden, hidden, 4 * hidden))]
    out_vis = [helper.make_tensor_value_info(n, dtype, (None, w))
               for n, w in zip(outs, widths)]
    return sg.make_graph("lstm_step", vis, out_vis)


def _setup(g, node, dtype, width, hidden, size, positions, stacked):
    """The start both lowerings share: the direction attribute, X as rows
    (T N, size), the shape (T, N, ``width``) of the input projection, a
    maker of the zero initial state (N, ``hidden``; emitted once, when first
    asked) and, for each input at ``positions``, its per-direction slices
    (None where the input is absent; ``stacked(name, count)``: the values
    a Concat joined into ``name``, see :func:`_directions`)."""
    inputs = list(node.input) + [""] * 8
    x = inputs[0]
    direction = _attr(node, "direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    n_dirs = 2 if direction == "bidirectional" else 1
    flat_x = g.op("Reshape", x, g.int64s([-1, size]))
    dims = g.op("Slice", g.shape_of(x), g.int64s([0]), g.int64s([2]))
    steps_shape = g.op("Concat", dims, g.int64s([width]), axis=0)
    zeros = []

    def zero_state():
        if not zeros:
            shape = g.op("Concat", g.op("Slice", dims, g.int64s([1]), g.int64s([2])),
                         g.int64s([hidden]), axis=0)
            zeros.append(g.op("Expand", g.const(0, dtype), shape))
        return zeros[0]
    per_dir = [_directions(g, inputs[k], n_dirs, stacked(inputs[k], n_dirs))
               if inputs[k] else [None] * n_dirs for k in positions]
    return direction, flat_x, steps_shape, zero_state, per_dir


def _lower(g, node, dtype, hidden, size, stacked):
    """Emit the lowering of the LSTM ``node`` into ``g``."""
    direction, flat_x, steps_shape, zero_state, per_dir = _setup(
        g, node, dtype, 4 * hidden, hidden, size, (1, 2, 3, 5, 6), stacked)
    ys, hs, cs = [], [], []
    for d, (w_d, r_d, b_d, h0_d, c0_d) in enumerate(zip(*per_dir)):
        bias = None
        if b_d:
            wb, rb = g.op("Split", b_d, axis=0, n_outputs=2,
                          **({"num_outputs": 2} if g.opset >= 18 else {}))
            bias = g.op("Add", wb, rb)
        xw = g.op("Reshape", g.op("Gemm", flat_x, w_d, bias, transB=1), steps_shape)
        states = [s or zero_state() for s in (h0_d, c0_d)]
        outs = _direction_scan(g, states, xw, _step_body(g, dtype, hidden, r_d),
                               len(LSTM_SCAN_OUTPUTS), LSTM_SCAN_DOC,
                               direction == "reverse" or d == 1)
        hs.append(outs[0])
        cs.append(outs[1])
        ys.append(outs[2])
    _stack_directions(g, node, (ys, hs, cs))


def _gru_step_body(g, dtype, hidden, r, rb):
    """The Scan body of one GRU step (``r``, ``rb``: the direction's R and
    Rb, outer; ``rb`` may be None)."""
    sg = GraphBuilder(g.opset, value_types=g.types, prefix="gru_step_")
    sg._used = g._used  # noqa: SLF001 - one namespace for all scopes
    h_in, x_t = sg.unique_name("h_in"), sg.unique_name("x_t")
    rec = sg.op("Gemm", h_in, r, *([rb] if rb else []), transB=1)
    sizes = sg.int64s([2 * hidden, hidden])
    rec_zr, rec_n = sg.op("Split", rec, sizes, axis=1, n_outputs=2)
    x_zr, x_n = sg.op("Split", x_t, sizes, axis=1, n_outputs=2)
    zr = sg.op("Sigmoid", sg.op("Add", x_zr, rec_zr))
    attrs = {"num_outputs": 2} if sg.opset >= 18 else {}
    z, r_gate = sg.op("Split", zr, axis=1, n_outputs=2, **attrs)
    n = sg.op("Tanh", sg.op("Add", x_n, sg.op("Mul", r_gate, rec_n)))
    # H = (1 - z) n + z H_prev
    h = sg.op("Add", n, sg.op("Mul", z, sg.op("Sub", h_in, n)))
    outs = [h, sg.op("Identity", h), zr, n, rec_n]
    widths = [hidden, hidden, 2 * hidden, hidden, hidden]
    vis = [helper.make_tensor_value_info(n_, dtype, (None, w))
           for n_, w in ((h_in, hidden), (x_t, 3 * hidden))]
    out_vis = [helper.make_tensor_value_info(n_, dtype, (None, w))
               for n_, w in zip(outs, widths)]
    return sg.make_graph("gru_step", vis, out_vis)


def _lower_gru(g, node, dtype, hidden, size, stacked):
    """Emit the lowering of the GRU ``node`` into ``g``."""
    direction, flat_x, steps_shape, zero_state, per_dir = _setup(
        g, node, dtype, 3 * hidden, hidden, size, (1, 2, 3, 5), stacked)
    ys, hs = [], []
    for d, (w_d, r_d, b_d, h0_d) in enumerate(zip(*per_dir)):
        wb = rb = None
        if b_d:
            wb, rb = g.op("Split", b_d, axis=0, n_outputs=2,
                          **({"num_outputs": 2} if g.opset >= 18 else {}))
        xw = g.op("Reshape", g.op("Gemm", flat_x, w_d, *([wb] if wb else []),
                                  transB=1), steps_shape)
        h0_d = h0_d or zero_state()
        outs = _direction_scan(g, [h0_d], xw, _gru_step_body(g, dtype, hidden, r_d, rb),
                               len(GRU_SCAN_OUTPUTS), GRU_SCAN_DOC,
                               direction == "reverse" or d == 1)
        hs.append(outs[0])
        ys.append(outs[1])
    _stack_directions(g, node, (ys, hs))


def _direction_scan(g, states, xw, body, n_outputs, doc, reverse):
    """The Scan of one direction: ``states`` carried, ``xw`` (T, N, gates)
    scanned (backwards when ``reverse``, and its per-step outputs written
    in the same order), marked by ``doc`` for its gradient rule."""
    reverse = int(bool(reverse))
    outs = g.op("Scan", *states, xw, body=body, n_outputs=n_outputs,
                num_scan_inputs=1, scan_input_directions=[reverse],
                scan_output_directions=[reverse] * (n_outputs - len(states)))
    g.nodes[-1].doc_string = doc
    return outs


def _stack_directions(g, node, per_output):
    """Write ``node``'s outputs (Y, then the final states) from the
    directions' values ``per_output``: Y stacks them on axis 1 (T, D, N,
    H), a final state on axis 0 (D, N, H); unnamed outputs are skipped."""
    outputs = list(node.output) + [""] * len(per_output)
    for index, (name, parts) in enumerate(zip(outputs, per_output)):
        if not name:
            continue
        axis = 1 if index == 0 else 0
        parts = [g.unsqueeze(p, [axis]) for p in parts]
        if len(parts) == 1:
            g.op("Identity", parts[0], outputs=[name])
        else:
            g.op("Concat", *parts, axis=axis, outputs=[name])


def lower_lstms(model, weights, types=None):
    """``model`` with its default LSTMs lowered (:func:`lower_recurrent`
    restricted to LSTMs).

    Parameters
    ----------
    model : onnx.ModelProto
    weights : iterable of str
    types : dict, default=None

    Returns
    -------
    onnx.ModelProto
    """
    return lower_recurrent(model, weights, types, ops=("LSTM",))


def lower_recurrent(model, weights, types=None, ops=("LSTM", "GRU")):
    """``model`` with its default LSTMs and GRUs computed from a weight of
    ``weights`` written as Scans emitting their gates (see the module
    doc); ``model`` itself when none qualifies.

    Parameters
    ----------
    model : onnx.ModelProto
    weights : iterable of str
        The values trained (an LSTM none of whose inputs depends on them
        keeps onnxruntime's kernel).
    types : dict, default=None
        ``model``'s :func:`~onnxtrain.graph.infer_value_types` when the
        caller has them (else inferred here, only when a node may
        qualify).
    ops : tuple of str, default=("LSTM", "GRU")
        The operators lowered.

    Returns
    -------
    onnx.ModelProto
        A new model (the input is not modified) or ``model``.
    """
    graph = model.graph
    opset = next((o.version for o in model.opset_import
                  if o.domain in ("", "ai.onnx")), 0)
    checks = {"LSTM": (is_default_lstm, _lower), "GRU": (is_default_gru, _lower_gru)}
    checks = {op: checks[op] for op in ops}

    def qualifies(node):
        return node.op_type in checks and checks[node.op_type][0](node, opset)
    if not any(qualifies(n) for n in graph.node):
        return model
    types = infer_value_types(model) if types is None else types
    reached = _depends_on(graph.node, weights)
    g = GraphBuilder(opset, used_names=graph_names(graph), value_types=dict(types))
    producers = {o: n for n in graph.node for o in n.output if o}

    def stacked(name, count):
        """The ``count`` values of one row each a Concat along axis 0 wrote
        as ``name`` (static shapes), else None."""
        concat = producers.get(name)
        shape = (types.get(name) or (None, None))[1]
        if count < 2 or concat is None or concat.op_type != "Concat" or \
                len(concat.input) != count or not shape:
            return None
        axis = _attr(concat, "axis")  # Concat-1's default axis is 1
        if axis is None or axis % len(shape) != 0:  # a negative axis too
            return None
        rows = [(types.get(p) or (None, None))[1] for p in concat.input]
        return list(concat.input) if all(r and r[0] == 1 for r in rows) else None

    def lower(node):
        if not qualifies(node):
            return False
        sizes = _static_sizes(node, types)
        dtype = (types.get(node.input[0]) or (None, None))[0]
        if (sizes is None or dtype not in (TensorProto.FLOAT, TensorProto.DOUBLE)
                or not reached & {i for i in node.input if i}):
            return False
        checks[node.op_type][1](g, node, dtype, *sizes, stacked)
        return True
    # the nodes no graph output needs leave: the Concats of stacked
    # weights only the lowered nodes read among them
    return rewrite_nodes(model, g, lower, drop_unread=True)
