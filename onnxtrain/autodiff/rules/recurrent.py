"""VJP rules of the recurrent operators RNN, GRU and LSTM.

Each node is expanded into standard ops that compute the equations of the
ONNX operator specification (https://onnx.ai/onnx/operators/onnx__RNN.html,
``onnx__GRU.html``, ``onnx__LSTM.html``); the expansion is recomputed in the
gradient graph from the node's inputs and the reverse pass runs over it, so
the gradient is built from the rules of the primitive ops (Scan's among
them, see :mod:`.control_flow`). For one direction:

- the input projections of every time step at once, ``X @ W^T + Wb + Rb``
  (GRU with ``linear_before_reset`` keeps ``Rbh`` for the step), reversed
  along time for the reverse direction (``ReverseSequence`` over each batch
  row's length);
- a ``Scan`` over time (axis 0) whose body is one step of the recurrence:
  it splits the step's projection into gates and reads the recurrence
  weights ``R^T`` (one per gate), the peepholes ``P`` and ``Rbh`` from the
  outer scope;
- the activations (``activations``, ``activation_alpha``,
  ``activation_beta``: alphas and betas are consumed in order by the
  activations that read them) and ``clip`` apply to every gate's
  pre-activation; LSTM's cell state enters ``h`` unclipped. This is what
  onnxruntime's kernels compute (checked against them in
  tests/autodiff/test_recurrent.py);
- with ``sequence_lens``, a mask ``t < sequence_lens[b]`` keeps the states
  of a finished row (``Y_h``, ``Y_c`` are those of its last step) and zeroes
  its outputs ``Y`` after its length.

Directions are stacked on axis 1 of ``Y`` and axis 0 of ``Y_h``/``Y_c``;
``layout=1`` transposes batch and time in and out. Sequence length and
batch size may be symbolic.

Not supported (a clear error): an activation outside the specification's
list; ThresholdedRelu, Affine and ScaledTanh without explicit
``activation_alpha``/``activation_beta`` (the specification's defaults are
the operators', onnxruntime takes 0); a hidden size unknown statically (no
``hidden_size`` attribute and ``R`` of unknown shape); the reverse
direction below opset 10 (``ReverseSequence``); ``sequence_lens`` below
opset 11 (``Range``).
"""
import numpy as np
from onnx import TensorProto, helper, numpy_helper

from ..expansion import (differentiate_expansion, outer_reads, record_types,
                         sub_builder)
from ..registry import register_vjp

#: Gates per op, in the order of the rows of W, R and B.
_GATES = {"RNN": ("i",), "GRU": ("z", "r", "h"),
          "LSTM": ("i", "o", "f", "c")}
#: Default activations of one direction (f, g, h in the specification).
_DEFAULT_ACTIVATIONS = {"RNN": ("Tanh",), "GRU": ("Sigmoid", "Tanh"),
                        "LSTM": ("Sigmoid", "Tanh", "Tanh")}
#: Activations of the specification (lower case) -> defaults of the
#: parameters they read from activation_alpha (then activation_beta); None:
#: no default (onnxruntime takes 0 where the specification refers to the
#: operator's default, so the value must be given).
_ACTIVATION_PARAMS = {
    "relu": (), "tanh": (), "sigmoid": (), "softsign": (), "softplus": (),
    "leakyrelu": (0.01,), "thresholdedrelu": (None,), "elu": (1.0,),
    "hardsigmoid": (0.2, 0.5), "affine": (None, None),
    "scaledtanh": (None, None),
}
_SIMPLE_OPS = {"relu": "Relu", "tanh": "Tanh", "sigmoid": "Sigmoid",
               "softsign": "Softsign", "softplus": "Softplus"}
_ALPHA_OPS = {"leakyrelu": "LeakyRelu", "elu": "Elu"}


# ---------------------------------------------------------------------------
# attributes
# ---------------------------------------------------------------------------

