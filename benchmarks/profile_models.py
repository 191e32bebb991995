"""Where the time of a training step of bench_models.py goes: onnxruntime's
profiler on one (model, system), each node's median kernel time over the
steps (the steady state: the first steps' allocations, which once made a
weight gradient's Reshape look 5x dearer, do not count), summed per
operator type, and per node with ``--nodes`` (with its shapes).

Run: ``python benchmarks/profile_models.py [--model resnet18]
[--system api] [--nodes 15] [--threads N]``; the models are
bench_models.py's and bench_small.py's. The profiler adds its own cost to every
kernel: read the shares and the kernel counts, and take the speed from
bench_models.py.
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


def _node_medians(prefix):
    """(session file, node name) -> (median microseconds, op type, input
    shapes, output shapes) over the runs the profiler recorded."""
    runs = collections.defaultdict(list)
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
    return {key: (float(np.median(times)),) + info[key] for key, times in runs.items()}


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
    nodes = _node_medians(prefix)
    per_op = collections.defaultdict(lambda: [0.0, 0])
    for us, op, _, _ in nodes.values():
        per_op[op][0] += us
        per_op[op][1] += 1
    total = sum(us for us, _ in per_op.values())
    print(f"{args.model} {args.system}: {sum(seconds) / cfg['steps'] * 1e3:.1f} ms per "
          f"step with the profiler; median kernel time {total / 1e3:.1f} ms per step "
          f"over {len(nodes)} kernels")
    print(f"{'op':22} {'share':>6} {'ms/step':>8} {'kernels':>8}")
    for op, (us, n) in sorted(per_op.items(), key=lambda kv: -kv[1][0]):
        print(f"{op:22} {us / total:6.1%} {us / 1e3:8.2f} {n:8d}")
    if args.nodes:
        print(f"\n{'node':40} {'op':14} {'ms/step':>8}  shapes")
        for (_, node), (us, op, ins, outs) in sorted(
                nodes.items(), key=lambda kv: -kv[1][0])[:args.nodes]:
            print(f"{node[-40:]:40} {op[:14]:14} {us / 1e3:8.3f}  "
                  f"{_shapes(ins)} -> {_shapes(outs)}")


if __name__ == "__main__":
    main()
