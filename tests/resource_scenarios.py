"""Workloads for the resource tests (tests/test_reliability_resources.py):
each builds onnxtrain objects, trains, predicts and drops them. Imported by
the tests, and run as a script in a subprocess to count a process's threads,
resident memory and open files over many repetitions:

    python tests/resource_scenarios.py KIND N_REPEATS

prints one JSON line {"before": {...}, "after": {...}} measured after a
warm-up and after N_REPEATS more runs of the workload KIND.
"""
import json
import os
import pickle
import sys
import tempfile
import warnings

import numpy as np
import psutil

from linear_models import linear_model
from onnxtrain import (LearningRateSGD, OrtGradientForwardBackward,
                       OrtGradientForwardBackwardClassifier,
                       OrtGradientForwardBackwardOptimizer, OrtGradientOptimizer,
                       add_loss_output, api, artifacts)
from onnxtrain.neural_network import MLPClassifier, MLPRegressor

#: Two threads per session: onnxruntime then starts a pool thread for each
#: session, so that a session kept alive shows in the thread count even on
#: a one- or two-core machine.
THREADS = 2
_RNG = np.random.RandomState(0)
X = _RNG.randn(20, 3).astype(np.float32)
Y = (X @ np.array([1.0, -2.0, 0.5], dtype=np.float32) + 0.3).astype(np.float32)
LABELS = np.digitize(Y, [-1.0, 1.0]).astype(np.int64)


REGRESSION = linear_model(3)
SOFTMAX = linear_model(3, 3, softmax=True)
WITH_LOSS = add_loss_output(REGRESSION)
_ARTIFACTS = None


def _artifacts():
    global _ARTIFACTS
    if _ARTIFACTS is None:
        _ARTIFACTS = tempfile.mkdtemp(prefix="onnxtrain-resources-")
        artifacts.generate_artifacts(
            REGRESSION, requires_grad=["W", "B"], loss=artifacts.LossType.MSELoss,
            optimizer=artifacts.OptimType.AdamW, artifact_directory=_ARTIFACTS)
    return _ARTIFACTS


def _regressor(path):
    return OrtGradientForwardBackwardOptimizer(
        REGRESSION, max_iter=1, batch_size=10, training_path=path,
        learning_rate=LearningRateSGD(0.001), n_threads=THREADS)


def split():
    _regressor("split").fit(X, Y).predict(X)


def fused():
    _regressor("fused").fit(X, Y).predict(X)


def loop():
    _regressor("loop").fit(X, Y).predict(X)


def refit():
    est = _regressor("auto")
    est.fit(X, Y)
    est.set_params(training_path="split").fit(X, Y)
    est.partial_fit(X, Y)
    est.predict(X)


def classifier():
    OrtGradientForwardBackwardClassifier(
        SOFTMAX, max_iter=1, batch_size=10, n_threads=THREADS).fit(X, LABELS).predict_proba(X)


def loss_output():
    OrtGradientOptimizer(WITH_LOSS, max_iter=1, batch_size=10, n_threads=THREADS,
                         learning_rate=LearningRateSGD(0.001)).fit(X, Y)


def engine():
    eng = OrtGradientForwardBackward(REGRESSION, ["W", "B"])
    out = eng.forward([X], training=True)
    eng.backward([np.ones_like(out[0])])


def mlp_regressor():
    MLPRegressor(hidden_layer_sizes=(3,), max_iter=1, n_threads=THREADS).fit(X, Y).predict(X)


def mlp_classifier():
    MLPClassifier(hidden_layer_sizes=(3,), max_iter=1,
                  n_threads=THREADS).fit(X, LABELS).predict_proba(X)


def pickled():
    est = MLPRegressor(hidden_layer_sizes=(3,), max_iter=1, n_threads=THREADS).fit(X, Y)
    pickle.loads(pickle.dumps(est)).predict(X)


def api_training():
    folder = _artifacts()
    state = api.CheckpointState.load_checkpoint(os.path.join(folder, "checkpoint"))
    module = api.Module(os.path.join(folder, "training_model.onnx"), state,
                        os.path.join(folder, "eval_model.onnx"))
    optimizer = api.Optimizer(os.path.join(folder, "optimizer_model.onnx"), module)
    module.train()
    module(X, Y[:, None])
    optimizer.step()
    module.eval()
    module(X, Y[:, None])


SCENARIOS = {f.__name__: f for f in (split, fused, loop, refit, classifier, loss_output,
                                     engine, mlp_regressor, mlp_classifier, pickled,
                                     api_training)}


def usage():
    process = psutil.Process()
    return {"threads": process.num_threads(), "rss": process.memory_info().rss,
            "fds": process.num_fds()}


def main(kind, repeats, warmup=30):
    warnings.simplefilter("ignore")
    scenario = SCENARIOS[kind]
    for _ in range(warmup):
        scenario()
    before = usage()
    for _ in range(repeats):
        scenario()
    print(json.dumps({"before": before, "after": usage()}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
