"""Tests of onnxtrain.plotting: graph drawings, loss curves, text rendering."""
import shutil
import subprocess
import sys
import warnings

import matplotlib
import numpy
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

matplotlib.use("Agg")
import matplotlib.image as mpimg  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import BoxStyle, FancyArrowPatch, FancyBboxPatch  # noqa: E402

from onnxtrain.autodiff import build_fused_model, build_gradient_models  # noqa: E402
from onnxtrain.plotting import (  # noqa: E402
    layout_onnx, onnx_to_text, plot_loss_curves, plot_onnxs)

WEIGHTS = ["coefficient", "intercepts"]
HAS_DOT = shutil.which("dot") is not None
NO_DOT = pytest.mark.skipif(not HAS_DOT, reason="graphviz 'dot' is not installed")
LAYOUTS = [pytest.param("dot", marks=NO_DOT), "python"]


@pytest.fixture(scope="module")
def regression():
    """The seed's graph: a linear regression (MLPRegressor without hidden layer)."""
    from sklearn.datasets import make_regression
    from sklearn.neural_network import MLPRegressor
    from skl2onnx import to_onnx
    X, y = make_regression(100, n_features=2, bias=2, random_state=0)
    X = X.astype(numpy.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = MLPRegressor(hidden_layer_sizes=(), activation="identity", max_iter=5,
                             random_state=0).fit(X, y.astype(numpy.float32))
        return to_onnx(model, X[:1], target_opset=17)


@pytest.fixture(scope="module")
def graphs(regression):
    models = build_gradient_models(regression, WEIGHTS)
    fused, _ = build_fused_model(regression, WEIGHTS)
    return {"regression": regression, "forward": models.forward_model,
            "backward": models.backward_model, "fused": fused}


def assert_png_not_blank(path):
    image = mpimg.imread(str(path))[..., :3]
    assert image.var() > 0
    background = image[0, 0]
    differs = numpy.abs(image - background).max(axis=-1) > 0.05
    assert differs.mean() > 0.01, f"only {differs.mean():.4f} of the pixels are drawn"


def rounded_boxes(ax):
    return [p for p in ax.patches if isinstance(p, FancyBboxPatch)
            and isinstance(p.get_boxstyle(), BoxStyle.Round)]


def kinds(graph_layout):
    return {box.label.split("\n")[0]: box.kind for box in graph_layout.boxes if box.kind != "op"}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", ["regression", "forward", "backward", "fused"])
def test_plot_one_graph_draws_every_node(graphs, name, layout, tmp_path):
    model = graphs[name]
    ax = plot_onnxs(model, title=name, layout=layout)
    path = tmp_path / f"{name}.png"
    ax.figure.savefig(path)
    plt.close(ax.figure)
    assert_png_not_blank(path)
    assert ax.onnx_layout.engine == layout
    assert ax.onnx_node_count == len(model.graph.node)
    assert len(rounded_boxes(ax)) == len(model.graph.node)
    arrows = [p for p in ax.patches if isinstance(p, FancyArrowPatch)]
    assert len(arrows) == len(ax.onnx_layout.edges)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layout_flows_downwards_without_overlap(graphs, layout):
    for model in graphs.values():
        lay = layout_onnx(model, layout=layout)
        boxes = {b.id: b for b in lay.boxes}
        assert all(boxes[e.head].y < boxes[e.tail].y for e in lay.edges)
        for i, a in enumerate(lay.boxes):
            for b in lay.boxes[i + 1:]:
                apart_x = abs(a.x - b.x) >= (a.width + b.width) / 2 - 1e-6
                apart_y = abs(a.y - b.y) >= (a.height + b.height) / 2 - 1e-6
                assert apart_x or apart_y, (a.label, b.label)


def test_regression_boxes_and_edges(regression):
    lay = layout_onnx(regression, layout="python")
    labels = sorted(b.label for b in lay.boxes)
    assert labels == sorted(["X\n?x2", "coefficient\n2x1", "intercepts\n1x1", "shape_tensor\n2",
                             "variable\n?x1", "Cast", "MatMul", "Add", "Reshape"])
    assert kinds(lay) == {"X": "input", "coefficient": "weight", "intercepts": "weight",
                          "shape_tensor": "initializer", "variable": "output"}
    by_id = {b.id: b.label.split("\n")[0] for b in lay.boxes}
    assert sorted((by_id[e.tail], by_id[e.head]) for e in lay.edges) == sorted([
        ("X", "Cast"), ("Cast", "MatMul"), ("coefficient", "MatMul"), ("MatMul", "Add"),
        ("intercepts", "Add"), ("Add", "Reshape"), ("shape_tensor", "Reshape"),
        ("Reshape", "variable")])


def test_gradients_and_weights_are_coloured(graphs):
    backward = kinds(layout_onnx(graphs["backward"], layout="python"))
    assert backward["coefficient_grad"] == backward["intercepts_grad"] == "gradient"
    assert backward["variable_grad"] == "gradient"
    assert backward["cast_input"] == "input"
    forward = graphs["forward"]
    assert kinds(layout_onnx(forward, layout="python"))["coefficient"] == "input"
    assert kinds(layout_onnx(forward, layout="python", weights=WEIGHTS))["coefficient"] == "weight"
    fused = kinds(layout_onnx(graphs["fused"], layout="python"))  # w is a weight: w_grad is there
    assert fused["coefficient"] == fused["intercepts"] == "weight"


def test_plot_several_graphs_returns_array(graphs, tmp_path):
    axes = plot_onnxs(graphs["regression"], graphs["backward"], title=["regression", "gradient"],
                      layout="python")
    assert isinstance(axes, numpy.ndarray) and axes.shape == (2,)
    assert [a.get_title() for a in axes] == ["regression", "gradient"]
    assert [a.onnx_node_count for a in axes] == [4, len(graphs["backward"].graph.node)]
    axes[0].figure.savefig(tmp_path / "two.png")
    plt.close(axes[0].figure)
    assert_png_not_blank(tmp_path / "two.png")


def test_plot_on_given_axes_and_other_inputs(regression, tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(regression, str(path))
    fig, given = plt.subplots(1, 3)
    axes = plot_onnxs(regression, regression.SerializeToString(), path, ax=given, layout="python")
    assert list(axes) == list(given)
    assert [a.onnx_node_count for a in axes] == [4, 4, 4]
    assert plot_onnxs(str(path), ax=given[0], layout="python") is given[0]
    plt.close(fig)


@pytest.mark.parametrize("bad", [42, None, [b"x"], onnx.GraphProto()])
def test_bad_model_type(bad):
    name = type(bad).__qualname__
    with pytest.raises(TypeError, match=name):
        plot_onnxs(bad)
    with pytest.raises(TypeError, match=name):
        onnx_to_text(bad)


def test_bad_arguments(regression):
    with pytest.raises(ValueError, match="layout"):
        layout_onnx(regression, layout="neato")
    with pytest.raises(ValueError, match="2 models"):
        plot_onnxs(regression, regression, title=["only one"], layout="python")
    with pytest.raises(ValueError, match="list of 2"):
        plot_onnxs(regression, regression, title="one str", layout="python")
    with pytest.raises(ValueError, match="at least one"):
        plot_onnxs()
    plt.close("all")


def test_layout_without_dot(regression, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert layout_onnx(regression).engine == "python"
    with pytest.raises(RuntimeError, match="dot"):
        layout_onnx(regression, layout="dot")


def test_failing_dot_falls_back(regression, monkeypatch):
    false = shutil.which("false")
    if false is None:
        pytest.skip("no 'false' executable")
    monkeypatch.setattr(shutil, "which", lambda name: false)
    with pytest.warns(RuntimeWarning, match="python layout"):
        assert layout_onnx(regression).engine == "python"
    with pytest.raises(RuntimeError, match="status 1"):
        layout_onnx(regression, layout="dot")


def test_onnx_to_text(graphs):
    for model in graphs.values():
        text = onnx_to_text(model)
        lines = text.splitlines()
        for node in model.graph.node:
            assert any(f"= {node.op_type}(" in line for line in lines), node.op_type
        for init in model.graph.initializer:
            assert f"init   {init.name}: " in text
        assert len(lines) == (1 + len(model.graph.input) + len(model.graph.initializer)
                              + len(model.graph.node) + len(model.graph.output))
    regression = onnx_to_text(graphs["regression"]).splitlines()
    assert "input  X: float32[?, 2]" in regression
    assert "init   shape_tensor: int64[2] = [-1, 1]" in regression
    assert "cast_input = Cast(X) to=float32" in regression
    assert "mul_result = MatMul(cast_input, coefficient)" in regression
    assert "output variable: float32[?, 1]" in regression
    assert "transpose = Transpose(cast_input) perm=[1, 0]" in onnx_to_text(graphs["backward"])


def test_onnx_to_text_abbreviates():
    big = numpy_helper.from_array(numpy.ones((10, 10), dtype=numpy.float32), "big")
    node = helper.make_node("Gemm", ["X", "big", ""], ["Y"], alpha=0.5, transB=1)
    split = helper.make_node("Split", ["Y"], ["a", "b"], axis=1, domain="")
    graph = helper.make_graph([node, split], "g",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 10])],
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("b", TensorProto.FLOAT, None)],
                              [big])
    lines = onnx_to_text(helper.make_model(graph)).splitlines()
    assert "init   big: float32[10, 10]" in lines
    assert "Y = Gemm(X, big, _) alpha=0.5, transB=1" in lines
    assert "a, b = Split(Y) axis=1" in lines
    assert "input  X: float32[N, 10]" in lines
    assert "output a: float32[...]" in lines


