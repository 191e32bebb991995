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
  weights ``R`` (one per gate, each gate's pre-activation one Gemm; all
  four in one Gemm for an LSTM without peepholes nor input_forget), the
  peepholes ``P`` and ``Rbh`` from the outer scope;
- the activations (``activations``, ``activation_alpha``,
  ``activation_beta``: alphas and betas are consumed in order by the
  activations that read them) and ``clip`` apply to every gate's
  pre-activation; LSTM's cell state enters ``h`` unclipped. This is what
  onnxruntime's kernels compute (checked against them in
  tests/autodiff/test_recurrent.py);
- with ``sequence_lens``, a mask ``t < sequence_lens[b]`` keeps the states
  of a finished row (``Y_h``, ``Y_c`` are those of its last step) and zeroes
  its outputs ``Y`` after its length.

The default LSTM (the specification's activations, no clip, peepholes,
input_forget, sequence_lens nor layout, its ``Y`` computed) skips the
expansion: :class:`_LSTMGradient` reads the hidden states from ``Y`` and
runs one backward Scan per direction. In a training graph such an LSTM is
lowered to one Scan per direction emitting its gates
(:mod:`onnxtrain.graph.recurrent_lowering`); :func:`lstm_scan_vjp`, the
rule of that Scan, reads them and runs the same backward Scan, with no
recomputation. A GRU with ``linear_before_reset`` (what torch exports) is
lowered too; :func:`gru_scan_vjp` reads its gates and runs one backward
Scan carrying dh (6 nodes per step); the GRU node itself keeps the
expansion's gradient.

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

from ...graph.recurrent_lowering import (GRU_SCAN_DOC, GRU_SCAN_OUTPUTS,
                                         LSTM_SCAN_DOC, LSTM_SCAN_OUTPUTS,
                                         is_default_lstm)
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

    def __init__(self, sg, dtype, activations, clip, hidden):
        self.sg, self.dtype, self.hidden = sg, dtype, hidden
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

    def pre(self, x, h, r):
        """``x + h @ r^T``: a gate's pre-activation, one Gemm (``r``: the
        gate's rows of R, whose gradient ``dy^T @ h`` and that of ``h``,
        ``dy @ r``, are Gemms again, with no transpose of ``r`` per step)."""
        return self.sg.op("Gemm", h, r, x, transB=1)


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
        linear = sg.op("Gemm", h, rh, outer["Rbh"], transB=1)
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
    if "R_all" in outer:
        return _lstm_step_fused(step, h, c, xs[0], outer["R_all"])
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


def _lstm_step_fused(step, h, c, x, r):
    # the equations of _lstm_step without peepholes nor input_forget, with
    # the four gates' pre-activations in one Gemm (x: the step's projection
    # of every gate, r: all of R) and i, o, f (contiguous, the same
    # activation f) activated at once: fewer kernels per time step in the
    # forward Scan and in its gradient's
    sg, hidden = step.sg, int(step.hidden)
    pre = sg.op("Gemm", h, r, x, transB=1)
    if step.clip is not None:
        pre = step._clip(pre)
    sizes = [3 * hidden, hidden]
    if sg.opset >= 13:
        ifo, cc = sg.op("Split", pre, sg.int64s(sizes), axis=1, n_outputs=2)
    else:
        ifo, cc = sg.op("Split", pre, axis=1, split=sizes, n_outputs=2)
    i, o, f = _split(sg, step.act(0, ifo, clip=False), 3, 1)
    c_new = sg.op("Add", sg.op("Mul", f, c),
                  sg.op("Mul", i, step.act(1, cc, clip=False)))
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

    def _fused_gates(self, p):
        """Whether an LSTM direction computes its gates together
        (:func:`_lstm_step_fused`): no peepholes, no input_forget."""
        return (self.op_type == "LSTM" and p is None
                and not self.ctx.attr("input_forget", 0))

    def _direction(self, d, reverse, w, r, b, h0, c0, p):
        """Y (T, B, H), final Y_h and Y_c (B, H) of direction ``d``."""
        g, lstm = self.g, self.op_type == "LSTM"
        xw, rbh = self._gate_inputs(w, b, reverse)
        n_gates = len(_GATES[self.op_type])
        if self._fused_gates(p):
            outer = {"R_all": r}
        else:
            outer = {"R": _split(g, r, n_gates, 0), "Rbh": rbh}
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
        step = _Step(sg, dtype, self.activations[d], ctx.attr("clip"), hidden)
        states = names[:n_states]
        xs = ([names[n_states]] if "R_all" in outer
              else _split(sg, names[n_states], n_gates, 1))
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


