"""n_threads: the intra-op threads of the sessions, joblib's budget by
default inside joblib worker processes."""
import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning

from onnxtrain import OrtGradientForwardBackwardOptimizer
from onnxtrain.estimators import OrtGradientForwardBackwardClassifier
from onnxtrain.neural_network import MLPClassifier, MLPRegressor
from onnxtrain.runtime.fused import SMALL_STEP_FLOPS
from onnxtrain.runtime.sessions import default_session_options
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
    assert _threads(mlp._run.runner.engine._forward) == 3


def _fused_threads(trainer):
    """Intra-op threads of each fused runner (step or loop graph) the trainer
    built, by runner key."""
    return {key[1]: _threads(runner) for key, runner in trainer._fused.items()
            if key[0] == "runner"}


@pytest.mark.parametrize("path,kind", [("fused", "step"), ("loop", "epochs")])
def test_explicit_n_threads_wins_over_the_small_step_rule(mlp_onnx, regression_data,
                                                          path, kind):
    """A step this small runs on one thread by default, but an explicit
    n_threads is what the fused and loop sessions get."""
    X, y = regression_data
    est = OrtGradientForwardBackwardOptimizer(mlp_onnx(), max_iter=1, n_threads=3,
                                              training_path=path).fit(X, y)
    assert est._trainer.flops_per_step(est.batch_size) < SMALL_STEP_FLOPS
    assert _fused_threads(est._trainer) == {kind: 3}
    # the rule itself is kept for n_threads=None
    est = OrtGradientForwardBackwardOptimizer(mlp_onnx(), max_iter=1,
                                              training_path=path).fit(X, y)
    assert _fused_threads(est._trainer) == {kind: 1}


def _softmax_model(n_features, n_classes):
    """X (N, n_features) -> Softmax(X @ W + B)."""
    from onnx import TensorProto, helper, numpy_helper
    inits = [numpy_helper.from_array(
                 np.full((n_features, n_classes), 0.1, dtype=np.float32), "W"),
             numpy_helper.from_array(np.zeros(n_classes, dtype=np.float32), "B")]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["XW"]),
         helper.make_node("Add", ["XW", "B"], ["Z"]),
         helper.make_node("Softmax", ["Z"], ["Y"], axis=1)], "softmax",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, n_features])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, n_classes])],
        inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_explicit_n_threads_in_classifiers(regression_data):
    X, target = regression_data
    y = np.where(target > np.median(target), "high", "low")
    clf = OrtGradientForwardBackwardClassifier(_softmax_model(5, 2), max_iter=1,
                                               n_threads=3,
                                               training_path="fused").fit(X, y)
    assert _fused_threads(clf._trainer) == {"step": 3}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        mlp = MLPClassifier(hidden_layer_sizes=(3,), max_iter=1, n_threads=3,
                            random_state=0).fit(X, y)
    runners = _fused_threads(mlp._run.runner)
    assert runners and set(runners.values()) == {3}, runners


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
    eval_module = Module(str(tmp_path / "training_model.onnx"), state,
                         str(tmp_path / "eval_model.onnx"), n_threads=3)
    eval_module.eval()(X, np.zeros((4, 2), dtype=np.float32))
    assert _threads(eval_module._runners["eval"]) == 3
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


def _spinning(runner):
    options = runner.session.get_session_options()
    return (options.get_session_config_entry("session.intra_op.allow_spinning"),
            options.get_session_config_entry("session.force_spinning_stop"))


def test_sessions_spin_within_a_run_and_stop_after_it(mlp_onnx, regression_data):
    from onnxtrain.runtime.sessions import SPIN_MIN_NODES, _node_count
    X, y = regression_data
    est = OrtGradientForwardBackwardOptimizer(mlp_onnx(), max_iter=1, n_threads=2,
                                              training_path="fused").fit(X, y)
    (runner,) = [r for key, r in est._trainer._fused.items() if key[0] == "runner"]
    assert _node_count(runner.step.model.graph) >= SPIN_MIN_NODES
    # between the kernels of a training step the threads spin; the spin
    # stops when the run returns (no core burnt between two steps)
    assert _spinning(runner) == ("1", "1")
    # a graph of a few nodes (the MLP's forward) does not spin: stopping the
    # spin would cost more than it saves
    split = OrtGradientForwardBackwardOptimizer(mlp_onnx(), max_iter=1, n_threads=2,
                                                training_path="split").fit(X, y)
    forward = split._trainer.engine._forward
    assert _node_count(split._trainer.engine.models.forward_model.graph) < SPIN_MIN_NODES
    assert _spinning(forward) == ("0", "1")
    options = default_session_options(2, spinning=False)
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert options.intra_op_num_threads == 2
    # no memory pattern: its block came on top of the arena's (sessions.py)
    assert options.enable_mem_pattern is False


def test_spinning_can_be_turned_off(mlp_onnx, regression_data, monkeypatch):
    from onnxtrain.runtime import session_spinning

    def spin():
        return default_session_options(2).get_session_config_entry(
            "session.intra_op.allow_spinning")

    assert spin() == "1"
    with session_spinning(False):
        assert spin() == "0"
        X, y = regression_data
        est = OrtGradientForwardBackwardOptimizer(
            mlp_onnx(), max_iter=1, n_threads=2, training_path="fused").fit(X, y)
        (runner,) = [r for key, r in est._trainer._fused.items() if key[0] == "runner"]
        assert _spinning(runner) == ("0", "1")
        with session_spinning(True):
            assert spin() == "1"
    assert spin() == "1"
    for value, expected in [("0", "0"), ("off", "0"), ("1", "1"), ("", "1")]:
        monkeypatch.setenv("ONNXTRAIN_SPINNING", value)
        assert spin() == expected, value
    with session_spinning(True):  # the block wins over the environment
        monkeypatch.setenv("ONNXTRAIN_SPINNING", "0")
        assert spin() == "1"
