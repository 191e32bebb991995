"""The reverse pass: gradient nodes of chosen outputs w.r.t. chosen values."""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..exceptions import MissingVJPRuleError
from ..graph import (FLOAT_TYPES, GraphBuilder, OpsetError, infer_value_types,
                     opset_of, type_of_value_info)
from ..graph.builder import constant_node_value
from ..graph.scopes import (node_reads, subgraph_outer_reads, subgraphs,
                            without_unread)
from .context import VJPContext, sum_to
from .patterns import erf_gelu, erf_gelu_vjp
from .registry import get_vjp_rule, is_nondifferentiable

__all__ = ["BackwardGraph", "backward", "implicit_inputs", "reverse_pass",
           "trainable_initializers"]


@dataclass
class BackwardGraph:
    """Result of :func:`backward`.

    Attributes
    ----------
    builder : GraphBuilder
        Holds the gradient nodes and the constants they use.
    wrt : list of str
        Values differentiated against.
    outputs : list of str
        Differentiated outputs.
    grad_output_names : list of str
        One new input per differentiated output (``<output>_grad``).
    grad_names : list of str
        One gradient output per ``wrt`` (``<name>_grad``).
    types : dict
        ``name -> (elem_type, shape)`` of the forward values.
    model : onnx.ModelProto or None
        A copy of the model whose nodes name the optional outputs the rules
        read (see ``register_vjp(saved_outputs=...)``); None when the
        model already named them. The forward models are built from it.
    """

    builder: GraphBuilder
    wrt: list
    outputs: list
    grad_output_names: list
    grad_names: list
    types: dict = field(repr=False)
    model: object = field(default=None, repr=False)


def implicit_inputs(node):
    """Outer-scope names a node's subgraphs read (sorted; [] without
    subgraphs): the rule of a control-flow op returns their gradients after
    those of ``node.input``."""
    if not subgraphs(node):
        return []
    return sorted(subgraph_outer_reads(node))


def _node_inputs(node):
    return [i for i in node.input if i] + implicit_inputs(node)


def _is_float(types, name):
    info = types.get(name)
    return info is None or info[0] in FLOAT_TYPES


class _Constants(Mapping):
    """``name -> numpy value`` of a model's initializers and Constant nodes,
    an initializer converted when a rule first reads it: the weights are
    most of a model's bytes and no rule reads them. The initializers in
    ``variables`` (the weights being differentiated) are not constants: their values change as they train,
    and a caller may keep the model without them."""

    def __init__(self, model, variables=()):
        variables = set(variables)
        self._tensors = {i.name: i for i in model.graph.initializer
                         if i.name not in variables}
        self._values = {}
        for node in model.graph.node:
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                value = constant_node_value(node)
                if value is not None:
                    self._values[node.output[0]] = value

    def __getitem__(self, name):
        if name not in self._values:
            self._values[name] = numpy_helper.to_array(self._tensors[name])
        return self._values[name]

    def __contains__(self, name):
        return name in self._values or name in self._tensors

    def scalar(self, name):
        """The float of a one-element constant, None for any other name
        (a weight is not converted to be looked at)."""
        tensor = self._tensors.get(name)
        if tensor is not None and math.prod(tensor.dims) != 1:
            return None
        return _one_float(self.get(name))

    def __iter__(self):
        return iter(set(self._tensors) | set(self._values))

    def __len__(self):
        return len(set(self._tensors) | set(self._values))



class _Upstream(dict):
    """value name -> bit mask of the ``wrt`` names it depends on (bit ``i``
    for ``wrt[i]``): the union at each node is an integer ``or``, not a set
    union (a 24-layer encoder's values depend on up to 391 weights)."""

    def __init__(self, wrt):
        super().__init__()
        self.wrt = list(wrt)

    def names(self, value):
        """The set of ``wrt`` names ``value`` depends on."""
        mask = self.get(value, 0)
        return {w for i, w in enumerate(self.wrt) if mask >> i & 1}


