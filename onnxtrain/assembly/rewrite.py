"""Rewrite prediction graphs into forms onnxtrain can train.

Pure graph utilities (no onnxruntime): every function takes a ModelProto
and returns a new one, the caller's model is never modified.

- :func:`rewrite_ml_linear_ops` replaces the ``ai.onnx.ml`` operators
  ``LinearRegressor`` and ``LinearClassifier`` (whose coefficients live in
  attributes, out of autodiff's reach) by standard ``MatMul``/``Add``
  (+ ``Sigmoid``/``Softmax``) nodes with trainable float initializers.
- :func:`probability_graph` keeps only the float probability tensor of a
  classifier (dropping ``ZipMap`` and the label path).
- :func:`prediction_graph` keeps only one output of a graph.
- :func:`class_labels` reads the labels a classifier graph gives its
  probability columns.
"""
from __future__ import annotations


import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..graph import (FLOAT_TYPES, GraphBuilder, clean_shape,
                     infer_value_types, opset_of)
from ..graph.builder import constant_node_value, copy_fields
from ..graph.scopes import subgraphs
from .models import load_model

__all__ = ["class_labels", "rewrite_ml_linear_ops", "probability_graph",
           "prediction_graph", "with_first_output"]

ML_DOMAIN = "ai.onnx.ml"

#: post_transform values the rewritten LinearClassifier reproduces.
_CLASSIFIER_TRANSFORMS = ("NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO")

#: Lowest default-domain opset added to a model that has none.
_MIN_ADDED_OPSET = 13


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------
def _copy(model):
    new = onnx.ModelProto()
    new.CopyFrom(model)
    return new


def _replace(field, items):
    """Set a repeated message field to copies of ``items`` (which may be
    elements of that field)."""
    copies = []
    for item in items:
        copy = type(item)()
        copy.CopyFrom(item)
        copies.append(copy)
    del field[:]
    field.extend(copies)


def _attributes(node):
    """``name -> python value`` of a node's attributes (strings decoded)."""
    values = {}
    for att in node.attribute:
        value = helper.get_attribute_value(att)
        if isinstance(value, bytes):
            value = value.decode("utf-8")
        elif isinstance(value, list) and value and isinstance(value[0], bytes):
            value = [v.decode("utf-8") for v in value]
        values[att.name] = value
    return values


def _node_label(node):
    return f"{node.op_type} node {node.name!r}" if node.name else \
        f"{node.op_type} node (outputs {list(node.output)})"


def _graph_names(graph, names=None):
    """Every name used in ``graph`` (values, initializers, nodes), recursively."""
    names = set() if names is None else names
    for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
        names.add(vi.name)
    for init in graph.initializer:
        names.add(init.name)
    for sparse in graph.sparse_initializer:
        names.add(sparse.values.name)
    for node in graph.node:
        names.update(n for n in node.input if n)
        names.update(n for n in node.output if n)
        if node.name:
            names.add(node.name)
        for sub in subgraphs(node):
            _graph_names(sub, names)
    return names


def _subgraph_inputs(graph, names=None):
    """Names read by the nodes of ``graph`` and its subgraphs (over-approximates
    the values a subgraph captures from the outer scope)."""
    names = set() if names is None else names
    for node in graph.node:
        names.update(n for n in node.input if n)
        for sub in subgraphs(node):
            _subgraph_inputs(sub, names)
    return names


def _used_domains(model):
    domains = set()
    # an explicit stack, not a recursive closure (a closure referring to
    # itself is a reference cycle left to the garbage collector)
    graphs = [model.graph]
    while graphs:
        graph = graphs.pop()
        for node in graph.node:
            domains.add(node.domain)
            graphs.extend(subgraphs(node))
    for function in model.functions:
        domains.add(function.domain)
        for node in function.node:
            domains.add(node.domain)
    return {"" if d == "ai.onnx" else d for d in domains}


def _tidy_opsets(model):
    """Drop the opset imports of non-default domains no node uses, and exact
    duplicates. The default domain is always kept."""
    used = _used_domains(model)
    kept, seen = [], set()
    for op in model.opset_import:
        domain = "" if op.domain == "ai.onnx" else op.domain
        if domain != "" and domain not in used:
            continue
        key = (op.domain, op.version)
        if key in seen:
            continue
        seen.add(key)
        kept.append(op)
    _replace(model.opset_import, kept)


