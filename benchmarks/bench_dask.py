"""Data-parallel training on a LocalCluster of worker processes: throughput
against the number of workers, bytes moved per round, memory when
streaming.

Run: ``python benchmarks/bench_dask.py [--rows 131072] [--workers 1 2 4]``.

The data is a ``dask.array`` whose partitions are drawn on the workers
(nothing of it exists on the client). The model is an MLP
(``--features`` -> 256 -> 256 -> 1, float32, plain SGD), each worker's
batch ``--batch`` rows (weak scaling: a step trains ``n_workers * batch``
rows), ``sync_every`` 1 (exact SGD) and 8 (local SGD), one epoch, timed
after a warm-up fit on the same cluster. Every worker has one thread.
The tables print:

1. per number of workers and ``sync_every``: rows per second, the ratio
   to one process training the same batches with ``partial_fit`` and no
   Dask (measured in the same run), the ratio to one Dask worker, the
   rounds, the bytes sent per round between workers and to the client over
   the whole fit (the workers' ``transfer_outgoing_log``), the round time,
   the step time measured alone in one worker of that cluster and what a
   round costs beyond its k steps; the one-process step time and the
   state size S above the table;
2. streaming: a dataset of ``--stream-mb`` MB on 2 workers, its shard size
   and each worker's peak resident memory above what it held before.
"""
from __future__ import annotations

import argparse
import os
import pickle
import resource
import sys
import time
import warnings

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
# the worker processes import this checkout too
os.environ["PYTHONPATH"] = os.pathsep.join(
    [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])

import dask  # noqa: E402
import dask.array as da  # noqa: E402
from dask.distributed import Client, LocalCluster  # noqa: E402

from onnxtrain import OrtGradientForwardBackwardOptimizer, to_onnx  # noqa: E402
from onnxtrain.distributed import fit_data_parallel  # noqa: E402
from onnxtrain.optim import LearningRateSGD  # noqa: E402


def partition(i, rows, features):
    """Partition ``i`` of the dataset, drawn where it is computed."""
    rng = np.random.default_rng(i)
    X = rng.standard_normal((rows, features), dtype=np.float32)
    y = np.tanh(X[:, :8].sum(axis=1)) + 0.1 * rng.standard_normal(rows, dtype=np.float32)
    return np.concatenate([X, y[:, None].astype(np.float32)], axis=1)


def dataset(n_parts, rows, features):
    blocks = [dask.delayed(partition)(i, rows, features) for i in range(n_parts)]
    both = da.concatenate([da.from_delayed(b, (rows, features + 1), np.float32)
                           for b in blocks])
    return both[:, :features], both[:, features]


def mlp(features, hidden):
    from sklearn.neural_network import MLPRegressor
    rng = np.random.RandomState(0)
    X = rng.randn(32, features).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        skl = MLPRegressor(hidden_layer_sizes=hidden, solver="sgd", max_iter=1)
        skl.fit(X, rng.randn(32))
    return to_onnx(skl, X[:1], target_opset=15)


def estimator(model, batch):
    return OrtGradientForwardBackwardOptimizer(
        model, learning_rate=LearningRateSGD(1e-3, learning_rate="constant"),
        batch_size=batch, random_state=0, n_threads=1)


def bytes_moved(client):
    """Bytes the workers sent so far: to workers, and to the client
    (directly: no ``who``, or through the scheduler)."""
    client_side = {None, client.scheduler.address}
    logs = client.run(lambda dask_worker: [(e["who"], e["total"])
                                           for e in dask_worker.transfer_outgoing_log])
    entries = [e for log in logs.values() for e in log]
    return (sum(n for who, n in entries if who not in client_side),
            sum(n for who, n in entries if who in client_side))


def one_process(model, args):
    """Rows per second of partial_fit on the same batches, no Dask."""
    est = estimator(model, args.batch)
    data = partition(0, args.batch * 64, args.features)
    X, y = data[:, :-1], data[:, -1]
    est.partial_fit(X[:args.batch], y[:args.batch])
    start = time.perf_counter()
    for _ in range(2):
        for s in range(0, len(X), args.batch):
            est.partial_fit(X[s:s + args.batch], y[s:s + args.batch])
    return 2 * len(X) / (time.perf_counter() - start)


def cluster(n_workers):
    return LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                        dashboard_address=":0", memory_limit=0)


