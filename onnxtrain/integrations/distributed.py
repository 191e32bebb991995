"""Data-parallel training on Dask (``dask.distributed``).

:func:`fit_data_parallel` trains an onnxtrain estimator on the shards of a
dataset held by Dask workers, synchronously:

1. the client prepares the estimator (graphs, initial weights) and sends a
   copy and one shard of the rows to each worker (a Dask actor keeps them,
   so each worker builds its onnxruntime sessions once, with as many
   threads as the worker has unless the estimator sets ``n_threads``);
2. every round, each worker starts from the same state, runs
   ``sync_every`` steps on its next batches (``partial_fit`` on one batch
   is one step), and returns its weights, its optimizer state (velocities,
   moments) and its running statistics;
3. the client averages them, weighted by the rows each worker trained on,
   and the next round starts from the average.

With ``sync_every=1`` and an update rule linear in the gradient (SGD, with
or without momentum or Nesterov's), averaging the workers' new weights and
velocities is averaging their gradients: one round is one step on the
union of the workers' batches, the gradient of the mean loss over all
those rows. Training then follows the curve of one process whose batches
are those unions (batch size ``n_shards * batch_size``, rows in shard
order). Adam's moments are not linear in the gradient: averaging them
approximates the single-process step; larger ``sync_every`` trades
exactness for less communication (local SGD).
"""
from __future__ import annotations

import numbers
import pickle

import numpy as np

__all__ = ["fit_data_parallel", "ShardWorker", "dask_worker_threads"]


class ShardWorker:
    """What one Dask worker holds: a copy of the estimator and its shard.

    Parameters
    ----------
    estimator : BaseOrtGradientEstimator or bytes
        Prepared (see :func:`fit_data_parallel`), or its pickle.
    X, y : ndarray
        The worker's rows.
    """

    def __init__(self, estimator, X, y):
        if isinstance(estimator, bytes):  # a copy of its own, on any transport
            estimator = pickle.loads(estimator)
        if getattr(estimator, "n_threads", None) is None:
            # the worker's thread budget, not every core for each worker
            estimator.set_params(n_threads=dask_worker_threads())
        self.estimator = estimator
        self.X, self.y = X, y

    def session_threads(self):
        """Intra-op threads of the worker's sessions (0: onnxruntime's
        default)."""
        runner = self.estimator._ensure_trainer().engine._forward
        return runner.session.get_session_options().intra_op_num_threads

    def run(self, state, batches, classes=None):
        """Start from ``state`` (``get_state(include_optimizer=True)``), run
        one step on each batch ``(start, stop)`` of the shard; returns
        ``(state, losses, rows)``, the state after the steps, the batch
        losses and their rows."""
        est = self.estimator
        est.set_state(state)
        losses, rows = [], []
        kwargs = {} if classes is None else {"classes": classes}
        for start, stop in batches:
            est.partial_fit(self.X[start:stop], self.y[start:stop], **kwargs)
            losses.append(est.train_losses_[-1])
            rows.append(stop - start)
        return est.get_state(include_optimizer=True), losses, rows


def dask_worker_threads():
    """Threads of the Dask worker running the caller (``nthreads``), or
    None outside a worker."""
    try:
        from distributed import get_worker
        worker = get_worker()
    except (ImportError, ValueError):
        return None
    state = getattr(worker, "state", worker)
    return getattr(state, "nthreads", None) or getattr(worker, "nthreads", None)


def _average(states, weights):
    """The row-weighted average of workers' states (weights, optimizer
    state, running statistics); counters from the first."""
    w = np.asarray(weights, dtype=np.float64) / float(np.sum(weights))

    def mean(arrays):
        total = sum(wi * np.asarray(a, dtype=np.float64) for wi, a in zip(w, arrays))
        return total.astype(np.asarray(arrays[0]).dtype)

    first = states[0]
    average = dict(first)
    average["weights"] = [mean([s["weights"][i] for s in states])
                          for i in range(len(first["weights"]))]
    average["optimizer"] = [
        [mean([s["optimizer"][i][j] for s in states])
         for j in range(len(first["optimizer"][i]))]
        for i in range(len(first["optimizer"]))]
    average["buffers"] = {name: mean([s["buffers"][name] for s in states])
                          for name in first["buffers"]}
    return average


