"""Draw ONNX graphs with matplotlib (:func:`plot_onnxs`)."""
import numpy

from ._pyplot import require_pyplot
from .layout import FONT_SIZE, layout_onnx

#: fill colour of each kind of box
COLORS = {
    "op": "#ffffff",
    "input": "#cfe2f3",
    "initializer": "#e6e6e6",
    "weight": "#f9cb9c",
    "output": "#d9ead3",
    "gradient": "#f4a6a6",
}
MAX_FIGURE = (18.0, 10.0)  # inches: a figure made here is never larger


def plot_onnxs(*models, title=None, ax=None, layout="auto", weights=None):
    """Draw one or several ONNX graphs side by side.

    Every node is a rounded white box labelled with its op type. Graph
    inputs (blue), initializers (grey), trainable weights (orange), outputs
    (green) and gradients (red, names ending in ``_grad``) are square boxes
    labelled with their name and shape, e.g. ``"coefficient\\n2x1"``.

    Parameters
    ----------
    *models : onnx.ModelProto, bytes, str or os.PathLike
        The graphs to draw, left to right.
    title : str or list of str, default=None
        One title per model (a str when there is one model).
    ax : matplotlib.axes.Axes or array-like of Axes, default=None
        Where to draw, one Axes per model; a new figure sized for the
        graphs when None.
    layout : {"auto", "dot", "python"}, default="auto"
        Layout engine, see :func:`onnxtrain.plotting.layout_onnx`.
    weights : iterable of str, default=None
        Names to colour as trainable weights; by default guessed as
        described in :func:`onnxtrain.plotting.layout_onnx`.

    Returns
    -------
    matplotlib.axes.Axes or ndarray of Axes
        One Axes for one model, else an object array with one Axes per
        model. Each carries ``onnx_layout`` (the :class:`GraphLayout`) and
        ``onnx_node_count`` (number of op boxes drawn).

    Raises
    ------
    ImportError
        If matplotlib is not installed.
    TypeError
        If a model is neither a ModelProto, bytes nor a path.
    ValueError
        If no model is given, or ``title``, ``ax`` do not match the number
        of models, or ``layout`` is unknown.
    """
    plt = require_pyplot()
    if not models:
        raise ValueError("plot_onnxs needs at least one model")
    titles = _titles(title, len(models))
    layouts = [layout_onnx(model, layout=layout, weights=weights) for model in models]
    axes = _axes(plt, ax, layouts)
    for axis, graph_layout, name in zip(axes, layouts, titles):
        draw_layout(axis, graph_layout, title=name)
    return axes[0] if len(models) == 1 else numpy.array(axes, dtype=object)


def draw_layout(ax, graph_layout, title=None):
    """Draw a :class:`GraphLayout` on ``ax``; fonts scale with the axes size."""
    xmin, ymin, xmax, ymax = graph_layout.bounds()
    margin = 0.1
    ax.set_xlim(xmin - margin, xmax + margin)
    ax.set_ylim(ymin - margin, ymax + margin)
    ax.set_aspect("equal")
    ax.set_axis_off()
    if title is not None:
        ax.set_title(title)
    ax.apply_aspect()
    pixels_per_unit = abs(ax.transData.transform((1, 0))[0] - ax.transData.transform((0, 0))[0])
    scale = pixels_per_unit / ax.figure.dpi  # 1 when drawn at the size dot assumed
    boxes = {box.id: (box, _draw_box(ax, box, scale)) for box in graph_layout.boxes}
    for edge in graph_layout.edges:
        _draw_edge(ax, edge, boxes, scale)
    ax.onnx_layout = graph_layout
    ax.onnx_node_count = graph_layout.node_count
    return ax


def _draw_box(ax, box, scale):
    from matplotlib.patches import FancyBboxPatch
    style = "round,pad=0,rounding_size=0.12" if box.kind == "op" else "square,pad=0"
    patch = FancyBboxPatch((box.x - box.width / 2, box.y - box.height / 2), box.width,
                           box.height, boxstyle=style, facecolor=COLORS[box.kind],
                           edgecolor="#404040", linewidth=max(0.3, scale), zorder=2)
    ax.add_patch(patch)
    weight = "bold" if box.kind == "op" else "normal"
    ax.text(box.x, box.y, box.label, ha="center", va="center", fontsize=FONT_SIZE * scale,
            fontweight=weight, zorder=3)
    return patch


def _draw_edge(ax, edge, boxes, scale):
    from matplotlib.patches import FancyArrowPatch
    from matplotlib.path import Path
    style = dict(arrowstyle="-|>", mutation_scale=10 * scale, color="#505050",
                 linewidth=max(0.3, scale), zorder=1)
    if edge.points:
        codes = [Path.MOVETO] + [Path.CURVE4] * (len(edge.points) - 1)
        arrow = FancyArrowPatch(path=Path(edge.points, codes), **style)
    else:
        (tail, tail_patch), (head, head_patch) = boxes[edge.tail], boxes[edge.head]
        arrow = FancyArrowPatch((tail.x, tail.y), (head.x, head.y), patchA=tail_patch,
                                patchB=head_patch, shrinkA=0, shrinkB=0, **style)
    ax.add_patch(arrow)


def _titles(title, count):
    if title is None:
        return [None] * count
    if isinstance(title, str):
        if count != 1:
            raise ValueError(f"title must be a list of {count} str, one per model, got a str")
        return [title]
    titles = list(title)
    if len(titles) != count:
        raise ValueError(f"title has {len(titles)} entries for {count} models")
    return titles


def _axes(plt, ax, layouts):
    count = len(layouts)
    if ax is not None:
        axes = list(numpy.ravel(numpy.asarray(ax, dtype=object)))
        if len(axes) != count:
            raise ValueError(f"ax holds {len(axes)} Axes for {count} models")
        return axes
    widths = [max(1.0, lay.bounds()[2] - lay.bounds()[0]) for lay in layouts]
    height = max(max(1.0, lay.bounds()[3] - lay.bounds()[1]) for lay in layouts)
    shrink = min(1.0, MAX_FIGURE[0] / sum(widths), MAX_FIGURE[1] / height)
    figsize = (max(3.0, sum(widths) * shrink + 0.3 * count), height * shrink + 0.6)
    _, axes = plt.subplots(1, count, figsize=figsize, squeeze=False,
                           gridspec_kw={"width_ratios": widths})
    return list(axes[0])