def _companion_opset(ml_version):
    """The default-domain opset onnx released together with ``ai.onnx.ml``
    version ``ml_version`` (at least :data:`_MIN_ADDED_OPSET`)."""
    default = None
    for row in helper.VERSION_TABLE:
        if row[3] == ml_version:
            default = row[2]
            break
    if default is None:
        default = onnx.defs.onnx_opset_version()
    return max(int(default), _MIN_ADDED_OPSET)


def _ensure_default_opset(model):
    """The default-domain opset of ``model``, added when missing."""
    version = opset_of(model, "")
    if version is not None:
        return version
    version = _companion_opset(opset_of(model, ML_DOMAIN) or 1)
    model.opset_import.append(helper.make_opsetid("", version))
    try:
        needed = helper.find_min_ir_version_for(list(model.opset_import),
                                                ignore_unknown=True)
    except Exception:  # pragma: no cover - opsets onnx does not know yet
        needed = model.ir_version
    model.ir_version = max(model.ir_version, needed)
    return version


def _make_float_initializer(builder, base, array):
    name = builder.unique_name(base)
    tensor = numpy_helper.from_array(np.asarray(array, dtype=np.float32), name)
    builder.initializers.append(tensor)
    builder.set_type(name, TensorProto.FLOAT, array.shape)
    return name


def _make_label_initializer(builder, labels, is_string):
    name = builder.unique_name("classlabels")
    if is_string:
        tensor = helper.make_tensor(name, TensorProto.STRING, [len(labels)],
                                    [str(v).encode("utf-8") for v in labels])
    else:
        tensor = numpy_helper.from_array(np.asarray(labels, dtype=np.int64), name)
    builder.initializers.append(tensor)
    return name


# --------------------------------------------------------------------------
# rewrite_ml_linear_ops
# --------------------------------------------------------------------------
def _float_input(builder, node, n_features):
    """The node's input X as a float 2-D tensor (Cast/Reshape when needed)."""
    x = node.input[0]
    info = builder.types.get(x)
    elem, shape = (None, None) if info is None else info
    if shape is not None and len(shape) >= 2 and isinstance(shape[-1], int) \
            and shape[-1] != n_features:
        raise ValueError(
            f"{_node_label(node)}: its coefficients expect {n_features} features, "
            f"its input {x!r} has shape {shape}.")
    if elem != TensorProto.FLOAT:
        # onnxruntime computes these ops in float whatever the input type
        x = builder.cast(x, TensorProto.FLOAT)
    if shape is not None and len(shape) == 1:
        # a single sample of shape (n_features,): onnxruntime treats it as (1, n)
        x = builder.op("Reshape", x, builder.int64s([1, n_features]))
    return x


def _linear(builder, x, weights, bias, output=None):
    """``x @ weights + bias`` with new trainable initializers."""
    w = _make_float_initializer(builder, "coefficient", weights)
    b = _make_float_initializer(builder, "intercepts", bias)
    product = builder.op("MatMul", x, w)
    return builder.op("Add", product, b,
                      outputs=None if output is None else [output])


def _rewrite_linear_regressor(builder, node):
    attrs = _attributes(node)
    post = attrs.get("post_transform", "NONE")
    if post != "NONE":
        raise NotImplementedError(
            f"{_node_label(node)}: post_transform={post!r} is not supported by "
            f"rewrite_ml_linear_ops (only 'NONE').")
    targets = int(attrs.get("targets", 1))
    coefficients = np.asarray(attrs.get("coefficients", []), dtype=np.float32)
    if targets < 1 or coefficients.size == 0 or coefficients.size % targets:
        raise ValueError(
            f"{_node_label(node)}: {coefficients.size} coefficients cannot be "
            f"split into targets={targets} rows.")
    n_features = coefficients.size // targets
    intercepts = np.asarray(attrs.get("intercepts", [0.0] * targets),
                            dtype=np.float32)
    if intercepts.size != targets:
        raise ValueError(f"{_node_label(node)}: {intercepts.size} intercepts for "
                         f"targets={targets}.")
    # onnx layout: the coefficients of each target are contiguous
    weights = coefficients.reshape(targets, n_features).T
    x = _float_input(builder, node, n_features)
    _linear(builder, x, np.ascontiguousarray(weights), intercepts.reshape(1, targets),
            output=node.output[0])
    return None


