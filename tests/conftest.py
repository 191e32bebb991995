"""Fixtures shared by the engine, small-graph and estimator tests.

Graphs come from skl2onnx conversions of scikit-learn MLPs: the graph's
topology depends only on the architecture, so the conversions fit
scikit-learn for one epoch and are cached for the whole session.
"""
import pathlib
import sys
import warnings

import numpy as np
import pytest
from onnx import numpy_helper
from sklearn.exceptions import ConvergenceWarning
from sklearn.neural_network import MLPRegressor

from onnxtrain import to_onnx

#: The tests mirror onnxtrain's folders (tests/graph, tests/autodiff...) and
#: import their helpers (gradcheck, op_corpus...) and each other by plain
#: module name: every folder of tests/ is on sys.path.
_TESTS = pathlib.Path(__file__).resolve().parent
for _folder in [_TESTS] + sorted(p for p in _TESTS.iterdir()
                                 if p.is_dir() and (p.name[0].isalpha() or p.name == "_utils")):
    if str(_folder) not in sys.path:
        sys.path.append(str(_folder))

#: scikit-learn MLP settings under which onnxtrain's SGD must match it step
#: for step (plain SGD, constant learning rate, rows in order, no penalty,
#: no early stop).
SGD_PARITY = dict(solver="sgd", learning_rate="constant", learning_rate_init=0.01,
                  momentum=0.0, nesterovs_momentum=False, alpha=0.0,
                  shuffle=False, n_iter_no_change=10 ** 6, tol=0.0,
                  random_state=0)


@pytest.fixture(scope="session")
def sgd_mlp():
    """Factory: an unfitted ``MLPRegressor`` with :data:`SGD_PARITY` settings
    (keywords override them)."""
    def make(**kwargs):
        return MLPRegressor(**{**SGD_PARITY, **kwargs})
    return make


@pytest.fixture(scope="session")
def mlp_onnx():
    """Factory: the ONNX graph of an ``MLPRegressor`` (cached).

    ``mlp_onnx(hidden=(8,), activation="relu", n_features=5, n_outputs=1,
    dtype=np.float32)`` returns a ModelProto whose input is ``X`` of shape
    (None, n_features) and ``dtype``; callers must not modify it. Its
    initializers come from ``random_state=1234``, so they differ from the
    weights the estimators draw with small seeds (warm_start=False).
    """
    cache = {}

    def make(hidden=(8,), activation="relu", n_features=5, n_outputs=1,
             dtype=np.float32):
        key = (tuple(hidden), activation, n_features, n_outputs, np.dtype(dtype).name)
        if key not in cache:
            rng = np.random.RandomState(1)
            X = rng.randn(20, n_features).astype(dtype)
            y = rng.randn(20, n_outputs).astype(dtype)
            if n_outputs == 1:
                y = y.ravel()
            skl = MLPRegressor(hidden_layer_sizes=tuple(hidden), activation=activation,
                               solver="sgd", max_iter=1, random_state=1234)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                skl.fit(X, y)
            model = to_onnx(skl, X[:1], target_opset=15)
            if n_outputs > 1:
                _fix_multi_output(model, n_outputs)
            cache[key] = model
        return cache[key]
    return make


def _fix_multi_output(model, n_outputs):
    """skl2onnx (1.20) ends an MLPRegressor graph with Reshape(., [-1, 1])
    whatever the number of outputs, which turns (n, k) predictions into
    (n * k, 1): reshape to [-1, k] instead."""
    shape = next(i for i in model.graph.initializer if i.name == "shape_tensor")
    shape.CopyFrom(numpy_helper.from_array(np.array([-1, n_outputs], dtype=np.int64),
                                           "shape_tensor"))
    dims = model.graph.output[0].type.tensor_type.shape.dim
    dims[1].dim_value = n_outputs


@pytest.fixture(scope="session")
def regression_data():
    """105 rows x 5 features (batches of 10 leave a last batch of 5), float32,
    a slightly non-linear target."""
    rng = np.random.RandomState(0)
    X = rng.randn(105, 5).astype(np.float32)
    y = (X @ rng.randn(5) + 0.5 * np.sin(2 * X[:, 0]) + 0.3).astype(np.float32)
    return X, y
