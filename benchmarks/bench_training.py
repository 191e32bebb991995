"""Training speed: onnxtrain (each path) against scikit-learn's MLP and
PyTorch eager, same data, same initial weights, same batches.

Run: ``python benchmarks/bench_training.py [--workloads W1 W2 W3 W4]
[--repeat 3]`` (PyTorch comes with ``pip install -e ".[bench]"``). The
environment variable ONNXTRAIN_BENCH_DEVICE=cuda runs onnxtrain and PyTorch
on the GPU (see gpu_check.py).

Workloads (float32, no shuffling, Glorot-uniform initial weights drawn by
scikit-learn's MLP with random_state=0):

- W1 linear 2->1, ``make_regression(100, 2, bias=2, noise=0)``, half-MSE,
  SGD lr 0.01, batch 10, 200 epochs;
- W2 MLP 10->100->1 relu, ``make_regression(10000, 10)`` y standardized,
  SGD lr 0.001, batch 200, 20 epochs;
- W3 MLP 784->512->512->10 relu, softmax cross-entropy, 20000 standard
  normal rows, labels argmax(X @ fixed matrix), SGD lr 0.01 momentum 0.9,
  batch 256, 2 epochs;
- W4 digits 64->100->10 relu, softmax cross-entropy, X / 16, SGD lr 0.1,
  batch 200, 100 epochs.

Each (workload, system) runs in its own subprocess, which reports the
training steps per second of a warm fit (graphs and sessions already built,
weights and optimizer state reset), the cold setup time, the final epoch
loss and the peak resident memory added by the fits (onnxtrain: the cold
fit, which builds the graphs and sessions, and the warm fit; the ONNX graph
given to fit is converted before the measurement starts, as PyTorch is
imported before it). The table prints the
ratio to scikit-learn measured in the same run, and the compute bound:
measured float32 GEMM GFLOP/s divided by the FLOPs of one step's matrix
products (3 times the forward FLOPs, less the first layer's input
gradient, which no system computes). The GEMM rate is measured twice:
by numpy (its BLAS) and by onnxruntime's MatMul (the kernels onnxtrain's
steps run, on as many threads as its sessions), so that the second bound
tells how close a path runs to its own kernels' speed, whatever the BLAS
numpy ships with. A third line, ``bound (products)``, times the step's own
matrix products (the same shapes and transpositions, each an onnxruntime
Gemm, all in one graph, on the same threads): the steps per second of a
step that would do nothing else, which the GEMM rate of 1024^3 products
overstates for narrow layers (an output of 10 columns, a batch of 256 rows
as the inner dimension of the weight gradients).

``--threads N`` runs PyTorch and onnxtrain on N threads (default: every
core): one thread compares the work each system does, which a machine
shared with other processes measures more steadily.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
import warnings

import numpy as np

WORKLOADS = {
    "W1": dict(hidden=(), epochs=200, batch=10, lr=0.01, momentum=0.0,
               task="regression"),
    "W2": dict(hidden=(100,), epochs=20, batch=200, lr=0.001, momentum=0.0,
               task="regression"),
    "W3": dict(hidden=(512, 512), epochs=2, batch=256, lr=0.01, momentum=0.9,
               task="classification"),
    "W4": dict(hidden=(100,), epochs=100, batch=200, lr=0.1, momentum=0.0,
               task="classification"),
}
SYSTEMS = ["sklearn", "torch", "onnxtrain-split", "onnxtrain-fused",
           "onnxtrain-loop"]
#: Threads of PyTorch and onnxtrain (``--threads``, passed to the child
#: processes by this environment variable); None: every core.
THREADS = int(os.environ.get("ONNXTRAIN_BENCH_THREADS", "0")) or None


def load(name):
    """(X, y) of a workload, float32."""
    from sklearn.datasets import load_digits, make_regression
    if name == "W1":
        X, y = make_regression(n_samples=100, n_features=2, bias=2.0, noise=0.0,
                               random_state=0)
    elif name == "W2":
        X, y = make_regression(n_samples=10000, n_features=10, random_state=0)
        y = (y - y.mean()) / y.std()
    elif name == "W3":
        X = np.random.RandomState(0).randn(20000, 784)
        y = np.argmax(X @ np.random.RandomState(1).randn(784, 10), axis=1)
    else:
        X, y = load_digits(return_X_y=True)
        X = X / 16.0
    X = X.astype(np.float32)
    return X, (y.astype(np.float32) if WORKLOADS[name]["task"] == "regression" else y)


def sklearn_model(name, max_iter):
    from sklearn.neural_network import MLPClassifier, MLPRegressor
    w = WORKLOADS[name]
    cls = MLPRegressor if w["task"] == "regression" else MLPClassifier
    kwargs = dict(hidden_layer_sizes=w["hidden"], solver="sgd",
                  learning_rate="constant", learning_rate_init=w["lr"],
                  momentum=w["momentum"], nesterovs_momentum=False,
                  batch_size=w["batch"], max_iter=max_iter, shuffle=False,
                  alpha=0.0, tol=0.0, n_iter_no_change=10 ** 6, random_state=0)
    if not w["hidden"]:
        kwargs["activation"] = "identity"
    return cls(**kwargs)


def fit_quietly(model, X, y):
    from sklearn.exceptions import ConvergenceWarning
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return model.fit(X, y)


def run_sklearn(name, X, y):
    w = WORKLOADS[name]
    fit_quietly(sklearn_model(name, 1), X, y)  # warm caches
    model = sklearn_model(name, w["epochs"])
    start = time.perf_counter()
    fit_quietly(model, X, y)
    return time.perf_counter() - start, 0.0, model.loss_curve_[-1]


def initial_weights(name, X, y):
    """scikit-learn's initial coefs/intercepts for random_state=0."""
    from sklearn.utils import check_random_state
    model = sklearn_model(name, 1)
    model._random_state = check_random_state(0)
    n_out = 1 if WORKLOADS[name]["task"] == "regression" else len(np.unique(y))
    n_out = 1 if n_out == 2 else n_out
    if WORKLOADS[name]["task"] == "classification":
        from sklearn.preprocessing import LabelBinarizer
        model._label_binarizer = LabelBinarizer().fit(y)
    layers = [X.shape[1], *WORKLOADS[name]["hidden"], n_out]
    model._initialize(np.zeros((1, n_out)), layers, np.float32)
    return model.coefs_, model.intercepts_


