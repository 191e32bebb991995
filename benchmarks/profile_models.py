"""Where the time of a training step of bench_models.py goes: onnxruntime's
profiler on one (model, system), each node's median kernel time over the
steps (the steady state: the first steps' allocations, which once made a
weight gradient's Reshape look 5x dearer, do not count), summed per
operator type, and per node with ``--nodes`` (with its shapes).

Run: ``python benchmarks/profile_models.py [--model resnet18]
[--system api] [--nodes 15] [--threads N] [--stat min] [--parallel]``;
the models are bench_models.py's and bench_small.py's. The profiler adds
its own cost to every kernel: read the shares and the kernel counts, and
take the speed from bench_models.py.

``--stat min`` takes each node's fastest step instead of its median: on a
machine other processes keep busy, a kernel of two threads often waits
for the one the system descheduled, and the minimum shows what the kernel
does when both run. ``--parallel`` (with ``--threads`` 2 or more) says per
operator type how the kernels use the intra-op thread pool, from the
thread statistics onnxruntime's profiler records for every kernel of a
pool of several threads: the kernels that never open a parallel section
(they run on the calling thread alone: a second thread cannot speed them
up) and those that open more than 16 per step (one per slice of the
tensor, as Transpose does for a batch of small transposes: each section
pays the pool's hand-off, and such kernels run slower on two threads than
on one). These counts do not depend on how busy the machine is.
"""
from __future__ import annotations

import argparse
import collections
import gc
import glob
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# the onnxtrain of this checkout, not an installed one
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bench_models as bench  # noqa: E402
import bench_small  # noqa: E402  (its import adds its models to bench.MODELS)


def _node_medians(prefix, stat=np.median):
    """(session file, node name) -> (``stat`` of the microseconds, op type,
    input shapes, output shapes, median number of parallel sections) over
    the runs the profiler recorded (sections: None without thread
    statistics, recorded for pools of several threads only)."""
    runs = collections.defaultdict(list)
    sections = collections.defaultdict(list)
    info = {}
    for path in glob.glob(prefix + "*.json"):
        with open(path, encoding="utf-8") as f:
            events = json.load(f)
        for event in events:
            # a Loop's or an If's time is its body's nodes', recorded too
            if (event.get("cat") == "Node" and event["name"].endswith("_kernel_time")
                    and event["args"].get("op_name") not in ("Loop", "If", "Scan")):
                key = (path, event["name"][:-len("_kernel_time")])
                runs[key].append(event["dur"])
                args = event["args"]
                info[key] = (args["op_name"], args.get("input_type_shape"),
                             args.get("output_type_shape"))
                stats = args.get("thread_scheduling_stats")
                if stats:  # one block size per parallel section
                    sections[key].append(len(stats["main_thread"]["block_size"]))
    return {key: (float(stat(times)),) + info[key]
            + (float(np.median(sections[key])) if sections[key] else None,)
            for key, times in runs.items()}