def _lstm_direct(ctx):
    """Whether an LSTM node's gradient is written directly
    (:class:`_LSTMGradient`): its Y output is computed, the default
    activations, no clip, peepholes, input_forget, sequence_lens nor
    layout, opset >= 13."""
    return is_default_lstm(ctx.node, ctx.opset)


class _LSTMGradient(_Expansion):
    """The gradient of an LSTM node from its own output Y: the hidden
    states entering every step are Y shifted by one step, so the gates of
    all steps come from two products over the whole sequence; a Scan of
    two nodes per step rebuilds the cell states, and one Scan walks the
    steps backwards carrying dh and dc (7 nodes per step, the recurrence's
    product ``dpre @ R`` among them); the gradients of X, W, R and B are
    products over all steps after it. Every tensor stays in the order of
    time: a reverse direction runs its Scans the other way round instead of
    reversing its sequences. The formulas are the chain rule on the
    equations of :func:`_lstm_step` (what the expansion computes)."""

    def run_gradient(self, gy, gyh, gyc):
        g, n_dirs = self.g, self.n_dirs
        ys = _directions(g, self.ctx.outputs[0], n_dirs, 1)
        per_dir = [_directions(g, v, n_dirs, axis) if v else [None] * n_dirs
                   for v, axis in ((gy, 1), (gyh, 0), (gyc, 0))]
        grads = [self._direction_grad(d, *args) for d, args in enumerate(zip(
            self._per_direction(1), self._per_direction(2),
            self._per_direction(3), self._per_direction(5),
            self._per_direction(6), ys, *per_dir))]
        dx = grads[0][0]
        for other in grads[1:]:
            dx = dx and g.op("Add", dx, other[0])
        stacked = [None if grads[0][k] is None else
                   g.op("Concat", *[g.unsqueeze(gr[k], [0]) for gr in grads], axis=0)
                   if n_dirs > 1 else g.unsqueeze(grads[0][k], [0])
                   for k in range(1, 6)]
        return [dx] + stacked

    def _direction_grad(self, d, w, r, b, h0, c0, y, gy, gyh, gyc):
        g, hidden, reverse = self.g, self.hidden, self.direction == "reverse" or d == 1
        h0 = h0 if h0 is not None else self._zeros_state()
        c0 = c0 if c0 is not None else self._zeros_state()
        x = self.x
        h_prev = _shift(g, h0, y, reverse)
        pre = g.op("Add", g.op("MatMul", x, g.op("Transpose", w, perm=[1, 0])),
                   g.op("MatMul", h_prev, g.op("Transpose", r, perm=[1, 0])))
        if b is not None:
            wb, rb = _split(g, b, 2, 0)
            pre = g.op("Add", pre, g.op("Add", wb, rb))
        ifo, cc = g.op("Split", pre, g.int64s([3 * hidden, hidden]), axis=2,
                       n_outputs=2)
        sig, tg = g.op("Sigmoid", ifo), g.op("Tanh", cc)
        i, o, f = _split(g, sig, 3, 2)
        cells = self._cells(c0, f, g.op("Mul", i, tg), reverse)
        c_prev = _shift(g, c0, cells, reverse)
        tc = g.op("Tanh", cells)
        coef, dh_to_dc = _coefficients(g, self.dtype, sig, i, o, tg, tc, c_prev)
        dpre, dh0, dc0 = _backward_scan(self.ctx, self.dtype, self.hidden, r, gy,
                                        gyh, gyc, dh_to_dc, coef, f, h0, reverse)
        need = self.ctx.needs_grad
        dpre2 = g.op("Reshape", dpre, g.int64s([-1, 4 * hidden]))
        grads = [None] * 6
        if need[0]:
            grads[0] = g.op("MatMul", dpre, w)
        if need[1]:
            flat_x = g.op("Reshape", x, g.int64s([-1, self._inputs()]))
            grads[1] = g.op("Gemm", dpre2, flat_x, transA=1)
        if need[2]:
            flat_h = g.op("Reshape", h_prev, g.int64s([-1, hidden]))
            grads[2] = g.op("Gemm", dpre2, flat_h, transA=1)
        if b is not None and need[3]:
            db = g.reduce_sum(dpre2, [0], keepdims=0)
            grads[3] = g.op("Concat", db, db, axis=0)
        grads[4], grads[5] = dh0, dc0
        return grads

    def _inputs(self):
        for position in (1, 0):  # W's last dimension, else X's
            shape = self.ctx.shape(self.ctx.input(position))
            if shape and isinstance(shape[-1], int):
                return shape[-1]
        self.ctx.fail("the input size (the last dimension of W or X) must be static")

    def _cells(self, c0, f, ig, reverse):
        """The cell states ``C_t = f_t . C_t-1 + (i . g)_t`` of every step,
        in the order of time (a reverse direction's Scan runs backwards)."""
        sg, dtype, hidden = sub_builder(self.ctx), self.dtype, self.hidden
        c_in, f_t, ig_t = (sg.unique_name(n) for n in ("c_in", "f_t", "ig_t"))
        for name in (c_in, f_t, ig_t):
            sg.set_type(name, dtype, (None, hidden))
        c = sg.op("Add", sg.op("Mul", f_t, c_in), ig_t)
        c_out = sg.op("Identity", c)
        vi = [helper.make_tensor_value_info(n, dtype, (None, hidden))
              for n in (c_in, f_t, ig_t)]
        out = [helper.make_tensor_value_info(n, dtype, (None, hidden))
               for n in (c, c_out)]
        body = sg.make_graph("lstm_cells", vi, out)
        _, cells = self.g.op("Scan", c0, f, ig, body=body, n_outputs=2,
                             num_scan_inputs=2,
                             scan_input_directions=[int(reverse)] * 2,
                             scan_output_directions=[int(reverse)])
        return cells

