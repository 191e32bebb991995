"""Callbacks of the estimators' epoch loop (``callbacks=`` parameter).

A callback is a scikit-learn style object (its ``__init__`` stores its
parameters, so that ``clone`` copies it) whose hooks
:class:`~onnxtrain.training.run.TrainingRun` calls with the estimator:

========================  ============================================
hook                      called
========================  ============================================
``on_train_begin``        before the first epoch of a fit or partial_fit
``on_epoch_begin``        before each epoch (1-based number)
``on_batch_begin``        before each batch's step (0-based index)
``on_batch_end``          after each batch's step, with the batch loss
``on_epoch_end``          after each epoch, with its ``history_`` record
                          (a dict the callback may extend); a true value
                          ends training after this epoch
``on_train_end``          after the last epoch
========================  ============================================

Batch hooks make every epoch run batch by batch (no in-graph loop: the
'auto' path becomes 'fused').
"""
from __future__ import annotations

import numbers
import os

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.metrics import check_scoring

__all__ = ["Callback", "EpochScoring", "Checkpoint", "LRScheduler",
           "EarlyStopping", "check_callbacks"]


class Callback(BaseEstimator):
    """Base class: every hook does nothing."""

    def on_train_begin(self, estimator, X=None, y=None):
        pass

    def on_train_end(self, estimator, X=None, y=None):
        pass

    def on_train_error(self, estimator, error):
        """Training raised ``error`` after ``on_train_begin`` (a divergence
        with ``exc=True``, a callback raising, an interruption):
        ``on_train_end`` will not come. The error propagates afterwards."""

    def on_epoch_begin(self, estimator, epoch):
        pass

    def on_epoch_end(self, estimator, record):
        pass

    def on_batch_begin(self, estimator, batch):
        pass

    def on_batch_end(self, estimator, batch, loss):
        pass


def check_callbacks(callbacks):
    """Validate a ``callbacks`` parameter.

    Raises
    ------
    TypeError
        Not None, a list or a tuple of :class:`Callback` objects (the
        message names the first wrong item).
    """
    if callbacks is None:
        return []
    if not isinstance(callbacks, (list, tuple)):
        raise TypeError(f"callbacks must be None or a list of Callback objects, "
                        f"got {type(callbacks).__name__}.")
    for i, callback in enumerate(callbacks):
        if not isinstance(callback, Callback):
            raise TypeError(f"callbacks[{i}] is {callback!r}, not a Callback "
                            "(onnxtrain.training.Callback).")
    return list(callbacks)


def _run(estimator):
    """The :class:`~onnxtrain.training.run.TrainingRun` of the estimator's
    fit."""
    return vars(estimator)["_run"]


def _update_rule(estimator):
    """The learning-rate object an estimator trains with."""
    return _run(estimator).update_rule


def _check_bool(value, name):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {value!r}.")


def _best(values, lower_is_better):
    return min(values) if lower_is_better else max(values)


class EpochScoring(Callback):
    """Score the estimator at the end of every epoch and record the score
    in ``history_`` under ``name``.

    Parameters
    ----------
    scoring : str or callable
        A scikit-learn scorer name ('r2', 'neg_mean_squared_error',
        'accuracy'...) or a callable ``scoring(estimator, X, y) -> float``
        (:func:`sklearn.metrics.check_scoring`).
    X, y : array-like
        The rows scored (a validation set); as the estimator's ``predict``
        takes them.
    name : str, default=None
        Key of the score in each ``history_`` record (default
        ``'valid_' + scoring`` for a name, ``'valid_score'`` otherwise).

    Attributes
    ----------
    scores_ : list of float
        The score of each epoch of the last fit.
    """

    def __init__(self, scoring, X, y, name=None):
        self.scoring = scoring
        self.X = X
        self.y = y
        self.name = name

    def key(self):
        """The ``history_`` key of the score."""
        if self.name is not None:
            return self.name
        return f"valid_{self.scoring}" if isinstance(self.scoring, str) \
            else "valid_score"

    def on_train_begin(self, estimator, X=None, y=None):
        self.scorer_ = check_scoring(estimator, scoring=self.scoring)
        self.scores_ = []

    def on_epoch_end(self, estimator, record):
        score = float(self.scorer_(estimator, self.X, self.y))
        self.scores_.append(score)
        record[self.key()] = score


