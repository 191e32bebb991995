"""Log onnxtrain estimators to MLflow: the trained ONNX graph (MLflow's
``onnx`` flavor), the parameters and the per-epoch ``history_``.

Requires ``pip install onnxtrain[mlflow]`` (``mlflow-skinny`` is enough).
MLflow 3 refuses a local file store unless the environment variable
``MLFLOW_ALLOW_FILE_STORE=true`` is set, and its default store (SQLite)
needs the full ``mlflow`` package: a refused store raises an error saying
what to set.

- :func:`log_model` logs a fitted estimator to the active run (or a new
  one);
- :class:`MLflowLogger`, a callback, logs the metrics of every epoch while
  ``fit`` runs, then the model and the parameters at the end.

MLflow's ``mlflow.sklearn.autolog`` does not see onnxtrain's estimators as
models it knows how to save; these functions do it explicitly.
"""
from __future__ import annotations

import inspect
import numbers

from ..training.callbacks import Callback

__all__ = ["log_model", "log_params", "log_history", "MLflowLogger"]


def _mlflow():
    try:
        import mlflow
        import mlflow.onnx  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError("onnxtrain.mlflow needs MLflow: pip install "
                          "onnxtrain[mlflow] (or mlflow-skinny).") from exc
    return mlflow


def _start_run(mlflow):
    """``mlflow.start_run()``, a store MLflow refuses named with what to set.

    Raises
    ------
    mlflow.exceptions.MlflowException
        MLflow 3 refuses its local file store (``file:`` URIs, ``./mlruns``)
        unless ``MLFLOW_ALLOW_FILE_STORE=true``, and its default store
        (``sqlite:///mlflow.db``) needs SQLAlchemy, which mlflow-skinny does
        not install: the message says both.
    """
    try:
        return mlflow.start_run()
    except Exception as exc:
        text = str(exc)
        if "MLFLOW_ALLOW_FILE_STORE" not in text and "sqlite" not in text:
            raise
        uri = mlflow.get_tracking_uri()
        raise mlflow.exceptions.MlflowException(
            f"MLflow cannot open its tracking store {uri!r}. For a local "
            "store, set the environment variable MLFLOW_ALLOW_FILE_STORE=true "
            "(os.environ['MLFLOW_ALLOW_FILE_STORE'] = 'true' before logging) "
            "with a file URI (mlflow.set_tracking_uri('file:./mlruns')); or "
            "install the full mlflow package (SQLAlchemy) for its default "
            "'sqlite:///mlflow.db'; or set MLFLOW_TRACKING_URI to a tracking "
            f"server. MLflow said: {text}") from exc


def _trained_onnx(estimator):
    export = getattr(estimator, "get_trained_onnx", None) or getattr(
        estimator, "to_onnx", None)
    if export is None:
        raise TypeError(f"{type(estimator).__name__} is not an onnxtrain estimator "
                        "(no get_trained_onnx or to_onnx).")
    return export()


def _requirements():
    """The installed onnx and onnxruntime (or onnxruntime-gpu) versions."""
    from importlib.metadata import PackageNotFoundError, version
    import onnx
    found = [f"onnx=={onnx.__version__}"]
    for name in ("onnxruntime", "onnxruntime-gpu"):
        try:
            return found + [f"{name}=={version(name)}"]
        except PackageNotFoundError:
            continue
    return found + ["onnxruntime"]


def _param_value(value):
    """A parameter as MLflow stores it (a str): graphs summarized."""
    if hasattr(value, "graph"):
        return f"<ModelProto {value.graph.name!r}: {len(value.graph.node)} nodes>"
    return repr(value) if not isinstance(value, str) else value


def log_params(estimator):
    """Log ``estimator.get_params(deep=False)`` to the active run (the
    graph summarized, callbacks by class name); returns the dict logged."""
    mlflow = _mlflow()
    params = {}
    for name, value in estimator.get_params(deep=False).items():
        if name == "callbacks" and value:
            value = [type(c).__name__ for c in value]
        params[name] = _param_value(value)[:6000]
    mlflow.log_params(params)
    return params