def _shift(g, first, seq, reverse):
    """The states entering every step (T, B, H): ``[first, seq[0], ...,
    seq[T-2]]``, or ``[seq[1], ..., seq[T-1], first]`` for a reverse
    direction."""
    if reverse:
        tail = g.op("Slice", seq, g.int64s([1]), g.int64s([2 ** 62]),
                    g.int64s([0]))
        return g.op("Concat", tail, g.unsqueeze(first, [0]), axis=0)
    head = g.op("Slice", seq, g.int64s([0]), g.int64s([-1]), g.int64s([0]))
    return g.op("Concat", g.unsqueeze(first, [0]), head, axis=0)


def _coefficients(g, dtype, sig, i, o, tg, tc, c_prev):
    """``coef`` (T, B, 4H) with d pre-activations = [dc, dh, dc, dc] *
    coef (gates i, o, f, c), and ``o (1 - tanh(C)^2)``, the part of dh
    reaching dc, from the sigmoids of (i, o, f) (together and i, o
    apart), tanh of the c gate, tanh of the cell states and the cell
    states entering every step."""
    one = g.const(1, dtype)
    dsig = g.op("Mul", sig, g.op("Sub", one, sig))
    coef = g.op("Concat", g.op("Mul", g.op("Concat", tg, tc, c_prev, axis=2), dsig),
                g.op("Mul", i, g.op("Sub", one, g.op("Mul", tg, tg))), axis=2)
    dh_to_dc = g.op("Mul", o, g.op("Sub", one, g.op("Mul", tc, tc)))
    return coef, dh_to_dc


