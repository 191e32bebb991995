"""Data-parallel training on Dask (``dask.distributed``).

:func:`fit_data_parallel` trains an onnxtrain estimator on the shards of a
dataset held by Dask workers, synchronously:

1. the client prepares the estimator (graphs, initial weights) and
   broadcasts it; each shard gets a :class:`ShardWorker` built on its
   worker (its onnxruntime sessions are built once, with as many threads
   as the worker has unless the estimator sets ``n_threads``);
2. the rows are partitions that live on the workers: a numpy array is cut
   into one partition per shard and scattered once; the partitions of a
   ``dask.array`` or ``dask.dataframe`` are computed on the worker of their
   shard when its batches reach them and released once passed, so a shard
   is streamed through a window of a few partitions and may be larger than
   its worker's memory;
3. every round, each shard starts from the same state, runs ``sync_every``
   steps on its next batches (``partial_fit`` on one batch is one step);
4. the shards' states (weights, optimizer state, running statistics) are
   averaged, weighted by the rows each trained on, by a binary tree of
   tasks on the workers; the average is sent back to the workers as a
   future (through a binary tree of copies beyond two workers). The
   client only submits tasks: it receives two floats per epoch and the
   final state, never a row.

With ``sync_every=1`` and an update rule linear in the gradient (SGD, with
or without momentum or Nesterov's), averaging the workers' new weights and
velocities is averaging their gradients: one round is one step on the
union of the workers' batches, the gradient of the mean loss over all
those rows. Training then follows the curve of one process whose batches
are those unions (batch size ``n_shards * batch_size``, rows in shard
order). Adam's moments are not linear in the gradient: averaging them
approximates the single-process step; larger ``sync_every`` trades
exactness for less communication (local SGD). See ``docs/dask.md`` for the
cost model.
"""
from __future__ import annotations

import numbers
import pickle
import sys
from collections import deque

import numpy as np

__all__ = ["fit_data_parallel", "ShardWorker", "dask_worker_threads"]

#: In-flight waves of segment tasks (one per shard each) the client lets
#: run ahead: bounds the partitions a worker holds at once.
_WINDOW = 2


class ShardWorker:
    """What one Dask worker holds for a shard: a copy of the estimator
    (and, for :meth:`run`, the shard's rows).

    Parameters
    ----------
    estimator : BaseOrtGradientEstimator or bytes
        Prepared (see :func:`fit_data_parallel`), or its pickle.
    X, y : ndarray, default=None
        The worker's rows, for :meth:`run`; :meth:`segment` is given its
        rows instead.
    """

    def __init__(self, estimator, X=None, y=None):
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
        self.estimator.set_state(state)
        losses, rows = [], []
        for start, stop in batches:
            losses.append(self._step(self.X[start:stop], self.y[start:stop], classes))
            rows.append(stop - start)
        return self.estimator.get_state(include_optimizer=True), losses, rows

    def segment(self, carry, parts, batches, classes=None):
        """Run one step on each batch made of pieces of ``parts``.

        Parameters
        ----------
        carry : dict or tuple
            The state to start from (``get_state(include_optimizer=True)``),
            or a ``(state, loss_sum, loss_rows, rows)`` to go on from.
        parts : list of (X, y)
            Partitions (ndarray or pandas objects).
        batches : list of list of (int, int, int)
            Each batch as pieces ``(part, start, stop)``: rows
            ``start:stop`` of ``parts[part]``, concatenated.
        classes : array-like, default=None

        Returns
        -------
        tuple
            ``(state, loss_sum, loss_rows, rows)``: the state after the
            steps, the sum of the batch losses times their rows and those
            rows (the carry's added), the rows trained on in the round (the
            weight of the state in the average).
        """
        state, loss_sum, loss_rows, rows = carry if isinstance(carry, tuple) \
            else (carry, 0.0, 0, 0)
        self.estimator.set_state(state)
        for pieces in batches:
            X = _concat([_rows(parts[k][0], a, b) for k, a, b in pieces])
            y = _concat([_rows(parts[k][1], a, b) for k, a, b in pieces])
            loss_sum += self._step(X, y, classes) * len(X)
            loss_rows, rows = loss_rows + len(X), rows + len(X)
        state = self.estimator.get_state(include_optimizer=True)
        return state, loss_sum, loss_rows, rows

    def _step(self, X, y, classes):
        kwargs = {} if classes is None else {"classes": classes}
        self.estimator.partial_fit(X, y, **kwargs)
        return float(self.estimator.train_losses_[-1])


