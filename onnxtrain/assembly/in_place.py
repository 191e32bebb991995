"""The fused step's update written over the parameters' own memory.

Writing a new weight into the old one's memory (as PyTorch's optimizers
do) keeps one copy of each weight and optimizer state instead of two. In
the flat step graph it is unsafe: onnxruntime may run a weight's update
before a backward node that still reads the weight (a Conv's input
gradient). An ``If`` node runs only once everything it reads exists (its
condition, and the names its branches read from the enclosing graph), so
the update goes inside ``If`` nodes on the loss being finite, each one run
after every other reader of the parameters it writes; inside a branch,
:func:`onnxtrain.graph.aliasing.writes_after_reads` decides which outputs
may overwrite their inputs. A non-finite loss takes the else branches,
which give the parameters back unchanged.

One ``If`` holding every update keeps every gradient alive until the end of
the backward pass: PyTorch's peak. Big models split the update into a few
``If`` nodes (:func:`update_in_place`'s groups), each run as soon as the
gradients of its parameters exist, so that those gradients are freed while
the backward pass goes on. A group's ``If`` must still run after every
reader of its parameters outside it: a reader that is not already one of
its ancestors (the input gradient of the group's first layer) has its
outputs passed through the ``If`` (an Identity in both branches), whose
copies the later nodes read instead.
"""
from __future__ import annotations

import heapq
from dataclasses import replace

import numpy as np
import onnx
from onnx import helper

from ..graph import GraphBuilder, elem_type_to_numpy, make_model, opset_of
from ..graph.aliasing import writes_after_reads
from ..graph.scopes import node_reads, rename_values, subgraphs, without_unread

__all__ = ["update_in_place", "renamed_value_info", "ALIASING_OPS",
           "MIN_GROUP_BYTES", "MAX_GROUPS"]

#: Ops whose output onnxruntime may place in its input's memory (a view):
#: whoever reads their output reads the input.
ALIASING_OPS = frozenset({"Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten",
                          "Cast", "Dropout", "ExpandDims"})

#: The update is split when each of ``MAX_GROUPS`` groups would hold
#: parameters and states of at least this many bytes: below, the gradients
#: freed early weigh less than what the split moves (the pass-through
#: copies, the order in which onnxruntime frees the activations).
MIN_GROUP_BYTES = 4 << 20
#: About how many groups the update of a big model is split into.
MAX_GROUPS = 8


def renamed_value_info(value, name):
    """A copy of the ValueInfoProto ``value`` named ``name``."""
    copy = onnx.ValueInfoProto()
    copy.CopyFrom(value)
    copy.name = name
    return copy


def _copy_node(node):
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    return copy


def update_in_place(step, min_group_bytes=MIN_GROUP_BYTES, max_groups=MAX_GROUPS):
    """The step graph with its update inside ``If`` nodes on the loss being
    finite, so that a run may write new parameters over the old ones (see
    the module's docstring).

    Parameters
    ----------
    step : TrainingStep
        From :func:`onnxtrain.assembly.training_graphs.build_training_step`,
        with ``update_values``.
    min_group_bytes : int, default=MIN_GROUP_BYTES
        The update is split when ``1 / max_groups`` of the bytes of the
        parameters and states is at least this; else one ``If`` updates
        them all.
    max_groups : int, default=MAX_GROUPS
        A group holds at least ``1 / max_groups`` of those bytes.

    Returns
    -------
    TrainingStep
        A new step with ``in_place`` naming the outputs that may be written
        into their inputs' memory; ``step`` itself when none may, or when a
        node holds a subgraph.
    """
    graph = step.model.graph
    outputs = [o.name for o in graph.output]
    loss = outputs[0]
    nodes = list(graph.node)
    if any(subgraphs(node) for node in nodes):
        return step
    branch = _update_nodes(nodes, step.update_values, loss)
    if not branch:
        return step
    plan = _Plan(step, nodes, branch)
    groups = plan.groups(min_group_bytes, max_groups)
    built = plan.build(groups) if len(groups) > 1 else None
    if built is None:  # one If (a small model, or a split that cannot hold)
        built = plan.build([sorted(plan.components, key=min)])
    if built is None:
        return step
    model, in_place = built
    return replace(step, model=model, in_place=in_place)