def _softmax_zero(builder, scores, output):
    """onnxruntime's SOFTMAX_ZERO: a softmax over the non-zero scores of each
    row, zero scores (|s| <= 1e-7) stay (almost) zero."""
    zero = builder.const(0.0, TensorProto.FLOAT)
    eps = builder.const(1e-7, TensorProto.FLOAT)
    row_max = builder.reduce("ReduceMax", scores, [1], keepdims=1)
    exps = builder.op("Exp", builder.op("Sub", scores, row_max))
    nonzero = builder.op("Greater", builder.op("Abs", scores), eps)
    kept = builder.op("Where", nonzero, exps, zero)
    small = builder.op("Mul", scores, builder.op("Exp", builder.op("Neg", row_max)))
    numerator = builder.op("Where", nonzero, exps, small)
    total = builder.reduce_sum(kept, [1], keepdims=1)
    return builder.op("Div", numerator, total, outputs=[output])


def _rewrite_linear_classifier(builder, node, tie_binary):
    attrs = _attributes(node)
    post = attrs.get("post_transform", "NONE")
    if post not in _CLASSIFIER_TRANSFORMS:
        raise NotImplementedError(
            f"{_node_label(node)}: post_transform={post!r} is not supported by "
            f"rewrite_ml_linear_ops (supported: {list(_CLASSIFIER_TRANSFORMS)}).")
    ints = attrs.get("classlabels_ints")
    strings = attrs.get("classlabels_strings")
    if (ints is None) == (strings is None):
        raise ValueError(f"{_node_label(node)}: exactly one of classlabels_ints and "
                         f"classlabels_strings must be set.")
    is_string = strings is not None
    labels = list(strings if is_string else ints)
    coefficients = np.asarray(attrs.get("coefficients", []), dtype=np.float32)
    intercepts = attrs.get("intercepts")
    if intercepts is not None:
        n_rows = len(intercepts)
    else:
        info = builder.types.get(node.input[0])
        n_feat = None if info is None or not info[1] else info[1][-1]
        if isinstance(n_feat, int) and n_feat > 0 and coefficients.size % n_feat == 0:
            n_rows = coefficients.size // n_feat
        else:
            n_rows = len(labels)
        intercepts = [0.0] * n_rows
    if n_rows < 1 or coefficients.size == 0 or coefficients.size % n_rows:
        raise ValueError(f"{_node_label(node)}: {coefficients.size} coefficients "
                         f"cannot be split into {n_rows} rows (one per intercept).")
    n_features = coefficients.size // n_rows
    rows = coefficients.reshape(n_rows, n_features)
    intercepts = np.asarray(intercepts, dtype=np.float32)

    if n_rows == 1:
        if len(labels) != 2:
            raise ValueError(f"{_node_label(node)}: one coefficient row needs exactly "
                             f"2 class labels, got {labels}.")
        mode = "one_row"
    elif n_rows != len(labels):
        raise ValueError(f"{_node_label(node)}: {n_rows} coefficient rows but "
                         f"{len(labels)} class labels {labels}.")
    elif (tie_binary and n_rows == 2 and np.array_equal(rows[0], -rows[1])
          and intercepts[0] == -intercepts[1]):
        mode = "tied"  # skl2onnx's binary LogisticRegression: rows (-w, w)
    else:
        mode = "rows"

    x = _float_input(builder, node, n_features)
    if mode == "rows":
        raw = _linear(builder, x, np.ascontiguousarray(rows.T),
                      intercepts.reshape(1, n_rows))
    else:
        # one score z for the positive class; the two columns are (-z, z)
        z = _linear(builder, x, rows[-1].reshape(n_features, 1),
                    intercepts[-1:].reshape(1, 1))
    label_out = node.output[0] if len(node.output) > 0 else ""
    score_out = node.output[1] if len(node.output) > 1 else ""
    if mode != "rows" and (mode == "tied" or label_out):
        # tied: the raw scores are (-z, z); one row: only the label needs them
        raw = builder.op("Concat", builder.op("Neg", z), z, axis=1)

    if label_out:
        # onnxruntime takes the first maximum of the raw scores (for one row:
        # the positive label when z > 0)
        index = builder.op("ArgMax", raw, axis=1, keepdims=0)
        classes = _make_label_initializer(builder, labels, is_string)
        builder.op("Gather", classes, index, axis=0, outputs=[label_out])
    if score_out:
        transform = post
        if mode == "one_row":
            # onnxruntime writes (1 - s, s) where s = sigmoid(z) when LOGISTIC
            # and s = z otherwise
            s = builder.op("Sigmoid", z) if post == "LOGISTIC" else z
            one = builder.const(1.0, TensorProto.FLOAT)
            builder.op("Concat", builder.op("Sub", one, s), s, axis=1,
                       outputs=[score_out])
        elif transform == "NONE":
            builder.op("Identity", raw, outputs=[score_out])
        elif transform == "LOGISTIC" and mode == "tied":
            # the sigmoid of each column of (-z, z), written so that the
            # graph does not end with a Sigmoid over two columns: those
            # rows sum to 1, and the classifier reads them as probabilities
            builder.op("Concat", builder.op("Sigmoid", builder.op("Neg", z)),
                       builder.op("Sigmoid", z), axis=1, outputs=[score_out])
        elif transform == "LOGISTIC":
            builder.op("Sigmoid", raw, outputs=[score_out])
        elif transform == "SOFTMAX":
            builder.op("Softmax", raw, axis=1, outputs=[score_out])
        else:
            _softmax_zero(builder, raw, score_out)
        return score_out
    return None


