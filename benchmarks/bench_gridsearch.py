"""GridSearchCV of onnxtrain MLPs: n_jobs=2 against n_jobs=1.

Each onnxruntime session sizes its thread pool to every core unless told
otherwise, so two joblib workers each running sessions of ``cpu_count()``
threads oversubscribe the machine. onnxtrain's sessions take joblib's
per-worker budget (``cpu_count() // n_jobs``, see
:mod:`onnxtrain.runtime.threads`). The script times three runs:

- ``n_jobs=1``;
- ``n_jobs=2`` with onnxtrain's default (the budget: "after");
- ``n_jobs=2`` with every worker's budget set to ``cpu_count()``
  (``parallel_config(inner_max_num_threads=cpu_count())``), which is what
  the sessions used before onnxtrain read the budget ("before");

and prints the speedups and the threads a worker's sessions got.

Usage: ``PYTHONPATH=. python benchmarks/bench_gridsearch.py [--repeat 3]``
(the workers import onnxtrain from the path, not from the script's folder)
"""
from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
from joblib import cpu_count, parallel_config
from sklearn.datasets import make_regression
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import GridSearchCV

from onnxtrain.neural_network import MLPRegressor


def _search(X, y, n_jobs, inner=None):
    grid = {"hidden_layer_sizes": [(32,), (64,)], "alpha": [1e-4, 1e-3],
            "learning_rate_init": [1e-3, 1e-2]}
    est = MLPRegressor(max_iter=40, random_state=0, batch_size=64)
    search = GridSearchCV(est, grid, cv=3, n_jobs=n_jobs)
    start = time.perf_counter()
    config = {} if inner is None else {"backend": "loky",
                                       "inner_max_num_threads": inner}
    with warnings.catch_warnings(), parallel_config(**config):
        warnings.simplefilter("ignore", ConvergenceWarning)
        search.fit(X, y)
    return time.perf_counter() - start


def _worker_threads(inner=None):
    from joblib import Parallel, delayed

    def threads():
        try:
            from onnxtrain.runtime.threads import current_session_threads
        except ImportError:  # an onnxtrain without n_threads
            return "onnxruntime's default"
        return current_session_threads()

    config = {} if inner is None else {"inner_max_num_threads": inner}
    with parallel_config(backend="loky", **config):
        return Parallel(n_jobs=2)(delayed(threads)() for _ in range(2))[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    X, y = make_regression(n_samples=3000, n_features=20, noise=5.0, random_state=0)
    X = X.astype(np.float32)
    _search(X, y, 2)  # starts the loky workers once
    cores = cpu_count()
    runs = {"n_jobs=1": (1, None), "n_jobs=2 (budget, after)": (2, None),
            f"n_jobs=2 ({cores} threads/worker, before)": (2, cores)}
    times = {name: min(_search(X, y, *spec) for _ in range(args.repeat))
             for name, spec in runs.items()}
    serial = times["n_jobs=1"]
    import onnxtrain
    print(f"onnxtrain: {onnxtrain.__file__}")
    print(f"cores: {cores}; threads of a worker's sessions: "
          f"{_worker_threads()} (budget), {_worker_threads(cores)} (before)")
    print(f"{'run':<40} {'seconds':>8} {'speedup':>8}")
    for name, seconds in times.items():
        print(f"{name:<40} {seconds:8.2f} {serial / seconds:8.2f}")


if __name__ == "__main__":
    main()