def _update_nodes(nodes, update_values, loss):
    """Indices of the update's nodes that only the update and the new
    parameters read: the graph is topologically sorted, so one pass from
    the last node decides each node after all its readers."""
    readers = {}
    for index, node in enumerate(nodes):
        for name in node.input:
            readers.setdefault(name, []).append(index)
    candidates = {i for i, node in enumerate(nodes)
                  if node.output and all(o in update_values for o in node.output)
                  and loss not in node.output}
    branch = set()
    for i in sorted(candidates, reverse=True):
        if all(r in branch for o in nodes[i].output for r in readers.get(o, ())):
            branch.add(i)
    return branch


class _Plan:
    """The update's nodes of one step split into components (the nodes of
    the parameters that must be updated together) and the ``If`` graphs
    built from groups of them."""

    def __init__(self, step, nodes, branch):
        self.step, self.nodes = step, nodes
        graph = step.model.graph
        self.sources = step.parameter_inputs
        outputs = [o.name for o in graph.output]
        self.params = outputs[1:1 + len(self.sources)]
        # the gradients of the deferred weights, outputs no If writes
        self.extra = outputs[1 + len(self.sources):]
        self.producer = {o: i for i, node in enumerate(nodes) for o in node.output if o}
        source_set = set(self.sources)
        targets = set(self.params)
        # the update's nodes reading no parameter (a schedule's scalars,
        # a gradient scaled by the learning rate) run before every If, so
        # that the groups share none
        reads_param = {}
        for i in sorted(branch):
            node = nodes[i]
            reads_param[i] = any(n in source_set for n in node.input) or any(
                reads_param.get(self.producer.get(n), False) for n in node.input) \
                or any(o in targets for o in node.output)
        self.hoisted = sorted(i for i in branch if not reads_param[i])
        inside = sorted(i for i in branch if reads_param[i])
        self.components = _components(nodes, inside, self.producer, source_set)
        by_input = {v.name: v for v in graph.input}
        self.nbytes = {s: _nbytes(by_input.get(s)) for s in self.sources}
        # when each value is ready: its producer's position; a hoisted node's
        # outputs when its inputs are
        ready = {}
        hoisted = set(self.hoisted)
        for i, node in enumerate(nodes):
            at = max((ready.get(n, -1) for n in node.input), default=-1) \
                if i in hoisted else i
            for o in node.output:
                ready[o] = at
        self.ready = ready

    def groups(self, min_group_bytes, max_groups):
        """The components in the order their inputs are ready, cut into
        groups of at least ``total / max_groups`` bytes of parameters and
        states (one group when that is under ``min_group_bytes``)."""
        def inputs_ready(component):
            inner = {o for i in component for o in self.nodes[i].output}
            return max((self.ready.get(n, -1) for i in component
                        for n in self.nodes[i].input if n not in inner), default=-1)

        def size(component):
            read = {n for i in component for n in self.nodes[i].input}
            return sum(self.nbytes.get(n, 0) for n in read)

        ordered = sorted(self.components, key=lambda c: (inputs_ready(c), min(c)))
        total = sum(size(c) for c in ordered)
        threshold = total / max(max_groups, 1)
        if threshold < min_group_bytes:
            return [ordered]
        groups, current, held = [], [], 0
        for component in ordered:
            current.append(component)
            held += size(component)
            if held >= threshold:
                groups.append(current)
                current, held = [], 0
        if current:
            groups.append(current)
        return groups

    def build(self, groups):
        """``(model, in_place)`` of the step with one ``If`` per group (a
        group: a list of components), or None when no output may be written
        in place or the groups' order cannot hold (a cycle, a reader that
        cannot run before its group's If)."""
        step, nodes = self.step, self.nodes
        graph = step.model.graph
        loss = graph.output[0].name
        by_name = {o.name: o for o in graph.output}
        taken = {n for node in nodes for n in list(node.input) + list(node.output)}
        taken |= {v.name for v in list(graph.input) + list(graph.output)}
        taken |= {v.name for v in graph.initializer}
        taken |= {node.name for node in nodes if node.name}
        # one builder names every new value and node; its nodes are moved to
        # the graph they belong to as they are written
        g = GraphBuilder(opset_of(step.model), used_names=taken)
        elem_type = by_name[loss].type.tensor_type.elem_type
        finite = g.op("Equal", g.op("Sub", loss, loss), g.const(0.0, elem_type))
        head = list(g.nodes)  # loss - loss is 0 for a finite loss, NaN else
        del g.nodes[:]
        in_branch = [[i for component in group for i in sorted(component)]
                     for group in groups]
        written = {o: k for k, members in enumerate(in_branch)
                   for i in members for o in nodes[i].output}
        pairs = list(zip(self.sources, self.params))
        branches = [_Branch() for _ in groups]
        renamed_outside = {}
        for source, target in pairs:
            # every output goes through an If: the running statistics,
            # computed outside the update, by an Identity in the last one,
            # so that their nodes run before it (left outside, they could run
            # after the in-place writes, and kept the activations they read
            # alive longer, raising the peak); in an earlier one, whose If
            # would wait for them, they would keep its gradients alive
            k = written.get(target, len(groups) - 1)
            branches[k].add_output(g, source, target, by_name[target],
                                   target in written, renamed_outside)
        for k, members in enumerate(in_branch):
            branches[k].nodes = [_copy_node(nodes[i]) for i in members]
            rename_values(branches[k].nodes, branches[k].renamed)
            branches[k].nodes += branches[k].identities
        in_place = set()
        for branch in branches:
            in_place |= branch.safe_targets()
        aliases = _alias_reads(branches, self.sources, self.params, nodes,
                               in_branch)
        in_place -= aliases
        if not in_place:
            return None
        members = {i for group in in_branch for i in group}
        outside = [_copy_node(node) for i, node in enumerate(nodes) if i not in members]
        rename_values(outside, renamed_outside)
        reads = {loss} | set(self.extra) | {n for b in branches for n in b.outer_reads()}
        outside, _ = without_unread(outside, reads)
        # one If reading every gradient runs after every reader of the
        # weights; a deferred weight's gradient is an output no If reads, so
        # the nodes feeding only it (dY @ W2^T for W1's) are routed too
        if len(groups) > 1 or self.extra:
            ordered = _route(g, outside, head, branches, in_place, finite)
            if ordered is None:
                return None
        else:
            ordered = outside + head + [branches[0].make_if(g, finite)]
        new_graph = helper.make_graph(ordered, graph.name, list(graph.input),
                                      list(graph.output),
                                      list(graph.initializer) + g.initializers)
        model = make_model(new_graph, list(step.model.opset_import),
                           ir_version=step.model.ir_version)
        return model, frozenset(in_place)