def _dependents(nodes, wrt, types):
    """Values depending on ``wrt`` through differentiable float paths
    (an :class:`_Upstream`: which ``wrt`` names are upstream of each)."""
    upstream = _Upstream(wrt)
    for i, w in enumerate(upstream.wrt):
        upstream[w] = upstream.get(w, 0) | 1 << i
    for node in nodes:
        if is_nondifferentiable(node.op_type, node.domain):
            continue
        ups = 0
        for name in _node_inputs(node):
            ups |= upstream.get(name, 0)
        if ups:
            for out in node.output:
                if out and _is_float(types, out):
                    upstream[out] = ups
    return upstream


def _path_nodes(nodes, outputs, upstream):
    """Nodes on a path from a ``wrt`` value to one of ``outputs``, in order."""
    needed = set(outputs)
    path = []
    for node in reversed(nodes):
        if not any(o in needed and o in upstream for o in node.output):
            continue
        if is_nondifferentiable(node.op_type, node.domain):
            continue
        ins = [i for i in _node_inputs(node) if i in upstream]
        if ins:
            path.append(node)
            needed.update(ins)
    return path[::-1]


def _check_rules(path, upstream):
    missing = []
    for node in path:
        if get_vjp_rule(node.op_type, node.domain) is None:
            weights = sorted(set().union(
                *(upstream.names(i) for i in _node_inputs(node))))
            missing.append(
                f"op_type={node.op_type!r} domain={node.domain or 'ai.onnx'!r} "
                f"node={node.name!r} (weights upstream: {weights})")
    if missing:
        raise MissingVJPRuleError(
            "No VJP rule for these nodes on the path from the weights to the "
            "outputs: " + "; ".join(missing))


def _accumulate(g, grads, name):
    parts = grads.get(name)
    if not parts:
        return None
    tiles = _tiling_pads(g, parts, name)
    if tiles is not None:
        # the gradients of Slices cutting one tensor into pieces (the
        # exporter's reordering of an LSTM's gates): the pieces side by
        # side, one copy, instead of zero-padding each and summing
        total = g.op("Concat", *tiles[1], axis=tiles[0])
    else:
        # three parts or more: one Sum (one node and one pass over the
        # values, adding in the same order as the chain of Adds would)
        total = parts[0] if len(parts) == 1 else g.op(
            "Add" if len(parts) == 2 else "Sum", *parts)
    grads[name] = [total]
    return total


def _tiling_pads(g, parts, name):
    """``(axis, pieces)`` when every part of the gradient of ``name`` is a
    zero Pad emitted in ``g`` along one same axis of a piece, the pieces (in
    order) covering that axis of ``name`` (of static size) exactly once;
    else None."""
    if len(parts) < 2:
        return None
    nodes = [g.producer(part) for part in parts]
    if any(node is None or node.op_type != "Pad" or len(node.input) != 2
           or node.attribute for node in nodes):
        return None
    wanted = {node.input[1] for node in nodes}
    pads_of = {t.name: numpy_helper.to_array(t).tolist()
               for t in g.initializers if t.name in wanted}
    spans = []
    for node in nodes:
        pads = pads_of.get(node.input[1])
        if pads is None or min(pads) < 0:
            return None
        rank = len(pads) // 2
        axes = [a for a in range(rank) if pads[a] or pads[rank + a]]
        if len(axes) != 1:
            return None
        spans.append((axes[0], rank, pads[axes[0]], pads[rank + axes[0]],
                      node.input[0]))
    axis, rank = spans[0][:2]
    shape = (g.types.get(name) or (None, None))[1]
    if (any(span[:2] != (axis, rank) for span in spans) or shape is None
            or len(shape) != rank or not isinstance(shape[axis], int)):
        return None
    # piece k covers [begin_k, n - end_k): a tiling starts at 0, ends at n,
    # and each piece begins where the one before ends
    spans.sort(key=lambda span: span[2])
    ends = [shape[axis] - span[3] for span in spans]
    begins = [span[2] for span in spans]
    if begins[0] != 0 or ends[-1] != shape[axis] or ends[:-1] != begins[1:]:
        return None
    return axis, [span[4] for span in spans]


