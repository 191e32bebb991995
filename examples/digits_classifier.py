"""Digits classification: an MLPClassifier graph trained by onnxtrain.
===================================================================

scikit-learn's ``MLPClassifier`` (64-32-10, relu, softmax) is converted to
ONNX with skl2onnx (``options={'zipmap': False}``: the graph returns the
label and a plain probability tensor). :class:`onnxtrain.
OrtGradientForwardBackwardClassifier` trains that graph on onnxruntime with
the cross-entropy loss (log-loss, as ``MLPClassifier``), starting from the
initial weights scikit-learn draws for the same ``random_state`` and using
the same batches: the two loss curves coincide and the test accuracies are
the same. The trained ONNX graph predicts the labels itself.

Run: ``python examples/digits_classifier.py [OUTPUT_DIR]``.
"""
import os
import sys
import warnings

import matplotlib
import numpy
import onnx
import onnxruntime
from sklearn.datasets import load_digits
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier

from onnxtrain import (LearningRateSGD, OrtGradientForwardBackwardClassifier,
                       to_onnx)
from onnxtrain.plotting import plot_loss_curves

HIDDEN = (32,)


def load_data():
    """Digits (8x8 images, 10 classes) scaled to [0, 1], 75 % / 25 % split."""
    X, y = load_digits(return_X_y=True)
    X = (X / 16.0).astype(numpy.float32)
    return train_test_split(X, y, test_size=0.25, random_state=0, stratify=y)


def main(output_dir=".", epochs=30, batch_size=32, learning_rate=0.1):
    """Train both ways, compare, draw ``loss_curves.png``.

    Returns a dict: ``onnxtrain_losses`` and ``sklearn_losses`` (per epoch),
    ``max_rel_diff`` (largest relative gap between them),
    ``onnxtrain_accuracy`` and ``sklearn_accuracy`` (test set),
    ``prediction_agreement`` (share of test rows both predict alike),
    ``onnx_accuracy`` (the trained ONNX graph run by a plain
    ``onnxruntime.InferenceSession``), ``pictures`` and ``model``.
    """
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(output_dir, exist_ok=True)
    X_train, X_test, y_train, y_test = load_data()

    skl = MLPClassifier(hidden_layer_sizes=HIDDEN, activation="relu",
                        solver="sgd", learning_rate="constant",
                        learning_rate_init=learning_rate, momentum=0.0,
                        nesterovs_momentum=False, alpha=0.0,
                        batch_size=batch_size, max_iter=epochs, shuffle=False,
                        tol=0.0, n_iter_no_change=epochs + 1, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        skl.fit(X_train, y_train)

    onx = to_onnx(skl, X_train[:1], options={"zipmap": False}, target_opset=15)
    est = OrtGradientForwardBackwardClassifier(
        onx, learning_rate=LearningRateSGD(eta0=learning_rate,
                                           learning_rate="constant"),
        max_iter=epochs, batch_size=batch_size, random_state=0,
        init="random")  # scikit-learn's initial weights, not its trained ones
    est.fit(X_train, y_train)

    ours, theirs = est.predict(X_test), skl.predict(X_test)
    results = {
        "onnxtrain_losses": list(map(float, est.train_losses_)),
        "sklearn_losses": list(map(float, skl.loss_curve_)),
        "onnxtrain_accuracy": float(est.score(X_test, y_test)),
        "sklearn_accuracy": float(skl.score(X_test, y_test)),
        "prediction_agreement": float((ours == theirs).mean()),
    }
    gap = numpy.abs(numpy.array(est.train_losses_) - skl.loss_curve_) / skl.loss_curve_
    results["max_rel_diff"] = float(gap.max())

    # The trained graph runs anywhere onnxruntime does.
    trained = est.get_trained_onnx()
    path = os.path.join(output_dir, "digits_mlp.onnx")
    onnx.save(trained, path)
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    labels, _ = session.run(None, {session.get_inputs()[0].name: X_test})
    results["onnx_accuracy"] = float((labels == y_test).mean())
    results["model"] = path
    print(f"log-loss after {epochs} epochs: onnxtrain "
          f"{results['onnxtrain_losses'][-1]:.5f}, scikit-learn "
          f"{results['sklearn_losses'][-1]:.5f} (largest relative gap "
          f"{results['max_rel_diff']:.1e})")
    print(f"test accuracy: onnxtrain {results['onnxtrain_accuracy']:.4f} "
          f"(trained ONNX graph {results['onnx_accuracy']:.4f}), scikit-learn "
          f"{results['sklearn_accuracy']:.4f}; same prediction on "
          f"{100 * results['prediction_agreement']:.1f} % of the test rows")

    ax = plot_loss_curves(est, skl, labels=["onnxtrain", "MLPClassifier"],
                          log_scale=True,
                          title="digits, MLP 64-32-10: log-loss per epoch")
    line = ax.lines[1]
    line.set_linestyle("none")
    line.set_marker("o")
    line.set_markerfacecolor("none")
    ax.legend()
    results["pictures"] = {"loss_curves.png": os.path.join(output_dir, "loss_curves.png")}
    ax.figure.savefig(results["pictures"]["loss_curves.png"], dpi=80,
                      bbox_inches="tight")
    plt.close(ax.figure)
    return results


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "digits_output")
