"""Where the time of a training step of bench_models.py goes: onnxruntime's
profiler on one (model, system), kernel time summed per operator type (and
per node with ``--nodes``).

Run: ``python benchmarks/profile_models.py [--model resnet18]
[--system api] [--nodes 15]``. The profiler adds its own cost to every
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# the onnxtrain of this checkout, not an installed one
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bench_models as bench  # noqa: E402
from profile_training import _kernel_times  # noqa: E402


def _node_times(prefix):
    """node name -> [microseconds, calls, op type]."""
    per_node = collections.defaultdict(lambda: [0, 0, ""])
    for path in glob.glob(prefix + "*.json"):
        with open(path, encoding="utf-8") as f:
            events = json.load(f)
        for event in events:
            if (event.get("cat") == "Node" and event["name"].endswith("_kernel_time")
                    and event["args"].get("op_name") != "Loop"):
                entry = per_node[event["name"][:-len("_kernel_time")]]
                entry[0] += event["dur"]
                entry[1] += 1
                entry[2] = event["args"]["op_name"]
    return per_node


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="resnet18", choices=["resnet18", "encoder"])
    parser.add_argument("--system", default="api", choices=["api", "estimator"])
    parser.add_argument("--nodes", type=int, default=0,
                        help="also list the slowest nodes")
    args = parser.parse_args(argv)
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
    steps = cfg["warmup"] + cfg["steps"]
    per_op = _kernel_times(prefix)
    total = sum(t for t, _ in per_op.values())
    print(f"{args.model} {args.system}: {sum(seconds) / cfg['steps'] * 1e3:.1f} ms per "
          f"step with the profiler; kernels {total / steps / 1e3:.1f} ms per step")
    print(f"{'op':22} {'share':>6} {'ms/step':>8} {'calls/step':>10}")
    for op, (us, n) in sorted(per_op.items(), key=lambda kv: -kv[1][0]):
        print(f"{op:22} {us / total:6.1%} {us / steps / 1e3:8.2f} {n / steps:10.1f}")
    if args.nodes:
        per_node = _node_times(prefix)
        print(f"\n{'node':60} {'op':14} {'ms/step':>8}")
        for node, (us, n, op) in sorted(per_node.items(),
                                         key=lambda kv: -kv[1][0])[:args.nodes]:
            print(f"{node[-60:]:60} {op:14} {us / steps / 1e3:8.2f}")


if __name__ == "__main__":
    main()
