"""Data-parallel training on Dask: averaged shards == the full batch."""
import pickle
import time
import weakref

import numpy as np
import pytest
from numpy.testing import assert_allclose

pytest.importorskip("dask.distributed")
import dask.array as da  # noqa: E402
from dask import delayed  # noqa: E402
from dask.distributed import Client, LocalCluster, get_task_stream  # noqa: E402

from onnxtrain import OrtGradientForwardBackwardOptimizer  # noqa: E402
from onnxtrain.distributed import ShardWorker, fit_data_parallel  # noqa: E402
from onnxtrain.optim import LearningRateSGD, LearningRateSGDNesterov  # noqa: E402
from onnxtrain.training.callbacks import Callback  # noqa: E402


@pytest.fixture(scope="module")
def client():
    with LocalCluster(n_workers=2, processes=False, threads_per_worker=1,
                      dashboard_address=None) as cluster, Client(cluster) as c:
        yield c


def _union_order(n_samples, n_shards, batch):
    """Row order of one process whose batch j is the union of every shard's
    batch j (shards: np.array_split)."""
    parts = np.array_split(np.arange(n_samples), n_shards)
    steps = max(-(-len(p) // batch) for p in parts)
    return np.concatenate([p[j * batch:(j + 1) * batch]
                           for j in range(steps) for p in parts])


def _assert_same_training(parallel, single):
    """The data-parallel fit followed the one-process curve and weights."""
    assert_allclose(parallel.train_losses_, single.train_losses_, rtol=1e-5)
    for a, b in zip(parallel.get_state(), single.get_state()):
        assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def _one_process(mlp_onnx, X, y, rate, epochs):
    """The one-process fit two shards of 50 rows with batches of 10 follow:
    batches of 20 rows, the unions of the shards' batches."""
    order = _union_order(100, 2, 10)
    return OrtGradientForwardBackwardOptimizer(
        mlp_onnx(), learning_rate=rate, batch_size=20, max_iter=epochs,
        random_state=0).fit(X[order], y[order])


@pytest.mark.parametrize("rate", [
    LearningRateSGD(0.02, learning_rate="constant"),
    LearningRateSGDNesterov(0.01, learning_rate="constant", momentum=0.9)])
def test_averaged_shards_follow_the_full_batch_curve(client, mlp_onnx,
                                                     regression_data, rate):
    X, y = regression_data
    X, y = X[:100], y[:100]  # two shards of 50 rows, batches of 10: 5 steps
    parallel = OrtGradientForwardBackwardOptimizer(
        mlp_onnx(), learning_rate=rate, batch_size=10, random_state=0)
    fit_data_parallel(parallel, X, y, client, max_iter=3)
    single = _one_process(mlp_onnx, X, y, rate, 3)
    _assert_same_training(parallel, single)
    assert parallel.n_iter_ == 3 and parallel.t_ == 300
    # a worker's sessions take the worker's threads (threads_per_worker=1)
    worker = client.submit(ShardWorker, parallel, X[:50], y[:50], actor=True).result()
    assert worker.session_threads().result() == 1
    assert parallel._trainer.step_count == single._trainer.step_count == 15


def test_sync_every_k_steps_is_local_sgd(client, mlp_onnx, regression_data):
    """sync_every=5 (one average per epoch): each worker runs its 5 steps
    alone; the result is the mean of two independent epochs."""
    X, y = regression_data
    X, y = X[:100], y[:100]
    rate = LearningRateSGD(0.02, learning_rate="constant")
    parallel = OrtGradientForwardBackwardOptimizer(
        mlp_onnx(), learning_rate=rate, batch_size=10, random_state=0)
    fit_data_parallel(parallel, X, y, client, max_iter=1, sync_every=5)
    shards = []
    for part in (slice(0, 50), slice(50, 100)):
        est = OrtGradientForwardBackwardOptimizer(
            mlp_onnx(), learning_rate=rate, batch_size=10, max_iter=1,
            random_state=0).fit(X[part], y[part])
        shards.append(est)
    for i, weight in enumerate(parallel.get_state()):
        assert_allclose(weight, (shards[0].get_state()[i] + shards[1].get_state()[i]) / 2,
                        rtol=1e-5, atol=1e-6)
    assert parallel.train_losses_[0] == pytest.approx(
        np.mean([s.train_losses_[0] for s in shards]), rel=1e-6)


def test_bad_arguments_raise_before_any_work(client, mlp_onnx, regression_data):
    X, y = regression_data
    est = OrtGradientForwardBackwardOptimizer(mlp_onnx(), shuffle=True)
    with pytest.raises(ValueError, match="shuffle=False"):
        fit_data_parallel(est, X, y, client)
    est = OrtGradientForwardBackwardOptimizer(mlp_onnx())
    with pytest.raises(ValueError, match="sync_every must be an int >= 1"):
        fit_data_parallel(est, X, y, client, sync_every=0)
    with pytest.raises(TypeError, match="not list"):
        fit_data_parallel([], X, y, client)
    assert not hasattr(est, "weights_to_train_")


# ---------------------------------------------------------- dask inputs
_LIVE = {"now": 0, "max": 0, "off_worker": 0}


def _partition(i, rows, on_worker=True, features=5):
    """Partition ``i``: rows drawn from its index, so that they exist only
    where this runs; counts the partitions alive in the process."""
    if on_worker:
        from distributed import get_worker
        try:
            get_worker()
        except ValueError:
            _LIVE["off_worker"] += 1
    rng = np.random.RandomState(100 + i)
    X = rng.randn(rows, features).astype(np.float32)
    y = (X.sum(axis=1) / features + 0.1 * rng.randn(rows)).astype(np.float32)
    data = np.concatenate([X, y[:, None]], axis=1)
    if on_worker:
        _LIVE["now"] += 1
        _LIVE["max"] = max(_LIVE["max"], _LIVE["now"])
        weakref.finalize(data, _release)
    return data


def _release():
    _LIVE["now"] -= 1


def _dask_data(n_parts, rows, frame=False, features=5):
    """(X, y) as dask collections of ``n_parts`` partitions built on the
    workers, and the same rows as numpy arrays."""
    blocks = [delayed(_partition)(i, rows, features=features) for i in range(n_parts)]
    both = da.concatenate([da.from_delayed(b, (rows, features + 1), np.float32)
                           for b in blocks])
    X, y = both[:, :features], both[:, features]
    full = np.concatenate([_partition(i, rows, False, features) for i in range(n_parts)])
    if frame:
        dd = pytest.importorskip("dask.dataframe")
        X = dd.from_dask_array(X, columns=[f"f{j}" for j in range(5)])
        y = dd.from_dask_array(y)
    return X, y, full[:, :features], full[:, features]


def _bytes_moved(client):
    """Bytes the workers sent so far: to other workers, and to the client
    (directly: no ``who``, or through the scheduler)."""
    client_side = {None, client.scheduler.address}
    logs = client.run(lambda dask_worker: [(e["who"], e["total"])
                                           for e in dask_worker.transfer_outgoing_log])
    entries = [e for log in logs.values() for e in log]
    return (sum(n for who, n in entries if who not in client_side),
            sum(n for who, n in entries if who in client_side))


@pytest.mark.parametrize("frame", [False, True])
def test_dask_partitions_follow_the_full_batch_curve(client, mlp_onnx, frame):
    """4 partitions of 25 rows, 2 shards, batches of 10: batch 3 of each
    shard spans two partitions; the curve is the one-process curve."""
    X, y, Xn, yn = _dask_data(4, 25, frame)
    rate = LearningRateSGDNesterov(0.01, learning_rate="constant", momentum=0.9)
    parallel = OrtGradientForwardBackwardOptimizer(
        mlp_onnx(), learning_rate=rate, batch_size=10, random_state=0)
    fit_data_parallel(parallel, X, y, client, max_iter=3)
    single = _one_process(mlp_onnx, Xn, yn, rate, 3)
    _assert_same_training(parallel, single)
    assert parallel.t_ == 300 and parallel._trainer.step_count == 15
    if frame:
        assert list(parallel.feature_names_in_) == [f"f{j}" for j in range(5)]


def test_partitions_smaller_than_a_batch_follow_the_full_batch_curve(client, mlp_onnx):
    """20 partitions of 5 rows, batches of 10: each batch spans two
    partitions (the batch size was capped at the largest partition, 5 rows,
    twice as many steps); best_loss_ is that of the curve."""
    X, y, Xn, yn = _dask_data(20, 5)
    rate = LearningRateSGD(0.02, learning_rate="constant")
    parallel = OrtGradientForwardBackwardOptimizer(
        mlp_onnx(), learning_rate=rate, batch_size=10, random_state=0)
    fit_data_parallel(parallel, X, y, client, max_iter=2)
    single = _one_process(mlp_onnx, Xn, yn, rate, 2)
    _assert_same_training(parallel, single)
    assert parallel._trainer.step_count == single._trainer.step_count == 10
    assert parallel.best_loss_ == min(parallel.train_losses_)


def test_a_penalty_and_a_closed_client_are_refused_before_any_work(mlp_onnx,
                                                                   regression_data):
    """Each shard would scale a learning penalty by its own rows (once per
    shard in the average): refused, as a closed client is, with the
    estimator left unfitted."""
    X, y = regression_data
    est = OrtGradientForwardBackwardOptimizer(mlp_onnx(), learning_penalty="elastic")
    with LocalCluster(n_workers=1, processes=False, threads_per_worker=1,
                      dashboard_address=None) as cluster, Client(cluster) as c:
        with pytest.raises(ValueError, match="learning penalty"):
            fit_data_parallel(est, X[:40], y[:40], c)
    with pytest.raises(ValueError, match="closed"):
        fit_data_parallel(est.set_params(learning_penalty=None), X[:40], y[:40], c)
    assert not hasattr(est, "weights_to_train_")


def test_a_dataframe_with_a_text_column_is_refused_clearly(client, mlp_onnx):
    dd = pytest.importorskip("dask.dataframe")
    import pandas as pd
    frame = pd.DataFrame({f"f{j}": np.arange(20, dtype=np.float32) for j in range(4)})
    frame["f4"] = ["a"] * 20
    X = dd.from_pandas(frame, npartitions=2)
    y = dd.from_pandas(pd.Series(np.zeros(20, np.float32)), npartitions=2)
    est = OrtGradientForwardBackwardOptimizer(mlp_onnx(), batch_size=5)
    with pytest.raises(ValueError, match=r"columns \['f4'\] that are not numeric"):
        fit_data_parallel(est, X, y, client)
    assert not hasattr(est, "weights_to_train_")


def _batchnorm1d_model():
    """x (N, 4) -> MatMul -> BatchNormalization in training mode over
    (N, 8) -> MatMul -> y (N, 1)."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(v.astype(np.float32), n) for n, v in (
        ("W", rng.standard_normal((4, 8))), ("scale", np.ones(8)), ("B", np.zeros(8)),
        ("mean", np.zeros(8)), ("var", np.ones(8)), ("V", rng.standard_normal((8, 1))))]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]),
             helper.make_node("BatchNormalization", ["h", "scale", "B", "mean", "var"],
                              ["n", "new_mean", "new_var"], training_mode=1),
             helper.make_node("MatMul", ["n", "V"], ["y"])]
    graph = helper.make_graph(
        nodes, "bn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_a_shard_batch_of_one_row_through_batchnorm_is_refused_first(client):
    """10 rows in shards of 5, batches of 4: each shard's last batch is one
    row through a BatchNorm over (N, 8) (the 10 rows alone would not have
    one), refused before any work as fit refuses it (it failed on a
    worker, mid-fit)."""
    X = np.random.default_rng(1).standard_normal((10, 4)).astype(np.float32)
    y = X.sum(1, keepdims=True)
    est = OrtGradientForwardBackwardOptimizer(_batchnorm1d_model(), batch_size=4)
    with pytest.raises(ValueError, match="batch of 1 row reaches BatchNormalization"):
        fit_data_parallel(est, X, y, client, n_shards=2, max_iter=1)
    assert not hasattr(est, "weights_to_train_")


_CALLS = []


class _Counting(Callback):
    def on_batch_end(self, estimator, batch, loss):
        _CALLS.append(batch)


def test_the_workers_copies_run_no_callback(client, mlp_onnx, regression_data):
    """Callbacks travel with the estimator; each shard's steps would call
    them (an MLflowLogger opened one run per shard and step): the workers'
    copies have none, the caller's estimator keeps its own."""
    X, y = regression_data
    counting = _Counting()
    est = OrtGradientForwardBackwardOptimizer(mlp_onnx(), batch_size=10,
                                              callbacks=[counting], random_state=0)
    _CALLS.clear()  # the workers run in this process (processes=False)
    fit_data_parallel(est, X[:40], y[:40], client, max_iter=1)
    assert _CALLS == [] and est.callbacks == [counting]


def test_dask_rows_stay_on_the_workers_and_stream(client, mlp_onnx):
    """64 partitions of 10 rows, 2 shards: the rows are made on the
    workers, never sent to the client (it receives the final state and two
    floats a round); a few partitions are alive at once; local SGD
    (sync_every=3, segments across partitions) gives the same weights as
    the numpy shards."""
    X, y, Xn, yn = _dask_data(64, 10, features=40)
    rate = LearningRateSGD(0.02, learning_rate="constant")
    _LIVE.update(now=0, max=0, off_worker=0)
    between0, client0 = _bytes_moved(client)
    parallel = OrtGradientForwardBackwardOptimizer(
        mlp_onnx(n_features=40), learning_rate=rate, batch_size=4, random_state=0)
    fit_data_parallel(parallel, X, y, client, max_iter=1, sync_every=3)
    between, to_client = (a - b for a, b in zip(_bytes_moved(client), (between0, client0)))
    state_bytes = len(pickle.dumps(parallel.get_state(include_optimizer=True)))
    rounds = 27  # 80 batches a shard, 3 a round
    assert _LIVE["off_worker"] == 0
    assert to_client <= state_bytes + 200 * rounds < Xn.nbytes / 4
    assert _LIVE["max"] <= 12  # of 64, 32 per shard
    for _ in range(100):  # the workers forget the last ones asynchronously
        if _LIVE["now"] == 0:
            break
        time.sleep(0.02)
    assert _LIVE["now"] == 0
    reference = OrtGradientForwardBackwardOptimizer(
        mlp_onnx(n_features=40), learning_rate=rate, batch_size=4, random_state=0)
    fit_data_parallel(reference, Xn, yn, client, max_iter=1, sync_every=3)
    assert_allclose(parallel.train_losses_, reference.train_losses_, rtol=1e-5)
    for a, b in zip(parallel.get_state(), reference.get_state()):
        assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_tree_reduction_on_four_workers(mlp_onnx, regression_data):
    """4 shards on 4 workers: averages by pairs on the workers (3 per
    round, on more than one worker), copies down a tree; the curve is
    still the one-process curve."""
    X, y = regression_data
    X, y = X[:100], y[:100]
    rate = LearningRateSGD(0.02, learning_rate="constant")
    parallel = OrtGradientForwardBackwardOptimizer(
        mlp_onnx(), learning_rate=rate, batch_size=5, random_state=0)
    with LocalCluster(n_workers=4, processes=False, threads_per_worker=1,
                      dashboard_address=":0") as cluster, Client(cluster) as c, \
            get_task_stream(c) as stream:
        fit_data_parallel(parallel, X, y, c, max_iter=2)
        workers = set(c.scheduler_info()["workers"])
    order = _union_order(100, 4, 5)
    single = OrtGradientForwardBackwardOptimizer(
        mlp_onnx(), learning_rate=rate, batch_size=20, max_iter=2,
        random_state=0).fit(X[order], y[order])
    assert_allclose(parallel.train_losses_, single.train_losses_, rtol=1e-5)
    combines = [t for t in stream.data if str(t["key"]).startswith("_combine")]
    rounds = 2 * 5
    assert len(combines) == 3 * rounds
    assert len({t["worker"] for t in combines}) > 1
    assert {t["worker"] for t in stream.data
            if str(t["key"]).startswith("_same")} == workers


def test_dask_bad_arguments_raise_before_any_work(client, mlp_onnx):
    X, y, Xn, yn = _dask_data(4, 25)
    est = OrtGradientForwardBackwardOptimizer(mlp_onnx())
    with pytest.raises(ValueError, match="n_shards=5 is more than the 4 partitions"):
        fit_data_parallel(est, X, y, client, n_shards=5)
    with pytest.raises(ValueError, match="X has 100 rows, y 99"):
        fit_data_parallel(est, X, yn[:99], client)
    with pytest.raises(TypeError, match="y is a dask collection but X is not"):
        fit_data_parallel(est, Xn, y, client)
    assert not hasattr(est, "weights_to_train_")


def test_dask_classifier_labels_found_on_the_workers(client):
    """A classifier on dask.array labels (no ``classes``): the labels are
    computed on the workers and training matches the numpy input."""
    import warnings
    from sklearn.neural_network import MLPClassifier
    from onnxtrain import OrtGradientForwardBackwardClassifier, to_onnx
    rng = np.random.RandomState(0)
    X = rng.randn(100, 4).astype(np.float32)
    y = np.where(X[:, 0] + X[:, 1] > 0, 3, 7).astype(np.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        skl = MLPClassifier((8,), max_iter=1).fit(X, y)
    onx = to_onnx(skl, X[:1], target_opset=15, options={id(skl): {"zipmap": False}})
    fitted = []
    for Xi, yi in ((X, y), (da.from_array(X, chunks=25), da.from_array(y, chunks=25))):
        est = OrtGradientForwardBackwardClassifier(onx, batch_size=10, random_state=0,
                                                   shuffle=False)
        fitted.append(fit_data_parallel(est, Xi, yi, client, max_iter=2))
    assert list(fitted[1].classes_) == [3, 7]
    assert_allclose(fitted[1].train_losses_, fitted[0].train_losses_, rtol=1e-6)


_LOADS = []


def _frame(i):
    """Partition ``i`` of a dask.dataframe holding features and target."""
    import pandas as pd
    _LOADS.append(i)
    data = _partition(i, 25, on_worker=False)
    return pd.DataFrame(data, columns=[f"f{j}" for j in range(5)] + ["target"])


def test_dask_dataframe_columns_of_one_frame_are_read_once(client, mlp_onnx):
    """X and y selected from one dask.dataframe of unknown lengths: each
    partition is read once to count the rows and once an epoch (not once
    for X and once for y), and training follows the numpy input's curve."""
    dd = pytest.importorskip("dask.dataframe")
    frame = dd.from_delayed([delayed(_frame)(i) for i in range(4)], meta=_frame(0))
    X, y = frame[[f"f{j}" for j in range(5)]], frame["target"]
    Xn = np.concatenate([_partition(i, 25, on_worker=False) for i in range(4)])
    rate = LearningRateSGD(0.02, learning_rate="constant")
    fitted = []
    _LOADS.clear()
    for Xi, yi in ((X, y), (Xn[:, :5], Xn[:, 5])):
        est = OrtGradientForwardBackwardOptimizer(mlp_onnx(), learning_rate=rate,
                                                  batch_size=10, random_state=0)
        fitted.append(fit_data_parallel(est, Xi, yi, client, max_iter=2))
    # once to count the rows, then once an epoch
    assert sorted(_LOADS) == sorted(list(range(4)) * 3)
    assert_allclose(fitted[0].train_losses_, fitted[1].train_losses_, rtol=1e-5)