def log_history(estimator, records=None):
    """Log the numeric values of each ``history_`` record (train_loss,
    valid_loss, learning_rate, dur, scores...) as metrics at step
    ``epoch``; returns the number of records logged."""
    mlflow = _mlflow()
    records = estimator.history_ if records is None else records
    for record in records:
        metrics = {k: float(v) for k, v in record.items()
                   if k != "epoch" and isinstance(v, numbers.Real)
                   and not isinstance(v, bool)}
        mlflow.log_metrics(metrics, step=int(record["epoch"]))
    return len(records)


def log_model(estimator, name="model", *, params=True, history=True,
              registered_model_name=None, pip_requirements=None):
    """Log a fitted estimator to the active MLflow run (a new run if none).

    Parameters
    ----------
    estimator : fitted onnxtrain estimator
        :class:`~onnxtrain.OrtGradientForwardBackwardOptimizer` and the
        other forward/backward estimators (``get_trained_onnx()``), or the
        MLPs (``to_onnx()``).
    name : str, default='model'
        Name of the logged model (MLflow's ``name``, ``artifact_path``
        before MLflow 3).
    params : bool, default=True
        Also log the parameters (:func:`log_params`).
    history : bool, default=True
        Also log ``history_`` (:func:`log_history`).
    registered_model_name : str, default=None
        Register the model under this name.
    pip_requirements : list of str, default=None
        What serving the model needs; default: the installed ``onnx`` and
        ``onnxruntime`` versions (MLflow's inference of them runs the
        model's loading in a subprocess, seconds).

    Returns
    -------
    mlflow.models.model.ModelInfo
        ``model_uri`` loads the graph back with ``mlflow.onnx.load_model``.

    Raises
    ------
    sklearn.exceptions.NotFittedError
        An estimator not fitted yet (nothing is logged).
    ImportError
        MLflow is not installed.
    mlflow.exceptions.MlflowException
        MLflow refuses its tracking store (a local file store without
        ``MLFLOW_ALLOW_FILE_STORE=true``...): the message says what to set.
    """
    mlflow = _mlflow()
    model = _trained_onnx(estimator)  # raises before anything is logged
    started = mlflow.active_run() is None
    if started:
        _start_run(mlflow)
    try:
        if params:
            log_params(estimator)
        if history and getattr(estimator, "history_", None):
            log_history(estimator)
        keyword = "name" if "name" in inspect.signature(
            mlflow.onnx.log_model).parameters else "artifact_path"
        if pip_requirements is None:
            pip_requirements = _requirements()
        return mlflow.onnx.log_model(model, registered_model_name=registered_model_name,
                                     pip_requirements=pip_requirements,
                                     **{keyword: name})
    finally:
        if started:
            mlflow.end_run()


class MLflowLogger(Callback):
    """Log each epoch's record while ``fit`` runs, and the model and the
    parameters when it ends, to the active MLflow run (or a new one, ended
    with training).

    Parameters
    ----------
    name : str, default='model'
    log_model_at_end : bool, default=True

    Attributes
    ----------
    run_id_ : str
        The run logged to by the last fit.
    model_info_ : mlflow.models.model.ModelInfo or None
        The model logged at the end of the last fit.
    """

    def __init__(self, name="model", log_model_at_end=True):
        self.name = name
        self.log_model_at_end = log_model_at_end

    def on_train_begin(self, estimator, X=None, y=None):
        mlflow = _mlflow()
        self._started = mlflow.active_run() is None
        run = _start_run(mlflow) if self._started else mlflow.active_run()
        self.run_id_ = run.info.run_id
        self.model_info_ = None

    def on_epoch_end(self, estimator, record):
        log_history(estimator, [record])

    def on_train_error(self, estimator, error):
        """Training failed: a run this logger started ends as FAILED (the
        next fit does not log into it)."""
        if getattr(self, "_started", False):
            self._started = False
            _mlflow().end_run(status="FAILED")

    def on_train_end(self, estimator, X=None, y=None):
        mlflow = _mlflow()
        status = "FAILED"
        try:
            if self.log_model_at_end:
                self.model_info_ = log_model(estimator, self.name, history=False)
            status = "FINISHED"
        finally:
            if self._started:
                self._started = False
                mlflow.end_run(status=status)
