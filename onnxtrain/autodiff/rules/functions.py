"""VJP of ops the ONNX standard defines as a function of other ops.

Attention, RMSNormalization, RotaryEmbedding, GroupNormalization... carry a
function body in their schema (``OpSchema.get_function_with_opset_version``
and its context-dependent twin). Their VJP expands the node into that body
(taken at the model's opset, converted with ``onnx.version_converter`` when
the body was written for an older one), recomputes the expansion in the
gradient graph from the node's inputs and runs the reverse pass over it, so
the gradient is exactly the one of the standard's definition, built from
the rules of the primitive ops. A body may hold control flow
(LinearAttention's recurrence is a Scan): its subgraphs are copied with
fresh names and differentiated by the rules of control_flow.py.
"""
from itertools import zip_longest

import numpy as np
import onnx
import onnx.defs
from onnx import AttributeProto, helper, numpy_helper, version_converter
from onnx.reference import ReferenceEvaluator

from ...graph.builder import constant_node_value
from ..backward import implicit_inputs
from ..expansion import differentiate_expansion, record_types
from ..registry import register_vjp

#: Ops differentiated through their function body (no closed-form rule).
EXPANDED_OPS = (
    "Attention", "RMSNormalization", "CausalConvWithState",
    "GroupNormalization", "LayerNormalization", "LinearAttention",
    "MeanVarianceNormalization", "NegativeLogLikelihoodLoss",
    "RotaryEmbedding", "SoftmaxCrossEntropyLoss")


def _type_proto(ctx, name):
    if not name or name not in ctx.g.types:
        return onnx.TypeProto()
    elem_type, shape = ctx.g.types[name]
    return helper.make_tensor_type_proto(elem_type, shape)


def _with_defaults(ctx, node, schema):
    """Copy of ``node`` with the schema's default attributes filled in; a
    ``stash_type`` below the input's precision is raised to it (float64
    inputs are normalized in float64, as onnxruntime's kernels do)."""
    full = onnx.NodeProto()
    full.CopyFrom(node)
    present = {a.name for a in node.attribute}
    for name, attr in schema.attributes.items():
        if name not in present and attr.default_value.name:
            full.attribute.append(attr.default_value)
    for att in full.attribute:
        if (att.name in ("stash_type", "softmax_precision")
                and ctx.dtype == onnx.TensorProto.DOUBLE):
            att.i = onnx.TensorProto.DOUBLE
    return full


#: Outputs of the Casts to the stash type in onnx's LayerNormalization body
#: (the epsilon and the input; the Cast back to the input's type is
#: NormalizedT's).
_STASH_CASTS = ("Epsilon", "XU")


def _stashed_in_float64(ctx, schema, version, dependent, node):
    """LayerNormalization's body stashing in float64: onnx builds it for a
    float32 or bfloat16 stash only (no body at all otherwise), so it is
    built for float32, then its Casts to the stash type cast to float64.
    Its Mean and InvStdDev are then float64, cast to the node's types by
    :func:`_with_node_types`."""
    as_float = onnx.NodeProto()
    as_float.CopyFrom(node)
    for att in as_float.attribute:
        if att.name == "stash_type":
            att.i = onnx.TensorProto.FLOAT
    function = _build_body(ctx, schema, version, dependent, as_float)
    stashes = [n for n in function.node
               if n.op_type == "Cast" and n.output[0] in _STASH_CASTS]
    if len(stashes) != len(_STASH_CASTS):
        ctx.fail("stash_type is float64 (double), and onnx's function body "
                 "for a float32 stash does not have the Casts expected")
    for cast in stashes:
        for att in cast.attribute:
            if att.name == "to":
                att.i = onnx.TensorProto.DOUBLE
    return function


def _function_body(ctx):
    """``(FunctionProto, node with defaults)`` valid for the model's opset."""
    node = ctx.node
    schema = onnx.defs.get_schema(node.op_type, ctx.opset, node.domain)
    candidates = [(v, False) for v in schema.function_opset_versions]
    candidates += [(v, True) for v in
                   schema.context_dependent_function_opset_versions]
    usable = [c for c in candidates if c[0] <= ctx.opset]
    if not usable:
        ctx.fail(f"the standard defines no function body for this op at "
                 f"opset {ctx.opset} (bodies at {sorted(c[0] for c in candidates)})")
    version, dependent = max(usable)
    full = _with_defaults(ctx, node, schema)
    function = _build_body(ctx, schema, version, dependent, full)
    stash = {a.name: a.i for a in full.attribute}.get("stash_type")
    if (not len(function.node) and node.op_type == "LayerNormalization"
            and stash == onnx.TensorProto.DOUBLE):
        function = _stashed_in_float64(ctx, schema, version, dependent, full)
    if not len(function.node):
        unranked = [i for i in node.input if i and ctx.g.shape(i) is None]
        why = (f"; the rank of {', '.join(map(repr, unranked))} is unknown"
               if unranked and dependent else "")
        ctx.fail(f"onnx builds no function body for this node at opset "
                 f"{version} (an attribute or input type its builder "
                 f"refuses{why})")
    return function, full