def _rewrite_l1_normalizer(builder, node):
    """Normalizer(norm='L1') on 2-D scores: ``x / sum(|x|)`` per row, ``x``
    itself for a row summing to zero."""
    x = node.input[0]
    zero = builder.const(0.0, TensorProto.FLOAT)
    total = builder.reduce_sum(builder.op("Abs", x), [1], keepdims=1)
    # total + (total == 0): the divisor is 1 on zero rows, written without
    # Where so that the gradient only needs Add (comparisons and the Cast of
    # a bool carry none); total >= 0, so Not(total > 0) means total == 0 and
    # is valid at opset 9, where Equal takes no floats
    is_zero = builder.cast(builder.op("Not", builder.op("Greater", total, zero)),
                           TensorProto.FLOAT)
    divisor = builder.op("Add", total, is_zero)
    builder.op("Div", x, divisor, outputs=[node.output[0]])


def _scalar_values(graph):
    """``name -> float`` of the one-element float initializers and Constant
    nodes of ``graph``."""
    values = {}
    for init in graph.initializer:
        if init.data_type in FLOAT_TYPES and int(np.prod(init.dims)) == 1:
            values[init.name] = float(numpy_helper.to_array(init).reshape(-1)[0])
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            value = constant_node_value(node)
            if value is not None and value.dtype.kind == "f" and value.size == 1:
                values[node.output[0]] = float(value.reshape(-1)[0])
    return values


def _logistic_chains(graph):
    """``(Mul, Exp, Add, Reciprocal)`` chains computing ``1 / (1 + exp(-x))``
    (skl2onnx's SGDClassifier probabilities) whose intermediate values
    nothing else reads."""
    scalars = _scalar_values(graph)
    readers = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    outputs = {o.name for o in graph.output}

    def only_reader(node, op_type):
        name = node.output[0]
        nodes = readers.get(name, [])
        if name in outputs or len(nodes) != 1 or nodes[0].op_type != op_type \
                or nodes[0].domain not in ("", "ai.onnx"):
            return None
        return nodes[0]

    def other(node, name):
        """The input of a binary node that is not ``name``."""
        if list(node.input).count(name) != 1 or len(node.input) != 2:
            return None
        return node.input[1] if node.input[0] == name else node.input[0]

    chains = []
    for mul in graph.node:
        if mul.op_type != "Mul" or mul.domain not in ("", "ai.onnx"):
            continue
        negate = [i for i in mul.input if scalars.get(i) == -1.0]
        if len(negate) != 1 or len(mul.input) != 2:
            continue
        exp = only_reader(mul, "Exp")
        add = exp and only_reader(exp, "Add")
        reciprocal = add and only_reader(add, "Reciprocal")
        if reciprocal and scalars.get(other(add, exp.output[0])) == 1.0:
            chains.append((mul, exp, add, reciprocal))
    return chains


#: Largest exponent of the bounded logistic chains: exp(88) is finite in
#: float32 (its largest exponent is 88.72).
_MAX_EXPONENT = 88.0


