"""Count the graph-building work of one ``fit`` (split, fused and loop
paths) and of one ``generate_artifacts``: reverse passes
(:func:`onnxtrain.autodiff.backward`), shape inferences
(``onnx.shape_inference.infer_shapes``), rewrites of the running
statistics (:func:`onnxtrain.graph.training_mode.with_running_statistics_updates`),
loss-graph builds
(``BaseLearningLoss.build_onnx`` and onnxblock loss blocks), onnxruntime
sessions created and, of them, those that ran.

Run: ``python benchmarks/count_build_work.py``; prints one table row per
case. :func:`count_build_work` is what ``tests/assembly/test_build_counts.py`` pins.
"""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import warnings

import numpy as np

__all__ = ["count_build_work", "counting", "CASES"]

CASES = ("split", "fused", "loop", "classifier-split", "classifier-loop",
         "batchnorm-split", "batchnorm-fused", "batchnorm-loop", "artifacts",
         "batchnorm-artifacts")


def _replace_everywhere(original, replacement):
    """Point every ``onnxtrain`` module attribute bound to ``original`` to
    ``replacement`` (functions imported by name); returns the undo list."""
    undo = []
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith("onnxtrain"):
            continue
        for attr, value in list(vars(module).items()):
            if value is original:
                setattr(module, attr, replacement)
                undo.append((module, attr, original))
    return undo


@contextlib.contextmanager
def counting():
    """Context manager yielding the dict of counts, updated while it is
    open."""
    import onnx.shape_inference
    import onnxruntime
    import importlib
    backward_module = importlib.import_module("onnxtrain.autodiff.backward")
    training_mode = importlib.import_module("onnxtrain.graph.training_mode")
    from onnxtrain.losses import BaseLearningLoss
    from onnxtrain.onnxblock import loss as block_loss
    from onnxtrain.runtime.opsets import CHECKED_DOMAINS, highest_opset

    # the opset probe's sessions are built once per process, not per fit
    for domain in CHECKED_DOMAINS:
        highest_opset(domain)

    counts = {"reverse passes": 0, "shape inferences": 0,
              "statistics rewrites": 0, "loss-graph builds": 0, "sessions": 0,
              "sessions run": 0}

    def counted(key, func):
        def wrapper(*args, **kwargs):
            counts[key] += 1
            return func(*args, **kwargs)
        return wrapper

    real_session = onnxruntime.InferenceSession

    class CountingSession(real_session):
        def __init__(self, *args, **kwargs):
            counts["sessions"] += 1
            self._ran = False
            super().__init__(*args, **kwargs)

        def _mark(self):
            if not self._ran:
                self._ran = True
                counts["sessions run"] += 1

        def run(self, *args, **kwargs):
            self._mark()
            return super().run(*args, **kwargs)

        def run_with_iobinding(self, *args, **kwargs):
            self._mark()
            return super().run_with_iobinding(*args, **kwargs)

    undo = []
    real_backward = backward_module.backward
    undo += _replace_everywhere(real_backward, counted("reverse passes",
                                                       real_backward))
    real_rewrite = training_mode.with_running_statistics_updates
    undo += _replace_everywhere(real_rewrite, counted("statistics rewrites",
                                                      real_rewrite))
    real_infer = onnx.shape_inference.infer_shapes
    onnx.shape_inference.infer_shapes = counted("shape inferences", real_infer)
    real_build = BaseLearningLoss.build_onnx
    BaseLearningLoss.build_onnx = counted("loss-graph builds", real_build)
    block_builds = []
    for cls in vars(block_loss).values():
        if isinstance(cls, type) and "build" in vars(cls) and \
                cls.__module__ == block_loss.__name__:
            block_builds.append((cls, cls.build))
            cls.build = counted("loss-graph builds", cls.build)
    onnxruntime.InferenceSession = CountingSession
    try:
        yield counts
    finally:
        onnxruntime.InferenceSession = real_session
        for cls, build in block_builds:
            cls.build = build
        BaseLearningLoss.build_onnx = real_build
        onnx.shape_inference.infer_shapes = real_infer
        for module, attr, value in undo:
            setattr(module, attr, value)


