"""What thread safety costs: an IOBinding per thread (or per call) instead
of one shared by every call.

Run: ``python benchmarks/bench_threads.py [--calls 5000] [--repeat 5]``.

``SessionRunner`` used to reuse one IOBinding across calls, which mixed the
rows of concurrent calls or crashed the process; it now keeps one IOBinding
per thread. The script measures, on a digits-sized MLP (64 -> 100 -> 10,
float32) fitted by ``OrtGradientForwardBackwardOptimizer``:

1. the latency of one 1-row inference run through ``SessionRunner`` with
   one shared binding (before; single thread only: it is not thread-safe),
   one binding per thread (now) and one new binding per call (the other
   safe choice), each rebuilt here as a subclass but the current one, and
   of ``estimator.predict`` on 1 row (validation included);
2. the throughput of ``estimator.predict`` (1 row and 256 rows per call)
   with 1 and with 4 threads calling the same estimator.

Each number is the median of ``--repeat`` runs, the three runners
measured in turn ``--repeat`` times; the tables print the ratios measured
in the same run (latency / before; throughput 4 threads / 1 thread).
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import numpy as np
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from onnxtrain.estimators import OrtGradientForwardBackwardOptimizer  # noqa: E402
from onnxtrain.runtime import SessionRunner, to_ortvalue  # noqa: E402


class SharedBindingRunner(SessionRunner):
    """The runner before: one IOBinding reused by every call."""

    def __init__(self, model, device="cpu", options=None):
        super().__init__(model, device, options)
        self._binding = self.session.io_binding()

    def __call__(self, feeds, output_names=None):
        binding = self._binding
        binding.clear_binding_inputs()
        binding.clear_binding_outputs()
        for name, value in feeds.items():
            binding.bind_ortvalue_input(name, value)
        names = self.output_names if output_names is None else output_names
        for name in names:
            binding.bind_output(name, self.device.type, self.device.index)
        self.session.run_with_iobinding(binding)
        return list(binding.get_outputs())


class PerCallBindingRunner(SessionRunner):
    """The other thread-safe choice: a new IOBinding at every call."""

    def __call__(self, feeds, output_names=None):
        binding = self.session.io_binding()
        for name, value in feeds.items():
            binding.bind_ortvalue_input(name, value)
        names = self.output_names if output_names is None else output_names
        for name in names:
            binding.bind_output(name, self.device.type, self.device.index)
        self.session.run_with_iobinding(binding)
        return list(binding.get_outputs())


def mlp_model(rng, n_in=64, hidden=100, n_out=10):
    """X -> relu(X W1 + B1) W2 + B2, float32, batch dim free."""
    def weight(*shape):
        return (0.1 * rng.randn(*shape)).astype(np.float32)

    inits = [numpy_helper.from_array(weight(n_in, hidden), "W1"),
             numpy_helper.from_array(np.zeros(hidden, np.float32), "B1"),
             numpy_helper.from_array(weight(hidden, n_out), "W2"),
             numpy_helper.from_array(np.zeros(n_out, np.float32), "B2")]
    nodes = [helper.make_node("MatMul", ["X", "W1"], ["h0"]),
             helper.make_node("Add", ["h0", "B1"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["h"]),
             helper.make_node("MatMul", ["h", "W2"], ["y0"]),
             helper.make_node("Add", ["y0", "B2"], ["Y"])]
    float_input = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes, "mlp", [float_input("X", TensorProto.FLOAT, [None, n_in])],
        [float_input("Y", TensorProto.FLOAT, [None, n_out])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def median_seconds(function, repeat):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def latency(call, calls, repeat):
    """Microseconds per call."""
    def run():
        for _ in range(calls):
            call()
    call()  # warm
    return median_seconds(run, repeat) / calls * 1e6


def throughput(call, n_threads, calls, repeat):
    """Calls per second, ``n_threads`` threads each making ``calls`` calls."""
    def run():
        threads = [threading.Thread(target=lambda: [call() for _ in range(calls)])
                   for _ in range(n_threads)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    call()
    return n_threads * calls / median_seconds(run, repeat)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    rng = np.random.RandomState(0)
    X = rng.randn(512, 64)
    y = X[:, :10] @ rng.randn(10, 10)
    est = OrtGradientForwardBackwardOptimizer(
        mlp_model(rng), max_iter=2, batch_size=64, learning_rate=0.001,
        random_state=0).fit(X, y)
    engine = est.train_session_
    model = engine.inference_model
    one = X[:1].astype(np.float32)
    feeds = {"X": to_ortvalue(one)}
    feeds.update(zip(engine.weights_to_train, engine.weights))
    runners = {"one shared IOBinding (before)": SharedBindingRunner(model),
               "one IOBinding per thread (now)": SessionRunner(model),
               "one new IOBinding per call": PerCallBindingRunner(model)}
    first = next(iter(runners.values()))(feeds)[0].numpy()
    assert all(np.array_equal(r(feeds)[0].numpy(), first) for r in runners.values())
    times = {name: [] for name in runners}
    for _ in range(args.repeat):  # in turn, so that load changes hit all three
        for name, runner in runners.items():
            times[name].append(latency(lambda: runner(feeds), args.calls, 1))
    times = {name: float(np.median(t)) for name, t in times.items()}
    before = times["one shared IOBinding (before)"]
    times["estimator.predict, 1 row (now)"] = latency(
        lambda: est.predict(X[:1]), args.calls // 5, args.repeat)
    print("1-row latency (us per call, median of %d)" % args.repeat)
    print(f"{'SessionRunner / estimator':<44}{'us':>10}{'ratio':>10}")
    for name, value in times.items():
        print(f"{name:<44}{value:>10.2f}{value / before:>10.3f}")
    print()
    print("estimator.predict throughput (calls per second, median of %d)" % args.repeat)
    print(f"{'rows per call':<16}{'1 thread':>12}{'4 threads':>12}{'4 / 1':>10}")
    for rows in (1, 256):
        block = X[:rows]
        calls = max(50, args.calls // (5 * rows ** 0.5))
        single = throughput(lambda: est.predict(block), 1, int(calls), args.repeat)
        multi = throughput(lambda: est.predict(block), 4, int(calls), args.repeat)
        print(f"{rows:<16}{single:>12.0f}{multi:>12.0f}{multi / single:>10.2f}")
    print(f"\n(os.cpu_count() = {os.cpu_count()}; threads share the session's "
          "intra-op thread pool)")


if __name__ == "__main__":
    main()