def _reverse_scan(ctx, dtype, name, carried, scanned, gy, step, out_sizes, reverse):
    """One Scan walking the steps against the direction's order (the
    backward Scans of the LSTM and the GRU).

    ``carried``: (initial value, size) of each state; ``scanned``: (value,
    size) of each sequence the step reads, then ``gy`` (the gradient of Y,
    of size hidden = the first state's) when not None. ``step(sg, states,
    reads)`` writes one step into the body builder ``sg`` from the body's
    names (``reads`` ends with dh, the first state plus that step's gy)
    and returns the names of its outputs: the new states, then the
    per-step outputs, of sizes ``out_sizes``. Returns the Scan's outputs:
    the final states, then the per-step outputs (in the order of time)."""
    g, sg = ctx.g, sub_builder(ctx)
    sequences = list(scanned) + ([(gy, carried[0][1])] if gy is not None else [])
    inputs = [(sg.unique_name(f"state_{k}"), size) for k, (_, size) in enumerate(carried)]
    inputs += [(sg.unique_name(f"step_{k}"), size) for k, (_, size) in enumerate(sequences)]
    for input_name, size in inputs:
        sg.set_type(input_name, dtype, (None, size))
    names = [n for n, _ in inputs]
    states, reads = names[:len(carried)], names[len(carried):len(carried) + len(scanned)]
    dh = sg.op("Add", states[0], names[-1]) if gy is not None else states[0]
    outs = step(sg, states, reads + [dh])
    body = sg.make_graph(name, [helper.make_tensor_value_info(n, dtype, (None, s))
                                for n, s in inputs],
                         [helper.make_tensor_value_info(n, dtype, (None, s))
                          for n, s in zip(outs, out_sizes)])
    backwards = 0 if reverse else 1
    return g.op("Scan", *[v for v, _ in carried], *[v for v, _ in sequences],
                body=body, n_outputs=len(outs), num_scan_inputs=len(sequences),
                scan_input_directions=[backwards] * len(sequences),
                scan_output_directions=[backwards] * (len(outs) - len(carried)))


def _backward_scan(ctx, dtype, hidden, r, gy, gyh, gyc, dh_to_dc, coef, f, h0,
                   reverse):
    """dpre (T, B, 4H) and the gradients of the initial states; the
    steps run against the direction's order."""
    g = ctx.g

    def step(sg, states, reads):
        a_t, coef_t, f_t, dh = reads
        dc = sg.op("Add", states[1], sg.op("Mul", dh, a_t))
        dpre = sg.op("Mul", sg.op("Concat", dc, dh, dc, dc, axis=1), coef_t)
        return [sg.op("MatMul", dpre, r), sg.op("Mul", dc, f_t), dpre]
    dh_init = gyh if gyh is not None else g.zeros_like(h0, dtype)
    dc_init = gyc if gyc is not None else g.zeros_like(h0, dtype)
    dh0, dc0, dpre_all = _reverse_scan(
        ctx, dtype, "lstm_backward", [(dh_init, hidden), (dc_init, hidden)],
        [(dh_to_dc, hidden), (coef, 4 * hidden), (f, hidden)], gy, step,
        (hidden, hidden, 4 * hidden), reverse)
    return dpre_all, dh0, dc0