def _activations(ctx, n_dirs):
    """One list of ``(name, params)`` per direction (ONNX defaults filled
    in); alphas and betas are consumed in order by the activations that
    read them, as onnxruntime does."""
    per_dir = len(_DEFAULT_ACTIVATIONS[ctx.node.op_type])
    names = ctx.attr("activations")
    if not names:
        names = list(_DEFAULT_ACTIVATIONS[ctx.node.op_type]) * n_dirs
    names = [n.decode() if isinstance(n, bytes) else n for n in names]
    if len(names) != per_dir * n_dirs:
        ctx.fail(f"activations={names}: {per_dir * n_dirs} names expected "
                 f"({per_dir} per direction)")
    alphas = list(ctx.attr("activation_alpha", []))
    betas = list(ctx.attr("activation_beta", []))
    parsed = []
    for name in names:
        defaults = _ACTIVATION_PARAMS.get(name.lower())
        if defaults is None:
            ctx.fail(f"activations: {name!r} is not an activation of the "
                     f"specification ({sorted(_ACTIVATION_PARAMS)})")
        params = []
        for attr, source, default in zip(
                ("activation_alpha", "activation_beta"), (alphas, betas),
                defaults):
            if not source and default is None:
                ctx.fail(f"activations: {name!r} without a value in {attr} "
                         "(onnxruntime and the specification disagree on "
                         "its default)")
            params.append(source.pop(0) if source else default)
        parsed.append((name.lower(), tuple(params)))
    return [parsed[d * per_dir:(d + 1) * per_dir] for d in range(n_dirs)]


def _hidden_size(ctx):
    size = ctx.attr("hidden_size")
    if size:
        return int(size)
    shape = ctx.shape(ctx.input(2))
    if shape is not None and len(shape) == 3 and isinstance(shape[2], int):
        return shape[2]
    ctx.fail("hidden_size: no attribute and the shape of R is unknown; "
             "the expansion needs the hidden size statically")


