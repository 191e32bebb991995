"""Draw the seed's linear regression graph and its gradient graphs.

Writes ``docs/images/regression_graph.png`` (the graph converted from an
``MLPRegressor`` without hidden layer, as in the seed) and
``docs/images/gradient_graph.png`` (the forward graph saving intermediates
and the backward graph computing ``coefficient_grad`` and ``intercepts_grad``,
built by :func:`onnxtrain.autodiff.build_gradient_models`).

Run: ``python examples/plot_graphs.py``.
"""
import os
import warnings

import matplotlib
import numpy
from sklearn.datasets import make_regression
from sklearn.neural_network import MLPRegressor
from skl2onnx import to_onnx

from onnxtrain.autodiff import build_gradient_models
from onnxtrain.plotting import onnx_to_text, plot_onnxs

IMAGES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "images")


def main():
    matplotlib.use("Agg")  # writes files, no window
    X, y = make_regression(1000, n_features=2, bias=2, random_state=0)
    X, y = X.astype(numpy.float32), y.astype(numpy.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning: a few epochs are enough here
        lr = MLPRegressor(hidden_layer_sizes=(), activation="identity", max_iter=100,
                          random_state=0).fit(X, y)
    onx = to_onnx(lr, X[:1], target_opset=17)
    print(onnx_to_text(onx))

    os.makedirs(IMAGES, exist_ok=True)
    ax = plot_onnxs(onx, title="Linear Regression in ONNX")
    ax.figure.savefig(os.path.join(IMAGES, "regression_graph.png"), dpi=100, bbox_inches="tight")

    weights = ["coefficient", "intercepts"]
    models = build_gradient_models(onx, weights)
    axes = plot_onnxs(models.forward_model, models.backward_model, weights=weights,
                      title=["forward (saves intermediates)", "backward (gradients)"])
    axes[0].figure.savefig(os.path.join(IMAGES, "gradient_graph.png"), dpi=100,
                           bbox_inches="tight")
    print("wrote regression_graph.png and gradient_graph.png in", os.path.normpath(IMAGES))


if __name__ == "__main__":
    main()
