"""What the divergence roll-back costs per epoch: the copy of the weights
every epoch (every ``partial_fit`` call) starts with, in memory or in a
temporary file (``onnxtrain/training/rollback.py``), and its finiteness
check.

Run: ``python benchmarks/bench_rollback.py [--repeat 15]``.

Weights: float32 CPU OrtValues of random values, in layouts of the sizes
of a small MLP, of resnet18 (bench_models.py: 62 weights, 42.7 MiB) and of
the AlexNet-style net of bench_small.py (16 weights, 109.6 MiB). Timed, in
turn within each repeat (the median over the repeats and the spread
max/min - 1 printed, in milliseconds, on the one thread numpy uses):

- ``isfinite+copy``: the former code, ``np.isfinite(v).all()`` on every
  weight (a bool temporary the size of each) then a copy into the arrays
  of the last copy;
- ``check``: :func:`onnxtrain.training.rollback.all_finite` on every weight;
- ``memory``: ``WeightsCopy.keep`` with the copy kept in memory;
- ``file``: ``WeightsCopy.keep`` with the copy in the temporary file;
- ``restore``: reading the file back into the weights (a divergence).

The peak memory a check adds (``check MB``: the former one, then the
current one) is measured on the largest weight with ``tracemalloc``,
which sees numpy's allocations.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import tracemalloc

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import onnxtrain.training.rollback as rollback  # noqa: E402
from onnxtrain.runtime import to_ortvalue  # noqa: E402
from onnxtrain.runtime.engine import copy_arrays  # noqa: E402

#: name -> (MiB of float32 weights, number of weights)
LAYOUTS = {"mlp": (0.0625, 6), "4 MiB": (4, 8), "resnet18": (42.7, 62),
           "alexnet": (109.6, 16)}


def weights_of(mib, count, seed=0):
    """``count`` float32 OrtValues of ``mib`` MiB in all, of unequal sizes
    (as layers are)."""
    rng = np.random.RandomState(seed)
    shares = rng.uniform(0.2, 1.0, count)
    sizes = np.maximum(1, (shares / shares.sum() * mib * 2 ** 20 / 4).astype(int))
    return [to_ortvalue(rng.randn(n).astype(np.float32), "cpu", owned=True)
            for n in sizes]


def check_peak_mb(check, array):
    """Peak memory (MB) numpy allocates while ``check(array)`` runs."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    check(array)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 2 ** 20


def measure(weights, repeat):
    """name -> list of seconds."""
    old = [None]
    in_memory, in_file = rollback.WeightsCopy(True), rollback.WeightsCopy(True)

    def former():
        values = [w.numpy() for w in weights]
        assert all(np.isfinite(v).all() for v in values)
        old[0] = copy_arrays(values, old[0])

    def check():
        assert all(rollback.all_finite(w.numpy()) for w in weights)

    def memory():
        rollback.ROLLBACK_FILE_MIN_BYTES = 1 << 62
        assert in_memory.keep(weights) and not in_memory.in_file

    def file():
        rollback.ROLLBACK_FILE_MIN_BYTES = 0
        assert in_file.keep(weights) and in_file.in_file

    def restore():
        in_file.restore(weights)

    cases = {"isfinite+copy": former, "check": check, "memory": memory,
             "file": file, "restore": restore}
    for case in cases.values():  # the arrays and the file's pages exist
        case()
    times = {name: [] for name in cases}
    for _ in range(repeat):
        for name, case in cases.items():
            start = time.perf_counter()
            case()
            times[name].append(time.perf_counter() - start)
    in_file.close()
    return times


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args(argv)
    saved = rollback.ROLLBACK_FILE_MIN_BYTES
    names = ["isfinite+copy", "check", "memory", "file", "restore"]
    print(f"{'weights':10} {'MiB':>6} " + " ".join(f"{n:>15}" for n in names)
          + f" {'check MB':>12}")
    try:
        for layout, (mib, count) in LAYOUTS.items():
            weights = weights_of(mib, count)
            times = measure(weights, args.repeat)
            cells = []
            for name in names:
                t = np.array(times[name]) * 1e3
                cells.append(f"{np.median(t):8.2f} {t.max() / t.min() - 1:5.0%}")
            largest = max((w.numpy() for w in weights), key=lambda a: a.size)
            peaks = (check_peak_mb(lambda a: np.isfinite(a).all(), largest),
                     check_peak_mb(rollback.all_finite, largest))
            print(f"{layout:10} {mib:6.1f} " + " ".join(f"{c:>15}" for c in cells)
                  + f" {peaks[0]:5.1f} {peaks[1]:5.2f}")
    finally:
        rollback.ROLLBACK_FILE_MIN_BYTES = saved


if __name__ == "__main__":
    main()