def _data():
    rng = np.random.RandomState(0)
    X = rng.randn(64, 4).astype(np.float32)
    y = (X @ rng.randn(4)).astype(np.float32)
    return X, y


def _mlp_model(X, y):
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPRegressor

    from onnxtrain import to_onnx
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        skl = MLPRegressor(hidden_layer_sizes=(6,), max_iter=1,
                           random_state=0).fit(X, y)
    return to_onnx(skl, X[:1])


def _classifier_model(X, y):
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier

    from onnxtrain import to_onnx
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        skl = MLPClassifier(hidden_layer_sizes=(6,), max_iter=1,
                            random_state=0).fit(X, y)
    return to_onnx(skl, X[:1], options={"zipmap": False})


def _batchnorm_model():
    """X (N, 1, 4, 4) -> Conv 3x3 (4 channels) -> BatchNormalization in
    training mode -> Relu -> (N, 64) -> MatMul -> Y (N, 1)."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.RandomState(0)
    channels = 4
    inits = [numpy_helper.from_array(value, name) for name, value in [
        ("W", (0.3 * rng.randn(channels, 1, 3, 3)).astype(np.float32)),
        ("scale", np.ones(channels, np.float32)),
        ("bias", np.zeros(channels, np.float32)),
        ("mean", np.zeros(channels, np.float32)),
        ("var", np.ones(channels, np.float32)),
        ("W2", (0.1 * rng.randn(channels * 16, 1)).astype(np.float32)),
        ("shape", np.array([0, channels * 16], np.int64))]]
    nodes = [
        helper.make_node("Conv", ["X", "W"], ["conv"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["conv", "scale", "bias", "mean", "var"],
                         ["bn", "bn_mean", "bn_var"], training_mode=1, momentum=0.9),
        helper.make_node("Relu", ["bn"], ["relu"]),
        helper.make_node("Reshape", ["relu", "shape"], ["flat"]),
        helper.make_node("MatMul", ["flat", "W2"], ["Y"])]
    graph = helper.make_graph(
        nodes, "cnn", [helper.make_tensor_value_info("X", TensorProto.FLOAT,
                                                     [None, 1, 4, 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 1])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def count_build_work(case):
    """The counts of one ``case`` (see :data:`CASES`) as a dict."""
    from onnxtrain import (OrtGradientForwardBackwardClassifier,
                           OrtGradientForwardBackwardOptimizer)
    from onnxtrain.artifacts import LossType, OptimType, generate_artifacts
    from onnxtrain.autodiff import trainable_initializers

    X, y = _data()
    model = _mlp_model(X, y)
    if case.startswith("batchnorm-"):
        case = case.split("-")[1]
        model = _batchnorm_model()
        X = np.random.RandomState(1).randn(64, 1, 4, 4).astype(np.float32)
        y = X.reshape(64, -1)[:, :3].sum(axis=1).astype(np.float32)
    if case == "artifacts":
        trainable = trainable_initializers(model)
        with tempfile.TemporaryDirectory() as folder, counting() as counts:
            generate_artifacts(model, requires_grad=trainable,
                               loss=LossType.MSELoss,
                               optimizer=OptimType.AdamW,
                               artifact_directory=folder)
        return counts
    if case.startswith("classifier-"):
        case = case.split("-")[1]
        y = (y > 0).astype(int) + (y > 1)
        est = OrtGradientForwardBackwardClassifier(
            _classifier_model(X, y), max_iter=3, learning_rate=0.01,
            training_path=case)
    else:
        est = OrtGradientForwardBackwardOptimizer(
            model, max_iter=3, learning_rate=0.01, training_path=case,
            random_state=0)
    with counting() as counts:
        est.fit(X, y)
    assert est.training_path_ == case
    return counts


def main():
    keys = ["reverse passes", "shape inferences", "statistics rewrites",
            "loss-graph builds", "sessions", "sessions run"]
    print("| case | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for case in CASES:
        counts = count_build_work(case)
        print(f"| {case} | " + " | ".join(str(counts[k]) for k in keys) + " |")


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main()
