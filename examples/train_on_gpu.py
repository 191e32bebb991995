"""Forward/backward training of a neural network on the GPU, when there is one.
============================================================================

The same code runs on both devices: ``device`` is ``"cuda"`` when the
installed onnxruntime has the CUDA execution provider (the
``onnxruntime-gpu`` package) and ``"cpu"`` otherwise, and the script says
which one it used. An ``MLPRegressor`` (10-50-10-1, relu) is converted to
ONNX and trained by :class:`onnxtrain.OrtGradientForwardBackwardOptimizer`;
weights, gradients and the intermediates the backward pass needs stay on
the device as OrtValues, only the loss comes back to the host. The loss
curve is compared with scikit-learn's (same initial weights, same batches);
on a GPU, the same training is repeated on the CPU and both curves are
compared too.

Run: ``python examples/train_on_gpu.py [OUTPUT_DIR]``.
"""
import os
import sys
import time
import warnings

import matplotlib
import numpy
import onnxruntime
from sklearn.datasets import make_regression
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPRegressor

from onnxtrain import LearningRateSGD, OrtGradientForwardBackwardOptimizer, to_onnx
from onnxtrain.plotting import plot_loss_curves, plot_onnxs


def pick_device():
    """"cuda" when onnxruntime has the CUDA execution provider, else "cpu"."""
    providers = onnxruntime.get_available_providers()
    return "cuda" if "CUDAExecutionProvider" in providers else "cpu"


def main(output_dir=".", epochs=20, batch_size=50, n_samples=2000):
    """Train on the best device available, compare with scikit-learn.

    Returns a dict: ``device``, ``providers``, ``weights_device`` (where the
    trained weights live), ``losses`` and ``sklearn_losses`` per epoch,
    ``max_rel_diff`` (largest relative gap between them), ``test_r2`` and
    ``sklearn_r2``, ``seconds`` (training time), ``cpu_losses`` (a CPU run
    of the same training when the device is a GPU, else None),
    ``node_counts`` and ``drawn_node_counts`` (forward and gradient models,
    in the graph and in the drawing) and ``pictures``.
    """
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(output_dir, exist_ok=True)
    device = pick_device()
    providers = onnxruntime.get_available_providers()
    if device == "cpu":
        print(f"No CUDAExecutionProvider in onnxruntime {onnxruntime.__version__} "
              f"(providers: {providers}): training on the CPU. Install "
              "onnxruntime-gpu in place of onnxruntime to train on a GPU.")
    else:
        print(f"CUDAExecutionProvider found: training on {device}.")

    X, y = make_regression(n_samples=n_samples, n_features=10, n_informative=8,
                           noise=5.0, random_state=0)
    X = X.astype(numpy.float32)
    y = (y / y.std()).astype(numpy.float32)
    X_train, X_test, y_train, y_test = train_test_split(X, y, random_state=0)

    skl = MLPRegressor(hidden_layer_sizes=(50, 10), activation="relu",
                       solver="sgd", learning_rate="constant",
                       learning_rate_init=0.01, momentum=0.0,
                       nesterovs_momentum=False, alpha=0.0, shuffle=False,
                       batch_size=batch_size, max_iter=epochs, tol=0.0,
                       n_iter_no_change=epochs + 1, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        skl.fit(X_train, y_train)
    onx = to_onnx(skl, X_train[:1], target_opset=15)

    def train(on):
        est = OrtGradientForwardBackwardOptimizer(
            onx, device=on, max_iter=epochs, batch_size=batch_size,
            learning_rate=LearningRateSGD(eta0=0.01, learning_rate="constant"),
            random_state=0, init="random")  # scikit-learn's initial weights
        begin = time.perf_counter()
        est.fit(X_train, y_train)
        return est, time.perf_counter() - begin

    est, seconds = train(device)
    losses = numpy.array(est.train_losses_)
    gap = numpy.abs(losses - skl.loss_curve_) / numpy.array(skl.loss_curve_)
    results = {
        "device": device, "providers": providers,
        "weights_device": est.train_session_.weights[0].device_name(),
        "losses": losses.tolist(), "sklearn_losses": list(skl.loss_curve_),
        "max_rel_diff": float(gap.max()),
        "test_r2": float(est.score(X_test, y_test)),
        "sklearn_r2": float(skl.score(X_test, y_test)),
        "seconds": seconds, "cpu_losses": None,
    }
    print(f"{epochs} epochs on {device} in {seconds:.2f} s (weights on "
          f"{results['weights_device']}): loss {losses[0]:.4f} -> {losses[-1]:.4f} "
          f"(scikit-learn {skl.loss_curve_[-1]:.4f}, largest relative gap "
          f"{results['max_rel_diff']:.1e}); test R² {results['test_r2']:.4f} "
          f"(scikit-learn {results['sklearn_r2']:.4f})")
    curves, labels = [est, skl], [f"onnxtrain on {device}", "MLPRegressor"]
    if device != "cpu":
        cpu_est, cpu_seconds = train("cpu")
        results["cpu_losses"] = list(cpu_est.train_losses_)
        results["cpu_seconds"] = cpu_seconds
        print(f"same training on cpu in {cpu_seconds:.2f} s: loss "
              f"{cpu_est.train_losses_[-1]:.4f}")
        curves.append(cpu_est)
        labels.append("onnxtrain on cpu")

    pictures = {}

    def save(ax, name):
        figure = numpy.atleast_1d(ax)[0].figure
        pictures[name] = os.path.join(output_dir, name)
        figure.savefig(pictures[name], dpi=80, bbox_inches="tight")
        plt.close(figure)

    ax = plot_loss_curves(*curves, labels=labels, log_scale=True,
                          title=f"MLP 10-50-10-1 trained on {device}")
    ax.lines[1].set_linestyle("none")
    ax.lines[1].set_marker("o")
    ax.lines[1].set_markerfacecolor("none")
    ax.legend()
    save(ax, "loss_curves.png")
    engine = est.train_session_
    axes = plot_onnxs(engine.forward_model, engine.gradient_model,
                      weights=engine.weights_to_train,
                      title=["forward (saves intermediates)", "gradient"])
    results["node_counts"] = [len(engine.forward_model.graph.node),
                              len(engine.gradient_model.graph.node)]
    results["drawn_node_counts"] = [ax.onnx_node_count for ax in axes]
    save(axes, "forward_gradient.png")
    results["pictures"] = pictures
    return results


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "gpu_output")
