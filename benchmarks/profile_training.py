"""Where the time of a training step goes: onnxruntime's profiler on one
workload of bench_training.py, kernel time summed per operator type.

Run: ``python benchmarks/profile_training.py [--workload W4] [--path loop]
[--threads N] [--nodes 20]``.

The fit runs twice: once without the profiler (wall time per step, the
number to compare with bench_training.py), once with it (the profiler adds
its own cost to every kernel, so its per-kernel times are inflated; the
shares and the kernel counts are what to read). Kernels of the Loop bodies
and of the If branches (the fused step's in-place update) are listed with
the others; the Loop and If nodes themselves are left out (their time is
the time of their bodies).

The summary line splits the kernel time between the matrix products
(MatMul, Gemm and the fused forms onnxruntime rewrites them into, Conv)
and every other kernel: the share a faster step could still take from the
non-product kernels. ``--nodes N`` lists the N costliest nodes with the
output shape of their last call, which tells the update of a weight (its
shape) from an activation's gradient (the batch's). ``--threads N`` runs
the sessions on N threads (default: bench_training.py's, every core); one
thread measures the work of each kernel, which a shared machine disturbs
least.
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_training as bench  # noqa: E402


#: Kernels of matrix products (onnxruntime's fusions included): the
#: summary's "products".
PRODUCT_OPS = frozenset({"MatMul", "Gemm", "FusedMatMul", "FusedGemm", "Conv",
                         "FusedConv", "ConvTranspose"})
#: Nodes whose kernel time is that of the kernels of their subgraphs,
#: which the profile lists too.
CONTROL_FLOW_OPS = frozenset({"Loop", "If", "Scan"})


def _kernel_times(prefix):
    """(op type -> [microseconds, calls, durations], node name ->
    [microseconds, calls, op type, output shapes of the last call,
    durations]) from the profiler's JSON files, control-flow nodes left
    out."""
    per_op = collections.defaultdict(lambda: [0, 0, []])
    per_node = collections.defaultdict(lambda: [0, 0, "", "", []])
    suffix = "_kernel_time"
    for path in glob.glob(prefix + "*.json"):
        with open(path, encoding="utf-8") as f:
            events = json.load(f)
        for event in events:
            if (event.get("cat") != "Node" or not event["name"].endswith(suffix)
                    or event["args"].get("op_name") in CONTROL_FLOW_OPS):
                continue
            op = event["args"]["op_name"]
            entry = per_op[op]
            entry[0] += event["dur"]
            entry[1] += 1
            entry[2].append(event["dur"])
            node = per_node[event["name"][:-len(suffix)]]
            node[0] += event["dur"]
            node[1] += 1
            node[2] = op
            node[3] = _shapes(event["args"].get("output_type_shape"))
            node[4].append(event["dur"])
    return per_op, per_node


def _shapes(outputs):
    """'[784, 512]'-like text of a profile event's output shapes."""
    if not isinstance(outputs, list):
        return ""
    return " ".join(str(shape) for output in outputs if isinstance(output, dict)
                    for shape in output.values())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", default="W4", choices=list(bench.WORKLOADS))
    parser.add_argument("--path", default="loop", choices=["split", "fused", "loop"])
    parser.add_argument("--threads", type=int, default=None,
                        help="intra-op threads of the sessions (default: every core)")
    parser.add_argument("--nodes", type=int, default=0,
                        help="list this many of the costliest nodes")
    args = parser.parse_args(argv)
    if args.threads:
        bench.THREADS = args.threads
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
    per_op, per_node = _kernel_times(prefix)
    total = sum(t for t, _, _ in per_op.values())
    # the profiled run covers the cold fit (one epoch per warm-up) and the
    # warm fit: scale the counts to one step of the warm fit
    calls = sum(c for _, c, _ in per_op.values())
    threads = f", {args.threads} thread(s)" if args.threads else ""
    print(f"{args.workload} {args.path}{threads}: {seconds / steps * 1e6:.1f} us per "
          f"step without the profiler ({steps / seconds:.0f} steps/s), "
          f"{profiled_seconds / steps * 1e6:.1f} us with it")
    # the median of a kernel's calls, unlike their mean, ignores the calls
    # another process preempted (milliseconds each on a shared machine)
    print(f"{'op':18} {'share':>6} {'us/call':>8} {'median':>7} {'calls/step':>10}")
    for op, (us, n, durations) in sorted(per_op.items(), key=lambda kv: -kv[1][0]):
        print(f"{op:18} {us / total:6.1%} {us / n:8.1f} {statistics.median(durations):7.1f} "
              f"{n / (2 * steps):10.1f}")
    print(f"{calls} kernels in the two fits: {calls / (2 * steps):.1f} per step")
    products = [v for op, v in per_op.items() if op in PRODUCT_OPS]
    product_us = sum(us for us, _, _ in products)
    other_calls = calls - sum(n for _, n, _ in products)
    print(f"matrix products {product_us / total:.1%} of the kernel time, other "
          f"kernels {1 - product_us / total:.1%} ({other_calls / (2 * steps):.1f} "
          "per step)")
    if args.nodes:
        print(f"\n{'node':40} {'op':12} {'share':>6} {'us/call':>8} {'median':>7} "
              f"{'calls/step':>10}  output shapes (last call)")
        ranked = sorted(per_node.items(), key=lambda kv: -kv[1][0])[:args.nodes]
        for name, (us, n, op, shapes, durations) in ranked:
            print(f"{name[:40]:40} {op[:12]:12} {us / total:6.1%} {us / n:8.1f} "
                  f"{statistics.median(durations):7.1f} {n / (2 * steps):10.2f}  {shapes}")


if __name__ == "__main__":
    main()
