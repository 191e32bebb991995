"""One owner per fit (issue 33): the estimators delegate each fit to a
plain :class:`~onnxtrain.training.run.TrainingRun`, which is not an
estimator and never reaches into an estimator's private attributes; no
class of the estimators, the training loop or the MLPs has more than 25
methods."""
import ast
import inspect
import os
import pathlib
import pickle
import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

import onnxtrain
from onnxtrain import OrtGradientForwardBackwardOptimizer
from onnxtrain.neural_network import MLPRegressor
from onnxtrain.neural_network import _loop as mlp_loop
from onnxtrain.training import run as run_module
from onnxtrain.training.run import TrainingRun

PACKAGE = pathlib.Path(os.path.dirname(onnxtrain.__file__))
FOLDERS = ("estimators", "training", "neural_network")
MAX_METHODS = 25


def _classes():
    for folder in FOLDERS:
        for path in sorted((PACKAGE / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    methods = [b.name for b in node.body
                               if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef))]
                    yield f"{folder}/{path.name}:{node.name}", methods


def test_no_class_has_more_than_25_methods():
    counts = dict((name, len(methods)) for name, methods in _classes())
    assert counts, "no class found"
    assert {n: c for n, c in counts.items() if c > MAX_METHODS} == {}


@pytest.mark.parametrize("cls", [TrainingRun, mlp_loop.MLPEpochLoop])
def test_the_owner_is_not_an_estimator(cls):
    assert not hasattr(cls, "get_params") and not hasattr(cls, "set_params")
    assert not hasattr(cls, "fit")


@pytest.mark.parametrize("module", [run_module, mlp_loop])
def test_the_loop_does_not_reach_into_the_estimator(module):
    """No ``estimator._x`` / ``est._x`` in the owner's modules: the run
    reads the estimator's parameters from its settings and calls back
    only through the hooks it is given for one fit_loop."""
    tree = ast.parse(inspect.getsource(module))
    reached = [f"{node.value.id}.{node.attr} (line {node.lineno})"
               for node in ast.walk(tree)
               if isinstance(node, ast.Attribute) and node.attr.startswith("_")
               and isinstance(node.value, ast.Name)
               and node.value.id in ("estimator", "est", "owner", "target")]
    assert reached == []


def test_estimators_publish_the_run(mlp_onnx, regression_data):
    """The fitted attributes are the run's; a pickled estimator carries its
    run without sessions, which it rebuilds."""
    X, y = regression_data
    est = OrtGradientForwardBackwardOptimizer(mlp_onnx(), max_iter=3, random_state=0)
    assert not hasattr(est, "train_losses_") and not hasattr(est, "n_iter_")
    est.fit(X, y)
    run = est._run
    assert isinstance(run, TrainingRun)
    assert est.train_losses_ is run.train_losses and est.n_iter_ == run.n_iter == 3
    assert est.history_ is run.history and est.learning_rate_ is run.update_rule
    assert est._trainer is run.runner
    copy = pickle.loads(pickle.dumps(est))
    assert copy._run.runner is None and copy.train_losses_ == est.train_losses_
    np.testing.assert_array_equal(copy.predict(X), est.predict(X))
    assert copy._run.runner is not None


def test_the_run_holds_no_estimator(mlp_onnx, regression_data):
    """The hooks reaching back to the estimator last one fit_loop: no
    owner <-> estimator cycle."""
    X, y = regression_data
    est = OrtGradientForwardBackwardOptimizer(mlp_onnx(), max_iter=2).fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        mlp = MLPRegressor(hidden_layer_sizes=(3,), max_iter=2, random_state=0).fit(X, y)
    for estimator in (est, mlp):
        run = estimator._run
        assert run.hooks is None
        assert all(value is not estimator for value in vars(run).values())
