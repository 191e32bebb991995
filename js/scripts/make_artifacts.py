"""Training artifacts, batches and Python reference runs for the JS package.

Usage::

    python js/scripts/make_artifacts.py OUT_DIR [MODEL ...]

MODEL is any of ``linear`` (MSE, SGD, two batches accumulated per step),
``mlp`` (cross-entropy, AdamW with weight decay, linear LR schedule),
``cnn`` (Conv + BatchNorm in training mode, SGD) and ``digits`` (the demo's
BatchNorm CNN on scikit-learn's 8x8 digits); default: all four. Each model
gets ``OUT_DIR/<model>/`` holding

- the artifacts of :func:`onnxtrain.artifacts.generate_artifacts`
  (``training_model.onnx``, ``eval_model.onnx``, ``optimizer_model.onnx``,
  ``checkpoint``);
- ``data.bin``: the float32/int64 arrays the runs feed, back to back;
- ``reference.json``: the run's recipe (batches per step, learning rates,
  array offsets in ``data.bin``) and what :mod:`onnxtrain.api` gave: the
  loss of every training call, the eval loss after training, and
  ``python_final.ckpt``, the state after training (optimizer included,
  properties ``epoch=7``, ``best=0.1``, ``missing=nan``, ``name="python"``);
- for ``linear``, also ``nominal_checkpoint``.

The JS tests replay the recipe and compare with these values.
"""
from __future__ import annotations

import io
import json
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxtrain import api, artifacts

MODELS = ("linear", "mlp", "cnn", "digits")


class _Data:
    """Arrays written back to back into one binary file."""

    def __init__(self):
        self.chunks, self.offset = [], 0

    def add(self, array):
        array = np.ascontiguousarray(array)
        dtype = {np.dtype(np.float32): "float32",
                 np.dtype(np.int64): "int64"}[array.dtype]
        record = {"dtype": dtype, "shape": list(array.shape),
                  "offset": self.offset, "nbytes": array.nbytes}
        self.chunks.append(array.tobytes())
        self.offset += array.nbytes
        pad = (-self.offset) % 8  # every array starts 8-byte aligned
        self.chunks.append(b"\0" * pad)
        self.offset += pad
        return record

    def write(self, path):
        with open(path, "wb") as f:
            for chunk in self.chunks:
                f.write(chunk)


def _torch_model(module, example, dynamic=True):
    import torch
    buffer = io.BytesIO()
    torch.onnx.export(module, (torch.from_numpy(example),), buffer, dynamo=False,
                      training=torch.onnx.TrainingMode.TRAINING,
                      do_constant_folding=False, input_names=["x"],
                      output_names=["logits"],
                      dynamic_axes={"x": {0: "N"}, "logits": {0: "N"}} if dynamic
                      else None)
    return onnx.load_from_string(buffer.getvalue())


def _linear_model(rng):
    w = rng.standard_normal((5, 3)).astype(np.float32) * 0.5
    b = np.zeros(3, np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"]),
         helper.make_node("Add", ["xw", "B"], ["y"])], "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _cnn_class(channels=4):
    import torch

    class CNN(torch.nn.Module):
        # the README's digits CNN without its Dropout (a random mask would
        # differ between runtimes)
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(1, channels, 3, padding=1)
            self.bn = torch.nn.BatchNorm2d(channels)
            self.fc = torch.nn.Linear(channels * 16, 10)

        def forward(self, x):
            h = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
            return self.fc(torch.flatten(h, 1))
    return CNN


def _spec(name, rng):
    """Model, generate_artifacts arguments, training data and recipe."""
    import torch
    torch.manual_seed(0)
    if name == "linear":
        x = rng.standard_normal((48, 5)).astype(np.float32)
        y = (x @ rng.standard_normal((5, 3)) + 0.1).astype(np.float32)
        return dict(model=_linear_model(rng), requires_grad=["W", "B"],
                    loss=artifacts.LossType.MSELoss,
                    optimizer=artifacts.OptimType.SGD, x=x, y=y, batch=8,
                    steps=12, accumulate=2, lr=0.05, schedule=None)
    if name == "mlp":
        x = rng.standard_normal((96, 6)).astype(np.float32)
        y = (np.abs(x[:, 0] * 2 + x[:, 1]) * 1.5).astype(np.int64) % 4
        mlp = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(),
                                  torch.nn.Linear(16, 4))
        model = _torch_model(mlp, x[:2])
        params = [i.name for i in model.graph.initializer]
        return dict(model=model, requires_grad=params,
                    loss=artifacts.LossType.CrossEntropyLoss,
                    optimizer=artifacts.onnxblock.optim.AdamW(weight_decay=0.01),
                    x=x, y=y, batch=16, steps=18, accumulate=1, lr=0.01,
                    schedule=(3, 18))
    if name in ("cnn", "digits"):
        if name == "digits":
            from sklearn.datasets import load_digits
            x, y = load_digits(return_X_y=True)
            order = rng.permutation(len(x))
            x = (x[order] / 16).astype(np.float32).reshape(-1, 1, 8, 8)
            y = y[order].astype(np.int64)
            steps, batch, lr = 150, 32, 0.05
        else:
            x = rng.random((64, 1, 8, 8), dtype=np.float32)
            y = rng.integers(0, 10, 64).astype(np.int64)
            steps, batch, lr = 8, 16, 0.1
        model = _torch_model(_cnn_class()(), x[:2])
        params = [i.name for i in model.graph.initializer]
        stats = [p for p in params if "running" in p]
        return dict(model=model,
                    requires_grad=[p for p in params if p not in stats
                                   and "num_batches" not in p],
                    frozen=stats, loss=artifacts.LossType.CrossEntropyLoss,
                    optimizer=artifacts.OptimType.SGD, x=x, y=y, batch=batch,
                    steps=steps, accumulate=1, lr=lr, schedule=None,
                    test=1500 if name == "digits" else None)
    raise ValueError(f"Unknown model {name!r}; models: {MODELS}.")


