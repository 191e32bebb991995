"""n_threads: the intra-op threads of the sessions, joblib's budget by
default inside joblib worker processes."""
import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

from onnxtrain import OrtGradientForwardBackwardOptimizer
from onnxtrain.neural_network import MLPRegressor
from onnxtrain.runtime.threads import (current_session_threads, joblib_thread_budget,
                                       session_threads)


def _threads(runner):
    return runner.session.get_session_options().intra_op_num_threads


def _fitted_threads(model, X, y, n_threads):
    est = OrtGradientForwardBackwardOptimizer(model, max_iter=1, n_threads=n_threads,
                                              training_path="split").fit(X, y)
    return _threads(est._trainer.engine._forward), _threads(est._trainer.update)


def test_n_threads_sets_every_session(mlp_onnx, regression_data):
    X, y = regression_data
    assert _fitted_threads(mlp_onnx(), X, y, 2) == (2, 2)
    # None outside joblib: onnxruntime's default (0 = every core)
    assert _fitted_threads(mlp_onnx(), X, y, None) == (0, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        mlp = MLPRegressor(hidden_layer_sizes=(3,), max_iter=1, n_threads=3).fit(X, y)
    assert _threads(mlp._loop._trainer.engine._forward) == 3


def test_session_threads_block():
    assert current_session_threads() is None and joblib_thread_budget() is None
    with session_threads(2):
        assert current_session_threads() == 2
        with session_threads(None):  # None inside: joblib's budget or default
            assert current_session_threads() is None
    with pytest.raises(ValueError, match="n_threads must be None or an int >= 1"):
        with session_threads(0):
            pass


def test_joblib_workers_default_to_their_thread_budget(mlp_onnx, regression_data,
                                                      monkeypatch):
    """In a joblib worker process joblib sets OMP_NUM_THREADS to its budget
    (``cpu_count() // n_jobs`` or ``inner_max_num_threads``): the sessions
    take it when n_threads is None; an explicit n_threads wins. (Simulated:
    starting loky workers takes seconds; benchmarks/bench_gridsearch.py
    reads the threads in real workers.)"""
    import multiprocessing
    X, y = regression_data
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert joblib_thread_budget() is None  # the main process: no budget
    monkeypatch.setattr(multiprocessing, "parent_process", lambda: object())
    assert joblib_thread_budget() == 3
    assert _fitted_threads(mlp_onnx(), X, y, None) == (3, 3)
    assert _fitted_threads(mlp_onnx(), X, y, 1) == (1, 1)
    monkeypatch.setenv("OMP_NUM_THREADS", "")  # not joblib's: no budget
    assert _fitted_threads(mlp_onnx(), X, y, None) == (0, 0)


def test_module_n_threads(tmp_path):
    from onnxtrain.api import CheckpointState, Module
    from onnxtrain.artifacts import LossType, generate_artifacts
    from onnx import TensorProto, helper, numpy_helper
    W = numpy_helper.from_array(np.ones((3, 2), dtype=np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"])], "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 2])], [W])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    generate_artifacts(model, ["W"], loss=LossType.MSELoss, artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    module = Module(str(tmp_path / "training_model.onnx"), state, n_threads=2)
    X = np.ones((4, 3), dtype=np.float32)
    module(X, np.zeros((4, 2), dtype=np.float32))  # the plain step (no accumulation)
    assert _threads(module._runners["train_plain"]) == 2
    # a second call adds to the gradients: the accumulating step
    module(X, np.zeros((4, 2), dtype=np.float32))
    assert _threads(module._runners["train"]) == 2
    with pytest.raises(ValueError, match="n_threads"):
        Module(str(tmp_path / "training_model.onnx"), state, n_threads=-1)


def test_unpickled_estimator_rebuilds_its_sessions_with_n_threads(mlp_onnx,
                                                                  regression_data):
    import pickle
    X, y = regression_data
    est = OrtGradientForwardBackwardOptimizer(mlp_onnx(), max_iter=1, n_threads=2,
                                              training_path="split").fit(X, y)
    copy = pickle.loads(pickle.dumps(est))
    weights = copy.get_state()  # rebuilds the trainer
    assert _threads(copy._trainer.engine._forward) == 2
    np.testing.assert_array_equal(weights[0], est.get_state()[0])