def _check_attributes(ctx):
    direction = ctx.attr("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        ctx.fail(f"direction={direction!r} is not in the specification")
    if direction != "forward" and ctx.opset < 10:
        ctx.fail(f"direction={direction!r} below opset 10: the expansion "
                 "reverses the sequences with ReverseSequence (opset 10)")
    if ctx.input(4) is not None and ctx.opset < 11:
        ctx.fail("sequence_lens below opset 11: the expansion masks the "
                 "finished rows with Range (opset 11)")
    if ctx.attr("layout", 0) not in (0, 1):
        ctx.fail(f"layout={ctx.attr('layout')}: only 0 and 1")
    return direction


# ---------------------------------------------------------------------------
# emission helpers
# ---------------------------------------------------------------------------

def _split(g, x, n, axis):
    """``n`` equal parts of ``x`` along a static ``axis`` (``[x]`` when
    ``n`` is 1)."""
    if n == 1:
        return [x]
    attrs = {"num_outputs": n} if g.opset >= 18 else {}
    parts = g.op("Split", x, axis=axis, n_outputs=n, **attrs)
    return [parts] if n == 1 else list(parts)


def _directions(g, x, n, axis):
    """The ``n`` slices of ``x`` along ``axis`` (the direction axis)."""
    return [g.squeeze(part, [axis]) for part in _split(g, x, n, axis)]


def _activate(sg, dtype, activation, x):
    """One activation of the specification's list applied to ``x``."""
    name, params = activation
    if name in _SIMPLE_OPS:
        return sg.op(_SIMPLE_OPS[name], x)
    if name in _ALPHA_OPS:
        return sg.op(_ALPHA_OPS[name], x, alpha=float(params[0]))
    if name == "hardsigmoid":
        return sg.op("HardSigmoid", x, alpha=float(params[0]),
                     beta=float(params[1]))
    alpha = sg.const(params[0], dtype)
    if name == "thresholdedrelu":  # x where x > alpha, else 0
        return sg.op("Mul", x, sg.cast(sg.op("Greater", x, alpha), dtype))
    if name == "affine":
        return sg.op("Add", sg.op("Mul", x, alpha), sg.const(params[1], dtype))
    # scaledtanh: alpha * tanh(beta * x)
    beta = sg.const(params[1], dtype)
    return sg.op("Mul", sg.op("Tanh", sg.op("Mul", x, beta)), alpha)


class _Step:
    """Builds one time step (the Scan body) in the builder ``sg``."""

    def __init__(self, sg, dtype, activations, clip):
        self.sg, self.dtype = sg, dtype
        self.activations, self.clip = activations, clip

    def act(self, k, x, clip=True):
        """Activation ``k`` (f, g, h) of ``x``, a gate's pre-activation
        clipped to [-clip, clip] (onnxruntime leaves LSTM's cell state
        unclipped before h)."""
        if clip and self.clip is not None:
            x = self._clip(x)
        return _activate(self.sg, self.dtype, self.activations[k], x)

    def _clip(self, x):
        sg, c = self.sg, float(self.clip)
        if sg.opset < 11:
            return sg.op("Clip", x, min=-c, max=c)
        return sg.op("Clip", x, sg.const(-c, self.dtype),
                     sg.const(c, self.dtype))

    def pre(self, x, h, rt):
        """``x + h @ rt``: a gate's pre-activation."""
        return self.sg.op("Add", x, self.sg.op("MatMul", h, rt))


def _rnn_step(step, h, xs, outer):
    # Ht = f(Xt W^T + Ht-1 R^T + Wb + Rb)
    return (step.act(0, step.pre(xs[0], h, outer["R"][0])),)


def _gru_step(step, h, xs, outer, linear_before_reset):
    # zt = f(Xt Wz^T + Ht-1 Rz^T + Wbz + Rbz), rt likewise,
    # ht = g(Xt Wh^T + (rt . Ht-1) Rh^T + Rbh + Wbh), or, with
    # linear_before_reset, g(Xt Wh^T + rt . (Ht-1 Rh^T + Rbh) + Wbh),
    # Ht = (1 - zt) . ht + zt . Ht-1
    sg = step.sg
    rz, rr, rh = outer["R"]
    z = step.act(0, step.pre(xs[0], h, rz))
    r = step.act(0, step.pre(xs[1], h, rr))
    if linear_before_reset:
        linear = sg.op("Add", sg.op("MatMul", h, rh), outer["Rbh"])
        hh = step.act(1, sg.op("Add", xs[2], sg.op("Mul", r, linear)))
    else:
        hh = step.act(1, step.pre(xs[2], sg.op("Mul", r, h), rh))
    return (sg.op("Add", hh, sg.op("Mul", z, sg.op("Sub", h, hh))),)


def _lstm_step(step, h, c, xs, outer, input_forget):
    # it = f(Xt Wi^T + Ht-1 Ri^T + Pi . Ct-1 + Wbi + Rbi)
    # ft = f(Xt Wf^T + Ht-1 Rf^T + Pf . Ct-1 + Wbf + Rbf) (1 - it with
    # input_forget), ct = g(Xt Wc^T + Ht-1 Rc^T + Wbc + Rbc),
    # Ct = ft . Ct-1 + it . ct,
    # ot = f(Xt Wo^T + Ht-1 Ro^T + Po . Ct + Wbo + Rbo), Ht = ot . h(Ct)
    sg = step.sg
    ri, ro, rf, rc = outer["R"]
    peep = outer.get("P")

    def with_peephole(pre, k, cell):
        if peep is None:
            return pre
        return sg.op("Add", pre, sg.op("Mul", peep[k], cell))
    i = step.act(0, with_peephole(step.pre(xs[0], h, ri), 0, c))
    if input_forget:
        f = sg.op("Sub", sg.const(1, step.dtype), i)
    else:
        f = step.act(0, with_peephole(step.pre(xs[2], h, rf), 2, c))
    cc = step.act(1, step.pre(xs[3], h, rc))
    c_new = sg.op("Add", sg.op("Mul", f, c), sg.op("Mul", i, cc))
    o = step.act(0, with_peephole(step.pre(xs[1], h, ro), 1, c_new))
    return sg.op("Mul", o, step.act(2, c_new, clip=False)), c_new


# ---------------------------------------------------------------------------
# the expansion
# ---------------------------------------------------------------------------

class _Expansion:
    """Emits the expansion of a recurrent node into ``ctx.g``.

    Attributes
    ----------
    x : str
        The input sequence, time first (T, B, I).
    lens : str or None
        ``sequence_lens`` as int64 (B,), or the full length T of every row
        when the reverse direction needs one and the node has none.
    mask : str or None
        ``t < sequence_lens[b]`` as 0/1 floats (T, B, 1); None without
        ``sequence_lens``.
    """

    def __init__(self, ctx):
        self.ctx, self.g, self.dtype = ctx, ctx.g, ctx.dtype
        self.op_type = ctx.node.op_type
        self.direction = _check_attributes(ctx)
        self.n_dirs = 2 if self.direction == "bidirectional" else 1
        self.activations = _activations(ctx, self.n_dirs)
        self.hidden = _hidden_size(ctx)
        self.layout = ctx.attr("layout", 0)
        x = ctx.input(0)
        self.x = self.g.op("Transpose", x, perm=[1, 0, 2]) if self.layout else x
        self.lens, self.mask = None, None
        if ctx.input(4) is not None:
            self.lens = self.g.cast(ctx.input(4), TensorProto.INT64)
            self.mask = self._mask()

    def _dim(self, axis):
        """Size of ``x`` along ``axis`` as an int64 scalar."""
        index = self.g.const(np.int64(axis), TensorProto.INT64)
        return self.g.op("Gather", self.g.shape_of(self.x), index, axis=0)

    def _mask(self):
        g = self.g
        steps = g.op("Range", g.const(np.int64(0), TensorProto.INT64),
                     self._dim(0), g.const(np.int64(1), TensorProto.INT64))
        valid = g.op("Less", g.unsqueeze(steps, [1]), g.unsqueeze(self.lens, [0]))
        return g.cast(g.unsqueeze(valid, [2]), self.dtype)

    def _reverse(self, x):
        """``x`` (T, B, ...) with the first sequence_lens[b] steps of every
        row b reversed (all T steps without sequence_lens)."""
        g = self.g
        if self.lens is None:
            batch = g.unsqueeze(self._dim(1), [0])
            self.lens = g.op("Expand", self._dim(0), batch)
        return g.op("ReverseSequence", x, self.lens, batch_axis=1, time_axis=0)

    def _zeros_state(self):
        g = self.g
        shape = g.op("Concat", g.unsqueeze(self._dim(1), [0]),
                     g.int64s([self.hidden]), axis=0)
        return g.op("Expand", g.const(0, self.dtype), shape)

    def _per_direction(self, index, axis=0):
        """Slices of input ``index`` per direction, None when omitted."""
        name = self.ctx.input(index)
        if name is None:
            return [None] * self.n_dirs
        return _directions(self.g, name, self.n_dirs, axis)

    def run(self):
        """Emit the expansion; returns the names of (Y, Y_h[, Y_c])."""
        g, lstm = self.g, self.op_type == "LSTM"
        state_axis = 1 if self.layout else 0
        weights = zip(self._per_direction(1), self._per_direction(2),
                      self._per_direction(3), self._per_direction(5, state_axis),
                      self._per_direction(6, state_axis) if lstm
                      else [None] * self.n_dirs,
                      self._per_direction(7) if lstm else [None] * self.n_dirs)
        ys, hs, cs = [], [], []
        for d, (w, r, b, h0, c0, p) in enumerate(weights):
            reverse = self.direction == "reverse" or d == 1
            y, h, c = self._direction(d, reverse, w, r, b, h0, c0, p)
            ys.append(g.unsqueeze(y, [1]))
            hs.append(g.unsqueeze(h, [0]))
            cs.append(g.unsqueeze(c, [0]) if lstm else None)
        outputs = [ys, hs, cs] if lstm else [ys, hs]
        outputs = [parts[0] if len(parts) == 1 else
                   g.op("Concat", *parts, axis=axis)
                   for parts, axis in zip(outputs, (1, 0, 0))]
        if self.layout:  # Y (B, T, D, H), Y_h and Y_c (B, D, H)
            outputs = [g.op("Transpose", outputs[0], perm=[2, 0, 1, 3])] + [
                g.op("Transpose", o, perm=[1, 0, 2]) for o in outputs[1:]]
        return outputs

    def _gate_inputs(self, w, b, reverse):
        """The input projections of every step ``X W^T + Wb + Rb`` (T, B,
        G*H) and the bias left for the step (GRU's Rbh with
        linear_before_reset, whose Rbh is not part of the projection)."""
        g, n_gates, hidden = self.g, len(_GATES[self.op_type]), self.hidden
        xw = g.op("MatMul", self.x, g.op("Transpose", w, perm=[1, 0]))
        rbh = None
        if b is not None:
            wb, rb = _split(g, b, 2, 0)
            if self.op_type == "GRU" and self.ctx.attr("linear_before_reset", 0):
                rbh = _split(g, rb, n_gates, 0)[2]
                keep = [1.0] * (2 * hidden) + [0.0] * hidden
                rb = g.op("Mul", rb, g.const(keep, self.dtype))
            xw = g.op("Add", xw, g.op("Add", wb, rb))
        if reverse:
            xw = self._reverse(xw)
        return xw, rbh

    def _direction(self, d, reverse, w, r, b, h0, c0, p):
        """Y (T, B, H), final Y_h and Y_c (B, H) of direction ``d``."""
        g, lstm = self.g, self.op_type == "LSTM"
        xw, rbh = self._gate_inputs(w, b, reverse)
        n_gates = len(_GATES[self.op_type])
        outer = {"R": [g.op("Transpose", part, perm=[1, 0])
                       for part in _split(g, r, n_gates, 0)],
                 "Rbh": rbh}
        if p is not None:
            outer["P"] = _split(g, p, 3, 0)
        states = [h0 if h0 is not None else self._zeros_state()]
        if lstm:
            states.append(c0 if c0 is not None else self._zeros_state())
        scan_inputs = [xw] + ([self.mask] if self.mask is not None else [])
        graph = self._body(d, outer, len(states))
        outs = g.op("Scan", *states, *scan_inputs, body=graph,
                    n_outputs=len(states) + 1,
                    num_scan_inputs=len(scan_inputs))
        y = outs[-1]
        if reverse:
            y = self._reverse(y)
        return y, outs[0], outs[1] if lstm else None

    def _body(self, d, outer, n_states):
        """The Scan body: one step of direction ``d`` (the step's input
        projection is split into gates here)."""
        ctx, dtype, hidden = self.ctx, self.dtype, self.hidden
        n_gates = len(_GATES[self.op_type])
        sg = sub_builder(ctx)
        names = [sg.unique_name(f"{self.op_type.lower()}_state_in")
                 for _ in range(n_states)]
        names.append(sg.unique_name(f"{self.op_type.lower()}_x_t"))
        shapes = [(None, hidden)] * n_states + [(None, n_gates * hidden)]
        if self.mask is not None:
            names.append(sg.unique_name("mask_t"))
            shapes.append((None, 1))
        for name, shape in zip(names, shapes):
            sg.set_type(name, dtype, shape)
        step = _Step(sg, dtype, self.activations[d], ctx.attr("clip"))
        states = names[:n_states]
        xs = _split(sg, names[n_states], n_gates, 1)
        if self.op_type == "RNN":
            new = _rnn_step(step, states[0], xs, outer)
        elif self.op_type == "GRU":
            new = _gru_step(step, states[0], xs, outer,
                            ctx.attr("linear_before_reset", 0))
        else:
            new = _lstm_step(step, *states, xs, outer, ctx.attr("input_forget", 0))
        y = new[0]
        if self.mask is not None:  # finished rows keep their states
            m = names[-1]
            y = sg.op("Mul", m, y)
            new = [sg.op("Add", s, sg.op("Mul", m, sg.op("Sub", n, s)))
                   for s, n in zip(states, new)]
        outs = [sg.op("Identity", v) for v in list(new) + [y]]
        vis = [helper.make_tensor_value_info(n, dtype, s)
               for n, s in zip(names, shapes)]
        out_vis = [helper.make_tensor_value_info(n, dtype, (None, hidden))
                   for n in outs]
        return sg.make_graph(f"{self.op_type.lower()}_step_{d}", vis, out_vis)


def expand(ctx):
    """Emit the expansion of the recurrent node of ``ctx`` into ``ctx.g``.

    Parameters
    ----------
    ctx : VJPContext
        Context of an RNN, GRU or LSTM node.

    Returns
    -------
    list of str
        Names of the expansion's Y, Y_h (and Y_c for LSTM), the node's
        outputs computed from its inputs by standard ops.

    Raises
    ------
    NotImplementedError
        For what the module docstring lists as not supported.
    """
    return _Expansion(ctx).run()


def _recurrent_vjp(ctx, *grad_outputs):
    """Gradient of an RNN, GRU or LSTM node through its expansion."""
    g = ctx.g
    start = len(g.nodes)
    outputs = expand(ctx)
    nodes = g.nodes[start:]
    del g.nodes[start:]
    # the constants the expansion made, given to inference (axes, sizes)
    outer = outer_reads(nodes)
    made = {t.name: numpy_helper.to_array(t) for t in g.initializers
            if t.name in outer}
    constants = record_types(g, nodes, outer, outputs, made)
    return differentiate_expansion(ctx, nodes, outputs, grad_outputs,
                                   constants)


for _op in _GATES:
    register_vjp(_op)(_recurrent_vjp)