def _rewrite_logistic(graph, types):
    """Bound the exponent of each chain of :func:`_logistic_chains`:
    ``1 / (1 + exp(min(-x, 88)))``. The values are the chain's where
    ``exp(-x)`` is finite, and below 1e-38 instead of 0 elsewhere; the
    gradient stays finite there (the chain's is ``0 * inf``, NaN, for
    scores below -88). Sigmoid would not do: onnxruntime's clamps its
    input to [-18, 18], and the ratios of small one-vs-rest probabilities
    would change. Returns whether the graph changed."""
    names = _graph_names(graph)
    changed = False
    for mul, exp, add, reciprocal in _logistic_chains(graph):
        elem = types.get(mul.output[0], (None,))[0]
        if elem not in FLOAT_TYPES:
            continue
        bound, bounded = (_unique(names, f"{mul.output[0]}_{suffix}")
                          for suffix in ("max", "bounded"))
        value = numpy_helper.from_array(np.asarray(
            _MAX_EXPONENT, dtype=helper.tensor_dtype_to_np_dtype(elem)), bound)
        position = list(graph.node).index(exp)
        graph.node.insert(position, helper.make_node(
            "Min", [mul.output[0], bound], [bounded], name=bounded))
        graph.node.insert(position, helper.make_node(
            "Constant", [], [bound], value=value, name=bound))
        exp.input[0] = bounded
        changed = True
    return changed


def _unique(names, base):
    """``base``, suffixed when taken, added to ``names``."""
    name, i = base, 0
    while name in names:
        i += 1
        name = f"{base}_{i}"
    names.add(name)
    return name


def rewrite_ml_linear_ops(model, tie_binary=True, copy=True):
    """Replace ``ai.onnx.ml`` linear models by trainable standard ops.

    Every ``LinearRegressor`` and ``LinearClassifier`` node of the main graph
    becomes ``MatMul(X, W) + B`` (+ ``Sigmoid``/``Softmax``) where ``W``
    (``n_features x n_outputs``) and ``B`` (``1 x n_outputs``) are new float32
    initializers (named ``coefficient``, ``intercepts``, suffixed when the
    name is taken) that :func:`onnxtrain.autodiff.trainable_initializers`
    returns. The outputs keep their names, element types and shapes and
    the values onnxruntime computes for the original nodes:

    - LinearRegressor: ``X @ W + B`` of shape (N, targets) (onnx stores
      the coefficients of each target contiguously: ``W`` is the transposed
      ``(targets, n_features)`` attribute). ``post_transform`` must be NONE.
      A missing ``intercepts`` attribute gives a zero ``B``.
    - LinearClassifier: the raw scores ``X @ W + B``; the label output is
      ``Gather(classlabels, ArgMax(raw scores))`` (int64 or string
      initializer); the scores output applies ``post_transform`` (NONE,
      LOGISTIC = Sigmoid, SOFTMAX = Softmax, SOFTMAX_ZERO). With a single
      coefficient row ``z = X @ w + b`` (two labels), the label is the
      second one when ``z > 0`` and the scores are ``(1 - s, s)`` with
      ``s = Sigmoid(z)`` when LOGISTIC, ``s = z`` otherwise, as onnxruntime
      computes them. With two rows ``(-w, w)`` and intercepts ``(-b, b)``
      (what skl2onnx emits for a binary LogisticRegression) and
      ``tie_binary``, only ``w`` and ``b`` become weights (``W`` of shape
      (n_features, 1)) and the raw scores are ``(-z, z)``, so the two
      probabilities keep summing to one during training; with LOGISTIC
      the scores are ``Concat(Sigmoid(-z), Sigmoid(z))`` (the same values
      as a Sigmoid of the raw scores, which would read as two independent
      one-vs-rest sigmoids).
    - ``Normalizer(norm='L1')`` nodes reading the scores of a rewritten
      LinearClassifier (skl2onnx's multiclass LogisticRegression) become
      ``scores / ReduceSum(Abs(scores))``.
    - ``Reciprocal(Add(Exp(Mul(x, -1)), 1))`` (skl2onnx's SGDClassifier
      probabilities), its intermediate values read by nothing else, gets
      its exponent bounded: ``Exp(Min(Mul(x, -1), 88))``, the same values
      where ``exp(-x)`` is finite (below 1e-38 instead of 0 elsewhere), and
      a gradient that stays finite where it overflows.

    Inputs that are not float are cast to float (these ops compute in float
    and output float in onnxruntime). The default-domain opset is added when
    the model has none (the one released with its ``ai.onnx.ml`` opset, at
    least 13); the ``ai.onnx.ml`` import is removed when no node uses that
    domain any longer.

    Parameters
    ----------
    model : onnx.ModelProto, bytes or str
        Not modified.
    tie_binary : bool, default=True
        Tie the two rows of an antisymmetric binary LinearClassifier into
        one weight column (see above). False keeps two independent rows.
    copy : bool, default=True
        False: ``model`` itself (loaded when a path or bytes) when the graph
        holds none of these operators, no copy.

    Returns
    -------
    onnx.ModelProto
        A new model; an unchanged copy (or with ``copy=False`` ``model``
        itself) when the graph holds none of these operators.

    Raises
    ------
    NotImplementedError
        An unsupported ``post_transform`` (named in the message).
    ValueError
        Inconsistent attributes (coefficient count, class labels) or a
        feature count that does not match the input's shape.
    """
    source = load_model(model)
    targets = {"LinearRegressor", "LinearClassifier"}
    logistic = bool(_logistic_chains(source.graph))
    if not logistic and not any(n.domain == ML_DOMAIN and n.op_type in targets
                                for n in source.graph.node):
        return _copy(source) if copy else source
    new = _copy(source)
    graph = new.graph
    if logistic:
        _rewrite_logistic(graph, infer_value_types(source))
    opset = _ensure_default_opset(new)
    builder = GraphBuilder(opset, used_names=_graph_names(graph),
                           value_types=infer_value_types(source))
    classifier_scores = set()
    nodes = []
    for node in graph.node:
        start = len(builder.nodes)
        if node.domain == ML_DOMAIN and node.op_type == "LinearRegressor":
            _rewrite_linear_regressor(builder, node)
        elif node.domain == ML_DOMAIN and node.op_type == "LinearClassifier":
            scores = _rewrite_linear_classifier(builder, node, tie_binary)
            if scores:
                classifier_scores.add(scores)
        elif (node.domain == ML_DOMAIN and node.op_type == "Normalizer"
              and node.input[0] in classifier_scores
              and _attributes(node).get("norm", "MAX") == "L1"):
            _rewrite_l1_normalizer(builder, node)
        else:
            nodes.append(node)
            continue
        nodes.extend(builder.nodes[start:])
    _replace(graph.node, nodes)
    graph.initializer.extend(builder.initializers)
    _tidy_opsets(new)
    return new