def scaling(model, args, base):
    rows = []
    X, y = dataset(args.rows // args.part_rows, args.part_rows, args.features)
    for n in args.workers:
        with cluster(n) as c, Client(c) as client:
            fit_data_parallel(estimator(model, args.batch), X[:n * 4 * args.part_rows],
                              y[:n * 4 * args.part_rows], client, max_iter=1)
            # the step on a worker, alone, under the same contention
            on_worker = client.submit(one_process, model, args, pure=False).result()
            for sync_every in args.sync_every:
                before = bytes_moved(client)
                est = estimator(model, args.batch)
                start = time.perf_counter()
                fit_data_parallel(est, X, y, client, max_iter=1, sync_every=sync_every)
                seconds = time.perf_counter() - start
                between, to_client = (a - b for a, b in zip(bytes_moved(client), before))
                n_rounds = -(-args.rows // (n * args.batch * sync_every))
                rows.append(dict(n=n, k=sync_every, rate=args.rows / seconds,
                                 step_ms=1e3 * args.batch / on_worker,
                                 rounds=n_rounds, between=between / n_rounds,
                                 to_client=to_client, round_ms=1e3 * seconds / n_rounds))
    state = len(pickle.dumps(est.get_state(include_optimizer=True)))
    one = {r["k"]: r["rate"] for r in rows if r["n"] == rows[0]["n"]}
    print(f"\n1. Throughput, {args.rows} rows x {args.features} features, MLP "
          f"{args.features}-256-256-1, batch {args.batch} per worker, 1 thread each")
    print(f"   one process, no Dask: {base:,.0f} rows/s, step {1e3 * args.batch / base:.2f} "
          f"ms; state S (pickled weights + optimizer) {state:,} B")
    print("| workers | sync_every | rows/s | / one process | / 1 worker | rounds | "
          "worker->worker B/round | ->client B (whole fit) | round ms | "
          "step on a worker ms | round - k steps ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['n']} | {r['k']} | {r['rate']:,.0f} | {r['rate'] / base:.2f} | "
              f"{r['rate'] / one[r['k']]:.2f} | {r['rounds']} | {r['between']:,.0f} | "
              f"{r['to_client']:,.0f} | {r['round_ms']:.2f} | {r['step_ms']:.2f} | "
              f"{r['round_ms'] - r['k'] * r['step_ms']:.2f} |")


def peak_rss_mb(dask_worker=None):
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mb(dask_worker=None):
    import psutil
    return psutil.Process().memory_info().rss / 2 ** 20


def streaming(args):
    part_rows = 8192
    n_parts = max(2, int(args.stream_mb * 2 ** 20 / (part_rows * (args.features + 1) * 4)))
    X, y = dataset(n_parts, part_rows, args.features)
    model = mlp(args.features, (16,))
    with cluster(2) as c, Client(c) as client:
        fit_data_parallel(estimator(model, 2048), X[:4 * part_rows], y[:4 * part_rows],
                          client, max_iter=1)
        held = client.run(rss_mb)
        start = time.perf_counter()
        fit_data_parallel(estimator(model, 2048), X, y, client, max_iter=1)
        seconds = time.perf_counter() - start
        peak = client.run(peak_rss_mb)
    shard_mb = (X.nbytes + y.nbytes) / 2 / 2 ** 20
    print(f"\n2. Streaming: {(X.nbytes + y.nbytes) / 2 ** 20:,.0f} MB in {n_parts} "
          f"partitions of {part_rows * (args.features + 1) * 4 / 2 ** 20:.1f} MB, "
          f"2 workers, MLP {args.features}-16-1, batch 2048, {seconds:.1f} s")
    print("| worker | shard MB | RSS before MB | peak RSS - before MB |")
    print("|---|---:|---:|---:|")
    for w in sorted(held):
        print(f"| {w.rsplit(':', 1)[-1]} | {shard_mb:,.0f} | {held[w]:,.0f} | "
              f"{peak[w] - held[w]:,.0f} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=131072)
    parser.add_argument("--part-rows", type=int, default=2048)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--sync-every", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--stream-mb", type=float, default=512)
    args = parser.parse_args()
    model = mlp(args.features, (256, 256))
    base = one_process(model, args)
    scaling(model, args, base)
    if args.stream_mb > 0:
        streaming(args)


if __name__ == "__main__":
    main()