def _drop_unread_constants(g):
    """Remove the initializers of ``g`` no node reads (the pads of the Pads
    a tiling replaced, :func:`_tiling_pads`: onnxruntime warns about an
    initializer nothing reads), from its cache of constants too."""
    reads = set().union(*map(node_reads, g.nodes))
    unread = {t.name for t in g.initializers} - reads
    if not unread:
        return
    g.initializers[:] = [t for t in g.initializers if t.name not in unread]
    constants = g._constants  # noqa: SLF001 - g.const must make them anew
    for key in [k for k, name in constants.items() if name in unread]:
        del constants[key]


def _normalize_result(result, n_inputs):
    if result is None or isinstance(result, str):
        result = (result,)
    result = list(result)
    if len(result) > n_inputs:
        raise ValueError(f"A VJP rule returned {len(result)} gradients for "
                         f"{n_inputs} inputs.")
    return result + [None] * (n_inputs - len(result))


def _one_float(value):
    """float of a one-element float array, else None."""
    if value is None:
        return None
    array = np.asarray(value)
    if array.size != 1 or not np.issubdtype(array.dtype, np.floating):
        return None
    return float(array.reshape(-1)[0])


def _apply_pattern(g, node, grads, upstream, constants, producers):
    """The VJP of a chain of nodes ending at ``node`` given as one formula
    (:mod:`onnxtrain.autodiff.patterns`); False when ``node`` ends none."""
    gelu = erf_gelu(node, producers, constants)
    elem_type = (g.types.get(node.output[0]) or (None,))[0]
    if gelu is None or elem_type is None:
        return False
    x, u, c = gelu
    gy = _accumulate(g, grads, node.output[0])
    if gy is not None and x in upstream:
        grads.setdefault(x, []).append(erf_gelu_vjp(g, gy, u, c, elem_type))
    return True


def _apply_rule(g, node, grads, upstream, constants):
    gys = [_accumulate(g, grads, o) if o else None for o in node.output]
    if all(gy is None for gy in gys):
        return
    rule = get_vjp_rule(node.op_type, node.domain)
    implicit = implicit_inputs(node)
    inputs = list(node.input) + implicit
    needs = [bool(i) and i in upstream for i in inputs]
    ctx = VJPContext(node, g, needs[:len(node.input)], constants,
                     implicit, needs[len(node.input):])
    try:
        results = _normalize_result(rule.fn(ctx, *gys), len(inputs))
        for name, need, grad in zip(inputs, needs, results):
            if not need or grad is None:
                continue
            if rule.unbroadcast:
                grad = sum_to(g, grad, g.shape(node.output[0]), name)
            grads.setdefault(name, []).append(grad)
    except OpsetError as exc:
        raise ValueError(f"The gradient of {node.op_type} node {node.name!r}: "
                         f"{exc}.") from exc


def reverse_pass(g, path, grads, upstream, constants):
    """Call the VJP rule of every node of ``path`` in reverse order.

    ``grads`` maps a value to the list of gradient parts reaching it (filled
    in place); ``upstream`` holds the values depending on the weights (an
    :class:`_Upstream` from :func:`_dependents`; only membership is read
    here); ``constants`` maps constant
    names to numpy values. Rules that expand an op into other ops (function
    bodies) call it on their expansion.
    """
    producers = {o: node for node in path for o in node.output if o}
    for node in reversed(path):
        if not _apply_pattern(g, node, grads, upstream, constants, producers):
            _apply_rule(g, node, grads, upstream, constants)


def _all_names(model):
    graph = model.graph
    names = {v.name for v in list(graph.input) + list(graph.output)}
    names |= {i.name for i in graph.initializer}
    for node in graph.node:
        names |= set(node.output) | {node.name}
    return names