DEVICE = os.environ.get("ONNXTRAIN_BENCH_DEVICE", "cpu")


def run_torch(name, X, y):
    import torch
    torch.set_num_threads(THREADS or os.cpu_count())
    device = torch.device("cuda" if DEVICE.startswith("cuda") else "cpu")
    w = WORKLOADS[name]
    coefs, intercepts = initial_weights(name, X, y)
    layers = []
    for i, (c, b) in enumerate(zip(coefs, intercepts)):
        linear = torch.nn.Linear(*c.shape)
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(c.T.copy()))
            linear.bias.copy_(torch.from_numpy(b))
        layers.append(linear)
        if i < len(coefs) - 1:
            layers.append(torch.nn.ReLU())
    net = torch.nn.Sequential(*layers).to(device)
    opt = torch.optim.SGD(net.parameters(), lr=w["lr"], momentum=w["momentum"])
    Xt = torch.from_numpy(X).to(device)
    if w["task"] == "regression":
        yt = torch.from_numpy(y).reshape(-1, 1).to(device)

        def loss_fn(out, target):
            return 0.5 * torch.mean((out - target) ** 2)
    else:
        yt = torch.from_numpy(y.astype(np.int64)).to(device)
        loss_fn = torch.nn.functional.cross_entropy
    n, batch = X.shape[0], w["batch"]
    start = time.perf_counter()
    for _ in range(w["epochs"]):
        total = 0.0
        for s in range(0, n, batch):
            opt.zero_grad()
            loss = loss_fn(net(Xt[s:s + batch]), yt[s:s + batch])
            loss.backward()
            opt.step()
            total += loss.item() * min(batch, n - s)
    return time.perf_counter() - start, 0.0, total / n


def onnx_model(name, X, y):
    """The ONNX graph to train: scikit-learn's MLP of the workload (fitted
    one epoch on 400 rows) converted by skl2onnx; its weights are replaced
    by the common initial weights before the timed fit."""
    from onnxtrain import to_onnx
    w = WORKLOADS[name]
    skl = fit_quietly(sklearn_model(name, 1), X[:400], y[:400])
    options = None if w["task"] == "regression" else {"zipmap": False}
    return to_onnx(skl, X[:1], options=options)


