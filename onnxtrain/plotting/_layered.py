"""Pure-Python layered layout (used when graphviz ``dot`` is not installed).

1. Layering: longest path from the sources along a topological order; a
   source (input, initializer) then moves down to just above its first
   consumer so that weights sit beside the node using them.
2. Ordering: a few sweeps of the barycenter heuristic (Sugiyama et al.,
   1981): each box moves to the mean position of its neighbours in the
   layers above (downward sweep) or below (upward sweep).
3. Coordinates: every layer is packed left to right and centred on x = 0.
"""
from collections import defaultdict

from ._boxes import GraphLayout

NODE_GAP = 0.25  # inches between two boxes of a layer
LAYER_GAP = 0.35  # inches between two layers
SWEEPS = 4


def layered_layout(boxes, edges):
    """Place ``boxes`` (their ``width``/``height`` already set) in layers."""
    preds, succs = defaultdict(list), defaultdict(list)
    for edge in edges:
        preds[edge.head].append(edge.tail)
        succs[edge.tail].append(edge.head)
    order = _topological_order([b.id for b in boxes], preds, succs)
    layer_of = _longest_path_layers(order, preds, succs)
    layers = [[] for _ in range(max(layer_of.values(), default=0) + 1)]
    for box_id in order:
        layers[layer_of[box_id]].append(box_id)
    _barycenter_ordering(layers, preds, succs)
    _assign_coordinates(layers, {b.id: b for b in boxes})
    return GraphLayout(boxes, edges, "python")


def _topological_order(ids, preds, succs):
    """Kahn's algorithm; boxes on a cycle (invalid ONNX) keep their order."""
    missing = {i: len(preds[i]) for i in ids}
    ready = [i for i in ids if missing[i] == 0]
    order = []
    while ready:
        current = ready.pop(0)
        order.append(current)
        for nxt in succs[current]:
            missing[nxt] -= 1
            if missing[nxt] == 0:
                ready.append(nxt)
    placed = set(order)
    return order + [i for i in ids if i not in placed]


def _longest_path_layers(order, preds, succs):
    layer = {}
    for box_id in order:
        layer[box_id] = 1 + max((layer[p] for p in preds[box_id] if p in layer), default=-1)
    for box_id in order:  # sources: right above their first consumer
        if not preds[box_id] and succs[box_id]:
            layer[box_id] = min(layer[s] for s in succs[box_id]) - 1
    return layer


def _barycenter_ordering(layers, preds, succs):
    position = {}

    def renumber(layer):
        position.update((box_id, i - (len(layer) - 1) / 2) for i, box_id in enumerate(layer))

    def barycenter(box_id, neighbours):
        known = [position[n] for n in neighbours[box_id] if n in position]
        return sum(known) / len(known) if known else position[box_id]

    for layer in layers:
        renumber(layer)
    for _ in range(SWEEPS):
        for sweep, neighbours in ((layers[1:], preds), (layers[-2::-1], succs)):
            for layer in sweep:
                layer.sort(key=lambda box_id: barycenter(box_id, neighbours))
                renumber(layer)


def _assign_coordinates(layers, boxes):
    top = 0.0
    for layer in layers:
        height = max((boxes[i].height for i in layer), default=0.0)
        width = sum(boxes[i].width for i in layer) + NODE_GAP * (len(layer) - 1)
        left = -width / 2
        for box_id in layer:
            box = boxes[box_id]
            box.x, box.y = left + box.width / 2, top - height / 2
            left += box.width + NODE_GAP
        top -= height + LAYER_GAP