# --------------------------------------------------------------------------
# prediction_graph / probability_graph
# --------------------------------------------------------------------------
def _describe_outputs(graph):
    return ", ".join(f"{o.name!r}: {helper.printable_type(o.type)}"
                     for o in graph.output) or "none"


def _is_float_tensor(value_info):
    return (value_info.type.HasField("tensor_type")
            and value_info.type.tensor_type.elem_type in FLOAT_TYPES)


def _keep_outputs(model, outputs):
    """A new model, ``model`` whose outputs are ``outputs`` (ValueInfoProtos
    of its values), without the nodes, initializers, value infos and opset
    imports they do not need.

    Only what is kept is copied (not the whole model, then a second copy of
    the kept part: the upb protobuf runtime frees the memory of a message
    only with the whole message, so the dropped copy stayed allocated as
    long as the model). ``model`` is not modified."""
    graph = model.graph
    names = {o.name for o in outputs}
    needed = set(names)
    kept = []
    for node in reversed(list(graph.node)):
        if any(o in needed for o in node.output if o):
            kept.append(node)
            needed.update(i for i in node.input if i)
            for sub in subgraphs(node):
                _subgraph_inputs(sub, needed)
    kept.reverse()
    produced = {o for n in kept for o in n.output if o}
    removed_inits = {i.name for i in graph.initializer if i.name not in needed}
    lists = {
        "node": kept,
        "initializer": [i for i in graph.initializer if i.name in needed],
        "sparse_initializer": [s for s in graph.sparse_initializer
                               if s.values.name in needed],
        "input": [i for i in graph.input if i.name not in removed_inits],
        "value_info": [v for v in graph.value_info if v.name not in names and (
            v.name in produced or v.name in needed)],
        "output": list(outputs)}
    new = onnx.ModelProto()
    copy_fields(new, model, skip=("graph",))
    copy_fields(new.graph, graph, skip=tuple(lists))
    for field, values in lists.items():
        getattr(new.graph, field).extend(values)  # copies each message
    _tidy_opsets(new)
    return new


def _value_info_of(model, name, types=None):
    """A ValueInfoProto for ``name`` (graph output or intermediate value)."""
    for out in model.graph.output:
        if out.name == name:
            return out
    types = infer_value_types(model) if types is None else types
    if name not in types:
        raise ValueError(f"The type of {name!r} cannot be inferred: it cannot "
                         f"become a graph output.")
    elem, shape = types[name]
    return helper.make_tensor_value_info(name, elem, clean_shape(shape))


