"""Data-parallel training on Dask: averaged shards == the full batch."""
import numpy as np
import pytest
from numpy.testing import assert_allclose

pytest.importorskip("dask.distributed")
from dask.distributed import Client, LocalCluster  # noqa: E402

from onnxtrain import OrtGradientForwardBackwardOptimizer  # noqa: E402
from onnxtrain.distributed import ShardWorker, fit_data_parallel  # noqa: E402
from onnxtrain.optim import LearningRateSGD, LearningRateSGDNesterov  # noqa: E402


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
    order = _union_order(100, 2, 10)
    single = OrtGradientForwardBackwardOptimizer(
        mlp_onnx(), learning_rate=rate, batch_size=20, max_iter=3,
        random_state=0).fit(X[order], y[order])
    assert_allclose(parallel.train_losses_, single.train_losses_, rtol=1e-5)
    for a, b in zip(parallel.get_state(), single.get_state()):
        assert_allclose(a, b, rtol=1e-4, atol=1e-6)
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