def _shapes(described):
    return [list(next(iter(d.values()))) for d in described or ()]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="resnet18", choices=[m for m in bench.MODELS if m != "encoder24"]
                        + [m for m in bench_small.SMALL_MODELS if m not in bench.MODELS])
    parser.add_argument("--system", default="api", choices=["api", "estimator"])
    parser.add_argument("--nodes", type=int, default=0,
                        help="also list the slowest nodes")
    parser.add_argument("--threads", type=int, default=0,
                        help="intra-op threads of the sessions (default: all cores)")
    parser.add_argument("--stat", default="median", choices=["median", "min"],
                        help="each node's time over the steps")
    parser.add_argument("--parallel", action="store_true",
                        help="how each operator type uses the thread pool")
    args = parser.parse_args(argv)
    bench.THREADS = args.threads or None
    import onnxtrain.runtime.fused as fused
    import onnxtrain.runtime.sessions as sessions

    folder = tempfile.mkdtemp(prefix="onnxtrain_profile_")
    path = os.path.join(folder, f"{args.model}.onnx")
    params = bench.export(args.model, path)
    prefix = os.path.join(folder, "profile")
    plain = sessions.default_session_options

    def profiled(*a, **k):
        options = plain(*a, **k)
        options.enable_profiling = True
        options.profile_file_prefix = prefix
        return options

    fused.default_session_options = profiled
    sessions.default_session_options = profiled
    if args.system == "api":
        seconds, _ = bench.run_api(args.model, path, params, ort=False)
    else:
        seconds, _ = bench.run_estimator(args.model, path, params)
    gc.collect()  # sessions write their profile when they are released
    cfg = bench.MODELS[args.model]
    nodes = _node_medians(prefix, np.min if args.stat == "min" else np.median)
    per_op = collections.defaultdict(lambda: [0.0, 0])
    for us, op, *_ in nodes.values():
        per_op[op][0] += us
        per_op[op][1] += 1
    total = sum(us for us, _ in per_op.values())
    print(f"{args.model} {args.system}: {sum(seconds) / cfg['steps'] * 1e3:.1f} ms per "
          f"step with the profiler; {args.stat} kernel time {total / 1e3:.1f} ms per step "
          f"over {len(nodes)} kernels")
    print(f"{'op':22} {'share':>6} {'ms/step':>8} {'kernels':>8}")
    for op, (us, n) in sorted(per_op.items(), key=lambda kv: -kv[1][0]):
        print(f"{op:22} {us / total:6.1%} {us / 1e3:8.2f} {n:8d}")
    if args.nodes:
        print(f"\n{'node':40} {'op':14} {'ms/step':>8}  shapes")
        for (_, node), (us, op, ins, outs, _) in sorted(
                nodes.items(), key=lambda kv: -kv[1][0])[:args.nodes]:
            print(f"{node[-40:]:40} {op[:14]:14} {us / 1e3:8.3f}  "
                  f"{_shapes(ins)} -> {_shapes(outs)}")

    if args.parallel:
        _print_parallel(nodes)


#: Parallel sections per step above which a kernel counts as one that
#: hands its work to the pool slice by slice.
MANY_SECTIONS = 16


def _print_parallel(nodes):
    """Per operator type: kernels run on the calling thread alone
    ("serial"), kernels opening more than MANY_SECTIONS parallel sections
    ("sliced"), and their times."""
    per_op = collections.defaultdict(lambda: [0.0, 0, 0.0, 0, 0.0, 0, 0.0])
    for us, op, _, _, sections in nodes.values():
        if sections is None:
            continue
        row = per_op[op]
        row[0] += us
        row[1] += 1
        if sections == 0:
            row[2] += us
            row[3] += 1
        elif sections > MANY_SECTIONS:
            row[4] += us
            row[5] += 1
        row[6] += sections
    if not per_op:
        print("\nno thread statistics: --parallel needs --threads 2 or more")
        return
    total = sum(row[0] for row in per_op.values())
    serial = sum(row[2] for row in per_op.values())
    sliced = sum(row[4] for row in per_op.values())
    print(f"\nkernels on the calling thread alone: {serial / 1e3:.2f} ms of "
          f"{total / 1e3:.2f} ({serial / total:.1%}); opening more than "
          f"{MANY_SECTIONS} parallel sections: {sliced / 1e3:.2f} ms ({sliced / total:.1%})")
    print(f"{'op':22} {'ms/step':>8} {'kernels':>8} {'serial':>8} {'ms':>7} "
          f"{'sliced':>7} {'ms':>7} {'sections':>9}")
    for op, row in sorted(per_op.items(), key=lambda kv: -kv[1][0]):
        print(f"{op:22} {row[0] / 1e3:8.2f} {row[1]:8d} {row[3]:8d} {row[2] / 1e3:7.2f} "
              f"{row[5]:7d} {row[4] / 1e3:7.2f} {row[6]:9.0f}")


if __name__ == "__main__":
    main()
