"""Logging estimators to MLflow (a local file store)."""
import pytest
from numpy.testing import assert_allclose

mlflow = pytest.importorskip("mlflow")
pytest.importorskip("mlflow.onnx")

from onnxtrain import OrtGradientForwardBackwardOptimizer  # noqa: E402
from onnxtrain.mlflow import MLflowLogger, log_model  # noqa: E402
from onnxtrain.optim import LearningRateSGD  # noqa: E402
from onnxtrain.training.callbacks import Callback  # noqa: E402


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    mlflow.set_tracking_uri((tmp_path / "mlruns").as_uri())
    yield mlflow.tracking.MlflowClient()
    mlflow.set_tracking_uri(None)


def _run(X, y, model, **kwargs):
    return OrtGradientForwardBackwardOptimizer(
        model, learning_rate=LearningRateSGD(0.01, learning_rate="constant"),
        max_iter=3, random_state=0, **kwargs).fit(X, y)


def test_log_model_logs_the_graph_parameters_and_history(store, mlp_onnx,
                                                         regression_data):
    import onnxruntime
    X, y = regression_data
    est = _run(X, y, mlp_onnx())
    info = log_model(est)
    run = store.get_run(info.run_id)
    assert run.data.params["max_iter"] == "3"
    assert run.data.params["model_onnx"].startswith("<ModelProto")
    history = store.get_metric_history(info.run_id, "train_loss")
    assert [m.step for m in history] == [1, 2, 3]
    assert_allclose([m.value for m in history], est.train_losses_, rtol=1e-12)
    loaded = mlflow.onnx.load_model(info.model_uri)
    session = onnxruntime.InferenceSession(loaded.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    assert_allclose(session.run(None, {"X": X})[0].ravel(), est.predict(X),
                    rtol=1e-6, atol=1e-6)
    assert mlflow.active_run() is None  # the run it started is ended


def test_mlflow_logger_callback_logs_during_fit(store, mlp_onnx, regression_data):
    X, y = regression_data
    logger = MLflowLogger()
    est = OrtGradientForwardBackwardOptimizer(
        mlp_onnx(), learning_rate=LearningRateSGD(0.01, learning_rate="constant"),
        max_iter=3, random_state=0, callbacks=[logger], validation_every=1)
    est.fit(X[:80], y[:80], X_val=X[80:], y_val=y[80:])
    valid = store.get_metric_history(logger.run_id_, "valid_loss")
    assert_allclose([m.value for m in valid], est.validation_losses_, rtol=1e-12)
    assert [m.step for m in valid] == [1, 2, 3]
    assert mlflow.active_run() is None
    assert logger.model_info_.run_id == logger.run_id_
    model = mlflow.onnx.load_model(logger.model_info_.model_uri)
    assert len(model.graph.node) == len(est.get_trained_onnx().graph.node)
    assert store.get_run(logger.run_id_).data.params["callbacks"] == "['MLflowLogger']"


def test_a_failed_fit_ends_the_loggers_run_as_failed(store, mlp_onnx, regression_data):
    """A divergence (exc=True) after on_train_begin: the run the logger
    started ends FAILED, and the next fit logs into a new run."""
    from onnxtrain.exceptions import ConvergenceError
    X, y = regression_data
    logger = MLflowLogger()
    est = OrtGradientForwardBackwardOptimizer(
        mlp_onnx(), learning_rate=LearningRateSGD(1e12, learning_rate="constant"),
        max_iter=3, random_state=0, callbacks=[logger])
    with pytest.raises(ConvergenceError):
        est.fit(X, y)
    failed = logger.run_id_
    assert mlflow.active_run() is None
    assert store.get_run(failed).info.status == "FAILED"
    est.set_params(learning_rate=LearningRateSGD(0.01, learning_rate="constant")).fit(X, y)
    assert logger.run_id_ != failed
    assert store.get_run(logger.run_id_).info.status == "FINISHED"


class _Boom(Callback):
    def __init__(self, hook=None):
        self.hook = hook

    def _maybe(self, hook):
        if self.hook == hook:
            raise RuntimeError(f"{hook} boom")

    def on_train_begin(self, estimator, X=None, y=None):
        self._maybe("on_train_begin")

    def on_epoch_end(self, estimator, record):
        self._maybe("on_epoch_end")

    def on_train_end(self, estimator, X=None, y=None):
        self._maybe("on_train_end")

    def on_train_error(self, estimator, error):
        self._maybe("on_train_error")


@pytest.mark.parametrize("hooks, first", [
    (["on_train_end"], True), (["on_train_begin"], False),
    (["on_epoch_end", "on_train_error"], True)])
def test_a_callback_raising_anywhere_ends_the_loggers_run(store, mlp_onnx,
                                                          regression_data, hooks, first):
    """Another callback raising in on_train_begin, on_train_end or
    on_epoch_end (then in on_train_error too): the logger's run ends
    FAILED and the error the user sees is the first one."""
    X, y = regression_data
    logger = MLflowLogger()
    booms = [_Boom(h) for h in hooks]
    callbacks = booms + [logger] if first else [logger] + booms
    est = OrtGradientForwardBackwardOptimizer(
        mlp_onnx(), learning_rate=LearningRateSGD(0.01, learning_rate="constant"),
        max_iter=2, random_state=0, callbacks=callbacks)
    with pytest.warns(RuntimeWarning) if "on_train_error" in hooks else _no_warning():
        with pytest.raises(RuntimeError, match=f"{hooks[0]} boom"):
            est.fit(X, y)
    assert mlflow.active_run() is None
    if hasattr(logger, "run_id_"):
        assert store.get_run(logger.run_id_).info.status == "FAILED"


def _no_warning():
    import contextlib
    return contextlib.nullcontext()


def test_log_model_refuses_an_unfitted_estimator(store, mlp_onnx):
    from sklearn.exceptions import NotFittedError
    with pytest.raises(NotFittedError):
        log_model(OrtGradientForwardBackwardOptimizer(mlp_onnx()))
    assert mlflow.active_run() is None
    experiment = store.get_experiment_by_name("Default")
    assert experiment is None or store.search_runs([experiment.experiment_id]) == []


def test_a_refused_local_store_says_what_to_set(tmp_path, monkeypatch, mlp_onnx,
                                                regression_data):
    """MLflow 3 refuses a file store without MLFLOW_ALLOW_FILE_STORE: the
    error names the variable and the alternatives; nothing is logged."""
    X, y = regression_data
    est = _run(X, y, mlp_onnx())
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    mlflow.set_tracking_uri((tmp_path / "mlruns").as_uri())
    try:
        with pytest.raises(mlflow.exceptions.MlflowException,
                           match="MLFLOW_ALLOW_FILE_STORE=true") as info:
            log_model(est)
        assert "set_tracking_uri('file:./mlruns')" in str(info.value)
        assert mlflow.active_run() is None
        monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
        assert log_model(est).model_uri  # what the message said works
    finally:
        mlflow.set_tracking_uri(None)


def test_the_default_store_without_sqlalchemy_says_what_to_set(
        tmp_path, monkeypatch, mlp_onnx, regression_data):
    """mlflow-skinny's default store (sqlite:///mlflow.db) needs SQLAlchemy,
    which it does not install: the error says what to set instead."""
    try:
        import sqlalchemy  # noqa: F401
        pytest.skip("SQLAlchemy is installed: the default store opens")
    except ImportError:
        pass
    X, y = regression_data
    est = _run(X, y, mlp_onnx())
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    mlflow.set_tracking_uri(None)
    with pytest.raises(mlflow.exceptions.MlflowException,
                       match="MLFLOW_ALLOW_FILE_STORE=true") as info:
        log_model(est)
    assert "set_tracking_uri('file:./mlruns')" in str(info.value)
