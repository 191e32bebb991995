"""Gradient corpus generated from onnx's own operator tests.

Every node test case of ``onnx.backend.test.case.node`` (the ``_expanded``
variants excluded: they test an op's function body, made of other ops) with
a float input and a float output becomes one corpus case. Each float graph
input is treated as a weight (``wrt``): it becomes an initializer holding
the test's value, as the weights of a trained model. Every float output receives a random
``grad_output``, the split gradient models are built with
:func:`onnxtrain.autodiff.build_gradient_models` and each gradient is
compared with central finite differences of ``sum(output * grad_output)``
computed on the inference model.

Precision. Every float tensor of the case (inputs, outputs, constants,
``Cast(to=float)``) is converted to float64 wherever the op's schema allows
it and onnxruntime runs the result; then ``eps = 1e-6`` and the relative
error must stay below :data:`TOLERANCE` ``["float64"]``. Otherwise the
case runs in float32 (float16 cases are raised to float32) with
``eps = 1e-3`` and the looser :data:`TOLERANCE` ``["float32"]``, the
round-off of a float32 finite difference. Some float64 kernels of
onnxruntime compute partly in float32 (Shrink, GroupNormalization's
statistics, CausalConvWithState...): a probe (:func:`_float32_inside`)
detects them and their cases use the float32 settings
("float64-in-float32" in the table).

Errors are ``max |reference - gradient| / max(max |reference|, FLOOR)``
(:data:`FLOOR`: 1e-3 in float64, 0.1 in float32), so that a gradient equal
to zero up to round-off is judged in absolute terms. Ops with a
``stash_type`` attribute compute their statistics in the case's precision.

Kinks. Where the one-sided differences of an element disagree, the
function has a kink there (ReLU at 0, a tie in Max): the element passes
when the computed gradient lies between the two one-sided derivatives.
Jumps. Where the function is discontinuous (LpNormalization of a zero
vector), the difference quotient grows as 1/eps: an element whose
quotients with steps eps and 10 eps differ that way is not compared.

Inputs the op's schema marks non-differentiable (Resize's ``scales``,
GridSample's ``grid``...) are differentiated too; if the VJP rule refuses
one of them with a clear error, the case is retried without it and the
skipped input is listed in the report.

Large inputs: at most ``max_coords`` elements of each weight, drawn at
random (seeded), are perturbed.

Statuses: ``passed``; ``wrong`` (a gradient disagrees with finite
differences: a bug, never acceptable); ``unsupported`` (the rule or the
backward pass refused the graph with a clear error); ``error`` (anything
else: the gradient model failed the checker or onnxruntime); and, outside
the pass rate, ``nondifferentiable`` (no float output depends on a float
input through differentiable ops) and ``no_reference`` (onnxruntime cannot
run the case itself, or it has random outputs).

Running this file writes docs/op_coverage.md::

    python tests/op_corpus.py            # full run, writes the table
    python tests/op_corpus.py softmax    # only the cases whose name matches
"""
from __future__ import annotations

import collections
import copy
import sys
import time
import traceback
import warnings
import zlib
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx.defs
from onnx import TensorProto, numpy_helper

from gradcheck import check_model, run, session, split_gradients
from onnxtrain.autodiff import build_gradient_models
from onnxtrain.exceptions import MissingVJPRuleError

FLOATS = (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16,
          TensorProto.BFLOAT16)
#: Relative error allowed, by the precision the case ran in.
TOLERANCE = {"float64": 1e-5, "float32": 3e-2}
EPS = {"float64": 1e-6, "float32": 1e-3}
#: Errors are relative to max(max |reference|, FLOOR): a gradient that is
#: zero up to round-off is compared in absolute terms.
FLOOR = {"float64": 1e-3, "float32": 1e-1}
COUNTED = ("passed", "wrong", "unsupported", "error")
#: Ops with subgraphs: their float tensors all take the case's precision.
CONTROL_FLOW_OPS = ("If", "Loop", "Scan")
#: Ops whose outputs are random: finite differences have no reference.
RANDOM_OPS = {"Bernoulli", "RandomNormal", "RandomNormalLike", "RandomUniform",
              "RandomUniformLike", "Multinomial"}


@dataclass
class CorpusCase:
    """One onnx node test: its model and the feeds of its first data set."""

    name: str
    op_type: str
    domain: str
    model: onnx.ModelProto
    feeds: dict


