"""Layout by the graphviz ``dot`` executable (``-Tplain`` output)."""
import math
import shutil
import subprocess
from collections import defaultdict, deque

from ._boxes import FONT_SIZE, GraphLayout

ARROW_LENGTH = 10 / 72  # inches: dot leaves this gap for the arrowhead


class DotError(Exception):
    """``dot`` is missing or failed."""


def dot_layout(boxes, edges, timeout=60):
    """Place ``boxes`` (their ``width``/``height`` set as minimal sizes) with dot."""
    executable = shutil.which("dot")
    if executable is None:
        raise DotError("graphviz 'dot' executable not found on the PATH "
                       "(install graphviz or use layout='python')")
    try:
        done = subprocess.run([executable, "-Tplain"], input=_to_dot(boxes, edges),
                              capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DotError(f"running {executable!r} failed: {exc}") from exc
    if done.returncode != 0:
        raise DotError(f"dot exited with status {done.returncode}: {done.stderr.strip()}")
    _read_plain(done.stdout, boxes, edges)
    return GraphLayout(boxes, edges, "dot")


def _to_dot(boxes, edges):
    lines = ["digraph G {", "  rankdir=TB; nodesep=0.25; ranksep=0.35;",
             f'  node [shape=box, fontsize={FONT_SIZE}, fontname="Helvetica"];']
    lines.extend(f'  {b.id} [label="{_escape(b.label)}", width={b.width:.3f}, '
                 f'height={b.height:.3f}];' for b in boxes)
    lines.extend(f"  {e.tail} -> {e.head};" for e in edges)
    lines.append("}")
    return "\n".join(lines)


def _escape(label):
    return label.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _read_plain(text, boxes, edges):
    """Copy positions from dot's plain output into ``boxes`` and ``edges``."""
    by_id = {b.id: b for b in boxes}
    routes = defaultdict(deque)  # (tail, head) -> splines, in dot's order
    for line in text.splitlines():
        tokens = line.split()
        if tokens and tokens[0] == "node":
            box = by_id[tokens[1]]
            box.x, box.y, box.width, box.height = map(float, tokens[2:6])
        elif tokens and tokens[0] == "edge":
            count = int(tokens[3])
            values = list(map(float, tokens[4:4 + 2 * count]))
            routes[tokens[1], tokens[2]].append(list(zip(values[::2], values[1::2])))
    for edge in edges:
        if routes[edge.tail, edge.head]:
            edge.points = _with_tip(routes[edge.tail, edge.head].popleft())


def _with_tip(points):
    """Extend the last Bezier segment to the arrow tip dot drew apart."""
    (x0, y0), (x1, y1) = points[-2], points[-1]
    norm = math.hypot(x1 - x0, y1 - y0)
    if norm == 0:
        return points
    dx, dy = (x1 - x0) / norm * ARROW_LENGTH, (y1 - y0) / norm * ARROW_LENGTH
    return points[:-1] + [(x1 + dx, y1 + dy)]