def run_onnxtrain(name, X, y, path, onx):
    from onnxtrain import (LearningRateSGD, LearningRateSGDNesterov,
                           OrtGradientForwardBackwardClassifier,
                           OrtGradientForwardBackwardOptimizer)
    w = WORKLOADS[name]
    rate = (LearningRateSGDNesterov(w["lr"], learning_rate="constant",
                                    momentum=w["momentum"], nesterov=False)
            if w["momentum"] else LearningRateSGD(w["lr"], learning_rate="constant"))
    cls = (OrtGradientForwardBackwardOptimizer if w["task"] == "regression"
           else OrtGradientForwardBackwardClassifier)
    est = cls(onx, learning_rate=rate, max_iter=w["epochs"], batch_size=w["batch"],
              random_state=0, training_path=path.split("-")[1], device=DEVICE,
              n_threads=THREADS)
    start = time.perf_counter()
    est.fit(X, y)
    cold = time.perf_counter() - start
    initial = est.get_state()
    est.set_params(warm_start=True)
    coefs, intercepts = initial_weights(name, X, y)
    drawn = [a for pair in zip(coefs, intercepts) for a in pair]
    est.set_state([d.reshape(i.shape) for d, i in zip(drawn, initial)])
    start = time.perf_counter()
    est.fit(X, y)
    warm = time.perf_counter() - start
    return warm, cold - warm, est.train_losses_[-1]


def one(name, system):
    """Run one (workload, system) in this process; print a JSON line."""
    X, y = load(name)
    import sklearn.neural_network  # noqa: F401  (imports are not the fit's memory)
    if system == "torch":
        import torch  # noqa: F401
    elif system != "sklearn":
        # the ONNX graph is the input of onnxtrain's fit, as the module is
        # PyTorch's: converting it (skl2onnx's imports alone take ~50 MB) is
        # not part of the measured fit
        onx = onnx_model(name, X, y)
    before = _rss_kb(reset_peak=True)
    if system == "sklearn":
        seconds, setup, loss = run_sklearn(name, X, y)
    elif system == "torch":
        seconds, setup, loss = run_torch(name, X, y)
    else:
        seconds, setup, loss = run_onnxtrain(name, X, y, system, onx)
    peak = _rss_kb(field="VmHWM")
    w = WORKLOADS[name]
    steps = w["epochs"] * -(-X.shape[0] // w["batch"])
    print(json.dumps(dict(workload=name, system=system, seconds=seconds,
                          setup=setup, steps=steps, samples=w["epochs"] * X.shape[0],
                          loss=float(loss), peak_mb=(peak - before) / 1024)))


def _rss_kb(reset_peak=False, field="VmRSS"):
    """Resident memory (kB) from /proc; ``reset_peak`` restarts the peak
    (VmHWM) there (Linux), else ru_maxrss is used."""
    try:
        if reset_peak:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def gemm_gflops():
    """float32 GEMM throughput of this machine (numpy, 1024^3, its BLAS
    limited to ``--threads`` when given), GFLOP/s."""
    from threadpoolctl import threadpool_limits
    a = np.random.rand(1024, 1024).astype(np.float32)
    b = np.random.rand(1024, 1024).astype(np.float32)
    with threadpool_limits(THREADS):
        a @ b
        best = min(_time(lambda: a @ b) for _ in range(5))
    return 2 * 1024 ** 3 / best / 1e9


def _cpu_session(graph):
    """An onnxruntime CPU session of ``graph`` (opset 17) on the threads of
    ``--threads`` (or every core)."""
    import onnxruntime
    from onnx import helper
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = onnxruntime.SessionOptions()
    if THREADS:
        options.intra_op_num_threads = THREADS
    return onnxruntime.InferenceSession(model.SerializeToString(), options,
                                        providers=["CPUExecutionProvider"])


def ort_gemm_gflops():
    """float32 GEMM throughput of onnxruntime's MatMul (1024^3, the
    threads of ``--threads`` or every core), GFLOP/s."""
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info("a", TensorProto.FLOAT, [1024, 1024])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1024, 1024])
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "a"], ["y"])],
                              "gemm", [x], [y])
    session = _cpu_session(graph)
    a = {"a": np.random.rand(1024, 1024).astype(np.float32)}
    session.run(None, a)
    best = min(_time(lambda: session.run(None, a)) for _ in range(5))
    return 2 * 1024 ** 3 / best / 1e9