def _rows(data, start, stop):
    return data.iloc[start:stop] if hasattr(data, "iloc") else data[start:stop]


def _concat(pieces):
    if len(pieces) == 1:
        return pieces[0]
    if hasattr(pieces[0], "iloc"):
        import pandas
        return pandas.concat(pieces)
    return np.concatenate(pieces)


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


# ---------------------------------------------------------------- tasks
def _segment_task(worker, carry, parts, batches, classes, schedule=None,
                  keep_loss=False):
    """A segment. The first of a round starts from the previous round's
    average ``carry``, its schedule ``(t, learning_rate)`` set, and keeps
    the carry's loss sum and rows with ``keep_loss`` (one shard a round
    does, so that the last round's average holds the epoch's sums)."""
    if schedule is not None:
        state = carry[0] if isinstance(carry, tuple) else carry
        state = dict(state, t=schedule[0], learning_rate=schedule[1])
        carry = (state, carry[1], carry[2], 0) if keep_loss else state
    return worker.segment(carry, parts, batches, classes)


def _combine(a, b):
    """Row-weighted mean of two ``(state, loss_sum, loss_rows, rows)``
    (float64 arithmetic, the states' dtypes; counters from ``a``), the
    sums of the others."""
    (sa, la, na, ra), (sb, lb, nb, rb) = a, b
    wa, wb = ra / float(ra + rb), rb / float(ra + rb)

    def mean(x, z):
        x = np.asarray(x)
        return (wa * x.astype(np.float64) + wb * np.asarray(z, np.float64)).astype(x.dtype)

    state = dict(sa)
    state["weights"] = [mean(x, z) for x, z in zip(sa["weights"], sb["weights"])]
    state["optimizer"] = [[mean(x, z) for x, z in zip(xs, zs)]
                          for xs, zs in zip(sa["optimizer"], sb["optimizer"])]
    state["buffers"] = {k: mean(v, sb["buffers"][k]) for k, v in sa["buffers"].items()}
    return state, la + lb, na + nb, ra + rb


def _round_loss(root):
    return root[1], root[2]


def _same(value):
    return value


def _tree_reduce(client, leaves):
    """Combine futures pairwise, level by level, on the workers."""
    while len(leaves) > 1:
        pairs = [client.submit(_combine, a, b, pure=False)
                 for a, b in zip(leaves[::2], leaves[1::2])]
        leaves = pairs + leaves[len(leaves) - len(leaves) % 2:]
    return leaves[0]