class _Branch:
    """One ``If`` of the update: its then-branch nodes and outputs, its
    else-branch (the parameters kept), the pass-through values added by
    :func:`_route`."""

    def __init__(self):
        self.nodes, self.identities, self.renamed = [], [], {}
        self.then_outputs, self.else_nodes, self.else_outputs = [], [], []
        self.targets, self.sources = [], []
        self.passed = []  # (value, name after the If)

    def add_output(self, g, source, target, value, written, renamed_outside):
        name = g.unique_name(f"{target}__then")
        if written:
            self.renamed[target] = name
        else:
            computed = g.unique_name(f"{target}__computed")
            renamed_outside[target] = computed
            g.op("Identity", computed, outputs=[name])
            self.identities.append(g.nodes.pop())
        self.then_outputs.append(renamed_value_info(value, name))
        kept = g.unique_name(f"{target}__kept")
        g.op("Identity", source, outputs=[kept])
        self.else_nodes.append(g.nodes.pop())
        self.else_outputs.append(renamed_value_info(value, kept))
        self.targets.append(target)
        self.sources.append(source)

    def then_graph(self):
        return helper.make_graph(self.nodes, "update", [], self.then_outputs)

    def safe_targets(self):
        """The targets written into their source's memory."""
        names = [o.name for o in self.then_outputs]
        safe = writes_after_reads(self.then_graph(), list(zip(self.sources, names)))
        return {t for s, n, t in zip(self.sources, names, self.targets)
                if (s, n) in safe}

    def outer_reads(self):
        inner = {o for node in self.nodes + self.else_nodes for o in node.output}
        return {n for node in self.nodes + self.else_nodes for n in node_reads(node)
                if n not in inner}

    def pass_through(self, g, value):
        """Make the If output a copy of ``value``; returns its name."""
        then_name = g.unique_name(f"{value}__then")
        else_name = g.unique_name(f"{value}__kept")
        after = g.unique_name(f"{value}__after")
        g.op("Identity", value, outputs=[then_name])
        self.nodes.append(g.nodes.pop())
        g.op("Identity", value, outputs=[else_name])
        self.else_nodes.append(g.nodes.pop())
        self.then_outputs.append(helper.make_empty_tensor_value_info(then_name))
        self.else_outputs.append(helper.make_empty_tensor_value_info(else_name))
        self.passed.append((value, after))
        return after

    def make_if(self, g, finite):
        g.op("If", finite, outputs=self.targets + [a for _, a in self.passed],
             then_branch=self.then_graph(),
             else_branch=helper.make_graph(self.else_nodes, "keep", [],
                                           self.else_outputs))
        return g.nodes.pop()