def products_steps_per_second(name, n_features, n_out):
    """Steps per second of a graph holding only the matrix products of
    one step of workload ``name`` (forward, weight gradients, input
    gradients but the first layer's: the FLOPs of :func:`step_flops`),
    each an onnxruntime Gemm with the transposition the backward pass
    gives it, on the threads of ``--threads`` (best of 20 runs)."""
    from onnx import TensorProto, helper
    w = WORKLOADS[name]
    layers = [n_features, *w["hidden"], n_out]
    shapes, nodes, outputs = {}, [], []
    for i, (a, b) in enumerate(zip(layers, layers[1:])):
        x, weight, dy = f"x{i}", f"w{i}", f"dy{i}"
        shapes.update({x: [w["batch"], a], weight: [a, b], dy: [w["batch"], b]})
        nodes.append(helper.make_node("Gemm", [x, weight], [f"y{i}"]))
        nodes.append(helper.make_node("Gemm", [x, dy], [f"dw{i}"], transA=1))
        outputs += [f"y{i}", f"dw{i}"]
        if i:
            nodes.append(helper.make_node("Gemm", [dy, weight], [f"dx{i}"], transB=1))
            outputs.append(f"dx{i}")
    graph = helper.make_graph(
        nodes, "products",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in shapes.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs])
    session = _cpu_session(graph)
    rng = np.random.RandomState(0)
    feeds = {n: rng.rand(*s).astype(np.float32) for n, s in shapes.items()}
    session.run(None, feeds)
    return 1 / min(_time(lambda: session.run(None, feeds)) for _ in range(20))


def _time(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def step_flops(name, n_features, n_out):
    """FLOPs of the matrix products of one step: forward, the weight
    gradients, and the gradients of every layer's input but the first (no
    system computes the gradient of the data): 3 times the forward FLOPs
    minus the first layer's once."""
    w = WORKLOADS[name]
    layers = [n_features, *w["hidden"], n_out]
    products = [2 * w["batch"] * a * b for a, b in zip(layers, layers[1:])]
    return 3 * sum(products) - products[0]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    parser.add_argument("--systems", nargs="+", default=SYSTEMS)
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs per cell; the median is shown")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads of PyTorch and onnxtrain (default: every core)")
    parser.add_argument("--one", nargs=2, metavar=("WORKLOAD", "SYSTEM"))
    args = parser.parse_args(argv)
    if args.threads:
        os.environ["ONNXTRAIN_BENCH_THREADS"] = str(args.threads)
        global THREADS
        THREADS = args.threads
    if args.one:
        one(*args.one)
        return
    gflops, ort_gflops = gemm_gflops(), ort_gemm_gflops()
    print(f"float32 GEMM: {gflops:.0f} GFLOP/s (numpy, 1024x1024x1024), "
          f"{ort_gflops:.0f} GFLOP/s (onnxruntime's MatMul)\n")
    header = (f"{'work':4} {'system':16} {'steps/s':>9} {'samples/s':>10} "
              f"{'x sklearn':>9} {'final loss':>11} {'setup s':>7} {'peak MB':>8}")
    print(header)
    print("-" * len(header))
    for name in args.workloads:
        rows = {}
        for system in args.systems:
            runs = []
            for _ in range(args.repeat):
                out = subprocess.run(
                    [sys.executable, __file__, "--one", name, system],
                    capture_output=True, text=True)
                if out.returncode:
                    print(f"{name} {system}: failed\n{out.stderr[-2000:]}")
                    break
                runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            if runs:
                runs.sort(key=lambda r: r["seconds"])
                rows[system] = runs[len(runs) // 2]
        base = rows.get("sklearn")
        for system, r in rows.items():
            rate = r["steps"] / r["seconds"]
            ratio = (base["seconds"] / r["seconds"]) if base else float("nan")
            print(f"{name:4} {system:16} {rate:9.0f} {r['samples'] / r['seconds']:10.0f} "
                  f"{ratio:9.2f} {r['loss']:11.6g} {r['setup']:7.2f} "
                  f"{r['peak_mb']:8.0f}")
        X, y = load(name)
        n_out = 1 if WORKLOADS[name]["task"] == "regression" else len(np.unique(y))
        flops = step_flops(name, X.shape[1], n_out)
        print(f"{name:4} {'compute bound':16} {gflops * 1e9 / flops:9.0f}")
        print(f"{name:4} {'bound (ort)':16} {ort_gflops * 1e9 / flops:9.0f}")
        print(f"{name:4} {'bound (products)':16} "
              f"{products_steps_per_second(name, X.shape[1], n_out):9.0f}\n")


if __name__ == "__main__":
    main()
