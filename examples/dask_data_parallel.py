"""Data-parallel training of an MLP graph on Dask workers.
=======================================================

The diabetes data is cut into two shards, one per worker of a
``dask.distributed`` cluster (a ``LocalCluster`` here; a real cluster's
``Client`` is used the same way). :func:`onnxtrain.distributed.fit_data_parallel`
sends each worker a copy of the estimator and its shard; at every step each
worker computes one SGD step on its next batch, and the client averages the
new weights (and momentum velocities), weighted by rows. For SGD that is
averaging the gradients: each step is one step on the union of the two
batches, so the loss curve is the one of a single process whose batches are
those unions, which the script checks and draws (``loss_curves.png``).

Requires ``pip install onnxtrain[dask]``.

Run: ``python examples/dask_data_parallel.py [OUTPUT_DIR]``.
"""
import os
import sys
import warnings

import matplotlib
import numpy
from sklearn.datasets import load_diabetes
from sklearn.exceptions import ConvergenceWarning
from sklearn.neural_network import MLPRegressor
from sklearn.preprocessing import StandardScaler

from onnxtrain import (LearningRateSGDNesterov, OrtGradientForwardBackwardOptimizer,
                       to_onnx)

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

N_WORKERS, BATCH, EPOCHS = 2, 16, 15


def load_data():
    """Standardized diabetes features and target (float32)."""
    X, y = load_diabetes(return_X_y=True)
    X = StandardScaler().fit_transform(X).astype(numpy.float32)
    y = ((y - y.mean()) / y.std()).astype(numpy.float32)
    return X[:432], y[:432]  # 2 shards of 216 rows


def union_order(n_samples, n_shards, batch):
    """Row order of one process whose batch j is every shard's batch j."""
    parts = numpy.array_split(numpy.arange(n_samples), n_shards)
    steps = max(-(-len(p) // batch) for p in parts)
    return numpy.concatenate([p[j * batch:(j + 1) * batch]
                              for j in range(steps) for p in parts])


def main(output_dir="dask_output"):
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:
        print("dask.distributed is not installed: pip install onnxtrain[dask]")
        return {"skipped": "dask.distributed is not installed"}
    from onnxtrain.distributed import fit_data_parallel

    os.makedirs(output_dir, exist_ok=True)
    X, y = load_data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        skl = MLPRegressor(hidden_layer_sizes=(16,), max_iter=1, random_state=0).fit(X, y)
    graph = to_onnx(skl, X[:1])
    rate = LearningRateSGDNesterov(0.01, learning_rate="constant", momentum=0.9)

    def estimator(batch_size, **kwargs):
        return OrtGradientForwardBackwardOptimizer(
            graph, learning_rate=rate, batch_size=batch_size, random_state=0, **kwargs)

    with LocalCluster(n_workers=N_WORKERS, processes=False, threads_per_worker=1,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        parallel = fit_data_parallel(estimator(BATCH), X, y, client, max_iter=EPOCHS)
    order = union_order(X.shape[0], N_WORKERS, BATCH)
    single = estimator(N_WORKERS * BATCH, max_iter=EPOCHS).fit(X[order], y[order])
    gap = float(numpy.max(numpy.abs(numpy.array(parallel.train_losses_)
                                    - single.train_losses_)
                          / numpy.array(single.train_losses_)))
    print(f"{N_WORKERS} workers, batches of {BATCH} rows each; final loss "
          f"{parallel.train_losses_[-1]:.5f}, one process with batches of "
          f"{N_WORKERS * BATCH}: {single.train_losses_[-1]:.5f} (largest "
          f"relative gap {gap:.1e})")

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    epochs = numpy.arange(1, EPOCHS + 1)
    ax.plot(epochs, single.train_losses_, label=f"one process, batch {N_WORKERS * BATCH}")
    ax.plot(epochs, parallel.train_losses_, "o", markerfacecolor="none",
            label=f"{N_WORKERS} Dask workers, batch {BATCH} each")
    ax.set_xlabel("epoch")
    ax.set_ylabel("training loss")
    ax.set_yscale("log")
    ax.legend()
    path = os.path.join(output_dir, "loss_curves.png")
    fig.savefig(path, dpi=80, bbox_inches="tight")
    plt.close(fig)
    return {"losses": parallel.train_losses_, "single_losses": single.train_losses_,
            "max_rel_diff": gap, "pictures": {"loss_curves.png": path}}


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "dask_output")