def lstm_scan_vjp(ctx, *grad_outputs):
    """Gradient of the Scan of one LSTM direction that
    :func:`~onnxtrain.graph.recurrent_lowering.lower_lstms` wrote: its
    scan outputs give the gates, tanh(C_t) and C_t-1 of every step, so the
    gradient is the direct LSTM gradient's backward Scan alone (no
    recomputation). Inputs: h0, c0 and the input projection of every step
    (whose gradient is the pre-activations'); R, read by the body, is the
    implicit input.

    Parameters
    ----------
    ctx : VJPContext
        Context of the Scan (:func:`is_lstm_scan`).
    *grad_outputs : str or None
        Gradients of its outputs (those of the final states and of Y; the
        gates' have none).

    Returns
    -------
    tuple of (str or None)
        Gradients of h0, c0, the projection, then of R.
    """
    g, dtype = ctx.g, ctx.dtype
    h0, c0, xw = ctx.inputs[:3]
    r = ctx.implicit_inputs[0]
    _, _, y, sig, tg, tc, c_prev = ctx.outputs
    hidden = _scan_hidden(ctx.node)
    reverse = bool(_scan_ints(ctx.node, "scan_input_directions")[0])
    i, o, f = _split(g, sig, 3, 2)
    coef, dh_to_dc = _coefficients(g, dtype, sig, i, o, tg, tc, c_prev)
    dpre, dh0, dc0 = _backward_scan(ctx, dtype, hidden, r, grad_outputs[2],
                                    grad_outputs[0], grad_outputs[1], dh_to_dc,
                                    coef, f, h0, reverse)
    grads = [dh0, dc0, dpre]
    result = [v if need else None for v, need in zip(grads, ctx.needs_grad)]
    dr = None
    if ctx.implicit_needs_grad[0]:
        flat = g.int64s([-1, 4 * hidden])
        dr = g.op("Gemm", g.op("Reshape", dpre, flat),
                  g.op("Reshape", _shift(g, h0, y, reverse), g.int64s([-1, hidden])),
                  transA=1)
    return tuple(result) + (dr,)


def _scan_ints(node, name):
    return next((list(a.ints) for a in node.attribute if a.name == name), [])


def _scan_hidden(node):
    body = next(a.g for a in node.attribute if a.name == "body")
    return body.input[0].type.tensor_type.shape.dim[1].dim_value


def is_lstm_scan(ctx, grad_outputs):
    """Whether the Scan of ``ctx`` is one LSTM direction written by
    :func:`~onnxtrain.graph.recurrent_lowering.lower_lstms`, as it wrote
    it (three inputs, seven outputs, R its only implicit input) and with
    no gradient reaching its gates (which only the gradient reads)."""
    node = ctx.node
    return (node.doc_string == LSTM_SCAN_DOC and len(node.input) == 3
            and len(node.output) == len(LSTM_SCAN_OUTPUTS)
            and len(ctx.implicit_inputs) == 1 and _scan_hidden(node) > 0
            and not any(grad_outputs[3:]))


def _gru_backward_scan(ctx, dtype, hidden, r, gy, gyh, coef, z, h0, reverse):
    """The gradients of the recurrent products ``H_t-1 R^T + Rb`` (T, B,
    3H), of the hidden states (T, B, H) and of the initial state; the
    steps run against the direction's order."""
    def step(sg, states, reads):
        coef_t, z_t, dh = reads
        if gy is None:  # a per-step output of its own, not the state
            dh = sg.op("Identity", dh)
        drec = sg.op("Mul", sg.op("Concat", dh, dh, dh, axis=1), coef_t)
        return [sg.op("Add", sg.op("MatMul", drec, r), sg.op("Mul", dh, z_t)),
                drec, dh]
    dh_init = gyh if gyh is not None else ctx.g.zeros_like(h0, dtype)
    dh0, drec_all, dh_all = _reverse_scan(
        ctx, dtype, "gru_backward", [(dh_init, hidden)],
        [(coef, 3 * hidden), (z, hidden)], gy, step,
        (hidden, 3 * hidden, hidden), reverse)
    return drec_all, dh_all, dh0