class Checkpoint(Callback):
    """Write the trained model to a file during fit: after every epoch, or
    after each epoch improving ``monitor``.

    Parameters
    ----------
    path : str or os.PathLike
        Written at each checkpoint (replaced): an ONNX file (the inference
        graph of :meth:`get_trained_onnx`) when it ends with '.onnx',
        otherwise a numpy ``.npz`` file of :meth:`get_state` (weights in
        ``weights_to_train_`` order as ``weight_0``, ``weight_1``...).
    monitor : str, default=None
        A ``history_`` key ('train_loss', 'valid_loss', a score from
        :class:`EpochScoring`...): checkpoint only when it improves. None:
        every epoch.
    lower_is_better : bool, default=True

    Attributes
    ----------
    best_ : float
        Best value of ``monitor`` so far (None without a monitor).
    epochs_ : list of int
        Epochs written during the last fit.
    """

    def __init__(self, path, monitor=None, lower_is_better=True):
        self.path = path
        self.monitor = monitor
        self.lower_is_better = lower_is_better

    def on_train_begin(self, estimator, X=None, y=None):
        if not isinstance(self.path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or a path, got {self.path!r}.")
        _check_bool(self.lower_is_better, "lower_is_better")
        self.best_ = None
        self.epochs_ = []

    def on_epoch_end(self, estimator, record):
        if self.monitor is not None:
            if self.monitor not in record:
                raise KeyError(f"Checkpoint monitors {self.monitor!r}, not in the "
                               f"epoch's record {sorted(record)}.")
            value = record[self.monitor]
            if self.best_ is not None and _best(
                    [value, self.best_], self.lower_is_better) == self.best_:
                return
            self.best_ = value
        self.save(estimator)
        self.epochs_.append(record["epoch"])
        record["checkpoint"] = True

    def save(self, estimator):
        """Write ``estimator`` to :attr:`path`."""
        path = os.fspath(self.path)
        if path.endswith(".onnx"):
            import onnx
            export = getattr(estimator, "get_trained_onnx", None) or estimator.to_onnx
            onnx.save(export(), path)
            return
        with open(path, "wb") as f:  # np.savez would append '.npz'
            np.savez(f, **{f"weight_{i}": w
                           for i, w in enumerate(estimator.get_state())})


class LRScheduler(Callback):
    """Set the learning rate before every batch: a linear warmup, then a
    schedule of the step number.

    At step ``s`` (1-based: the update rule's step count, which a fit
    starts at 1 and partial_fit calls continue), the rate is
    ``base * s / warmup_steps`` while ``s <= warmup_steps``, then
    ``base * policy(s - warmup_steps)`` (``base`` without a policy), where
    ``base`` is the update rule's initial rate (``eta0``).

    Parameters
    ----------
    policy : callable, default=None
        ``policy(step) -> float`` factor, step counted from the end of the
        warmup (0 first); e.g. ``lambda s: 0.5 ** (s // 100)``.
    warmup_steps : int, default=0

    Attributes
    ----------
    rates_ : list of float
        The rate of every step of the last fit or partial_fit.
    """

    def __init__(self, policy=None, warmup_steps=0):
        self.policy = policy
        self.warmup_steps = warmup_steps

    def on_train_begin(self, estimator, X=None, y=None):
        if not isinstance(self.warmup_steps, numbers.Integral) or \
                isinstance(self.warmup_steps, bool) or self.warmup_steps < 0:
            raise ValueError("warmup_steps must be an int >= 0, got "
                             f"{self.warmup_steps!r}.")
        if self.policy is not None and not callable(self.policy):
            raise TypeError(f"policy must be callable, got {self.policy!r}.")
        self.base_ = float(_update_rule(estimator).schedule(0))
        self.rates_ = []

    def rate(self, step):
        """The learning rate of 1-based ``step``."""
        if step <= self.warmup_steps:
            return self.base_ * step / self.warmup_steps
        factor = 1.0 if self.policy is None else float(
            self.policy(step - self.warmup_steps - 1))
        return self.base_ * factor

    def on_batch_begin(self, estimator, batch):
        value = self.rate(_run(estimator).runner.step_count + 1)
        _update_rule(estimator).value = value
        self.rates_.append(value)


class EarlyStopping(Callback):
    """Stop when ``monitor`` has not improved by ``threshold`` for
    ``patience`` epochs, and keep the weights of its best epoch.

    Parameters
    ----------
    monitor : str, default='valid_loss'
        A ``history_`` key: 'train_loss', 'valid_loss' (with ``X_val``) or a
        score recorded by :class:`EpochScoring` (set ``lower_is_better``).
    patience : int, default=5
    threshold : float, default=1e-4
        Minimum improvement (absolute).
    lower_is_better : bool, default=True
    load_best : bool, default=True
        Put back the weights of the best epoch when training ends.

    Attributes
    ----------
    best_, best_epoch_ : float, int
    stopped_epoch_ : int or None
        The epoch that ended training, None if it ran to ``max_iter``.
    """

    def __init__(self, monitor="valid_loss", patience=5, threshold=1e-4,
                 lower_is_better=True, load_best=True):
        self.monitor = monitor
        self.patience = patience
        self.threshold = threshold
        self.lower_is_better = lower_is_better
        self.load_best = load_best

    def on_train_begin(self, estimator, X=None, y=None):
        if not isinstance(self.patience, numbers.Integral) or self.patience < 1:
            raise ValueError(f"patience must be an int >= 1, got {self.patience!r}.")
        _check_bool(self.lower_is_better, "lower_is_better")
        self.best_, self.best_epoch_, self.stopped_epoch_ = None, None, None
        self._best_weights, self._waited = None, 0

    def on_epoch_end(self, estimator, record):
        if self.monitor not in record:
            return False  # e.g. a validation loss not computed this epoch
        value = float(record[self.monitor])
        sign = 1.0 if self.lower_is_better else -1.0
        if self.best_ is None or sign * (self.best_ - value) > self.threshold:
            self.best_, self.best_epoch_, self._waited = value, record["epoch"], 0
            if self.load_best:
                self._best_weights = estimator.get_state()
            return False
        self._waited += 1
        if self._waited >= self.patience:
            self.stopped_epoch_ = record["epoch"]
            return True
        return False

    def on_train_end(self, estimator, X=None, y=None):
        if self.load_best and self._best_weights is not None:
            estimator.set_state(self._best_weights)
