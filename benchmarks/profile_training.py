"""Where the time of a training step goes: onnxruntime's profiler on one
workload of bench_training.py, kernel time summed per operator type.

Run: ``python benchmarks/profile_training.py [--workload W4] [--path loop]``.

The fit runs twice: once without the profiler (wall time per step, the
number to compare with bench_training.py), once with it (the profiler adds
its own cost to every kernel, so its per-kernel times are inflated; the
shares and the kernel counts are what to read). Kernels of the Loop bodies
are listed with the others; the Loop nodes themselves are left out (their
time is the time of their bodies).
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_training as bench  # noqa: E402


def _kernel_times(prefix):
    """op type -> [microseconds, calls] from the profiler's JSON files."""
    per_op = collections.defaultdict(lambda: [0, 0])
    for path in glob.glob(prefix + "*.json"):
        with open(path, encoding="utf-8") as f:
            events = json.load(f)
        for event in events:
            if (event.get("cat") == "Node" and event["name"].endswith("_kernel_time")
                    and event["args"].get("op_name") != "Loop"):
                entry = per_op[event["args"]["op_name"]]
                entry[0] += event["dur"]
                entry[1] += 1
    return per_op


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", default="W4", choices=list(bench.WORKLOADS))
    parser.add_argument("--path", default="loop", choices=["split", "fused", "loop"])
    args = parser.parse_args(argv)
    import onnxtrain.runtime.fused as fused
    import onnxtrain.runtime.sessions as sessions

    X, y = bench.load(args.workload)
    onx = bench.onnx_model(args.workload, X, y)
    w = bench.WORKLOADS[args.workload]
    steps = w["epochs"] * -(-X.shape[0] // w["batch"])
    seconds = min(bench.run_onnxtrain(args.workload, X, y, f"onnxtrain-{args.path}",
                                      onx)[0] for _ in range(3))

    folder = tempfile.mkdtemp(prefix="onnxtrain_profile_")
    prefix = os.path.join(folder, "profile")
    plain = sessions.default_session_options

    def profiled(*a, **k):
        options = plain(*a, **k)
        options.enable_profiling = True
        options.profile_file_prefix = prefix
        return options

    fused.default_session_options = profiled
    sessions.default_session_options = profiled
    start = time.perf_counter()
    bench.run_onnxtrain(args.workload, X, y, f"onnxtrain-{args.path}", onx)
    profiled_seconds = time.perf_counter() - start
    import gc
    gc.collect()  # sessions write their profile when they are released
    per_op = _kernel_times(prefix)
    total = sum(t for t, _ in per_op.values())
    # the profiled run covers the cold fit (one epoch per warm-up) and the
    # warm fit: scale the counts to one step of the warm fit
    calls = sum(c for _, c in per_op.values())
    print(f"{args.workload} {args.path}: {seconds / steps * 1e6:.1f} us per step "
          f"without the profiler ({steps / seconds:.0f} steps/s), "
          f"{profiled_seconds / steps * 1e6:.1f} us with it")
    print(f"{'op':18} {'share':>6} {'us/call':>8} {'calls/step':>10}")
    for op, (us, n) in sorted(per_op.items(), key=lambda kv: -kv[1][0]):
        print(f"{op:18} {us / total:6.1%} {us / n:8.1f} {n / (2 * steps):10.1f}")
    print(f"{calls} kernels in the two fits: {calls / (2 * steps):.1f} per step")


if __name__ == "__main__":
    main()
