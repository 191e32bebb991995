"""Peak memory of a build, measured in a fresh Python process (the
build-memory tests of the estimators and of the artifacts).

A probe script resets the peak (``/proc/self/clear_refs``), does its work
and prints, last, one JSON line the test reads; :data:`PROBE_PRELUDE`
gives it :func:`status` and the model of one 64 MiB weight those tests
use (given as a path in ``sys.argv[1]`` when the test saved it with
external data).
"""
import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: float32 (ROWS, COLUMNS): 64 MiB.
ROWS, COLUMNS = 64, 262144
WEIGHT_BYTES = ROWS * COLUMNS * 4

#: Linux only: the peak resident memory is reset by ``/proc/self/clear_refs``.
needs_peak_reset = pytest.mark.skipif(
    not os.path.exists("/proc/self/clear_refs"),
    reason="needs Linux's /proc/self/clear_refs (VmHWM reset)")


def one_weight_model():
    """``Y = X @ W``, W float32 (ROWS, COLUMNS) drawn with seed 0."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(
        (rng.standard_normal((ROWS, COLUMNS)) * 0.01).astype(np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"])], "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, ROWS])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, COLUMNS])],
        [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def chain_model(count=4, size=2048):
    """``X @ W0 @ W1 ...``: ``count`` float32 weights (size, size) drawn
    with seed 0 (4 of 16 MiB by default)."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(
        (rng.standard_normal((size, size)) * 0.01).astype(np.float32), f"W{k}")
        for k in range(count)]
    nodes = [helper.make_node("MatMul", ["X" if k == 0 else f"H{k - 1}", f"W{k}"],
                              [f"H{k}"]) for k in range(count)]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, size])],
        [helper.make_tensor_value_info(f"H{count - 1}", TensorProto.FLOAT,
                                       [None, size])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def save_external(folder, model=None):
    """``model`` (default :func:`one_weight_model`) saved in ``folder``
    with its weights as external data (one file, ``model.data``); returns
    the model's path."""
    path = os.path.join(folder, "model.onnx")
    onnx.save(one_weight_model() if model is None else model, path,
              save_as_external_data=True, all_tensors_to_one_file=True,
              location="model.data")
    return path


#: The start of every probe script.
PROBE_PRELUDE = r'''
import json
import sys

sys.path.insert(0, %r)
from memory_probe import (ROWS, COLUMNS, WEIGHT_BYTES, chain_model,
                          one_weight_model)


def status(field):
    """A /proc/self/status field, in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024


def reset_peak():
    """Give the heap's free memory back (what building the model freed
    would otherwise hold the build's first allocations unseen), then start
    a new peak."""
    import ctypes
    import gc
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
''' % os.path.dirname(os.path.abspath(__file__))


def run_probe(script, *args):
    """Run :data:`PROBE_PRELUDE` + ``script`` in a new process (onnxtrain
    of this checkout) with ``args``; returns its last line, parsed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", PROBE_PRELUDE + script, *args],
                         capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])