class _Trained:
    def __init__(self, train, validation=()):
        self.train_losses_ = train
        self.validation_losses_ = validation


def test_plot_loss_curves_one_line_per_curve():
    curves = [[3.0, 2.0, 1.5], numpy.array([4.0, 2.5, 1.0, 0.5]), _Trained([5.0, 4.0])]
    ax = plot_loss_curves(*curves, log_scale=True, title="losses")
    assert len(ax.lines) == 3
    for line, curve in zip(ax.lines, curves):
        expected = getattr(curve, "train_losses_", curve)
        numpy.testing.assert_allclose(line.get_ydata(), expected)
        numpy.testing.assert_allclose(line.get_xdata(), numpy.arange(1, len(expected) + 1))
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["curve 0", "curve 1", "Trained"]
    assert ax.get_yscale() == "log" and ax.get_title() == "losses"
    plt.close(ax.figure)


def test_plot_loss_curves_validation_and_mlp():
    from sklearn.neural_network import MLPRegressor
    rng = numpy.random.RandomState(0)
    X = rng.randn(60, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mlp = MLPRegressor(hidden_layer_sizes=(3,), max_iter=8, early_stopping=True,
                           random_state=0).fit(X, X.sum(axis=1))
    ax = plot_loss_curves(_Trained([3.0, 2.0], [3.5, 2.5]), mlp, labels=["a", "b"])
    assert [line.get_label() for line in ax.lines] == ["a", "a (validation)", "b"]
    assert ax.lines[1].get_linestyle() == "--"
    numpy.testing.assert_allclose(ax.lines[2].get_ydata(), mlp.loss_curve_)
    plt.close(ax.figure)
    with pytest.raises(TypeError, match="curve 0"):
        plot_loss_curves(object())
    with pytest.raises(ValueError, match="labels"):
        plot_loss_curves([1.0], labels=["a", "b"])


def test_plot_without_matplotlib(regression, monkeypatch):
    for name in list(sys.modules):
        if name == "matplotlib" or name.startswith("matplotlib."):
            monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError, match=r"pip install onnxtrain\[plot\]"):
        plot_onnxs(regression)
    with pytest.raises(ImportError, match=r"pip install onnxtrain\[plot\]"):
        plot_loss_curves([1.0, 0.5])
    assert "MatMul" in onnx_to_text(regression)


def test_import_without_matplotlib():
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "import onnxtrain.plotting as p\n"
            "assert not any(m.startswith('matplotlib.') for m in sys.modules)\n"
            "print(p.onnx_to_text.__name__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "onnx_to_text"
