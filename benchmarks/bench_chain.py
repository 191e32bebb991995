"""The cost of gradient clipping in a training step: onnxtrain's chain
(``chain(ClipByGlobalNorm(1.0), LearningRateSGDNesterov(...))``) against
the same optimizer without it, and PyTorch's ``clip_grad_norm_`` before
``torch.optim.SGD`` against ``SGD`` alone, measured in the same run.

Run: ``python benchmarks/bench_chain.py [--epochs 2] [--repeat 3]
[--paths fused loop]``.

Workload: MLP 784->512->512->10 relu, softmax cross-entropy, 8192 standard
normal float32 rows, labels argmax(X @ fixed matrix), SGD lr 0.01
momentum 0.9 (classical), batch 256. Each timing is the best of
``--repeat`` warm fits (graphs and sessions built by a first fit); the
table prints steps per second and the ratio clipped / plain of each system.
"""
from __future__ import annotations

import argparse
import time
import warnings

import numpy as np


def _data(n=8192, seed=0):
    rng = np.random.RandomState(seed)
    X = rng.randn(n, 784).astype(np.float32)
    y = np.argmax(X @ rng.randn(784, 10), axis=1)
    return X, y


def _onnx_model(X, y):
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier

    from onnxtrain import to_onnx
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        skl = MLPClassifier(hidden_layer_sizes=(512, 512), max_iter=1,
                            random_state=0).fit(X[:300], y[:300])
    return to_onnx(skl, X[:1], options={"zipmap": False})


def _onnxtrain_rate(clip):
    from onnxtrain.optim import (ClipByGlobalNorm, LearningRateSGDNesterov,
                                 chain)
    rate = LearningRateSGDNesterov(0.01, learning_rate="constant", momentum=0.9,
                                   nesterov=False)
    return chain(ClipByGlobalNorm(1.0), rate) if clip else rate


def time_onnxtrain(X, y, onx, path, clip, epochs, repeat):
    from onnxtrain.estimators import OrtGradientForwardBackwardClassifier
    est = OrtGradientForwardBackwardClassifier(
        onx, learning_rate=_onnxtrain_rate(clip), max_iter=epochs, batch_size=256,
        training_path=path)
    est.fit(X, y)
    best = min(_timed(lambda: est.fit(X, y)) for _ in range(repeat))
    return epochs * -(-X.shape[0] // 256) / best


def time_torch(X, y, clip, epochs, repeat):
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
        torch.nn.ReLU(), torch.nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    tx, ty = torch.from_numpy(X), torch.from_numpy(y)
    loss_fn = torch.nn.CrossEntropyLoss()

    def fit():
        for _ in range(epochs):
            for start in range(0, X.shape[0], 256):
                opt.zero_grad()
                loss = loss_fn(model(tx[start:start + 256]), ty[start:start + 256])
                loss.backward()
                if clip:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()

    fit()
    best = min(_timed(fit) for _ in range(repeat))
    return epochs * -(-X.shape[0] // 256) / best


def _timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--paths", nargs="+", default=["fused", "loop"])
    args = parser.parse_args(argv)
    X, y = _data()
    onx = _onnx_model(X, y)
    rows = []
    for path in args.paths:
        plain = time_onnxtrain(X, y, onx, path, False, args.epochs, args.repeat)
        clipped = time_onnxtrain(X, y, onx, path, True, args.epochs, args.repeat)
        rows.append((f"onnxtrain-{path}", plain, clipped))
    try:
        plain = time_torch(X, y, False, args.epochs, args.repeat)
        clipped = time_torch(X, y, True, args.epochs, args.repeat)
        rows.append(("torch", plain, clipped))
    except ImportError:
        print("torch is not installed: no PyTorch row")
    print(f"{'system':<18}{'plain steps/s':>15}{'clipped steps/s':>17}"
          f"{'clipped/plain':>15}")
    for name, plain, clipped in rows:
        print(f"{name:<18}{plain:>15.1f}{clipped:>17.1f}{clipped / plain:>15.3f}")


if __name__ == "__main__":
    main()
