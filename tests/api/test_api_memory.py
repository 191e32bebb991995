"""The memory of training from artifacts (issue 37): the checkpoint is read
into the parameters' arrays (no copy of its entries as bytes, no second
copy in the state), and the flat optimizer's temporaries stay of one
segment's size whatever the largest parameter. Measured in a subprocess (a
fresh VmHWM) on four 16 MiB weights trained with AdamW, against their
size: PyTorch holds parameters, gradients and two moments, 4 times it.
"""
import pytest

from memory_probe import chain_model, needs_peak_reset, run_probe
from onnxtrain.onnxblock import artifacts

_SCRIPT = r"""
import os
import numpy as np
from onnxtrain import api

folder = sys.argv[1]
reset_peak()
before = status("VmRSS")
state = api.CheckpointState.load_checkpoint(os.path.join(folder, "checkpoint"))
loaded = status("VmHWM") - before
module = api.Module(os.path.join(folder, "training_model.onnx"), state)
optimizer = api.Optimizer(os.path.join(folder, "optimizer_model.onnx"), module)
module.train()
X = np.ones((2, 2048), np.float32)
for _ in range(2):
    module(X, X)
    optimizer.step()
    module.lazy_reset_grad()
print(json.dumps({"loaded": loaded, "trained": status("VmHWM") - before,
                  "weights": 4 * 2048 * 2048 * 4}))
"""


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    folder = tmp_path_factory.mktemp("artifacts")
    artifacts.generate_artifacts(
        chain_model(), requires_grad=["W0", "W1", "W2", "W3"],
        loss=artifacts.LossType.MSELoss, optimizer=artifacts.OptimType.AdamW,
        artifact_directory=str(folder))
    return run_probe(_SCRIPT, str(folder))


@needs_peak_reset
def test_the_checkpoint_is_read_into_the_parameters(measured):
    # 1.03 times the weights; an entry read as bytes then copied, and the
    # state copying the reader's arrays, made it 2.0
    assert measured["loaded"] < 1.3 * measured["weights"], measured


@needs_peak_reset
def test_training_holds_parameters_gradients_and_moments(measured):
    # 4.41 times the weights (PyTorch's 4 and the optimizer's temporaries
    # of one 4 MiB segment); a segment per large parameter made its
    # temporaries as large as the parameter: 5.19 (the checkpoint copied
    # too: 5.2)
    assert measured["trained"] < 4.7 * measured["weights"], measured