def _tree_broadcast(client, future, workers):
    """A copy of ``future`` on each worker: worker ``j`` copies from worker
    ``(j - 1) // 2``, so no process sends more than two copies; with two
    workers or fewer, Dask's own fetch."""
    if len(workers) <= 2:
        return {w: future for w in workers}
    copies = []
    for j, w in enumerate(workers):
        source = future if j == 0 else copies[(j - 1) // 2]
        copies.append(client.submit(_same, source, workers=[w], pure=False))
    return dict(zip(workers, copies))


# ----------------------------------------------------------- the data
def _is_dask(data):
    dask = sys.modules.get("dask")
    return dask is not None and dask.is_dask_collection(data)


class _Source:
    """The rows as partitions along axis 0, each ``(X, y)`` delayed (dask
    inputs) or already scattered (numpy inputs): ``lengths[g]`` rows in
    partition ``g``; ``shards[i]`` the partitions of shard ``i``."""

    def __init__(self, X, y, client, n_shards):
        self.client = client
        if _is_dask(X) or _is_dask(y):
            self._from_dask(X, y, n_shards)
        else:
            self._from_numpy(np.asarray(X), np.asarray(y), n_shards)

    def _from_numpy(self, X, y, n_shards):
        if X.shape[0] != y.shape[0]:
            raise ValueError(f"X has {X.shape[0]} rows, y {y.shape[0]}.")
        _check_shards(n_shards, X.shape[0], "rows")
        self.sample = X, y
        self.n_samples = X.shape[0]
        parts = np.array_split(np.arange(X.shape[0]), n_shards)
        self.lengths = [len(p) for p in parts]
        self.shards = [[i] for i in range(n_shards)]
        self._numpy = [(X[p], y[p]) for p in parts]

    def _from_dask(self, X, y, n_shards):
        if not _is_dask(X):
            raise TypeError("y is a dask collection but X is not: give X as a "
                            "dask.array or dask.dataframe too.")
        X = _rows_whole(X)
        self._numpy = None
        n_parts = X.npartitions if hasattr(X, "npartitions") else len(X.chunks[0])
        _check_shards(n_shards, n_parts, "partitions")
        known = getattr(X, "chunks", None)
        y_lengths = None
        if known is not None and not any(np.isnan(known[0])):
            lengths = [int(n) for n in known[0]]
        elif _is_dask(y) and not hasattr(y, "chunks"):  # both counted at once
            lengths, y_lengths = _partition_lengths(X, y)
        else:
            lengths, = _partition_lengths(X)
        self.sample = X, y
        y = _aligned_y(y, lengths, y_lengths)
        x_parts, y_parts = _partitions(X), _partitions(y)
        # flat graphs, culled for each partition: a submission costs what
        # its partition needs, not the whole graph
        self._graphs = dict(x_parts[0].__dask_graph__()), dict(y_parts[0].__dask_graph__())
        self._keys = [(a.key, b.key) for a, b in zip(x_parts, y_parts)]
        self.n_samples = sum(lengths)
        self.lengths = lengths
        self.shards = _contiguous_groups(lengths, n_shards)

    def scatter(self, workers):
        """Numpy partitions: sent once, each to its shard's worker."""
        if self._numpy is None:
            return
        self._numpy = [tuple(self.client.scatter(list(part), workers=[w], hash=False))
                       for part, w in zip(self._numpy, workers)]

    def future(self, g, worker):
        """Partition ``g`` as a pair of futures, computed on ``worker``."""
        if self._numpy is not None:
            return self._numpy[g]
        from dask.optimization import cull
        keys = list(self._keys[g])
        graph = {}
        for whole, key in zip(self._graphs, keys):
            graph.update(cull(whole, [key])[0])
        return tuple(self.client.get(graph, keys, workers=[worker], sync=False))


def _rows_whole(X):
    """A dask collection whose partitions hold whole rows."""
    if hasattr(X, "chunks"):  # dask.array
        if X.ndim >= 2 and any(len(c) > 1 for c in X.chunks[1:]):
            X = X.rechunk({i: -1 for i in range(1, X.ndim)})
        return X
    if hasattr(X, "npartitions"):  # dask.dataframe
        return X
    raise TypeError(f"X: a dask.array or dask.dataframe, not {type(X).__name__}.")


def _partitions(data):
    """One Delayed per partition along the rows. A dask.dataframe needs its
    graph optimized (lowered); an array's is kept as written, since
    optimizing fuses the tasks X and y share into each of them, computing
    them twice."""
    parts = data.to_delayed(optimize_graph=not hasattr(data, "chunks"))
    return list(parts.ravel()) if hasattr(parts, "ravel") else list(parts)


def _partition_lengths(*collections):
    """Rows of each partition of each collection, computed on the workers
    in one graph (tasks they share run once; ints come back)."""
    import dask
    counts = dask.compute([[dask.delayed(len)(p) for p in _partitions(data)]
                           for data in collections])[0]
    return [list(c) for c in counts]


def _aligned_y(y, lengths, y_lengths=None):
    """y as a dask collection whose partitions have the rows of X's
    (``y_lengths``: y's, when known)."""
    import dask.array as da
    if not _is_dask(y):
        y = np.asarray(y)
        if y.shape[0] != sum(lengths):
            raise ValueError(f"X has {sum(lengths)} rows, y {y.shape[0]}.")
        return da.from_array(y, chunks=(tuple(lengths),) + y.shape[1:])
    if not hasattr(y, "chunks"):  # dask.dataframe
        y_lengths = y_lengths or _partition_lengths(y)[0]
        if y_lengths == lengths:
            return y
        y = y.to_dask_array(lengths=y_lengths)
    if any(np.isnan(y.chunks[0])):
        raise ValueError("y has unknown chunk sizes: call y.compute_chunk_sizes() "
                         "or give it as a dask.dataframe.")
    if y.shape[0] != sum(lengths):
        raise ValueError(f"X has {sum(lengths)} rows, y {y.shape[0]}.")
    if y.chunks[0] != tuple(lengths) or any(len(c) > 1 for c in y.chunks[1:]):
        y = y.rechunk((tuple(lengths),) + tuple(-1 for _ in y.shape[1:]))
    return y


def _contiguous_groups(lengths, n_groups):
    """Split partitions ``0..len(lengths)-1`` into ``n_groups`` runs of
    consecutive partitions with about as many rows each (none empty)."""
    ends = np.cumsum(lengths)
    cuts, start = [], 0
    for k in range(1, n_groups):
        # the boundary nearest k / n_groups of the rows, leaving one
        # partition at least to each group
        target = ends[-1] * k / n_groups
        g = int(np.argmin(np.abs(ends - target))) + 1
        g = min(max(g, start + 1), len(lengths) - (n_groups - k))
        cuts.append(g)
        start = g
    bounds = [0] + cuts + [len(lengths)]
    return [list(range(a, b)) for a, b in zip(bounds[:-1], bounds[1:])]


def _check_shards(n_shards, n_units, unit):
    if n_shards > n_units:
        raise ValueError(f"n_shards={n_shards} is more than the {n_units} {unit}.")


# ----------------------------------------------------------- the plan
def _shard_plan(parts, lengths, batch_size, sync_every):
    """The rounds of one shard: for each round, its segments, each
    ``(partitions, batches)`` where a batch is pieces ``(k, start, stop)``
    in ``partitions[k]``; a segment reads two partitions at most (more
    only when one batch needs them)."""
    offsets = np.concatenate([[0], np.cumsum([lengths[g] for g in parts])])
    n_rows = int(offsets[-1])
    batches = [(s, min(s + batch_size, n_rows)) for s in range(0, n_rows, batch_size)]
    rounds = []
    for first in range(0, len(batches), sync_every):
        segments, current, pieces_list = [], [], []
        for start, stop in batches[first:first + sync_every]:
            touched = [j for j in range(len(parts))
                       if offsets[j] < stop and offsets[j + 1] > start]
            if current and len(set(current) | set(touched)) > 2:
                segments.append((current, pieces_list))
                current, pieces_list = [], []
            current = sorted(set(current) | set(touched))
            pieces_list.append([(j, max(start, offsets[j]) - offsets[j],
                                 min(stop, offsets[j + 1]) - offsets[j])
                                for j in touched])
        segments.append((current, pieces_list))
        rounds.append([([parts[j] for j in segment],
                        [[(segment.index(j), int(a), int(b)) for j, a, b in pieces]
                         for pieces in batch_pieces])
                       for segment, batch_pieces in segments])
    return rounds


def _check(estimator, sync_every, n_shards, max_iter):
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
    if estimator.shuffle or getattr(estimator, "early_stopping", False):
        raise ValueError("fit_data_parallel runs the batches of each shard in "
                         "order, without early stopping: set shuffle=False and "
                         "early_stopping=False.")


def _initial_rows(source, estimator, classes):
    """Rows to prepare the estimator on: the data itself for numpy inputs;
    for dask inputs, rows of zeros (or dask's fake rows) of the right
    columns and dtypes, and the labels computed on the workers, so that no
    row of the data reaches the client."""
    X, y = source.sample
    if source._numpy is not None:
        return X, y, classes
    from sklearn.base import is_classifier
    m = int(np.clip(estimator.batch_size, 1, source.n_samples))
    if hasattr(X, "chunks"):
        X0 = np.zeros((m,) + tuple(X.shape[1:]), dtype=X.dtype)
    else:
        from pandas.api.types import is_bool_dtype, is_numeric_dtype
        text = [str(c) for c, t in X.dtypes.items()
                if not (is_numeric_dtype(t) or is_bool_dtype(t))]
        if text:  # dask's fake rows of such columns fail in check_array
            raise ValueError(f"X has columns {text} that are not numeric "
                             "(object, string or category): encode them first "
                             "(the estimators take numbers).")
        meta = X._meta_nonempty
        X0 = meta.iloc[np.arange(m) % len(meta)].reset_index(drop=True)
    if is_classifier(estimator):
        if classes is None:
            import dask.array as da
            labels = y.unique() if hasattr(y, "unique") else \
                da.unique(da.asarray(y).ravel())
            classes = np.unique(np.asarray(labels.compute()))
        y0 = np.asarray(classes)[np.arange(m) % len(classes)]
        return X0, y0, classes
    shape = tuple(getattr(y, "shape", (None,))[1:])
    dtype = getattr(y, "dtype", None)
    if dtype is None or dtype == object:  # a dask DataFrame of targets
        shape, dtype = (len(y.columns),), np.float64
    return X0, np.zeros((m,) + shape, dtype=dtype), classes


def fit_data_parallel(estimator, X, y, client, *, n_shards=None, sync_every=1,
                      max_iter=None, classes=None):
    """Train ``estimator`` on Dask workers, one shard of the rows each.

    Parameters
    ----------
    estimator : OrtGradientForwardBackwardOptimizer, \
            OrtGradientForwardBackwardClassifier or OrtGradientOptimizer
        Its ``batch_size`` is each worker's batch; trained in place (from
        its current weights if already fitted).
    X : ndarray, dask.array.Array or dask.dataframe.DataFrame
        Of shape (n_samples, ...). A numpy array is split into ``n_shards``
        parts (``np.array_split``) sent once to the workers. A dask
        collection stays on the workers: shard ``i`` is a run of
        consecutive partitions (about ``n_samples / n_shards`` rows), whose
        partitions are computed on shard ``i``'s worker when its batches
        reach them, every epoch (persist X first if it fits in memory and
        is costly to compute), and released once passed.
    y : ndarray, dask.array.Array or dask.dataframe.Series
        Of shape (n_samples,) or (n_samples, n_outputs); rechunked like X
        when its partitions differ.
    client : dask.distributed.Client
    n_shards : int, default=None
        Number of shards (default: the client's workers, at most X's
        partitions); shard ``i`` runs on worker ``i % n_workers``.
    sync_every : int, default=1
        Steps each shard runs between two averages.
    max_iter : int, default=None
        Epochs (default: the estimator's ``max_iter``); an epoch runs every
        batch of the largest shard once.
    classes : array-like, default=None
        For a classifier: every label (as ``partial_fit``'s ``classes``);
        with a dask ``y``, computed on the workers when not given.

    Returns
    -------
    estimator
        With the averaged weights and optimizer state; ``train_losses_``
        and ``history_`` hold one row-weighted mean batch loss per epoch.
        Its ``callbacks`` are not called (the workers' copies have none):
        log afterwards, e.g. with
        :func:`onnxtrain.integrations.mlflow.log_history`.

    Raises
    ------
    TypeError
        Not a forward/backward estimator, or y a dask collection and X not.
    ValueError
        ``sync_every``, ``n_shards`` or ``max_iter`` not an int >= 1, more
        shards than rows (numpy) or partitions (dask), X and y of different
        lengths, ``shuffle=True`` or ``early_stopping=True``; raised before
        any training.

    Notes
    -----
    Per round the client submits tasks; per epoch it receives two floats
    (the sum of the batch losses times their rows, and the rows); a shard's
    state goes up a binary tree of averages (``log2(n_shards)`` levels) and
    back down as a future. See ``docs/dask.md`` for the cost model.
    """
    workers = _workers(client)
    epochs = getattr(estimator, "max_iter", None) if max_iter is None else max_iter
    default_shards = n_shards is None
    _check(estimator, sync_every, 1 if default_shards else n_shards, epochs)
    if default_shards:
        n_shards = len(workers)
        if _is_dask(X):
            n_shards = min(n_shards, X.npartitions if hasattr(X, "npartitions")
                           else len(X.chunks[0]))
    _check_penalty(estimator)
    source = _Source(X, y, client, n_shards)
    # a batch may span partitions: the largest shard bounds it, not the
    # largest partition
    shard_rows = [sum(source.lengths[g] for g in parts) for parts in source.shards]
    size = int(np.clip(estimator.batch_size, 1, max(shard_rows)))
    _check_batches(estimator, {size} | {n % size for n in shard_rows if n % size})
    if not hasattr(estimator, "weights_to_train_"):
        estimator._initialize(*_initial_rows(source, estimator, classes))
    elif classes is None and source._numpy is None:
        classes = getattr(estimator, "classes_", None)
    shard_workers = [workers[i % len(workers)] for i in range(n_shards)]
    loop = _RoundLoop(client, estimator, shard_workers, source, classes)
    plans = [_shard_plan(parts, source.lengths, size, sync_every)
             for parts in source.shards]
    state, history = loop.train(plans, epochs)
    estimator.set_state(dict(state, n_iter=epochs))
    estimator.train_losses_ = [h["train_loss"] for h in history]
    estimator._run.best_loss = min(estimator.train_losses_)
    estimator.history_ = history
    return estimator


def _workers(client):
    """The client's workers; a clear error for a closed client."""
    if getattr(client, "status", "running") in ("closed", "closing"):
        raise ValueError("fit_data_parallel needs a running dask client; this one "
                         "is closed.")
    workers = list(client.scheduler_info().get("workers", ()))
    if not workers:
        raise ValueError("fit_data_parallel found no worker on the client's "
                         "cluster (closed, or not started yet).")
    return workers


def _check_batches(estimator, sizes):
    """The shards' batch sizes checked against the graph before any work,
    as fit checks its own (one row through a BatchNorm1d)."""
    from ..estimators._inputs import check_batchnorm_batches
    model = estimator._training_model()
    check_batchnorm_batches(model, sizes, estimator._training_types(),
                            estimator._feature_inputs(model))


def _check_penalty(estimator):
    """Refuse a learning penalty: each shard's step adds it scaled by its
    own rows (1 / rows, scikit-learn's alpha), so the average would hold it
    once per shard instead of once for the union of the batches."""
    from ..losses.penalties import BaseLearningPenalty, resolve_learning_penalty
    from ..optim.learning_rates import resolve_learning_rate
    from ..optim.links import AddPenalty
    penalty = resolve_learning_penalty(getattr(estimator, "learning_penalty", None))
    active = type(penalty).penalize is not BaseLearningPenalty.penalize
    rule = resolve_learning_rate(estimator.learning_rate).update_rule()
    chained = any(isinstance(link, AddPenalty) for link in getattr(rule, "links", ()))
    if active or chained:
        raise ValueError(
            "fit_data_parallel does not train with a learning penalty (or an "
            "AddPenalty link): each shard scales it by its own batch rows, so "
            "the average would count it once per shard. Use a decoupled weight "
            "decay in the learning-rate chain instead (AddDecayedWeights, "
            "DecoupledWeightDecay), which the average keeps once.")


class _RoundLoop:
    """Runs the rounds: submits the segment tasks of each round, shard by
    shard in lockstep (wave ``k`` is every shard's ``k``-th segment),
    holding the partitions of the waves in flight only (before a wave is
    submitted, the wave ``_WINDOW`` before it has finished), then the
    tree of averages and of copies."""

    def __init__(self, client, estimator, workers, source, classes):
        self.client, self.estimator, self.workers = client, estimator, workers
        self.source, self.classes = source, classes
        source.scatter(workers)
        # the workers' copies run no callback: each shard's steps would
        # call them (an MLflowLogger opened one run per shard and step)
        callbacks = estimator.callbacks
        estimator.callbacks = None
        try:
            pickled = client.scatter(pickle.dumps(estimator), broadcast=True)
        finally:
            estimator.callbacks = callbacks
        self.holders = [client.submit(ShardWorker, pickled, workers=[w], pure=False)
                        for w in workers]
        self.live = [{} for _ in workers]  # shard -> {partition: futures}
        self.waves = deque()

    def train(self, plans, epochs):
        """Every round of ``epochs`` epochs; returns the final state and
        the history."""
        client, rate = self.client, self.estimator.learning_rate_
        state = self.estimator.get_state(include_optimizer=True)
        # in a list: a dict would be scattered as one key per item
        first, = client.scatter([state], broadcast=True, hash=False)
        state_on = dict.fromkeys(set(self.workers), first)
        t = state["t"]
        schedule = t, state["learning_rate"]
        sums, rates = [], []
        for _ in range(epochs):
            for r in range(max(len(p) for p in plans)):
                rounds = [p[r] if r < len(p) else [] for p in plans]
                t += sum(b - a for segs in rounds for _, batches in segs
                         for pieces in batches for _, a, b in pieces)
                root = _tree_reduce(client, self.submit_round(rounds, state_on, schedule,
                                                              keep_loss=r > 0))
                rate.update_learning_rate(t)
                schedule = t, float(rate.value)
                state_on = _tree_broadcast(client, root, sorted(set(self.workers)))
            sums.append(client.submit(_round_loss, root, pure=False))
            rates.append(schedule[1])
        history = [{"epoch": e + 1, "train_loss": loss / rows, "learning_rate": lr}
                   for e, ((loss, rows), lr) in enumerate(zip(client.gather(sums), rates))]
        state = dict(root.result()[0], t=schedule[0], learning_rate=schedule[1])
        return state, history

    def submit_round(self, rounds, state_on, schedule, keep_loss):
        """The ``(state, loss_sum, loss_rows, rows)`` futures of the shards
        that train in this round, from ``state_on[worker]`` with
        ``schedule``; the first of them keeps the previous sums with
        ``keep_loss``."""
        from distributed import wait
        keeper = min(i for i, segs in enumerate(rounds) if segs) if keep_loss else None
        carries = {}
        for k in range(max(len(segs) for segs in rounds)):
            wave = []
            for i, segs in enumerate(rounds):
                if k >= len(segs):
                    continue
                parts, batches = segs[k]
                live = {g: self.live[i].get(g) or self.source.future(g, self.workers[i])
                        for g in parts}
                self.live[i] = live  # the client lets go of passed partitions
                start = state_on[self.workers[i]] if k == 0 else carries[i]
                carries[i] = self.client.submit(
                    _segment_task, self.holders[i], start, [live[g] for g in parts],
                    batches, self.classes, schedule if k == 0 else None,
                    i == keeper, workers=[self.workers[i]], pure=False)
                wave.append(carries[i])
            self.waves.append(wave)
            if len(self.waves) > _WINDOW:
                wait(self.waves.popleft())
        return [carries[i] for i in sorted(carries)]
