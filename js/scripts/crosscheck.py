"""Reads what the JS package wrote with Python's onnxtrain and onnxruntime.

Usage::

    python js/scripts/crosscheck.py MODEL_DIR JS_CHECKPOINT JS_INFERENCE_MODEL

Loads ``JS_CHECKPOINT`` with :meth:`onnxtrain.api.CheckpointState.load_checkpoint`
and compares it with ``MODEL_DIR/python_final.ckpt`` (the Python run's
state); runs ``JS_INFERENCE_MODEL`` in a plain onnxruntime session on the
recipe's eval rows and compares its first rows with the logits the Python
run's inference export gave. Prints one JSON object: ``parameters`` (name ->
largest |js - python| / max|python|), ``step``, ``learning_rate`` (JS's and
Python's), ``states`` (as ``parameters``, per optimizer state),
``logits`` (largest relative difference), ``properties`` (what Python read).
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np
import onnxruntime as ort

from onnxtrain import api


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    scale = max(float(np.abs(b).max()) if b.size else 0.0, 1e-30)
    return float(np.abs(a - b).max() / scale) if b.size else 0.0


def main(model_dir, js_ckpt, js_model):
    js = api.CheckpointState.load_checkpoint(js_ckpt)
    py = api.CheckpointState.load_checkpoint(os.path.join(model_dir, "python_final.ckpt"))
    with open(os.path.join(model_dir, "reference.json")) as f:
        recipe = json.load(f)
    out = {"parameters": {}, "states": {}}
    for name, param in py.parameters:
        mine = js.parameters[name]
        assert mine.dtype == param.dtype and mine.shape == param.shape, name
        assert mine.requires_grad == param.requires_grad, name
        out["parameters"][name] = _rel(mine.data, param.data)
    out["parameter_names"] = [n for n, _ in js.parameters]
    jo, po = js.optimizer_state, py.optimizer_state
    out["step"] = [jo.step, po.step]
    out["learning_rate"] = [jo.learning_rate, po.learning_rate]
    for name, states in po.states.items():
        for key, value in states.items():
            out["states"][f"{name}.{key}"] = _rel(jo.states[name][key], value)
    out["properties"] = {k: [type(v).__name__, v if v == v else "nan"]
                         for k, v in js.properties.items()}
    data = np.fromfile(os.path.join(model_dir, "data.bin"), dtype=np.uint8)
    rec = recipe["eval"][0]
    x = data[rec["offset"]:rec["offset"] + rec["nbytes"]].view(np.float32).reshape(rec["shape"])
    session = ort.InferenceSession(js_model, providers=["CPUExecutionProvider"])
    logits = session.run(None, {session.get_inputs()[0].name: x})[0]
    out["logits"] = _rel(logits[:4], np.array(recipe["eval_logits"]))
    out["inference_inputs"] = [i.name for i in session.get_inputs()]
    out["inference_outputs"] = [(o.name, o.type, o.shape) for o in session.get_outputs()]
    print(json.dumps(out))


if __name__ == "__main__":
    main(*sys.argv[1:])