def gru_scan_vjp(ctx, *grad_outputs):
    """Gradient of the Scan of one GRU direction that
    :func:`~onnxtrain.graph.recurrent_lowering.lower_recurrent` wrote: its
    scan outputs give z, r, the candidate n and ``H_t-1 Rh^T + Rbh`` of
    every step, so the gradient is one backward Scan (no recomputation).
    Inputs: h0 and the input projection of every step; R and Rb (when the
    GRU has B), read by the body's Gemm, are the implicit inputs.

    Parameters
    ----------
    ctx : VJPContext
        Context of the Scan (:func:`is_gru_scan`).
    *grad_outputs : str or None
        Gradients of its outputs (those of the final state and of Y; the
        gates' have none).

    Returns
    -------
    tuple of (str or None)
        Gradients of h0, the projection, then of the implicit inputs.
    """
    g, dtype = ctx.g, ctx.dtype
    h0 = ctx.inputs[0]
    _, y, zr, n, rec_n = ctx.outputs
    hidden = _scan_hidden(ctx.node)
    reverse = bool(_scan_ints(ctx.node, "scan_input_directions")[0])
    gemm = _body_gemm(ctx.node)
    r = gemm.input[1]
    one = g.const(1, dtype)
    h_prev = _shift(g, h0, y, reverse)
    z, r_gate = _split(g, zr, 2, 2)
    # H = n + z (H_prev - n), n = tanh(x_n + r . rec_n): dn = dH (1 - z),
    # d pre-activation of n = dn (1 - n^2)
    cn = g.op("Mul", g.op("Sub", one, z), g.op("Sub", one, g.op("Mul", n, n)))
    dsig = g.op("Mul", zr, g.op("Sub", one, zr))
    coef = g.op("Concat", g.op("Mul", g.op("Concat", g.op("Sub", h_prev, n),
                                             g.op("Mul", cn, rec_n), axis=2),
                               dsig),
                g.op("Mul", cn, r_gate), axis=2)
    drec, dh_all, dh0 = _gru_backward_scan(ctx, dtype, hidden, r, grad_outputs[1],
                                           grad_outputs[0], coef, z, h0, reverse)
    drec_zr, _ = g.op("Split", drec, g.int64s([2 * hidden, hidden]), axis=2,
                      n_outputs=2)
    dxw = g.op("Concat", drec_zr, g.op("Mul", dh_all, cn), axis=2)
    result = [v if need else None for v, need in zip((dh0, dxw), ctx.needs_grad)]
    flat = g.op("Reshape", drec, g.int64s([-1, 3 * hidden]))
    implicit = []
    for name, need in zip(ctx.implicit_inputs, ctx.implicit_needs_grad):
        if not need:
            implicit.append(None)
        elif name == r:
            implicit.append(g.op(
                "Gemm", flat, g.op("Reshape", h_prev, g.int64s([-1, hidden])),
                transA=1))
        else:  # Rb
            implicit.append(g.reduce_sum(flat, [0], keepdims=0))
    return tuple(result) + tuple(implicit)


def _body_gemm(node):
    body = next(a.g for a in node.attribute if a.name == "body")
    return next(n for n in body.node if n.op_type == "Gemm")


def is_gru_scan(ctx, grad_outputs):
    """Whether the Scan of ``ctx`` is one GRU direction written by
    :func:`~onnxtrain.graph.recurrent_lowering.lower_recurrent`, as it
    wrote it (two inputs, five outputs, R and Rb the body Gemm's outer
    inputs and the only implicit inputs) and with no gradient reaching its
    gates (which only the gradient reads)."""
    node = ctx.node
    if not (node.doc_string == GRU_SCAN_DOC and len(node.input) == 2
            and len(node.output) == len(GRU_SCAN_OUTPUTS)
            and _scan_hidden(node) > 0 and not any(grad_outputs[2:])):
        return False
    gemm = _body_gemm(node)
    return set(ctx.implicit_inputs) == set(gemm.input[1:])


def _recurrent_or_direct_vjp(ctx, *grad_outputs):
    """The direct LSTM gradient where it applies, else the expansion's."""
    if not _lstm_direct(ctx):
        return _recurrent_vjp(ctx, *grad_outputs)
    grads = _LSTMGradient(ctx).run_gradient(*(list(grad_outputs) + [None] * 3)[:3])
    order = [0, 1, 2, 3, None, 4, 5, None]  # X W R B lens h0 c0 P
    return tuple(None if order[j] is None or not ctx.needs_grad[j]
                 or ctx.input(j) is None else grads[order[j]]
                 for j in range(len(ctx.inputs)))


for _op in _GATES:
    register_vjp(_op)(_recurrent_or_direct_vjp)