@dataclass
class Result:
    """Outcome of one case (see the module docstring for ``status``)."""

    case: str
    op_type: str
    status: str
    reason: str = ""
    precision: str = ""
    error: float = 0.0
    skipped_inputs: list = field(default_factory=list)
    seconds: float = 0.0


# ---------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------

def _is_float(vi):
    return (vi.type.HasField("tensor_type")
            and vi.type.tensor_type.elem_type in FLOATS)


def load_corpus():
    """The corpus cases, in the order onnx lists its tests."""
    from onnx.backend.test.case.node import collect_testcases
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        cases = collect_testcases()
    corpus = []
    for case in cases:
        graph = case.model.graph
        if case.kind != "node" or "_expanded" in case.name:
            continue
        if not (any(_is_float(i) for i in graph.input)
                and any(_is_float(o) for o in graph.output)):
            continue
        node = graph.node[0]
        inputs = case.data_sets[0][0]
        feeds = {vi.name: _as_array(value)
                 for vi, value in zip(graph.input, inputs)}
        corpus.append(CorpusCase(case.name, node.op_type, node.domain,
                                 case.model, feeds))
    return corpus


def extra_cases():
    """Cases for registered ops whose onnx node tests cannot pass here (a
    CastLike test set made of non-finite values; Tile and GatherND tests
    at an opset below 16, where duplicated elements cannot be summed), and
    for attribute combinations the node tests leave out."""
    rng = np.random.default_rng(0)
    f = TensorProto.FLOAT

    def one_node(name, op, inputs, feeds, opset, **attrs):
        vis = [onnx.helper.make_tensor_value_info(
            n, onnx.helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
            for n, v in zip(inputs, feeds)]
        node = onnx.helper.make_node(op, inputs, ["y"], **attrs)
        graph = onnx.helper.make_graph(
            [node], name, vis, [onnx.helper.make_tensor_value_info("y", f, None)])
        model = onnx.helper.make_model(
            graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
        model.ir_version = 8
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        model.graph.output[0].CopyFrom(inferred.graph.output[0])
        return CorpusCase(name, op, "", model, dict(zip(inputs, feeds)))

    x = rng.uniform(-1, 1, (3, 4)).astype(np.float32)
    w = rng.uniform(-1, 1, (4,)).astype(np.float32)
    xt = rng.uniform(-1, 1, (2, 2, 3, 3)).astype(np.float32)
    wt = rng.uniform(-1, 1, (2, 3, 2, 3)).astype(np.float32)
    xz = x.copy()
    xz[0, 1] = xz[1, 1] = xz[1, 2] = 0.0
    return [
        one_node("extra_castlike_float_to_float", "CastLike", ["x", "like"],
                 [x, np.zeros(1, np.float32)], 19),
        one_node("extra_tile_opset16", "Tile", ["x", "repeats"],
                 [x, np.array([2, 3], np.int64)], 16),
        one_node("extra_gathernd_opset16", "GatherND", ["x", "indices"],
                 [x, np.array([[0, 1], [2, 3], [0, 1]], np.int64)], 16),
        # conventions the node tests leave out: ConvTranspose's crop with
        # an odd total padding, CumProd at zeros
        one_node("extra_convtranspose_output_shape_odd", "ConvTranspose",
                 ["x", "w"], [xt, wt], 17, strides=[2, 3], output_shape=[7, 9]),
        one_node("extra_convtranspose_same_lower", "ConvTranspose",
                 ["x", "w"], [xt, wt], 17, strides=[2, 2], auto_pad="SAME_LOWER"),
        one_node("extra_cumprod_zeros", "CumProd", ["x", "axis"],
                 [xz, np.array(1, np.int64)], 26),
        # control flow (onnx's If tests have no float input): a weight read
        # by both branches, differently, for each value of the condition
        if_case("extra_if_then", x, w, True),
        if_case("extra_if_else", x, w, False),
        # a Loop whose body reads a weight from the outer scope (onnx's
        # Loop test carries its only float value)
        loop_case("extra_loop_rnn", x, w),
    ]


def if_case(name, x, w, cond):
    """``If(cond)`` reading the float inputs x and w from the outer scope:
    then ``x * w``, else ``Exp(x) + w * w``."""
    helper, f = onnx.helper, TensorProto.FLOAT
    then_branch = helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["t"])], "then", [],
        [helper.make_tensor_value_info("t", f, None)])
    else_branch = helper.make_graph(
        [helper.make_node("Exp", ["x"], ["e0"]),
         helper.make_node("Mul", ["w", "w"], ["e1"]),
         helper.make_node("Add", ["e0", "e1"], ["e"])], "else", [],
        [helper.make_tensor_value_info("e", f, None)])
    node = helper.make_node("If", ["cond"], ["y"], then_branch=then_branch,
                            else_branch=else_branch)
    graph = helper.make_graph(
        [node], name,
        [helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x", f, x.shape),
         helper.make_tensor_value_info("w", f, w.shape)],
        [helper.make_tensor_value_info("y", f, x.shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return CorpusCase(name, "If", "", model,
                      {"cond": np.array(cond), "x": x, "w": w})


def loop_case(name, x, w):
    """``Loop`` over the rows of x (trip count M = 3, a condition the body
    passes through): ``h <- Tanh(h * w + x[i])`` from h0, stacking
    ``h * h``; x and w are read from the outer scope."""
    helper, f = onnx.helper, TensorProto.FLOAT
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Mul", ["h_in", "w"], ["a"]),
         helper.make_node("Gather", ["x", "i"], ["x_i"], axis=0),
         helper.make_node("Add", ["a", "x_i"], ["pre"]),
         helper.make_node("Tanh", ["pre"], ["h_out"]),
         helper.make_node("Mul", ["h_out", "h_out"], ["z"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_in", f, w.shape)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_out", f, w.shape),
         helper.make_tensor_value_info("z", f, w.shape)])
    node = helper.make_node("Loop", ["M", "cond", "h0"], ["hM", "Z"],
                            body=body)
    graph = helper.make_graph(
        [node], name,
        [helper.make_tensor_value_info("M", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h0", f, w.shape),
         helper.make_tensor_value_info("x", f, x.shape),
         helper.make_tensor_value_info("w", f, w.shape)],
        [helper.make_tensor_value_info("hM", f, w.shape),
         helper.make_tensor_value_info("Z", f, [None, w.shape[0]])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return CorpusCase(name, "Loop", "", model,
                      {"M": np.array(x.shape[0], np.int64),
                       "cond": np.array(True), "h0": np.flip(w).copy(),
                       "x": x, "w": w})


def _as_array(value):
    """numpy value of a data-set entry (sequences and optionals stay)."""
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, np.generic):
        return np.asarray(value)
    return value


def corpus_op_types():
    """Op types with at least one corpus or extra case (cached)."""
    if not _OP_TYPES:
        _OP_TYPES.update(c.op_type for c in load_corpus() + extra_cases())
    return set(_OP_TYPES)


_OP_TYPES = set()


# ---------------------------------------------------------------------------
# precision
# ---------------------------------------------------------------------------

def _allowed(schema, formal_list, index, type_name):
    """Whether the formal parameter at ``index`` accepts ``type_name``."""
    if not formal_list:
        return False
    formal = formal_list[min(index, len(formal_list) - 1)]
    constraints = {c.type_param_str: c.allowed_type_strs
                   for c in schema.type_constraints}
    allowed = constraints.get(formal.type_str, [formal.type_str])
    return type_name in allowed


def _retype_tensor(tensor, elem_type):
    array = numpy_helper.to_array(tensor).astype(
        onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    tensor.CopyFrom(numpy_helper.from_array(array, tensor.name))


def _retype_node_attributes(node, elem_type):
    for att in node.attribute:
        if att.type == onnx.AttributeProto.TENSOR and att.t.data_type in FLOATS:
            _retype_tensor(att.t, elem_type)
        if att.name == "to" and node.op_type == "Cast" and att.i in FLOATS:
            att.i = elem_type


def _retype_graph(graph, elem_type):
    """Every float tensor of ``graph`` and of its subgraphs in
    ``elem_type`` (control flow: the schemas accept any tensor type)."""
    for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
        if _is_float(vi):
            vi.type.tensor_type.elem_type = elem_type
    for init in graph.initializer:
        if init.data_type in FLOATS:
            _retype_tensor(init, elem_type)
    for node in graph.node:
        _retype_node_attributes(node, elem_type)
        for att in node.attribute:
            for sub in list(att.graphs) + ([att.g] if att.HasField("g") else []):
                _retype_graph(sub, elem_type)


def with_precision(model, elem_type):
    """Copy of a one-node ``model`` whose float tensors take ``elem_type``
    wherever the node's schema accepts it (everywhere for control flow)."""
    model = copy.deepcopy(model)
    graph = model.graph
    node = graph.node[0]
    if node.op_type in CONTROL_FLOW_OPS:
        _retype_graph(graph, elem_type)
        return model
    opset = next(o.version for o in model.opset_import
                 if o.domain == node.domain or (o.domain in ("", "ai.onnx")
                                                and not node.domain))
    schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
    type_name = {TensorProto.DOUBLE: "tensor(double)",
                 TensorProto.FLOAT: "tensor(float)"}[elem_type]
    ok = {}
    for i, name in enumerate(node.input):
        ok[name] = _allowed(schema, schema.inputs, i, type_name)
    for i, name in enumerate(node.output):
        ok[name] = _allowed(schema, schema.outputs, i, type_name)
    for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
        if _is_float(vi) and ok.get(vi.name, False):
            vi.type.tensor_type.elem_type = elem_type
    for init in graph.initializer:
        if init.data_type in FLOATS and ok.get(init.name, False):
            _retype_tensor(init, elem_type)
    _retype_node_attributes(node, elem_type)
    for name in ("stash_type", "softmax_precision"):  # in the same precision
        if name in schema.attributes:
            node.attribute.append(onnx.helper.make_attribute(name, elem_type))
    kept = {a.name: a for a in node.attribute}  # the last one wins
    del node.attribute[:]
    node.attribute.extend(kept.values())
    return model


def _feeds_for(model, feeds):
    types = {vi.name: vi.type.tensor_type.elem_type for vi in model.graph.input}
    out = {}
    for name, value in feeds.items():
        if types.get(name) in FLOATS and types[name] != TensorProto.BFLOAT16:
            value = value.astype(onnx.helper.tensor_dtype_to_np_dtype(types[name]))
        out[name] = value
    return out


def _float32_inside(sess, model, feeds):
    """True when a float64 kernel does not compute in float64 (some round
    their inputs or statistics to float32): along a random direction, a step
    100 times longer must change the outputs 100 times more."""
    rng = np.random.default_rng(0)
    direction = {n: rng.uniform(-1, 1, v.shape) for n, v in feeds.items()
                 if v.dtype == np.float64}
    if not direction:
        return False

    def moved(step):
        outs = run(sess, {n: v + step * direction[n] if n in direction else v
                          for n, v in feeds.items()})
        return np.concatenate([o.astype(np.float64).ravel()
                               for o in outs.values() if o.dtype == np.float64]
                              or [np.zeros(0)])
    base, small, large = moved(0.0), moved(1e-7), moved(1e-5)
    d_small, d_large = small - base, large - base
    if not (np.isfinite(d_small).all() and np.isfinite(d_large).all()):
        return False
    scale = max(float(np.max(np.abs(d_large), initial=0.0)), 1e-300)
    return float(np.max(np.abs(d_large - 100 * d_small), initial=0.0)) > 1e-3 * scale


def choose_precision(case):
    """``(model, feeds, precision)`` in float64 when onnxruntime runs it,
    else float32, else the original types; None when nothing runs."""
    for elem_type, label in ((TensorProto.DOUBLE, "float64"),
                             (TensorProto.FLOAT, "float32")):
        try:
            model = with_precision(case.model, elem_type)
            if not any(_is_float(vi) and vi.type.tensor_type.elem_type == elem_type
                       for vi in model.graph.input):
                continue  # the schema keeps every float input in another type
            feeds = _feeds_for(model, case.feeds)
            sess = session(model)
            run(sess, feeds)
            if label == "float64" and _float32_inside(sess, model, feeds):
                label = "float64-in-float32"
            return model, feeds, label
        except Exception:  # noqa: BLE001 - try the next precision
            continue
    try:
        run(session(case.model), case.feeds)
        return case.model, dict(case.feeds), "original"
    except Exception:  # noqa: BLE001
        return None


# ---------------------------------------------------------------------------
# finite differences with kink detection
# ---------------------------------------------------------------------------

def _objective(sess, feeds, name, grad_outputs):
    def f(value):
        outs = run(sess, {**feeds, name: value})
        return sum(float(np.sum(outs[o].astype(np.float64) * g))
                   for o, g in grad_outputs.items())
    return f


def _jumps(f, base, idx, eps, mid):
    """True when the central difference with a 10 times longer step differs
    from ``mid`` as a jump does (a difference quotient growing as 1/eps)."""
    plus, minus = base.copy(), base.copy()
    plus[idx] += 10 * eps
    minus[idx] -= 10 * eps
    step = (float(plus[idx]) - float(minus[idx])) / 2
    wide = (f(plus) - f(minus)) / (2 * step)
    return abs(wide - mid) > 0.5 * max(abs(mid), 1.0)


def compare_gradient(sess, feeds, name, grad_outputs, analytic, precision,
                     max_coords, rng):
    """Relative error of ``analytic`` against finite differences, with the
    kink rule of the module docstring. Returns ``(error, n_kinks)``."""
    base = np.asarray(feeds[name])
    eps = EPS["float64" if precision == "float64" else "float32"]
    f = _objective(sess, feeds, name, grad_outputs)
    f0 = f(base)
    coords = list(np.ndindex(base.shape))
    if len(coords) > max_coords:
        picked = rng.choice(len(coords), size=max_coords, replace=False)
        coords = [coords[i] for i in sorted(picked)]
    analytic = np.asarray(analytic, dtype=np.float64)
    if analytic.shape != base.shape:
        raise AssertionError(f"gradient of {name} has shape {analytic.shape}, "
                             f"expected {base.shape}")
    central, fitted, kinks, jumps = [], [], 0, 0
    for idx in coords:
        plus, minus = base.copy(), base.copy()
        plus[idx] += eps
        minus[idx] -= eps
        step = (float(plus[idx]) - float(minus[idx])) / 2  # as represented
        if step == 0:
            continue
        fp, fm = f(plus), f(minus)
        right, left = (fp - f0) / step, (f0 - fm) / step
        mid = (fp - fm) / (2 * step)
        value = analytic[idx]
        if not np.isfinite([left, right]).all():
            continue  # not defined on both sides: no reference here
        scale = max(abs(left), abs(right), 1.0)
        if abs(mid - value) > 1e-3 * scale and _jumps(f, base, idx, eps, mid):
            jumps += 1
            continue  # discontinuous here (a step): no derivative to compare
        if abs(right - left) > 1e-2 * scale:  # a kink at this point
            kinks += 1
            lo, hi = min(left, right), max(left, right)
            mid = min(max(value, lo), hi)
        central.append(mid)
        fitted.append(value)
    central, fitted = np.array(central), np.array(fitted)
    floor = FLOOR["float64" if precision == "float64" else "float32"]
    scale = max(float(np.max(np.abs(central), initial=0.0)), floor)
    return float(np.max(np.abs(central - fitted), initial=0.0)) / scale, kinks


# ---------------------------------------------------------------------------
# one case
# ---------------------------------------------------------------------------

#: Inputs of deprecated ops whose schema leaves their differentiation
#: category unknown, where the successor marks them non-differentiable
#: (Upsample's scales are Resize's scales).
_DEPRECATED_NONDIFFERENTIABLE = {"Upsample": (1,)}


def _schema_nondifferentiable(case):
    """Graph inputs bound to formal inputs the schema marks
    NonDifferentiable."""
    node = case.model.graph.node[0]
    try:
        schema = onnx.defs.get_schema(node.op_type, domain=node.domain)
    except Exception:  # noqa: BLE001
        return set()
    names = {node.input[i] for i in _DEPRECATED_NONDIFFERENTIABLE.get(
        node.op_type, ()) if i < len(node.input)}
    category = onnx.defs.OpSchema.DifferentiationCategory.NonDifferentiable
    for i, name in enumerate(node.input):
        formal = schema.inputs[min(i, len(schema.inputs) - 1)]
        if formal.differentiation_category == category:
            names.add(name)
    return names


def as_weights(model, feeds, names):
    """Copy of ``model`` where the graph inputs ``names`` become
    initializers holding ``feeds`` (weights, as in a trained model)."""
    model = copy.deepcopy(model)
    # the ai.onnx.ml tests: IR 3 lists every initializer among the inputs,
    # and no default-domain opset is imported for the gradient's ops
    model.ir_version = max(model.ir_version, 4)
    if not any(o.domain in ("", "ai.onnx") for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid("", 17))
    kept = [vi for vi in model.graph.input if vi.name not in names]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    model.graph.initializer.extend(
        numpy_helper.from_array(np.asarray(feeds[n]), n) for n in names)
    return model


def _build(case, model, wrt):
    """Gradient models; on a refusal naming a schema-non-differentiable
    input, retry without the inputs of that kind. Returns (gm, skipped)."""
    try:
        return build_gradient_models(model, wrt), []
    except NotImplementedError:
        optional = _schema_nondifferentiable(case) & set(wrt)
        if not optional:
            raise
        kept = [w for w in wrt if w not in optional]
        if not kept:
            raise
        return build_gradient_models(model, kept), sorted(optional)


def check_case(case, max_coords=2000):
    """Run one corpus case and return its :class:`Result`."""
    start = time.perf_counter()
    result = _check_case(case, max_coords)
    result.seconds = time.perf_counter() - start
    return result


def _random_dropout(case):
    """Dropout in training mode with a non-zero ratio draws its mask."""
    inputs = list(case.model.graph.node[0].input) + ["", "", ""]
    training = case.feeds.get(inputs[2])
    ratio = case.feeds.get(inputs[1], np.array(0.5))
    return training is not None and bool(training) and float(ratio) != 0.0


def _check_case(case, max_coords):
    res = Result(case.name, case.op_type, "error")
    if case.op_type in RANDOM_OPS:
        res.status, res.reason = "no_reference", "random outputs"
        return res
    if not all(isinstance(v, np.ndarray) for v in case.feeds.values()):
        res.status, res.reason = "no_reference", "non-tensor inputs"
        return res
    if case.op_type == "Dropout" and _random_dropout(case):
        res.status, res.reason = "no_reference", "random outputs (training mode)"
        return res
    chosen = choose_precision(case)
    if chosen is None:
        res.status, res.reason = "no_reference", "onnxruntime cannot run the case"
        return res
    model, feeds, res.precision = chosen
    wrt = [vi.name for vi in model.graph.input if _is_float(vi)]
    try:
        gm, res.skipped_inputs = _build(case, as_weights(model, feeds, wrt), wrt)
    except ValueError as exc:
        if "No output" in str(exc):
            res.status, res.reason = "nondifferentiable", "no differentiable path"
        else:
            res.status, res.reason = "unsupported", _first_line(exc)
        return res
    except (NotImplementedError, MissingVJPRuleError) as exc:
        res.status, res.reason = "unsupported", _first_line(exc)
        return res
    except Exception as exc:  # noqa: BLE001 - a bug, reported
        res.reason = f"build: {type(exc).__name__}: {_first_line(exc)}"
        return res
    return _compare(case, gm, feeds, res, max_coords)


def _compare(case, gm, feeds, res, max_coords):
    try:
        _check_forward_model(case, gm.forward_model)
        check_model(gm.backward_model)
        rng = np.random.default_rng(zlib.crc32(case.name.encode()))
        inference = session(gm.inference_model)
        ys = run(inference, feeds)
        if not all(np.all(np.isfinite(ys[o].astype(np.float64)))
                   for o in gm.outputs):
            res.status, res.reason = "no_reference", "non-finite outputs"
            return res
        grad_outputs = {o: rng.uniform(-1, 1, np.shape(ys[o])).astype(
            ys[o].dtype) for o in gm.outputs}
        _, grads = split_gradients(gm, feeds, grad_outputs)
    except Exception as exc:  # noqa: BLE001 - a bug, reported
        res.reason = f"run: {type(exc).__name__}: {_first_line(exc)}"
        return res
    errors = []
    for w in gm.wrt:
        try:
            err, _ = compare_gradient(inference, feeds, w, grad_outputs,
                                      grads[w], res.precision, max_coords, rng)
        except AssertionError as exc:
            res.status, res.reason = "wrong", str(exc)
            return res
        except Exception:  # noqa: BLE001 - onnxruntime refused a perturbed input
            if w in _schema_nondifferentiable(case):
                res.skipped_inputs.append(w)
                continue
            raise
        errors.append((err, w))
    res.error = max(errors)[0]
    tol = TOLERANCE["float64" if res.precision == "float64" else "float32"]
    bad = [f"{w} ({e:.1e})" for e, w in errors if not e <= tol]
    res.status = "wrong" if bad else "passed"
    res.reason = ("relative error of " + ", ".join(bad)) if bad else ""
    return res


def _check_forward_model(case, forward):
    """The checker on the forward model, unless onnx's checker rejects the
    case's own model for the same reason: onnx 1.23's shape inference fails
    on MeanVarianceNormalization without ``axes`` (its function body's
    Constant gets no value), a fault of onnx that the forward model, which
    copies the node, inherits."""
    try:
        check_model(forward)
    except Exception as exc:  # noqa: BLE001 - compared with the case's own
        try:
            check_model(case.model)
        except Exception as own:  # noqa: BLE001
            if _first_line(own) == _first_line(exc):
                return
        raise


def _first_line(exc):
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


# ---------------------------------------------------------------------------
# the table
# ---------------------------------------------------------------------------

def summarize(results):
    """``{op: Counter(status)}`` and the overall counts."""
    per_op = collections.defaultdict(collections.Counter)
    for r in results:
        per_op[r.op_type][r.status] += 1
    return per_op


def render_markdown(results, seconds):
    per_op = summarize(results)
    counted = [r for r in results if r.status in COUNTED]
    passed = sum(r.status == "passed" for r in counted)
    wrong = sum(r.status == "wrong" for r in counted)
    full_ops = sorted(op for op, c in per_op.items()
                      if c["passed"] and c["passed"] == sum(
                          c[s] for s in COUNTED))
    lines = [
        "# Operator coverage of onnxtrain's gradients",
        "",
        "Generated by `python tests/op_corpus.py` (do not edit by hand) from "
        "onnx's node tests (`onnx.backend.test.case.node`, onnx "
        f"{onnx.__version__}); see the docstring of tests/op_corpus.py for "
        "the method (float64 finite differences where onnxruntime has the "
        "kernel, float32 otherwise; tolerances "
        f"{TOLERANCE['float64']:g} and {TOLERANCE['float32']:g}).",
        "",
        f"- cases with a float input and a float output: {len(results)} "
        "(the `extra_*` ones are tests/op_corpus.py's own, see `extra_cases`)",
        f"- cases counted (differentiable, with a reference): {len(counted)}",
        f"- passed: {passed} ({100.0 * passed / max(len(counted), 1):.1f}%)",
        f"- wrong gradients: {wrong}",
        f"- ops passing all their counted cases: {len(full_ops)}",
        f"- run time: {seconds:.0f} s",
        "",
        "| op | cases | passed | wrong | unsupported | error | not counted |",
        "|---|---|---|---|---|---|---|",
    ]
    for op in sorted(per_op):
        c = per_op[op]
        other = c["nondifferentiable"] + c["no_reference"]
        lines.append(f"| {op} | {sum(c.values())} | {c['passed']} | "
                     f"{c['wrong']} | {c['unsupported']} | {c['error']} | "
                     f"{other} |")
    lines += ["", "## Cases not passed", "",
              "| case | status | precision | reason |", "|---|---|---|---|"]
    for r in results:
        if r.status != "passed":
            reason = r.reason.replace("|", "\\|")
            lines.append(f"| {r.case} | {r.status} | {r.precision} | {reason} |")
    skipped = [r for r in results if r.skipped_inputs]
    if skipped:
        lines += ["", "## Inputs not differentiated",
                  "", "Inputs the schema marks non-differentiable and whose "
                  "gradient the rule refuses with a clear error.", "",
                  "| case | inputs |", "|---|---|"]
        lines += [f"| {r.case} | {', '.join(r.skipped_inputs)} |"
                  for r in skipped]
    return "\n".join(lines) + "\n"


def main(argv):
    import onnxruntime
    onnxruntime.set_default_logger_severity(3)
    pattern = argv[1] if len(argv) > 1 else ""
    start = time.perf_counter()
    results = []
    for case in load_corpus() + extra_cases():
        if pattern not in case.name:
            continue
        try:
            r = check_case(case)
        except Exception:  # noqa: BLE001 - keep going, show the bug
            r = Result(case.name, case.op_type, "error",
                       traceback.format_exc().strip().splitlines()[-1])
        results.append(r)
        if r.status != "passed":
            print(f"{r.status:18s} {r.case:60s} {r.precision:8s} {r.reason[:150]}",
                  flush=True)
    seconds = time.perf_counter() - start
    text = render_markdown(results, seconds)
    if not pattern:
        with open("docs/op_coverage.md", "w", encoding="utf-8") as f:
            f.write(text)
    print("\n".join(text.splitlines()[6:13]))


if __name__ == "__main__":
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        main(sys.argv)
