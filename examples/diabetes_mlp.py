"""An MLP on the diabetes data, trained by onnxtrain and by scikit-learn.
======================================================================

scikit-learn's ``MLPRegressor`` (10-16-1, relu) is converted to ONNX with
skl2onnx, and :class:`onnxtrain.OrtGradientForwardBackwardOptimizer` trains
the converted graph on onnxruntime. With ``init='random'`` and the same
``random_state``, onnxtrain draws the initial weights scikit-learn draws and
visits the same batches, so the two per-epoch loss curves coincide. Two
solvers are compared:

- plain SGD with a constant learning rate, rows in order;
- Adam with an L2 penalty (``alpha=1``) and shuffled rows.

Both run in float32, as scikit-learn does for float32 data; the curves agree
to about 1e-6 relative. (A deeper float32 MLP trained by Adam can drift
apart after some epochs: Adam divides tiny gradients by their own tiny
scale, which magnifies rounding differences. In float64 the two curves of
such a network still agree to 1e-15.)

The loss curves are overlaid with :func:`onnxtrain.plotting.plot_loss_curves`
(``loss_curves.png``, the picture of the README), and the test R² of each
model is printed.

Run: ``python examples/diabetes_mlp.py [OUTPUT_DIR]``.
"""
import os
import sys
import warnings

import matplotlib
import numpy
from sklearn.datasets import load_diabetes
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPRegressor
from sklearn.preprocessing import StandardScaler

from onnxtrain import (ElasticLearningPenalty, LearningRateAdam, LearningRateSGD,
                       OrtGradientForwardBackwardOptimizer, to_onnx)
from onnxtrain.plotting import plot_loss_curves

HIDDEN = (16,)


def load_data():
    """Standardized diabetes features and target, 75 % / 25 % split."""
    X, y = load_diabetes(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(
        X, y, test_size=0.25, random_state=0)
    scaler = StandardScaler().fit(X_train)
    mean, std = y_train.mean(), y_train.std()
    return (scaler.transform(X_train).astype(numpy.float32),
            scaler.transform(X_test).astype(numpy.float32),
            ((y_train - mean) / std).astype(numpy.float32),
            ((y_test - mean) / std).astype(numpy.float32))


def train_both(X_train, y_train, solver, epochs, batch_size):
    """Fit ``MLPRegressor`` and onnxtrain (on the skl2onnx graph of the
    scikit-learn model) with the same settings; returns both."""
    common = dict(hidden_layer_sizes=HIDDEN, activation="relu",
                  batch_size=batch_size, max_iter=epochs, random_state=0,
                  tol=0.0, n_iter_no_change=epochs + 1)
    if solver == "sgd":
        skl = MLPRegressor(solver="sgd", learning_rate="constant",
                           learning_rate_init=0.01, momentum=0.0,
                           nesterovs_momentum=False, alpha=0.0, shuffle=False,
                           **common)
        ours = dict(learning_rate=LearningRateSGD(eta0=0.01, learning_rate="constant"),
                    shuffle=False)
    else:
        alpha = 1.0
        skl = MLPRegressor(solver="adam", learning_rate_init=0.005, alpha=alpha,
                           shuffle=True, **common)
        # scikit-learn adds 0.5 * alpha * ||W||² (biases excluded).
        ours = dict(learning_rate=LearningRateAdam(eta0=0.005),
                    learning_penalty=ElasticLearningPenalty(l1=0.0, l2=alpha / 2),
                    shuffle=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        skl.fit(X_train, y_train)
    # The training does not depend on the weights scikit-learn learned:
    # onnxtrain starts from the weights scikit-learn started from
    # (init='random'; the default, init='model', would fine-tune the graph's).
    onx = to_onnx(skl, X_train[:1], target_opset=15)
    est = OrtGradientForwardBackwardOptimizer(
        onx, max_iter=epochs, batch_size=batch_size, random_state=0,
        init="random", **ours)
    est.fit(X_train, y_train)
    return skl, est


def main(output_dir=".", epochs=60, batch_size=32):
    """Train both ways with SGD and Adam; draw ``loss_curves.png``.

    Returns a dict with, for each solver (``sgd``, ``adam``): the loss curves
    ``<solver>_onnxtrain_losses`` and ``<solver>_sklearn_losses``, the test R²
    ``<solver>_onnxtrain_r2`` and ``<solver>_sklearn_r2``, the largest
    relative difference of the curves ``<solver>_max_rel_diff``; and
    ``pictures``.
    """
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(output_dir, exist_ok=True)
    X_train, X_test, y_train, y_test = load_data()

    results, curves, labels = {}, [], []
    for solver in ("sgd", "adam"):
        skl, est = train_both(X_train, y_train, solver, epochs, batch_size)
        ours, theirs = numpy.array(est.train_losses_), numpy.array(skl.loss_curve_)
        results.update({
            f"{solver}_onnxtrain_losses": ours.tolist(),
            f"{solver}_sklearn_losses": theirs.tolist(),
            f"{solver}_onnxtrain_r2": float(est.score(X_test, y_test)),
            f"{solver}_sklearn_r2": float(skl.score(X_test, y_test)),
            f"{solver}_max_rel_diff": float(numpy.max(numpy.abs(ours - theirs) / theirs)),
        })
        print(f"{solver:>4}: final loss onnxtrain {ours[-1]:.5f} scikit-learn "
              f"{theirs[-1]:.5f} (largest relative gap "
              f"{results[f'{solver}_max_rel_diff']:.1e}); test R² onnxtrain "
              f"{results[f'{solver}_onnxtrain_r2']:.4f} scikit-learn "
              f"{results[f'{solver}_sklearn_r2']:.4f}")
        curves += [est, skl]
        labels += [f"onnxtrain, {solver}", f"MLPRegressor, {solver}"]

    layers = "-".join(map(str, (X_train.shape[1], *HIDDEN, 1)))
    ax = plot_loss_curves(*curves, labels=labels, log_scale=True,
                          title=f"diabetes, MLP {layers}: onnxtrain vs scikit-learn")
    # scikit-learn's curves as markers on top of onnxtrain's lines.
    for ours, theirs in zip(ax.lines[0::2], ax.lines[1::2]):
        theirs.set_color(ours.get_color())
        theirs.set_linestyle("none")
        theirs.set_marker("o")
        theirs.set_markerfacecolor("none")
        theirs.set_markersize(5)
    ax.legend(fontsize=8)
    path = os.path.join(output_dir, "loss_curves.png")
    ax.figure.set_size_inches(6.4, 4.0)
    ax.figure.savefig(path, dpi=80, bbox_inches="tight")
    plt.close(ax.figure)
    results["pictures"] = {"loss_curves.png": path}
    return results


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "diabetes_output")
