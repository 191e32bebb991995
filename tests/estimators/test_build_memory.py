"""The memory of a fit's build (issue 37): with the caller's model given,
the build holds that model and one copy of the weights (the engine's), not
a copy per rewrite; with the model given as a path whose weights are
external data, only the engine's copy (the data is read from its file into
the weights). Measured in a subprocess (a fresh VmHWM) on a model of one
64 MiB weight, as the peak resident memory the fit adds up to its first
epoch (graphs built, sessions not yet), against the weight's size.
"""
import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_SCRIPT = r"""
import json
import sys
import numpy as np
from onnx import TensorProto, helper, numpy_helper
from onnxtrain import OrtGradientForwardBackwardOptimizer
from onnxtrain.training.callbacks import Callback

ROWS, COLUMNS = 64, 262144  # float32: 64 MiB


def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024


class BuildPeak(Callback):
    peaks = []

    def on_train_begin(self, estimator, X=None, y=None):
        self.peaks.append(status("VmHWM"))


rng = np.random.default_rng(0)
weight = numpy_helper.from_array(
    (rng.standard_normal((ROWS, COLUMNS)) * 0.01).astype(np.float32), "W")
graph = helper.make_graph(
    [helper.make_node("MatMul", ["X", "W"], ["Y"])], "g",
    [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, ROWS])],
    [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, COLUMNS])],
    [weight])
del weight
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 8
if len(sys.argv) > 1:  # the same model, saved with its weight as external data
    del model, graph
    model = sys.argv[1]
X = rng.standard_normal((2, ROWS)).astype(np.float32)
y = np.zeros((2, COLUMNS), dtype=np.float32)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = status("VmRSS")
est = OrtGradientForwardBackwardOptimizer(
    model, max_iter=1, batch_size=2, learning_rate=1e-3, callbacks=[BuildPeak()],
    training_path="%s")
est.fit(X, y)
print(json.dumps({"build": BuildPeak.peaks[0] - before, "weights": ROWS * COLUMNS * 4,
                  "trained": est.weights_to_train_}))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"),
                    reason="needs Linux's /proc/self/clear_refs (VmHWM reset)")
@pytest.mark.parametrize("path", ["fused", "split"])
def test_the_build_holds_one_copy_of_the_weights(path):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", _SCRIPT % path], capture_output=True,
                         text=True, env=env, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["trained"] == ["W"]
    # the engine's weights, the bytes of the one tensor while it is read
    # into them, and onnxruntime's own: 2.17 times the weights; with the
    # values copied by the rewrites it was 4.17 (one copy more: 3.17)
    assert result["build"] < 2.5 * result["weights"], result


def _external_model(folder):
    """The script's model (same weight), saved in ``folder`` with the
    weight as external data; returns its path."""
    rng = np.random.default_rng(0)
    rows, columns = 64, 262144
    weight = numpy_helper.from_array(
        (rng.standard_normal((rows, columns)) * 0.01).astype(np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"])], "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, rows])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, columns])],
        [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = os.path.join(folder, "model.onnx")
    onnx.save(model, path, save_as_external_data=True, location="model.data")
    return path


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"),
                    reason="needs Linux's /proc/self/clear_refs (VmHWM reset)")
@pytest.mark.parametrize("path", ["fused", "split"])
def test_a_path_with_external_data_is_read_into_the_weights(path, tmp_path):
    model = _external_model(str(tmp_path))
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", _SCRIPT % path, model],
                         capture_output=True, text=True, env=env, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["trained"] == ["W"]
    # the engine's weights and onnxruntime's own: 1.17 times the weights;
    # with the model loaded with its data (then read into the weights) it
    # was 3.17, and a single copy more would make it 2.17
    assert result["build"] < 1.6 * result["weights"], result
