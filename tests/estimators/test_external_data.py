"""A model given to an estimator as a path whose weights are external data
(issue 37): its float weights are read from their files into the engine's
weights, the other initializers loaded; the fit, the stored model and the
files behave as with the model given in memory, and external data that
cannot be read is refused before any step, naming the initializer and file."""
import os
import pickle

import numpy as np
import onnx
import pytest
from onnx import TensorProto, external_data_helper, helper, numpy_helper

from onnxtrain import OrtGradientForwardBackwardOptimizer
from onnxtrain._utils.files import load_onnx_file_deferred
from onnxtrain.exceptions import InvalidModelError
from onnxtrain.training.callbacks import Callback


def small_model():
    """X (N, 16) @ W (16, 128) + C (128, frozen), reshaped by S (int64),
    + B (128): a trained weight and bias, a frozen float constant and an
    integer initializer, all above onnx's external-data threshold of 0."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((0.1 * rng.standard_normal((16, 128))).astype(
                 np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal(128).astype(np.float32), "C"),
             numpy_helper.from_array(np.array([-1, 128], dtype=np.int64), "S"),
             numpy_helper.from_array(np.zeros(128, dtype=np.float32), "B")]
    nodes = [helper.make_node("MatMul", ["X", "W"], ["xw"]),
             helper.make_node("Add", ["xw", "C"], ["xc"]),
             helper.make_node("Reshape", ["xc", "S"], ["xr"]),
             helper.make_node("Add", ["xr", "B"], ["Y"])]
    graph = helper.make_graph(
        nodes, "external",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 16])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 128])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def save_external(model, folder):
    path = os.path.join(folder, "model.onnx")
    onnx.save(model, path, save_as_external_data=True, location="model.data",
              size_threshold=0)
    return path


def data():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((40, 16)).astype(np.float32)
    return X, rng.standard_normal((40, 128)).astype(np.float32)


def estimator(model, **kwargs):
    return OrtGradientForwardBackwardOptimizer(
        model, weights_to_train=["W", "B"], max_iter=3, batch_size=8,
        learning_rate=1e-2, shuffle=False, **kwargs)


def files(folder):
    return {name: open(os.path.join(folder, name), "rb").read()
            for name in sorted(os.listdir(folder))}


@pytest.mark.parametrize("training_path", ["fused", "split"])
def test_a_path_with_external_data_fits_as_the_model_in_memory(training_path, tmp_path):
    model = small_model()
    path = save_external(small_model(), str(tmp_path))  # onnx.save edits it
    stored = onnx.load(path, load_external_data=False)
    assert all(t.data_location == TensorProto.EXTERNAL for t in stored.graph.initializer)
    before = files(str(tmp_path))
    X, y = data()
    in_memory = estimator(model, training_path=training_path).fit(X, y)
    from_path = estimator(path, training_path=training_path).fit(X, y)
    assert from_path.get_params()["model_onnx"] == path
    expected = in_memory.get_state()
    for got, want in zip(from_path.get_state(), expected):
        np.testing.assert_array_equal(got, want)
    assert not np.array_equal(expected[0], numpy_helper.to_array(model.graph.initializer[0]))
    np.testing.assert_array_equal(from_path.predict(X), in_memory.predict(X))
    trained = {t.name: numpy_helper.to_array(t)
               for t in from_path.get_trained_onnx().graph.initializer}
    for t in in_memory.get_trained_onnx().graph.initializer:
        np.testing.assert_array_equal(trained[t.name], numpy_helper.to_array(t))
    again = pickle.loads(pickle.dumps(from_path))
    np.testing.assert_array_equal(again.predict(X), in_memory.predict(X))
    assert files(str(tmp_path)) == before  # nothing written next to the model


class Started(Callback):
    def __init__(self):
        self.started = False

    def on_train_begin(self, estimator, X=None, y=None):
        self.started = True


def _edit_external(path, name, edit):
    """Rewrite the model file at ``path`` (not its data) with the external
    data entries of initializer ``name`` edited by ``edit(dict) -> dict``."""
    model = onnx.load(path, load_external_data=False)
    tensor = [t for t in model.graph.initializer if t.name == name][0]
    entries = edit({e.key: e.value for e in tensor.external_data})
    del tensor.external_data[:]
    for key, value in entries.items():
        tensor.external_data.add(key=key, value=value)
    onnx.save(model, path)


CASES = {
    # case: (edit of W's entries, of W's data file, what the message says)
    "outside": (lambda e: {**e, "location": "../model.data"}, None,
                r"tensor name: W\).*points outside the directory"),
    "absolute": (lambda e: {**e, "location": "/dev/zero"}, None,
                 r"tensor name: W\).*should be a relative path"),
    "length": (lambda e: {**e, "length": str(int(e["length"]) - 4)}, None,
               r"initializer 'W' in .*model\.data is 8188 bytes long, but its "
               r"shape \[16, 128\] of float32 takes 8192"),
    "short": (lambda e: e, "truncate",
              r"initializer 'W' in .*model\.data takes bytes \d+ to \d+, "
              r"but the file holds \d+"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_external_data_that_cannot_be_read_is_refused_before_training(case, tmp_path):
    edit, data_edit, says = CASES[case]
    folder = tmp_path / "model"
    folder.mkdir()
    (tmp_path / "model.data").write_bytes(b"\0" * 100000)  # what '..' would reach
    path = save_external(small_model(), str(folder))
    _edit_external(path, "W", edit)
    if data_edit == "truncate":
        data_file = folder / "model.data"
        data_file.write_bytes(data_file.read_bytes()[:1000])
    started = Started()
    est = estimator(path, callbacks=[started])
    X, y = data()
    with pytest.raises(InvalidModelError, match=rf"{path}: .*{says}"):
        est.fit(X, y)
    assert not started.started
    assert not hasattr(est, "weights_to_train_")


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_deferred_data_reads_the_values_onnx_loads(dtype, tmp_path):
    rng = np.random.default_rng(2)
    values = {"A": rng.standard_normal((3, 50)).astype(dtype),
              "B": rng.standard_normal(7).astype(dtype),  # not deferred
              "I": np.arange(100, dtype=np.int64)}  # not a float: loaded
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph(
        [helper.make_node("Identity", ["A"], ["Y"])], "g", [],
        [helper.make_tensor_value_info("Y", elem, [3, 50])],
        [numpy_helper.from_array(v, n) for n, v in values.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = save_external(model, str(tmp_path))
    proto, external = load_onnx_file_deferred(path, lambda t: t.name != "B")
    assert sorted(external) == ["A"]
    got = external["A"].to_array()
    assert got.dtype == dtype and got.flags.writeable
    np.testing.assert_array_equal(got, values["A"])
    inits = {t.name: t for t in proto.graph.initializer}
    assert not inits["A"].raw_data and inits["A"].data_location == TensorProto.DEFAULT
    assert list(inits["A"].dims) == [3, 50]
    for name in ("B", "I"):
        np.testing.assert_array_equal(numpy_helper.to_array(inits[name]), values[name])
    # the location is checked again when read: a link put in the file's place
    # since the model was loaded is refused
    data_file = tmp_path / "model.data"
    os.replace(data_file, tmp_path / "moved.data")
    os.symlink(tmp_path / "moved.data", data_file)
    with pytest.raises(InvalidModelError, match=r"initializer 'A' can no longer be "
                       r"read .*symbolic link"):
        external["A"].to_array()


@pytest.mark.parametrize("form", ["proto", "bytes"])
def test_a_proto_with_unloaded_external_data_is_refused(form, tmp_path, monkeypatch):
    """A ModelProto (or its bytes) whose initializers point to external
    files names no folder: refused before any work with what to do, even
    from the folder that holds the file (onnx's checker found it there,
    and onnxruntime then failed on the integer initializer at the first
    run); the same model loaded with its data trains."""
    path = save_external(small_model(), str(tmp_path))
    proto = onnx.load(path, load_external_data=False)
    model = proto if form == "proto" else proto.SerializeToString()
    X, y = data()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidModelError, match=r"\['W', 'C', 'S', 'B'\].*"
                       r"\['model.data'\].*load_external_data_for_model"):
        estimator(model).fit(X, y)
    onnx.load_external_data_for_model(proto, str(tmp_path))
    assert estimator(proto).fit(X, y).n_iter_ == 3


def test_a_constant_attribute_left_in_an_external_file_is_refused(tmp_path):
    """onnx.save(convert_attribute=True) moves Constant values out too: a
    proto whose only external tensor is an attribute is refused as well."""
    model = small_model()
    graph = model.graph
    s = next(i for i in graph.initializer if i.name == "S")
    graph.node.insert(0, helper.make_node("Constant", [], ["S"], value=s))
    graph.initializer.remove(s)
    path = os.path.join(tmp_path, "model.onnx")
    onnx.save(model, path, save_as_external_data=True, location="model.data",
              size_threshold=0, convert_attribute=True)
    proto = onnx.load(path, load_external_data=False)
    for tensor in proto.graph.initializer:  # the initializers loaded, not S
        external_data_helper.load_external_data_for_tensor(tensor, str(tmp_path))
        tensor.data_location = TensorProto.DEFAULT
        del tensor.external_data[:]
    with pytest.raises(InvalidModelError, match=r"\['S'\]"):
        estimator(proto).fit(*data())
