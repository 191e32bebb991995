"""Draw the seed's linear regression graph and its gradient graphs.
================================================================

Writes ``regression_graph.png`` (the graph converted from an
``MLPRegressor`` without hidden layer, as in the seed) and
``gradient_graph.png`` (the forward graph saving intermediates and the
backward graph computing ``coefficient_grad`` and ``intercepts_grad``, built
by :func:`onnxtrain.autodiff.build_gradient_models`), and prints the text
rendering of the regression graph. By default the pictures go to
``docs/images/``, where the README shows them.

Run: ``python examples/plot_graphs.py [OUTPUT_DIR]``.
"""
import os
import sys
import warnings

import matplotlib
import numpy
from sklearn.datasets import make_regression
from sklearn.neural_network import MLPRegressor
from skl2onnx import to_onnx

from onnxtrain.autodiff import build_gradient_models
from onnxtrain.plotting import onnx_to_text, plot_onnxs

IMAGES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "images")


def main(output_dir=IMAGES):
    """Draw the graphs in ``output_dir``.

    Returns a dict: ``text`` (the text rendering of the regression graph),
    ``node_counts`` and ``drawn_node_counts`` (per graph: nodes in the
    model, node boxes in its drawing) and ``pictures`` (paths).
    """
    matplotlib.use("Agg")  # writes files, no window
    import matplotlib.pyplot as plt
    X, y = make_regression(1000, n_features=2, bias=2, random_state=0)
    X, y = X.astype(numpy.float32), y.astype(numpy.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning: a few epochs are enough here
        lr = MLPRegressor(hidden_layer_sizes=(), activation="identity", max_iter=100,
                          random_state=0).fit(X, y)
    onx = to_onnx(lr, X[:1], target_opset=17)
    text = onnx_to_text(onx)
    print(text)

    os.makedirs(output_dir, exist_ok=True)
    pictures, counts, drawn = {}, {}, {}

    def save(ax, name):
        figure = numpy.atleast_1d(ax)[0].figure
        pictures[name] = os.path.join(output_dir, name)
        figure.savefig(pictures[name], dpi=80, bbox_inches="tight")
        plt.close(figure)

    ax = plot_onnxs(onx, title="Linear Regression in ONNX")
    counts["regression"], drawn["regression"] = len(onx.graph.node), ax.onnx_node_count
    save(ax, "regression_graph.png")

    weights = ["coefficient", "intercepts"]
    models = build_gradient_models(onx, weights)
    axes = plot_onnxs(models.forward_model, models.backward_model, weights=weights,
                      title=["forward (saves intermediates)", "backward (gradients)"])
    for name, model, ax in zip(["forward", "backward"],
                               [models.forward_model, models.backward_model], axes):
        counts[name], drawn[name] = len(model.graph.node), ax.onnx_node_count
    save(axes, "gradient_graph.png")
    print("wrote regression_graph.png and gradient_graph.png in",
          os.path.normpath(output_dir))
    return {"text": text, "node_counts": counts, "drawn_node_counts": drawn,
            "pictures": pictures}


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else IMAGES)