def backward(model, wrt, outputs=None, types=None, in_place=False):
    """Build the gradient nodes of ``outputs`` w.r.t. ``wrt``.

    Keeps the nodes on a path from ``wrt`` to ``outputs``, walks them in
    reverse topological order calling each op's VJP rule, accumulates the
    gradients reaching one value with Add (one Sum for three or more) and
    reduces broadcast gradients
    with :func:`~onnxtrain.autodiff.context.sum_to`.

    Parameters
    ----------
    model : onnx.ModelProto
        Not modified.
    wrt : list of str
        Initializers or graph inputs (float) to differentiate against.
    outputs : list of str, default=None
        Outputs to differentiate; default: every float graph output that
        depends on ``wrt``.
    types : dict, default=None
        ``model``'s :func:`~onnxtrain.graph.infer_value_types`, when the
        caller has it already (not modified); None runs shape inference.
    in_place : bool, default=False
        True when ``model`` is the caller's own copy: the optional outputs
        the rules read (``saved_outputs``) are named on its nodes instead of
        on a copy of the whole model (its weights included).

    Returns
    -------
    BackwardGraph

    Raises
    ------
    ValueError
        Unknown names in ``wrt`` or ``outputs``, no output depends on wrt, or
        a model opset below 8, or a rule needing an op the model's opset
        lacks (the message names the node, the op and the opset it needs).
    MissingVJPRuleError
        A node on the path has no VJP rule (the message names op type,
        domain, node name and the weights upstream).
    """
    model, named = _with_saved_outputs(model, in_place)
    graph = model.graph
    opset = opset_of(model) or 1
    if opset < 8 and any(n.domain in ("", "ai.onnx") for n in graph.node):
        raise ValueError(f"The model's default-domain opset is {opset}; onnxtrain "
                         "differentiates opset 8 and newer (onnx.version_converter"
                         ".convert_version upgrades a model).")
    # a copy: the builder records the gradients' types in it; a model that
    # gained outputs (``named``) has values the caller's types lack
    if types is None:
        types = infer_value_types(model)
    else:
        types = dict(types)
        if named:
            types.update(_node_output_types(model, named, types))
    sources = {i.name for i in graph.initializer} | {i.name for i in graph.input}
    unknown = [w for w in wrt if w not in sources]
    if unknown:
        raise ValueError(f"wrt names {unknown} are neither initializers nor "
                         f"inputs of the model; candidates: {sorted(sources)}.")
    nodes = list(graph.node)
    upstream = _dependents(nodes, list(wrt), types)
    graph_outputs = [o.name for o in graph.output]
    if outputs is None:
        outputs = [o for o in graph_outputs
                   if o in upstream and _is_float(types, o)]
    bad = [o for o in outputs if o not in graph_outputs]
    if bad:
        raise ValueError(f"outputs {bad} are not graph outputs {graph_outputs}.")
    if not any(o in upstream for o in outputs):
        raise ValueError(f"No output among {outputs} depends on {list(wrt)}.")
    path = _path_nodes(nodes, outputs, upstream)
    _check_rules(path, upstream)

    g = GraphBuilder(opset, _all_names(model), types)
    g.know_nodes(nodes)
    grads, grad_output_names = {}, []
    for out in outputs:
        name = g.unique_name(f"{out}_grad")
        g.set_type(name, *_grad_output_type(types, out))
        grad_output_names.append(name)
        grads[out] = [name]
    reverse_pass(g, path, grads, upstream, _Constants(model, wrt))
    grad_names = [_final_gradient(g, grads, w) for w in wrt]
    fold_output_identities(g.nodes, grad_names)
    remove_unread_nodes(g.nodes, grad_names)
    _drop_unread_constants(g)
    return BackwardGraph(g, list(wrt), list(outputs), grad_output_names,
                         grad_names, types, model if named else None)


def _grad_output_type(types, out):
    """Type of the gradient fed for the output ``out``: the output's, with
    its dims of 0 unknown. onnx's Attention inference writes 0 for a dim
    it cannot tell (V's hidden size or sequence length when symbolic); a
    gradient input declared so refuses the gradient of the actual output."""
    elem_type, shape = types.get(out, (None, None))
    if shape is not None:
        shape = tuple(None if d == 0 else d for d in shape)
    return elem_type, shape


