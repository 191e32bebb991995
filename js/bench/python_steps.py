"""Steps/s of Python's onnxtrain.api on a recipe of make_artifacts.py.

Usage: python js/bench/python_steps.py MODEL_DIR REPEATS

Replays the recipe's training calls and optimizer steps as the JS
``replay`` does (sessions created first, the clock started before the
first training call) ``REPEATS`` times on fresh modules; prints JSON
``{"steps": n, "seconds": [...]}``.
"""
import json
import os
import sys
import time

import numpy as np

from onnxtrain import api


def main(folder, repeats):
    with open(os.path.join(folder, "reference.json")) as f:
        recipe = json.load(f)
    raw = np.fromfile(os.path.join(folder, "data.bin"), dtype=np.uint8)

    def array(rec):
        dtype = np.float32 if rec["dtype"] == "float32" else np.int64
        return raw[rec["offset"]:rec["offset"] + rec["nbytes"]].view(dtype).reshape(rec["shape"])

    batches = [[array(r) for r in b] for b in recipe["batches"]]
    steps = len(batches) // recipe["accumulate"]
    seconds = []
    for _ in range(int(repeats)):
        state = api.CheckpointState.load_checkpoint(os.path.join(folder, "checkpoint"))
        module = api.Module(os.path.join(folder, "training_model.onnx"), state,
                            os.path.join(folder, "eval_model.onnx"))
        optimizer = api.Optimizer(os.path.join(folder, "optimizer_model.onnx"), module)
        optimizer.set_learning_rate(recipe["learning_rate"])
        calls = iter(batches)
        start = time.perf_counter()
        for _ in range(steps):
            for _ in range(recipe["accumulate"]):
                module(*next(calls))
            optimizer.step()
            module.lazy_reset_grad()
        seconds.append(time.perf_counter() - start)
    print(json.dumps({"steps": steps, "seconds": seconds}))


if __name__ == "__main__":
    main(*sys.argv[1:])
