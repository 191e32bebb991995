"""The main job on embedded data: two scikit-learn MLPs converted to ONNX with
skl2onnx, trained by onnxtrain on onnxruntime, compared with scikit-learn.

(a) the seed's linear regression (``make_regression``, 2 features, bias 2);
(b) an MLP with one hidden relu layer on scikit-learn's bundled diabetes data
(standardized). Both start from the initial weights scikit-learn draws with
the same ``random_state`` and use the same batches, so the per-epoch losses
overlay ``MLPRegressor.loss_curve_``.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import numpy as np
import onnx
from sklearn.datasets import load_diabetes, make_regression
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPRegressor
from sklearn.preprocessing import StandardScaler

from .estimators import OrtGradientForwardBackwardOptimizer
from .models import to_onnx
from .optim import LearningRateSGD

__all__ = ["DemoResult", "run_demo", "demo_linear_regression", "demo_diabetes"]


@dataclass
class DemoResult:
    """Outcome of one demo task (losses per epoch, test R², model path)."""

    name: str
    onnxtrain_losses: list
    sklearn_losses: list
    onnxtrain_r2: float
    sklearn_r2: float
    model_path: str | None = None


def _train_both(name, X_train, X_test, y_train, y_test, hidden, epochs,
                batch_size, learning_rate, device, verbose):
    """Fit scikit-learn's MLP and onnxtrain on the converted graph."""
    settings = dict(hidden_layer_sizes=hidden, solver="sgd",
                    learning_rate="constant", learning_rate_init=learning_rate,
                    batch_size=batch_size, max_iter=epochs, shuffle=False,
                    alpha=0.0, momentum=0.0, nesterovs_momentum=False,
                    n_iter_no_change=epochs + 1, tol=0.0, random_state=0)
    if not hidden:
        settings["activation"] = "identity"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        skl = MLPRegressor(**settings).fit(X_train, y_train)
    onx = to_onnx(skl, X_train[:1], target_opset=15, black_op={"LinearRegressor"})
    est = OrtGradientForwardBackwardOptimizer(
        onx, learning_rate=LearningRateSGD(eta0=learning_rate,
                                           learning_rate="constant"),
        max_iter=epochs, batch_size=batch_size, device=device,
        random_state=0, verbose=verbose, init="random")
    est.fit(X_train, y_train)
    return DemoResult(name, list(est.train_losses_), list(skl.loss_curve_),
                      est.score(X_test, y_test), skl.score(X_test, y_test)), est


def demo_linear_regression(epochs=50, device="cpu", verbose=0):
    """(a) The seed's linear regression. Returns (DemoResult, estimator)."""
    X, y = make_regression(n_samples=200, n_features=2, bias=2.0, noise=0.0,
                           random_state=0)
    X, y = X.astype(np.float32), y.astype(np.float32)
    split = train_test_split(X, y, test_size=0.25, random_state=0)
    return _train_both("linear regression (make_regression, 2 features, bias 2)",
                       *split, hidden=(), epochs=epochs, batch_size=10,
                       learning_rate=0.01, device=device, verbose=verbose)


def demo_diabetes(epochs=50, device="cpu", verbose=0):
    """(b) An MLP (16 relu units) on the standardized diabetes data."""
    X, y = load_diabetes(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(
        X, y, test_size=0.25, random_state=0)
    scaler = StandardScaler().fit(X_train)
    mean, std = y_train.mean(), y_train.std()
    X_train = scaler.transform(X_train).astype(np.float32)
    X_test = scaler.transform(X_test).astype(np.float32)
    y_train = ((y_train - mean) / std).astype(np.float32)
    y_test = ((y_test - mean) / std).astype(np.float32)
    return _train_both("MLP 10-16-1 relu on diabetes (standardized)",
                       X_train, X_test, y_train, y_test, hidden=(16,),
                       epochs=epochs, batch_size=32, learning_rate=0.01,
                       device=device, verbose=verbose)


def _print_result(result, out):
    print(f"\n== {result.name}", file=out)
    print(f"{'epoch':>5} {'onnxtrain loss':>16} {'MLPRegressor':>16} "
          f"{'rel. diff':>10}", file=out)
    for epoch, (a, b) in enumerate(zip(result.onnxtrain_losses,
                                       result.sklearn_losses), 1):
        print(f"{epoch:5d} {a:16.8g} {b:16.8g} {abs(a - b) / abs(b):10.2e}",
              file=out)
    print(f"test R2: onnxtrain {result.onnxtrain_r2:.4f}  "
          f"scikit-learn {result.sklearn_r2:.4f}", file=out)
    if result.model_path:
        print(f"trained ONNX model: {result.model_path}", file=out)


def _save_curves(results, path):
    """Loss-curve PNG when matplotlib is installed; returns the path or None."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4))
    for ax, result in zip(np.atleast_1d(axes), results):
        ax.plot(result.sklearn_losses, "o", label="MLPRegressor.loss_curve_",
                markersize=4)
        ax.plot(result.onnxtrain_losses, "-", label="onnxtrain train_losses_")
        ax.set_yscale("log")
        ax.set_xlabel("epoch")
        ax.set_ylabel("loss")
        ax.set_title(result.name, fontsize=9)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def run_demo(output_dir="onnxtrain_demo", epochs=50, device="cpu", verbose=0,
             out=None):
    """Run both demo tasks, print the comparison and write the artifacts.

    Parameters
    ----------
    output_dir : str, default="onnxtrain_demo"
        Folder receiving ``linear_regression.onnx``, ``diabetes_mlp.onnx`` and
        ``loss_curves.png`` (when matplotlib is installed); created if needed.
    epochs : int, default=50
    device : str, default="cpu"
    verbose : int, default=0
    out : file, default=sys.stdout

    Returns
    -------
    list of DemoResult
    """
    import sys

    out = out or sys.stdout
    os.makedirs(output_dir, exist_ok=True)
    results = []
    for filename, task in (("linear_regression.onnx", demo_linear_regression),
                           ("diabetes_mlp.onnx", demo_diabetes)):
        result, est = task(epochs=epochs, device=device, verbose=verbose)
        result.model_path = os.path.join(output_dir, filename)
        onnx.save(est.get_trained_onnx(), result.model_path)
        _print_result(result, out)
        results.append(result)
    png = _save_curves(results, os.path.join(output_dir, "loss_curves.png"))
    missing = "not drawn (matplotlib is missing: install the 'plot' extra)"
    print(f"\nloss curves: {png or missing}", file=out)
    return results
