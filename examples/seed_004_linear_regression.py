"""Train a linear regression with forward/backward (the seed example).
===================================================================

The onnxcustom example "Train a linear regression with forward backward",
run on onnxtrain with only its imports changed (and fixed random seeds so
the numbers are reproducible). It converts a scikit-learn ``MLPRegressor``
without hidden layer to ONNX, trains its two initializers with
:class:`onnxtrain.OrtGradientForwardBackwardOptimizer` on onnxruntime, and
draws the four graphs the seed draws and the loss curves.

Run: ``python examples/seed_004_linear_regression.py [OUTPUT_DIR]``.
"""
import os
import sys
import warnings
from pprint import pprint

import matplotlib
import numpy
from onnxruntime import get_device
from sklearn.datasets import make_regression
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPRegressor

from onnxtrain import (OrtGradientForwardBackwardOptimizer,
                       get_train_initializer, to_onnx)
from onnxtrain.plotting import plot_loss_curves, plot_onnxs


def main(output_dir="."):
    """Run the seed in ``output_dir``.

    Returns a dict: ``coef`` (the generating coefficients, the bias is 2),
    ``trained_coef`` and ``trained_intercept``, ``losses`` (onnxtrain's
    ``train_losses_``), ``sklearn_losses`` (``MLPRegressor.loss_curve_``),
    ``final_loss``, ``test_r2``, ``node_counts`` and ``drawn_node_counts``
    (nodes of each graph drawn, in the graph and in its drawing) and
    ``pictures`` (the five PNG paths).
    """
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(output_dir, exist_ok=True)
    pictures, counts, drawn = {}, {}, {}

    def save(ax, name, models=()):
        axes = numpy.atleast_1d(ax)
        for i, (model, one) in enumerate(zip(models, axes)):
            counts[f"{name}[{i}]"] = len(model.graph.node)
            drawn[f"{name}[{i}]"] = one.onnx_node_count
        pictures[name] = os.path.join(output_dir, name)
        axes[0].figure.savefig(pictures[name], dpi=80, bbox_inches="tight")
        plt.close(axes[0].figure)

    X, y, coef = make_regression(n_features=2, bias=2, coef=True, random_state=0)
    X = X.astype(numpy.float32)
    y = y.astype(numpy.float32)
    X_train, X_test, y_train, y_test = train_test_split(X, y, random_state=0)

    # A simple linear regression with scikit-learn.
    lr = MLPRegressor(hidden_layer_sizes=tuple(), activation='identity',
                      max_iter=50, batch_size=10, solver='sgd', alpha=0,
                      learning_rate_init=1e-2, n_iter_no_change=200,
                      momentum=0, nesterovs_momentum=False, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        lr.fit(X, y)
    print(lr.predict(X[:5]))
    print("trained coefficients:", lr.coefs_, lr.intercepts_)

    # The ONNX graph.
    onx = to_onnx(lr, X_train[:1].astype(numpy.float32), target_opset=15,
                  black_op={'LinearRegressor'})
    save(plot_onnxs(onx, title="Linear Regression in ONNX"), "regression.png", [onx])

    # The weights: every float initializer that reaches the output.
    inits = get_train_initializer(onx)
    weights = {k: v for k, v in inits.items() if k != "shape_tensor"}
    pprint(list((k, v[0].shape) for k, v in weights.items()))

    device = "cuda" if get_device().upper() == 'GPU' else 'cpu'
    print("device=%r get_device()=%r" % (device, get_device()))

    # Stochastic gradient descent.
    train_session = OrtGradientForwardBackwardOptimizer(
        onx, list(weights), device=device, verbose=0, learning_rate=1e-2,
        warm_start=False, max_iter=200, batch_size=10, random_state=0)
    train_session.fit(X, y)
    print(train_session)

    state_tensors = train_session.get_state()
    pprint(["trained coefficients:", state_tensors])
    print("last_losses:", train_session.train_losses_[-5:])
    save(plot_loss_curves(train_session, lr, labels=["onnxtrain", "scikit-learn"],
                          log_scale=True, title="Train loss against iterations"),
         "loss_curves.png")

    # The graphs the engine runs, and the two small graphs.
    onx_loss = train_session.train_session_.cls_type_._optimized_pre_grad_model
    save(plot_onnxs(onx, onx_loss, title=['regression', 'loss']),
         "regression_and_loss.png", [onx, onx_loss])
    onx_gradient = train_session.train_session_.cls_type_._trained_onnx
    save(plot_onnxs(onx_loss, onx_gradient, title=['loss', 'gradient + loss']),
         "gradient.png", [onx_loss, onx_gradient])
    small = [train_session.learning_loss.loss_grad_onnx_,
             train_session.learning_rate.axpy_onnx_]
    save(plot_onnxs(*small, title=['error gradient + loss', 'gradient update']),
         "small_graphs.png", small)

    trained_coef, trained_intercept = state_tensors
    print("generating coefficients:", coef, "bias: 2")
    return {"coef": coef, "trained_coef": trained_coef.ravel(),
            "trained_intercept": float(trained_intercept.ravel()[0]),
            "losses": list(train_session.train_losses_),
            "sklearn_losses": list(lr.loss_curve_),
            "final_loss": train_session.train_losses_[-1],
            "test_r2": train_session.score(X_test, y_test),
            "node_counts": counts, "drawn_node_counts": drawn,
            "pictures": pictures}


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "seed_004_output")