def _components(nodes, inside, producer, source_set):
    """The update's nodes ``inside`` as lists of indices: two nodes are in
    one component when one reads the other's output or both read one
    parameter."""
    parent = {i: i for i in inside}

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first_reader = {}
    for i in inside:
        for name in nodes[i].input:
            j = producer.get(name)
            if j in parent:
                parent[find(i)] = find(j)
            if name in source_set:
                if name in first_reader:
                    parent[find(i)] = find(first_reader[name])
                else:
                    first_reader[name] = i
    components = {}
    for i in inside:
        components.setdefault(find(i), []).append(i)
    return list(components.values())


def _nbytes(value):
    """Bytes of a tensor ValueInfoProto of static shape (0 otherwise)."""
    if value is None or not value.type.HasField("tensor_type"):
        return 0
    tensor = value.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim]
    if any(d < 0 for d in dims):
        return 0
    try:
        itemsize = elem_type_to_numpy(tensor.elem_type).itemsize
    except (KeyError, TypeError, ValueError):
        return 0
    return int(np.prod(dims, dtype=np.int64)) * itemsize


def _alias_closure(names, nodes):
    """``names`` and every value an :data:`ALIASING_OPS` node of ``nodes``
    makes of them (transitively)."""
    closure, stack = set(names), list(names)
    readers = {}
    for node in nodes:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    while stack:
        for node in readers.get(stack.pop(), ()):
            if node.op_type in ALIASING_OPS and node.domain in ("", "ai.onnx"):
                for o in node.output:
                    if o and o not in closure:
                        closure.add(o)
                        stack.append(o)
    return closure


def _alias_reads(branches, sources, params, nodes, in_branch):
    """The targets that may not overwrite their source because an update
    branch reads a view of the source (a Reshape of it...), whose reads the
    branch's own check does not see."""
    bad = set()
    members = {i for group in in_branch for i in group}
    outside = [n for i, n in enumerate(nodes) if i not in members]
    for source, target in zip(sources, params):
        views = _alias_closure([source], outside) - {source}
        if views and any(views & b.outer_reads() for b in branches):
            bad.add(target)
    return bad