def _build_body(ctx, schema, version, dependent, node):
    """The FunctionProto of ``node`` (attributes filled in) at ``version``;
    empty when onnx's context-dependent builder refuses the node."""
    if dependent:
        types = [_type_proto(ctx, i).SerializeToString() for i in node.input]
        data = schema.get_context_dependent_function_with_opset_version(
            version, node.SerializeToString(), types)
    else:
        data = schema.get_function_with_opset_version(version)
    function = onnx.FunctionProto()
    function.ParseFromString(data)
    return function


def _renamer(ctx, function, node):
    names = {f: a or "" for f, a in zip_longest(function.input, node.input)
             if f}
    prefix = f"{node.op_type}_fn"

    def rename(name):
        if not name:
            return ""
        if name not in names:
            names[name] = ctx.g.unique_name(f"{prefix}_{name}")
        return names[name]
    return rename


def _resolved_attributes(ctx, node, given, rename):
    """The attributes of a body node: references to the function's
    attributes (``ref_attr_name``) replaced by the node's values (dropped
    when absent), subgraphs renamed (see :func:`_renamed_subgraph`)."""
    attrs = []
    for att in node.attribute:
        if att.ref_attr_name:
            if att.ref_attr_name not in given:
                continue
            new = AttributeProto()
            new.CopyFrom(given[att.ref_attr_name])
            new.name = att.name
            att = new
        if att.type == AttributeProto.GRAPH:
            new = AttributeProto()
            new.CopyFrom(att)
            new.g.CopyFrom(_renamed_subgraph(ctx, att.g, given, rename))
            att = new
        elif att.type == AttributeProto.GRAPHS:
            new = AttributeProto()
            new.CopyFrom(att)
            del new.graphs[:]
            new.graphs.extend(_renamed_subgraph(ctx, sub, given, rename)
                              for sub in att.graphs)
            att = new
        attrs.append(att)
    return attrs


def _renamed_subgraph(ctx, graph, given, outer):
    """Copy of a subgraph of the function body (a Scan's body...) whose
    local values take fresh names (one namespace for every scope, so that
    two expansions never clash) and whose reads of enclosing values follow
    ``outer`` (a function mapping a name of the enclosing scope to its
    expansion name)."""
    if len(graph.sparse_initializer):
        ctx.fail("a subgraph of its function body holds sparse initializers")
    local = {}

    def rename(name):
        if not name:
            return ""
        return local[name] if name in local else outer(name)

    def fresh(name):
        local[name] = ctx.g.unique_name(f"{ctx.node.op_type}_fn_{name}")
        return local[name]

    new = onnx.GraphProto()
    new.name = graph.name
    for vi in graph.input:
        new.input.add().CopyFrom(vi)
        new.input[-1].name = fresh(vi.name)
    for init in graph.initializer:
        new.initializer.add().CopyFrom(init)
        new.initializer[-1].name = fresh(init.name)
    for node in graph.node:
        copy = helper.make_node(
            node.op_type, [rename(i) for i in node.input], [],
            domain=node.domain, name=ctx.g.unique_name(f"{node.op_type}_node"))
        copy.attribute.extend(_resolved_attributes(ctx, node, given, rename))
        copy.output.extend(fresh(o) if o else "" for o in node.output)
        new.node.append(copy)
    for vi in graph.output:
        new.output.add().CopyFrom(vi)
        new.output[-1].name = rename(vi.name)
    return new


def _expanded_nodes(ctx, function, node):
    """The body's nodes with fresh value names and attributes resolved;
    returns ``(nodes, names of the body's outputs)``."""
    rename = _renamer(ctx, function, node)
    given = {a.name: a for a in function.attribute_proto}
    given.update({a.name: a for a in node.attribute})
    nodes = []
    for body in function.node:
        attrs = _resolved_attributes(ctx, body, given, rename)
        new_node = helper.make_node(
            body.op_type, [rename(i) for i in body.input],
            [rename(o) for o in body.output], domain=body.domain,
            name=ctx.g.unique_name(f"{body.op_type}_node"))
        new_node.attribute.extend(attrs)
        nodes.append(new_node)
    return nodes, [rename(o) for o in function.output]


def _body_opset(function):
    for op in function.opset_import:
        if op.domain in ("", "ai.onnx"):
            return op.version
    return None


def _typed_model(ctx, nodes, inputs, outputs, opset):
    """The expansion as a model, for the version converter. Its outputs are
    the body outputs the nodes produce: a context-dependent body leaves out
    the nodes of outputs the node does not use (LayerNormalization's Mean
    and InvStdDev), and the converter refuses an undefined graph output."""
    vis = [helper.make_value_info(i, _type_proto(ctx, i))
           for i in dict.fromkeys(inputs) if i]
    produced = {o for n in nodes for o in n.output}
    graph = helper.make_graph(nodes, "expansion", vis,
                              [helper.make_value_info(o, onnx.TypeProto())
                               for o in outputs if o in produced])
    return helper.make_model(graph, opset_imports=[
        helper.make_opsetid("", opset)])


