"""Peak memory and step time of a fit dominated by one big weight:
``Y = X @ W`` with W float32 (64, 262144) (64 MiB), a squared loss,
batches of 8 rows (``--batch``), against PyTorch's ``nn.Linear`` with the
same optimizer.

Each cell runs in a fresh process. The peak is the resident memory the
fit adds (VmHWM after a reset, minus the resident memory before the
model is built), in units of the weight's size. The systems:

- torch: ``nn.Linear`` without bias, ``torch.optim`` SGD, SGD with
  Nesterov momentum 0.9, or AdamW (its default ``foreach`` form);
- estimator: ``OrtGradientForwardBackwardOptimizer`` on the fused path,
  given the model's path with its weight as external data (so that no
  loaded copy of the model is counted); the weight is updated over
  segments after the step graph (``onnxtrain.runtime.segmented_update``);
- estimator-in-graph: the same with the update inside the step graph
  (``DEFERRED_MIN_ELEMENTS`` raised above the weight's size), as before
  the segmented update.

Usage: ``python benchmarks/bench_big_weight.py [--rules sgd momentum
adamw] [--steps 8] [--threads 1] [--batch 8]``. Linux only
(``/proc/self/clear_refs``); the cells run through the memory tests'
probe (``tests/memory_probe.py``, which imports pytest).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
# the model of the memory tests (one 64 MiB weight), saved with external data
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
from memory_probe import COLUMNS, ROWS, run_probe, save_external  # noqa: E402

# after memory_probe.PROBE_PRELUDE (status, reset_peak, ROWS, COLUMNS)
_DATA = r'''
import time
import numpy as np
STEPS, THREADS, BATCH = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[6])
RULE, PATH = sys.argv[1], sys.argv[2]
rng = np.random.default_rng(0)
X = rng.standard_normal(((STEPS + 1) * BATCH, ROWS)).astype(np.float32)
y = np.zeros(((STEPS + 1) * BATCH, COLUMNS), dtype=np.float32)
'''

_TORCH = r'''
import torch
torch.set_num_threads(THREADS)
Xt, yt = torch.from_numpy(X), torch.from_numpy(y)
reset_peak()
before = status("VmRSS")
model = torch.nn.Linear(ROWS, COLUMNS, bias=False)
opt = {"sgd": lambda p: torch.optim.SGD(p, lr=1e-3),
       "momentum": lambda p: torch.optim.SGD(p, lr=1e-3, momentum=0.9, nesterov=True),
       "adamw": lambda p: torch.optim.AdamW(p, lr=1e-3)}[RULE](model.parameters())
times = []
for step in range(STEPS + 1):
    start = time.perf_counter()
    opt.zero_grad()
    batch = slice(step * BATCH, (step + 1) * BATCH)
    loss = ((model(Xt[batch]) - yt[batch]) ** 2).mean()
    loss.backward()
    opt.step()
    times.append(time.perf_counter() - start)
print(json.dumps({"peak": status("VmHWM") - before, "step_ms": 1e3 * float(np.median(times[1:]))}))
'''

_ESTIMATOR = r'''
import onnxtrain.runtime.segmented_update as segmented
from onnxtrain import (LearningRateAdamW, LearningRateSGD, LearningRateSGDNesterov,
                       OrtGradientForwardBackwardOptimizer)
if sys.argv[5] == "in-graph":
    segmented.DEFERRED_MIN_ELEMENTS = 1 << 60
rate = {"sgd": LearningRateSGD(1e-3, learning_rate="constant"),
        "momentum": LearningRateSGDNesterov(1e-3, learning_rate="constant"),
        "adamw": LearningRateAdamW(1e-3)}[RULE]
reset_peak()
before = status("VmRSS")
est = OrtGradientForwardBackwardOptimizer(PATH, max_iter=1, batch_size=BATCH,
                                          learning_rate=rate, training_path="fused",
                                          n_threads=THREADS, warm_start=True)
est.partial_fit(X[:BATCH], y[:BATCH])
start = time.perf_counter()
est.partial_fit(X[BATCH:], y[BATCH:])
step_ms = 1e3 * (time.perf_counter() - start) / STEPS
print(json.dumps({"peak": status("VmHWM") - before, "step_ms": step_ms}))
'''


def _cell(system, rule, path, steps, threads, batch):
    """One cell in a fresh process (memory_probe.run_probe: this checkout's
    onnxtrain)."""
    script = _DATA + (_TORCH if system == "torch" else _ESTIMATOR)
    mode = "in-graph" if system == "estimator-in-graph" else "segments"
    return run_probe(script, rule, path, str(steps), str(threads), mode, str(batch))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rules", nargs="+", default=["sgd", "momentum", "adamw"])
    parser.add_argument("--systems", nargs="+",
                        default=["torch", "estimator", "estimator-in-graph"])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args(argv)
    weight_bytes = ROWS * COLUMNS * 4
    with tempfile.TemporaryDirectory() as folder:
        path = save_external(folder)
        print(f"{'rule':10} {'system':20} {'peak / weight':>14} {'x torch':>8} "
              f"{'ms/step':>8} {'x torch':>8}")
        for rule in args.rules:
            results = {s: _cell(s, rule, path, args.steps, args.threads, args.batch)
                       for s in args.systems}
            base = results.get("torch")
            for system, r in results.items():
                peak = r["peak"] / weight_bytes
                ratio_peak = r["peak"] / base["peak"] if base else float("nan")
                # speed ratio as the other benchmarks print it: torch's time / ours
                ratio_speed = base["step_ms"] / r["step_ms"] if base else float("nan")
                print(f"{rule:10} {system:20} {peak:14.2f} {ratio_peak:8.2f} "
                      f"{r['step_ms']:8.1f} {ratio_speed:8.2f}")


if __name__ == "__main__":
    main()