def _node_output_types(model, indices, types):
    """``name -> (elem_type, shape)`` of the outputs of the nodes at
    ``indices`` of ``model``'s graph that ``types`` lacks, by onnx's
    inference of each node alone from the types of its inputs in ``types``
    (not a second inference of the whole model, which is slow on large
    models); the whole model's when a node's inputs are not all typed or
    its inference fails."""
    graph, result = model.graph, {}
    for index in sorted(set(indices)):
        node = graph.node[index]
        try:
            inputs = {name: helper.make_tensor_type_proto(
                types[name][0], None if types[name][1] is None
                else list(types[name][1]))
                for name in node.input if name}
            schema = onnx.defs.get_schema(node.op_type, opset_of(model, node.domain)
                                          or 1, node.domain)
            inferred = onnx.shape_inference.infer_node_outputs(
                schema, node, inputs, opset_imports=list(model.opset_import))
        except Exception:  # noqa: BLE001 - any failure: the slow, sure way
            return infer_value_types(model)
        for name, proto in inferred.items():
            info = type_of_value_info(helper.make_value_info(name, proto))
            if info is not None and name not in types:
                result[name] = info
    return result


def _with_saved_outputs(model, in_place=False):
    """``(model, [])``, or a copy (``model`` itself when ``in_place``)
    naming the optional outputs rules read (``saved_outputs``) and the
    indices of the nodes it named them on."""
    missing = []
    for index, node in enumerate(model.graph.node):
        rule = get_vjp_rule(node.op_type, node.domain)
        for i in (rule.saved_output_indices(node) if rule else ()):
            if i >= len(node.output) or not node.output[i]:
                missing.append((index, i))
    if not missing:
        return model, []
    used = _all_names(model)
    if in_place:
        named = model
    else:
        named = onnx.ModelProto()
        named.CopyFrom(model)
    for index, i in missing:
        node = named.graph.node[index]
        while len(node.output) <= i:
            node.output.append("")
        name, k = f"{node.name or node.op_type}_saved{i}", 0
        while name in used:
            k += 1
            name = f"{node.name or node.op_type}_saved{i}_{k}"
        used.add(name)
        node.output[i] = name
    return named, [index for index, _ in missing]


def _final_gradient(g, grads, w):
    total = _accumulate(g, grads, w)
    name = g.unique_name(f"{w}_grad")
    if total is None:  # no path: the gradient is zero
        return g.zeros_like(w, outputs=[name])
    return g.op("Identity", total, outputs=[name])


def rename_reads(nodes, old, new):
    """Make ``nodes`` (and the subgraphs they hold, where ``old`` is not
    defined locally) read ``new`` wherever they read ``old``."""
    rename_many_reads(nodes, {old: new})


def rename_many_reads(nodes, rename):
    """:func:`rename_reads` for every ``old -> new`` of the dict ``rename``
    in one pass over the nodes (a pass per name is quadratic: hundreds of
    carried values, each renamed over a loop body of thousands of nodes).
    Renames apply
    once: a new name that is also a key is not renamed again."""
    if not rename:
        return
    for node in nodes:
        for i, name in enumerate(node.input):
            if name in rename:
                node.input[i] = rename[name]
        for graph in subgraphs(node):
            local = {v.name for v in graph.input}
            local |= {v.name for v in graph.initializer}
            local |= {o for n in graph.node for o in n.output}
            # a name the subgraph defines is its own value (shadowed)
            inner = {k: v for k, v in rename.items() if k not in local}
            if not inner:
                continue
            rename_many_reads(graph.node, inner)
            for out in graph.output:
                if out.name in inner:
                    out.name = inner[out.name]