def _at_model_opset(ctx, nodes, inputs, outputs, opset):
    """Convert the body's nodes to the model's opset when they differ."""
    if opset is None or opset == ctx.opset:
        return nodes
    model = _typed_model(ctx, nodes, inputs, outputs, opset)
    try:
        converted = version_converter.convert_version(model, ctx.opset)
    except Exception as exc:  # noqa: BLE001 - reported as unsupported
        ctx.fail(f"its function body (opset {opset}) does not convert to "
                 f"opset {ctx.opset}: {exc}")
    return list(converted.graph.node)


def _fold(ctx, node, known, ranks):
    """Values of the node's outputs when computable now, else None: shapes
    and ranks of inputs whose types are static, and nodes whose inputs are
    all constants (evaluated with onnx's reference implementation)."""
    if node.op_type == "Constant":
        return [constant_node_value(node)]
    if node.op_type == "Shape" and node.input[0] not in known:
        shape = ctx.g.shape(node.input[0])
        if shape is None:
            return None
        attrs = {a.name: a.i for a in node.attribute}
        dims = list(shape)[attrs.get("start", 0):attrs.get("end", len(shape))]
        ranks[node.output[0]] = len(dims)
        if not all(isinstance(d, int) for d in dims):
            return None
        return [np.array(dims, dtype=np.int64)]
    if node.op_type == "Size" and node.input[0] in ranks:
        return [np.array(ranks[node.input[0]], dtype=np.int64)]
    inputs = [i for i in node.input if i]
    if (node.domain or "Random" in node.op_type or implicit_inputs(node)
            or not all(i in known for i in inputs)):
        return None
    try:
        evaluator = ReferenceEvaluator(node)
        return evaluator.run(None, {i: known[i] for i in inputs})
    except Exception:  # noqa: BLE001 - left to onnxruntime
        return None


def _fold_constants(ctx, nodes):
    """Replace the expansion's computable nodes by Constants so that shape
    inference and the rules (axes...) see their values."""
    known = {i: ctx.constant_value(i) for i, need in zip(ctx.inputs, ctx.needs_grad)
             if not need and ctx.constant_value(i) is not None}  # never a weight
    ranks, folded = {}, []
    for node in nodes:
        values = _fold(ctx, node, known, ranks)
        if values is None:
            folded.append(node)
            continue
        for name, value in zip(node.output, values):
            known[name] = np.asarray(value)
            folded.append(helper.make_node(
                "Constant", [], [name], name=ctx.g.unique_name("Constant_node"),
                value=numpy_helper.from_array(np.asarray(value), name)))
    return folded, known


def _with_node_types(ctx, nodes, outputs):
    """The expansion's outputs in the element types of the node's: a Cast
    appended where they differ. A float64 LayerNormalization normalizes in
    float64 (see :func:`_function_body`) but its Mean and InvStdDev are of
    the stash type, float32, as onnxruntime computes them."""
    result = list(outputs)
    for k, (name, out) in enumerate(zip(ctx.node.output, outputs)):
        want = ctx.g.types.get(name, (None, None))[0] if name else None
        have, shape = ctx.g.types.get(out, (None, None))
        if not (want and have) or want == have:
            continue
        result[k] = ctx.g.unique_name(f"{out}_cast")
        nodes.append(helper.make_node(
            "Cast", [out], [result[k]], to=want,
            name=ctx.g.unique_name("Cast_node")))
        ctx.g.set_type(result[k], want, shape)
    return result


def vjp_by_expansion(ctx, *grad_outputs):
    """Gradient of the node through its standard function body."""
    function, node = _function_body(ctx)
    nodes, outputs = _expanded_nodes(ctx, function, node)
    nodes = _at_model_opset(ctx, nodes, node.input, outputs,
                            _body_opset(function))
    # the expansion's values have fresh names: the second inference, after
    # constant folding, refines what the first found (a Split whose sizes
    # were computed from a Shape gets its output shapes once those sizes
    # are constants); the inputs keep their dims, so that the expansion's
    # shapes match theirs
    record_types(ctx.g, nodes, node.input, outputs, refine=True, clean=False)
    nodes, known = _fold_constants(ctx, nodes)
    record_types(ctx.g, nodes, node.input, outputs, refine=True, clean=False)
    outputs = _with_node_types(ctx, nodes, outputs)
    try:
        return differentiate_expansion(ctx, nodes, outputs, grad_outputs, known)
    except ValueError as exc:  # a rule of the body refused: name the node
        raise ValueError(f"The gradient of {ctx.node.op_type} node "
                         f"{ctx.node.name!r}, through its function body: "
                         f"{exc}") from exc


for _op in EXPANDED_OPS:
    if _op != "LayerNormalization":  # closed form first: layer_norm.py
        register_vjp(_op)(vjp_by_expansion)