def prediction_graph(model, output_name=None, types=None):
    """A copy of ``model`` keeping a single output.

    Nodes not needed to compute that output (the label path of a
    classifier, a ZipMap...) are removed with the initializers, value infos
    and opset imports only they used. Graph inputs are kept.

    Parameters
    ----------
    model : onnx.ModelProto, bytes or str
        Not modified.
    output_name : str, default=None
        A graph output or an intermediate value of the main graph (whose
        type shape inference must then find). None selects the first float
        tensor output.
    types : dict, default=None
        ``model``'s :func:`~onnxtrain.graph.infer_value_types` if known
        (types an intermediate ``output_name`` without shape inference).

    Returns
    -------
    onnx.ModelProto
        Its one output is ``output_name``, typed (the first float tensor
        output when None).

    Raises
    ------
    ValueError
        ``output_name`` is not a value of the graph, or, when None, the
        graph has no float tensor output.
    """
    source = load_model(model)
    graph = source.graph
    if output_name is None:
        floats = [o.name for o in graph.output if _is_float_tensor(o)]
        if not floats:
            raise ValueError(f"The model has no float tensor output "
                             f"(outputs: {_describe_outputs(graph)}).")
        output_name = floats[0]
    produced = {o for n in graph.node for o in n.output if o}
    known = produced | {o.name for o in graph.output} | {
        i.name for i in graph.input} | {i.name for i in graph.initializer}
    if output_name not in known:
        raise ValueError(f"{output_name!r} is not a value of the graph "
                         f"(outputs: {_describe_outputs(graph)}).")
    return _keep_outputs(source, [_value_info_of(source, output_name, types)])


def with_first_output(model, output_name, types=None):
    """A copy of ``model`` whose first output is the value ``output_name``,
    its other outputs kept (a classifier's graph on its logits that still
    outputs the updated running statistics), without what none of them
    needs (as :func:`prediction_graph`).

    Parameters
    ----------
    model : onnx.ModelProto
        Not modified.
    output_name : str
        A value of the main graph (typed from ``types`` unless an output).
    types : dict, default=None
        ``model``'s :func:`~onnxtrain.graph.infer_value_types` if known.

    Returns
    -------
    onnx.ModelProto
        Outputs: ``output_name``, then ``model``'s outputs but the first.

    Raises
    ------
    ValueError
        The type of ``output_name`` cannot be inferred.
    """
    head = _value_info_of(model, output_name, types)
    return _keep_outputs(model, [head] + list(model.graph.output[1:]))


def probability_graph(model):
    """A copy of a classifier graph whose only output is its probabilities.

    The probability tensor is the first float tensor output of rank 2 (or
    of unknown rank), else the float tensor a ``ZipMap`` node turns into the
    graph's list of dictionaries. It keeps its name; every node, initializer
    and opset import only the other outputs need (labels, ZipMap) is
    removed.

    Parameters
    ----------
    model : onnx.ModelProto, bytes or str
        Not modified. Graphs made of ``ai.onnx.ml`` LinearClassifier nodes
        have nothing to train before :func:`rewrite_ml_linear_ops`.

    Returns
    -------
    model : onnx.ModelProto
        Its only output is a float tensor of shape (N, n_classes).
    name : str
        The name of that output.

    Raises
    ------
    ValueError
        The graph has no float probability tensor.
    """
    source = load_model(model)
    graph = source.graph
    types = infer_value_types(source)
    for out in graph.output:
        if not _is_float_tensor(out):
            continue
        shape = types.get(out.name, (None, None))[1]
        if shape is None or len(shape) == 2:
            info = out
            if shape is not None and not out.type.tensor_type.HasField("shape"):
                info = helper.make_tensor_value_info(
                    out.name, out.type.tensor_type.elem_type, clean_shape(shape))
            return _keep_outputs(source, [info]), out.name
    outputs = {o.name for o in graph.output}
    for node in graph.node:
        if node.domain != ML_DOMAIN or node.op_type != "ZipMap" \
                or node.output[0] not in outputs:
            continue
        name = node.input[0]
        elem, shape = types.get(name, (None, None))
        if elem is not None and elem not in FLOAT_TYPES:
            continue
        attrs = _attributes(node)
        labels = attrs.get("classlabels_int64s") or attrs.get("classlabels_strings")
        n_classes = len(labels) if labels else None
        if shape is None or len(shape) != 2:
            shape = (None, n_classes)
        info = helper.make_tensor_value_info(name, elem or TensorProto.FLOAT,
                                             clean_shape(shape))
        return _keep_outputs(source, [info]), name
    raise ValueError(
        f"The model has no float probability tensor: expected a float tensor "
        f"output of shape (N, n_classes) or a ZipMap node fed by one "
        f"(outputs: {_describe_outputs(graph)}).")


