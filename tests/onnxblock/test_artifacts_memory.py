"""The memory of generate_artifacts (issue 37): the checkpoint converts
(or reads from their external data file) one weight at a time while it
writes them, and a path's trained weights are not loaded with the graph.
Measured in a subprocess (a fresh VmHWM) on a model of four 16 MiB
weights, as the peak resident memory the call adds, against the weights'
size; the artifacts are the same whichever way the model is given.
"""
import os

import numpy as np
import onnx
import pytest

from memory_probe import chain_model, needs_peak_reset, run_probe, save_external
from onnxtrain.checkpoint import read_checkpoint
from onnxtrain.onnxblock import artifacts

_SCRIPT = r"""
from onnxtrain.onnxblock import artifacts

# the model, or its path saved with its weights as external data
model = sys.argv[2] if len(sys.argv) > 2 else chain_model()
reset_peak()
before = status("VmRSS")
artifacts.generate_artifacts(model, requires_grad=["W0", "W1", "W2", "W3"],
                             loss=artifacts.LossType.MSELoss,
                             optimizer=artifacts.OptimType.AdamW,
                             artifact_directory=sys.argv[1])
print(json.dumps({"build": status("VmHWM") - before, "weights": 4 * 2048 * 2048 * 4}))
"""


@needs_peak_reset
def test_the_checkpoint_converts_one_weight_at_a_time(tmp_path):
    result = run_probe(_SCRIPT, str(tmp_path))
    # the caller's model is held before the call, which adds the one
    # weight's array the checkpoint writes: 0.43 times the weights; every
    # weight converted before writing made it 1.18
    assert result["build"] < 0.7 * result["weights"], result


@needs_peak_reset
def test_a_path_with_external_data_keeps_the_weights_in_their_file(tmp_path):
    model = save_external(str(tmp_path), chain_model())
    result = run_probe(_SCRIPT, str(tmp_path / "out"), model)
    # the weight read while the checkpoint writes it: 0.43 times the
    # weights; loaded with the graph it was 2.41
    assert result["build"] < 0.7 * result["weights"], result


@pytest.mark.parametrize("loss", [artifacts.LossType.MSELoss, None])
def test_artifacts_from_a_path_equal_those_from_the_loaded_model(tmp_path, loss):
    expected = {t.name: onnx.numpy_helper.to_array(t)
                for t in chain_model(count=2, size=64).graph.initializer}
    path = save_external(str(tmp_path), chain_model(count=2, size=64))
    written = []
    for name, given in (("path", path), ("loaded", onnx.load(path))):
        written.append(artifacts.generate_artifacts(
            given, requires_grad=["W0", "W1"], loss=loss,
            optimizer=artifacts.OptimType.AdamW,
            artifact_directory=str(tmp_path / name)))
    for key in ("training_model", "eval_model", "optimizer_model"):
        with open(written[0][key], "rb") as a, open(written[1][key], "rb") as b:
            assert a.read() == b.read(), key
    for w in written:
        parameters = read_checkpoint(w["checkpoint"])["parameters"]
        assert [(n, trained) for n, _, trained in parameters] == [("W0", True), ("W1", True)]
        for name, value, _ in parameters:
            np.testing.assert_array_equal(value, expected[name])
    # the data file the path names is read, never written
    assert os.path.getsize(os.path.join(tmp_path, "model.data")) == \
        sum(v.nbytes for v in expected.values())


def test_artifacts_over_the_files_of_the_model_they_read(tmp_path):
    # the model given as a path named like an artifact, its external data
    # in the file the training model's external data would take: the
    # checkpoint reads the weights before any model replaces that file
    expected = {t.name: onnx.numpy_helper.to_array(t)
                for t in chain_model(count=2, size=64).graph.initializer}
    path = str(tmp_path / "training_model.onnx")
    onnx.save(chain_model(count=2, size=64), path, save_as_external_data=True,
              location="training_model.onnx.data")
    written = artifacts.generate_artifacts(
        path, requires_grad=["W0", "W1"], loss=artifacts.LossType.MSELoss,
        optimizer=artifacts.OptimType.AdamW, artifact_directory=str(tmp_path))
    for name, value, _ in read_checkpoint(written["checkpoint"])["parameters"]:
        np.testing.assert_array_equal(value, expected[name])
    assert list(written) == ["training_model", "eval_model", "optimizer_model",
                             "checkpoint"]