def make(name, out_dir, seed=0):
    """Write the artifacts, data and reference of model ``name`` into
    ``out_dir/name``; returns that directory."""
    rng = np.random.default_rng(seed)
    spec = _spec(name, rng)
    folder = os.path.join(out_dir, name)
    os.makedirs(folder, exist_ok=True)
    artifacts.generate_artifacts(
        spec["model"], requires_grad=spec["requires_grad"],
        frozen_params=spec.get("frozen"), loss=spec["loss"],
        optimizer=spec["optimizer"], artifact_directory=folder,
        nominal_checkpoint=name == "linear")
    x, y = spec["x"], spec["y"]
    n_train = spec.get("test") or len(x)
    data = _Data()
    recipe = {"model": name, "input_names": None, "batches": [], "steps": [],
              "learning_rate": spec["lr"], "schedule": spec["schedule"]}
    # batches in order, wrapping around the training rows
    batch, calls = spec["batch"], spec["steps"] * spec["accumulate"]
    starts = [(i * batch) % (n_train - batch + 1) for i in range(calls)]
    for start in starts:
        recipe["batches"].append([data.add(x[start:start + batch]),
                                  data.add(y[start:start + batch])])
    eval_x, eval_y = (x[n_train:], y[n_train:]) if spec.get("test") \
        else (x[:batch], y[:batch])
    recipe["eval"] = [data.add(eval_x), data.add(eval_y)]
    recipe["accumulate"] = spec["accumulate"]
    data.write(os.path.join(folder, "data.bin"))

    state = api.CheckpointState.load_checkpoint(os.path.join(folder, "checkpoint"))
    module = api.Module(os.path.join(folder, "training_model.onnx"), state,
                        os.path.join(folder, "eval_model.onnx"))
    recipe["input_names"] = module.input_names()
    eval_logits = _logits(module, eval_x)
    recipe["accuracy_before"] = _accuracy(eval_logits, eval_y)
    optimizer = api.Optimizer(os.path.join(folder, "optimizer_model.onnx"), module)
    optimizer.set_learning_rate(spec["lr"])
    scheduler = None
    if spec["schedule"]:
        scheduler = api.LinearLRScheduler(optimizer, *spec["schedule"], spec["lr"])
    losses, rates = [], []
    batches = iter(starts)
    for _ in range(spec["steps"]):
        for _ in range(spec["accumulate"]):
            start = next(batches)
            losses.append(float(module(x[start:start + batch],
                                       y[start:start + batch]).item()))
        rates.append(optimizer.get_learning_rate())
        optimizer.step()
        module.lazy_reset_grad()
        if scheduler is not None:
            scheduler.step()
    recipe["losses"], recipe["learning_rates"] = losses, rates
    module.eval()
    recipe["eval_loss"] = float(module(eval_x, eval_y).item())
    eval_logits = _logits(module, eval_x)
    recipe["accuracy_after"] = _accuracy(eval_logits, eval_y)
    recipe["eval_logits"] = eval_logits[:4].tolist()
    state.properties.update(epoch=7, best=0.1, missing=float("nan"), name="python")
    api.CheckpointState.save_checkpoint(state, os.path.join(folder, "python_final.ckpt"),
                                        include_optimizer_state=True)
    with open(os.path.join(folder, "reference.json"), "w") as f:
        json.dump(recipe, f)
    return folder


def _logits(module, x):
    """The model output (before the loss) through an inference export."""
    import onnxruntime as ort
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "inference.onnx")
        model = module.export_model_for_inferencing(path, [_output_name(module)])
        session = ort.InferenceSession(model.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        return session.run(None, {session.get_inputs()[0].name: x})[0]


def _output_name(module):
    graph = module._models["eval"].graph
    return "y" if any(n.output[0] == "y" for n in graph.node) else "logits"


def _accuracy(logits, y):
    if logits.ndim != 2 or y.dtype != np.int64:
        return None
    return float((logits.argmax(axis=1) == y).mean())


def main(argv):
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    out_dir, names = argv[0], argv[1:] or list(MODELS)
    for name in names:
        print(make(name, out_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