def fold_output_identities(nodes, outputs):
    """Drop the Identity nodes producing the graph outputs ``outputs`` from
    a value another node of ``nodes`` produces: that node writes the output
    itself and every reader of the value reads the output instead (in
    place; chains of Identity are folded too).

    Why: onnxruntime 1.32 breaks a graph (or a Scan/Loop/If body) in which
    an output is the Identity of a value v that a MatMul also reads, once
    that MatMul is followed by an Add and one of its operands is a
    Transpose read by nothing else (the gradients of ``x @ W`` produce this
    pattern: the gradient of W reads Transpose(x) and the gradient of the
    pre-activation, which may be exactly the gradient of an input or of a
    scan input). MatMulAddFusion makes a Gemm; GemmTransposeFusion
    rebuilds it without the Transpose and moves only the Transpose's input
    edges to the new Gemm, so the edge v -> Gemm is missing until the graph
    is resolved again; EliminateIdentity, in the same pass (level 1, so
    ORT_ENABLE_BASIC already), then sees the Identity as v's only reader,
    removes it and renames v to the output, and the Gemm reads a v that no
    longer exists ("Missing Input: v" at run time in a subgraph, "Node
    input 'v' is not a graph input, initializer, or output of a previous
    node" at session creation in the main graph). Without the Identity,
    the Gemm and the output name one value; renaming it is harmless.

    A value that no node of ``nodes`` produces (an input, an initializer,
    an outer-scope value) keeps its Identity, as does one that is already
    an output (a second output of the same value).
    """
    outputs = list(outputs)
    wanted = set(outputs)
    producers = {o: n for n in nodes for o in n.output if o}
    readers = {}
    for node in nodes:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    holders = [n for n in nodes if subgraphs(n)]  # their subgraphs may read the value too
    held = {}  # value -> output, renamed in the holders' subgraphs at the end
    removed = set()
    for out in outputs:
        while True:
            node = producers.get(out)
            if (node is None or node.op_type != "Identity"
                    or node.domain not in ("", "ai.onnx")):
                break
            value = node.input[0]
            source = producers.get(value)
            if source is None or value in wanted:
                break
            removed.add(id(node))
            source.output[list(source.output).index(value)] = out
            producers[out] = source
            del producers[value]
            moved = [r for r in readers.pop(value, []) if r is not node]
            rename_reads(moved, value, out)
            held[value] = out  # never an output itself, nor renamed again
            readers.setdefault(out, []).extend(moved)
    rename_many_reads(holders, held)  # one pass, not one per output
    if removed:
        nodes[:] = [n for n in nodes if id(n) not in removed]


def remove_unread_nodes(nodes, outputs):
    """Drop from ``nodes`` (in place, topological order) the nodes none of
    whose outputs is in ``outputs`` or read by a later node (its inputs or
    the subgraphs it holds): what a rule emitted and a simplification made
    useless (:meth:`~onnxtrain.graph.GraphBuilder.transpose`)."""
    kept, _ = without_unread(nodes, outputs)
    if len(kept) < len(nodes):
        nodes[:] = kept


def trainable_initializers(model, candidates=None, types=None):
    """Float initializers that reach a float output through differentiable ops.

    Parameters
    ----------
    model : onnx.ModelProto
        Not modified.
    candidates : list of str, default=None
        Restrict the search to these names (default: every initializer).
    types : dict, default=None
        ``model``'s :func:`~onnxtrain.graph.infer_value_types` if known.

    Returns
    -------
    list of str
        In the order of ``model.graph.initializer``. Integer tensors (shapes,
        indices, class labels) are never returned; neither are rank-0 float
        initializers, which converters use for constants (skl2onnx's
        ``unity`` in ``1 - p``), nor floats that reach the outputs only
        through non-differentiable ops.
    """
    graph = model.graph
    types = infer_value_types(model) if types is None else types
    names = [i.name for i in graph.initializer
             if i.data_type in FLOAT_TYPES and len(i.dims) > 0]
    if candidates is not None:
        wanted = set(candidates)
        names = [n for n in names if n in wanted]
    nodes = list(graph.node)
    outputs = [o.name for o in graph.output if _is_float(types, o.name)]
    upstream = _dependents(nodes, names, types)
    reached = set()
    for out in outputs:
        reached |= upstream.names(out)
    return [n for n in names if n in reached]
