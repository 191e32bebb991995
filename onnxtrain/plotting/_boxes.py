"""The boxes and edges of a drawn graph, shared by the layout engines
(:mod:`._dot`, :mod:`._layered`) and :mod:`.layout`, which calls them."""
from dataclasses import dataclass, field
from typing import List, Tuple

__all__ = ["BOX_KINDS", "FONT_SIZE", "Box", "Edge", "GraphLayout"]

#: kinds of boxes, in the order a legend shows them
BOX_KINDS = ("op", "input", "initializer", "weight", "output", "gradient")
FONT_SIZE = 10.0  # points, the size the box dimensions are computed for


@dataclass
class Box:
    """One box: an op node or a graph value (input, initializer, output)."""

    id: str
    kind: str
    label: str
    x: float = 0.0
    y: float = 0.0
    width: float = 0.0
    height: float = 0.0


@dataclass
class Edge:
    """Data flowing from box ``tail`` to box ``head``.

    ``points`` holds the control points of a cubic Bezier spline (3k + 1
    points, tip included) when the layout engine routed the edge, else it is
    empty and the edge is drawn straight.
    """

    tail: str
    head: str
    points: List[Tuple[float, float]] = field(default_factory=list)


@dataclass
class GraphLayout:
    """Positions of the boxes of one graph, returned by :func:`layout_onnx`."""

    boxes: List[Box]
    edges: List[Edge]
    engine: str

    @property
    def node_count(self):
        """Number of op boxes, one per ``NodeProto`` of the graph."""
        return sum(box.kind == "op" for box in self.boxes)

    def bounds(self):
        """``(xmin, ymin, xmax, ymax)`` enclosing every box and edge."""
        xs = [b.x + sign * b.width / 2 for b in self.boxes for sign in (-1, 1)]
        ys = [b.y + sign * b.height / 2 for b in self.boxes for sign in (-1, 1)]
        for edge in self.edges:
            xs.extend(p[0] for p in edge.points)
            ys.extend(p[1] for p in edge.points)
        if not xs:
            return (0.0, 0.0, 1.0, 1.0)
        return (min(xs), min(ys), max(xs), max(ys))