def _sync_round(estimator, actors, chunks, state, classes):
    """Every worker runs its batches of ``chunks`` from ``state``; returns
    the averaged state (its schedule advanced to the samples seen), the sum
    of the batch losses times their rows, and the rows."""
    running = [(actor, chunk) for actor, chunk in zip(actors, chunks) if chunk]
    results = [f.result() for f in [actor.run(state, chunk, classes)
                                    for actor, chunk in running]]
    rows = [sum(r[2]) for r in results]
    t = state["t"] + int(sum(rows))
    averaged = _average([r[0] for r in results], rows)
    estimator.set_state(averaged)
    estimator.learning_rate_.update_learning_rate(t)
    averaged = dict(averaged, t=t, learning_rate=estimator.learning_rate_.value)
    loss_sum = sum(float(np.dot(losses, batch_rows)) for _, losses, batch_rows in results)
    return averaged, loss_sum, float(sum(rows))


def _check(estimator, sync_every, n_shards, n_samples, max_iter):
    from ..estimators._base import BaseOrtGradientEstimator
    if not isinstance(estimator, BaseOrtGradientEstimator):
        raise TypeError("fit_data_parallel trains the forward/backward estimators "
                        "(OrtGradientForwardBackwardOptimizer, ...Classifier, "
                        f"OrtGradientOptimizer), not {type(estimator).__name__}.")
    for name, value in (("sync_every", sync_every), ("n_shards", n_shards),
                        ("max_iter", max_iter)):
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) \
                or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}.")
    if n_shards > n_samples:
        raise ValueError(f"n_shards={n_shards} is more than the {n_samples} rows.")
    if estimator.shuffle or getattr(estimator, "early_stopping", False):
        raise ValueError("fit_data_parallel runs the batches of each shard in "
                         "order, without early stopping: set shuffle=False and "
                         "early_stopping=False.")


def fit_data_parallel(estimator, X, y, client, *, n_shards=None, sync_every=1,
                      max_iter=None, classes=None):
    """Train ``estimator`` on Dask workers, one shard of the rows each.

    Parameters
    ----------
    estimator : OrtGradientForwardBackwardOptimizer, \
            OrtGradientForwardBackwardClassifier or OrtGradientOptimizer
        Its ``batch_size`` is each worker's batch; trained in place (from
        its current weights if already fitted).
    X : ndarray of shape (n_samples, ...)
    y : ndarray of shape (n_samples,) or (n_samples, n_outputs)
    client : dask.distributed.Client
    n_shards : int, default=None
        Number of shards, one per worker (default: the client's workers).
        Shard ``i`` holds rows ``np.array_split(range(n_samples), n_shards)[i]``.
    sync_every : int, default=1
        Steps each worker runs between two averages.
    max_iter : int, default=None
        Epochs (default: the estimator's ``max_iter``); an epoch runs every
        batch of the largest shard once.
    classes : array-like, default=None
        For a classifier: every label (as ``partial_fit``'s ``classes``).

    Returns
    -------
    estimator
        With the averaged weights and optimizer state; ``train_losses_``
        and ``history_`` hold one row-weighted mean batch loss per epoch.

    Raises
    ------
    TypeError
        Not a forward/backward estimator.
    ValueError
        ``sync_every``, ``n_shards`` or ``max_iter`` not an int >= 1, more shards than
        rows, ``shuffle=True`` or ``early_stopping=True``; raised before
        any work.
    """
    X, y = np.asarray(X), np.asarray(y)
    n_shards = len(client.scheduler_info()["workers"]) if n_shards is None \
        else n_shards
    epochs = getattr(estimator, "max_iter", None) if max_iter is None else max_iter
    _check(estimator, sync_every, n_shards, X.shape[0], epochs)
    if not hasattr(estimator, "weights_to_train_"):
        estimator._initialize(X, y, classes)
    workers = list(client.scheduler_info()["workers"])
    parts = np.array_split(np.arange(X.shape[0]), n_shards)
    pickled = pickle.dumps(estimator)
    actors = [client.submit(ShardWorker, pickled, X[p], y[p], actor=True,
                            workers=[workers[i % len(workers)]]).result()
              for i, p in enumerate(parts)]
    size = int(np.clip(estimator.batch_size, 1, max(len(p) for p in parts)))
    batches = [[(s, min(s + size, len(p))) for s in range(0, len(p), size)]
               for p in parts]
    n_steps = max(len(b) for b in batches)
    state = estimator.get_state(include_optimizer=True)
    history = []
    for _ in range(epochs):
        total = rows_total = 0.0
        for first in range(0, n_steps, sync_every):
            chunks = [b[first:first + sync_every] for b in batches]
            state, loss_sum, rows = _sync_round(estimator, actors, chunks, state,
                                                classes)
            total, rows_total = total + loss_sum, rows_total + rows
        history.append({"epoch": len(history) + 1,
                        "train_loss": total / rows_total,
                        "learning_rate": float(state["learning_rate"])})
    estimator.set_state(dict(state, n_iter=epochs))
    estimator.train_losses_ = [r["train_loss"] for r in history]
    estimator.history_ = history
    return estimator