def _route(g, outside, head, branches, in_place, finite):
    """The nodes of the split step in a topological order where each
    group's If runs once every other reader of the parameters it writes in
    place has run: the outputs of a reader that is not already one of its
    ancestors pass through it. None when that cannot hold."""
    all_nodes = outside + head
    for branch in branches:
        sources = [s for s, t in zip(branch.sources, branch.targets) if t in in_place]
        if not sources:
            continue
        views = _alias_closure(sources, all_nodes)
        ancestors = _ancestor_names(all_nodes, branch.outer_reads() | {finite})
        for node in all_nodes:
            if not views & set(node.input) or node.op_type in ALIASING_OPS:
                continue
            if any(o in ancestors for o in node.output if o):
                continue
            node = _product_of_transpose(node, all_nodes, ancestors)
            rename = {o: branch.pass_through(g, o) for o in node.output if o}
            rename_values([n for n in all_nodes if n is not node], rename)
            for other in branches:
                if other is not branch:
                    rename_values(other.nodes + other.else_nodes, rename)
    ifs = [branch.make_if(g, finite) for branch in branches]
    ordered = _sorted(all_nodes, ifs)
    if ordered is None:
        return None
    # each If runs after every other reader of its in-place parameters and
    # of their views: checked on the final graph
    for branch, node in zip(branches, ifs):
        sources = [s for s, t in zip(branch.sources, branch.targets) if t in in_place]
        if not sources:
            continue
        views = _alias_closure(sources, ordered)
        before = _ancestor_nodes(ordered, node)
        if any(other is not node and id(other) not in before
               and views & node_reads(other) for other in ordered):
            return None
    return ordered


def _product_of_transpose(node, nodes, ancestors):
    """The MatMul or Gemm that alone reads the output of the Transpose
    ``node`` when its other inputs are among ``ancestors`` (the If's
    ancestors: passing the product through then orders nothing new), else
    ``node``. Passed through the If, the Transpose's output would have the
    If's Identity as a second reader, and onnxruntime would no longer fold
    the transpose into the product (a weight-sized Transpose per step)."""
    if node.op_type != "Transpose" or node.domain not in ("", "ai.onnx"):
        return node
    readers = [n for n in nodes if node.output[0] in node_reads(n)]
    if len(readers) != 1 or readers[0].op_type not in ("MatMul", "Gemm") or \
            readers[0].domain not in ("", "ai.onnx"):
        return node
    product = readers[0]
    if all(i in ancestors for i in product.input if i and i != node.output[0]):
        return product
    return node


def _ancestor_names(nodes, names):
    """Every value name the values ``names`` depend on (themselves
    included), through ``nodes``."""
    producer = {o: node for node in nodes for o in node.output if o}
    seen, stack = set(names), list(names)
    while stack:
        node = producer.get(stack.pop())
        if node is None:
            continue
        for name in node_reads(node):
            if name not in seen:
                seen.add(name)
                stack.append(name)
    return seen


def _ancestor_nodes(nodes, target):
    """ids of the nodes ``target`` depends on."""
    names = _ancestor_names(nodes, node_reads(target))
    return {id(node) for node in nodes
            if any(o in names for o in node.output if o)}


def _sorted(nodes, ifs):
    """``nodes`` and ``ifs`` in a topological order keeping the order of
    ``nodes`` where it can and running each If as soon as what it reads
    exists; None on a cycle."""
    everything = list(nodes) + list(ifs)
    producer = {o: k for k, node in enumerate(everything) for o in node.output if o}
    deps = [{producer[n] for n in node_reads(node) if n in producer}
            for node in everything]
    key = [float(k) for k in range(len(nodes))]
    for k in range(len(nodes), len(everything)):
        key.append(max((key[d] for d in deps[k] if d < len(nodes)), default=-1.0) + 0.5)
    users = [[] for _ in everything]
    missing = [len(d) for d in deps]
    for k, d in enumerate(deps):
        for p in d:
            users[p].append(k)
    heap = [(key[k], k) for k, m in enumerate(missing) if m == 0]
    heapq.heapify(heap)
    ordered = []
    while heap:
        _, k = heapq.heappop(heap)
        ordered.append(k)
        for u in users[k]:
            missing[u] -= 1
            if missing[u] == 0:
                heapq.heappush(heap, (key[u], u))
    if len(ordered) != len(everything):
        return None
    # onnxruntime runs a graph in the order of a depth-first search from
    # the nodes no node reads, the last of them (in the graph's order)
    # first, each after what it needs: the Ifs no node reads go last, the
    # first group's last, so that each runs as soon as its gradients exist
    leaves = [k for k in range(len(nodes), len(everything)) if not users[k]]
    ordered = [k for k in ordered if k not in leaves] + leaves[::-1]
    return [everything[k] for k in ordered]