#: Ops a label output passes through on its way from the label table
#: (skl2onnx writes Reshape then Cast after an ArrayFeatureExtractor).
_LABEL_PASSTHROUGH = ("Identity", "Cast", "Reshape", "Squeeze", "Unsqueeze",
                      "Flatten")


def _label_array(values):
    """1-D ndarray of labels: str for string tensors (decoded from UTF-8),
    int64 for integers; None for anything else."""
    values = np.asarray(values).ravel()
    if values.dtype.kind in "OSU":
        return np.array([v.decode("utf-8") if isinstance(v, bytes) else str(v)
                         for v in values])
    if values.dtype.kind in "iu":
        return values.astype(np.int64)
    return None


def _through_passthrough(producers, name):
    """The node producing ``name`` behind :data:`_LABEL_PASSTHROUGH` ops."""
    node = producers.get(name)
    while node is not None and node.op_type in _LABEL_PASSTHROUGH \
            and node.domain in ("", "ai.onnx"):
        node = producers.get(node.input[0])
    return node


def _table_labels(graph, output, producers):
    """The labels of the table ``output`` looks up: walking back from it
    through :data:`_LABEL_PASSTHROUGH` ops to a ``Gather`` (axis 0) or an
    ``ArrayFeatureExtractor`` of a constant at an index an ``ArgMax`` over
    the last axis computes (the column of the highest score), or None
    (``producers``: value name -> the node writing it)."""
    initializers = {i.name: i for i in graph.initializer}
    node = _through_passthrough(producers, output)
    if node is None or not (
            (node.op_type == "Gather" and node.domain in ("", "ai.onnx")
             and _attributes(node).get("axis", 0) == 0)
            or (node.op_type == "ArrayFeatureExtractor" and node.domain == ML_DOMAIN)):
        return None
    index = _through_passthrough(producers, node.input[1])
    if index is None or index.op_type != "ArgMax" or \
            _attributes(index).get("axis", 0) not in (1, -1):
        return None
    table = node.input[0]
    if table in initializers:
        return _label_array(numpy_helper.to_array(initializers[table]))
    source = producers.get(table)
    if source is not None and source.op_type == "Constant":
        value = constant_node_value(source)
        return None if value is None else _label_array(value)
    return None


def class_labels(model, probabilities):
    """The labels a classifier graph gives the columns of its probability
    tensor, when the graph carries them: the ``classlabels`` attribute of a
    ``ZipMap`` reading that tensor, or the constant table its label output
    looks up (``Gather`` or ``ArrayFeatureExtractor`` of a constant at the
    column index, as skl2onnx and :func:`rewrite_ml_linear_ops` write them).

    Parameters
    ----------
    model : onnx.ModelProto
        Not modified.
    probabilities : str
        Name of the probability tensor, of shape (N, n_classes).

    Returns
    -------
    ndarray of shape (n_classes,) or None
        Labels in column order (str, or int64), or None when the graph
        carries none, when its sources disagree or when two columns share
        a label (the caller compares their number with the columns').
    """
    graph = model.graph
    producers = {o: n for n in graph.node for o in n.output}
    aliases = {probabilities}
    node = producers.get(probabilities)
    while node is not None and node.op_type == "Identity":
        aliases.add(node.input[0])
        node = producers.get(node.input[0])
    found = []
    for n in graph.node:
        if n.domain == ML_DOMAIN and n.op_type == "ZipMap" and n.input[0] in aliases:
            attrs = _attributes(n)
            labels = attrs.get("classlabels_int64s") or attrs.get("classlabels_strings")
            if labels:
                found.append(_label_array(labels))
    for out in graph.output:
        if out.type.HasField("tensor_type") and \
                out.type.tensor_type.elem_type in (TensorProto.STRING, TensorProto.INT64,
                                                   TensorProto.INT32):
            labels = _table_labels(graph, out.name, producers)
            if labels is not None:
                found.append(labels)
    if not found or any(f is None for f in found):
        return None
    first = found[0]
    if any(f.dtype.kind != first.dtype.kind or not np.array_equal(f, first)
           for f in found[1:]) or len(np.unique(first)) != len(first):
        return None
    return first
