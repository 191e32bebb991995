"""Reliability of errors (issue 32, items 5, 6 and 7): the models users give
(path, bytes, ModelProto) go through one loading and checking helper at
every entry point, so onnx's, protobuf's and onnxruntime's internal errors
do not leak; opsets beyond the installed onnxruntime are refused before
any work; messages name the file, tensor, node, op or opset at fault.
Grouped by kind: opsets, model loading, model checks, api checkpoints,
messages."""
import os

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxtrain.onnxblock as onnxblock
from onnxtrain import OrtGradientForwardBackward, api, artifacts
from onnxtrain.autodiff import build_gradient_models
from onnxtrain.estimators import (OrtGradientForwardBackwardClassifier,
                                  OrtGradientForwardBackwardOptimizer)
from onnxtrain.exceptions import InvalidModelError
from onnxtrain.neural_network import MLPClassifier, MLPRegressor
from onnxtrain.optim import LearningRateSGD
from onnxtrain.ortgradient import OrtGradientForwardBackward as OrtGradient
from onnxtrain.runtime.opsets import highest_opset
from test_reliability_runtime import linear_model, regression


def estimator(model):
    return OrtGradientForwardBackwardOptimizer(
        model, max_iter=2, learning_rate=LearningRateSGD(
            0.01, learning_rate="constant"))


def generate(model, directory):
    artifacts.generate_artifacts(
        model, requires_grad=["W", "B"], loss=artifacts.LossType.MSELoss,
        optimizer=artifacts.OptimType.SGD, artifact_directory=str(directory))


def build_module(directory):
    state = api.CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    module = api.Module(str(directory / "training_model.onnx"), state,
                        str(directory / "eval_model.onnx"))
    return state, module, api.Optimizer(
        str(directory / "optimizer_model.onnx"), module)


def with_opset(version, domain=""):
    model = linear_model()
    if domain:
        model.opset_import.append(helper.make_opsetid(domain, version))
    else:
        model.opset_import[0].version = version
    return model


def session_builds(model):
    try:
        onnxruntime.InferenceSession(model.SerializeToString(),
                                     providers=["CPUExecutionProvider"])
    except Exception:
        return False
    return True


# ------------------------------------------------------------------- opsets

@pytest.mark.parametrize("domain", ["", "ai.onnx.ml"])
def test_highest_opset_is_the_last_one_onnxruntime_loads(domain):
    highest = highest_opset(domain)
    assert highest >= (13 if domain == "" else 3)
    assert session_builds(with_opset(highest, domain))
    assert not session_builds(with_opset(highest + 1, domain))


def test_generate_artifacts_refuses_an_opset_beyond_the_runtime(tmp_path):
    beyond = highest_opset("") + 2
    model = with_opset(beyond)
    before = model.SerializeToString()
    with pytest.raises(InvalidModelError, match=(
            rf"opset {beyond} of domain 'ai.onnx', but the installed "
            rf"onnxruntime {onnxruntime.__version__} runs opsets up to "
            rf"{highest_opset('')}")):
        generate(model, tmp_path / "artifacts")
    assert not (tmp_path / "artifacts").exists()
    assert model.SerializeToString() == before


def test_generate_artifacts_refuses_an_ml_opset_beyond_the_runtime(tmp_path):
    beyond = highest_opset("ai.onnx.ml") + 1
    with pytest.raises(InvalidModelError, match=(
            rf"opset {beyond} of domain 'ai.onnx.ml'.* up to "
            rf"{highest_opset('ai.onnx.ml')}")):
        generate(with_opset(beyond, "ai.onnx.ml"), tmp_path)


def api_module(directory, opset=None, train_model=None):
    """api.Module of linear_model's artifacts, its training model given as a
    ModelProto importing ``opset`` or as ``train_model``."""
    generate(linear_model(), directory)
    state = api.CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    if train_model is None:
        train_model = onnx.load(str(directory / "training_model.onnx"))
        train_model.opset_import[0].version = opset
    return api.Module(train_model, state)


@pytest.mark.parametrize("entry", ["fit", "engine", "ortgradient", "api"])
def test_sessions_from_a_user_model_refuse_an_opset_beyond_the_runtime(
        entry, tmp_path):
    beyond = highest_opset("") + 1
    model = with_opset(beyond)
    X, y = regression()
    calls = {
        "fit": lambda: estimator(model).fit(X, y),
        "engine": lambda: OrtGradientForwardBackward(model, ["W", "B"]),
        "ortgradient": lambda: OrtGradient(model, ["W", "B"]),
        "api": lambda: api_module(tmp_path, beyond),
    }
    with pytest.raises(InvalidModelError, match=(
            rf"imports opset {beyond} of domain 'ai.onnx', but the installed "
            rf"onnxruntime .* runs opsets up to {highest_opset('')}")):
        calls[entry]()


# ------------------------------------------------------------ model loading

def external_model(folder, location, link_to=None):
    """linear_model saved in ``folder`` with W's data at ``location``."""
    folder.mkdir()
    model = linear_model()
    weight = model.graph.initializer[0]
    weight.ClearField("raw_data")
    weight.data_location = TensorProto.EXTERNAL
    weight.external_data.add(key="location", value=location)
    path = folder / "model.onnx"
    onnx.save(model, str(path))
    if link_to is not None:
        os.symlink(link_to, folder / location)
    return path


EXTERNAL = {
    # case: (location, symlink target, what onnx's message says)
    "missing": ("missing.bin", None, "not regular file"),
    "outside": ("../x.bin", None, "points outside the directory"),
    "device": ("/dev/zero", None, "should be a relative path"),
    "device-link": ("x.bin", "/dev/zero", "is a symbolic link"),
}


@pytest.mark.parametrize("case", sorted(EXTERNAL))
@pytest.mark.parametrize("entry", ["fit", "artifacts", "onnxblock", "engine"])
def test_external_data_that_cannot_be_read_names_the_file_and_tensor(
        case, entry, tmp_path):
    location, target, says = EXTERNAL[case]
    path = external_model(tmp_path / "model", location, target)
    X, y = regression()

    def in_onnxblock():
        with onnxblock.base(str(path)):
            pass
    calls = {"fit": lambda: estimator(str(path)).fit(X, y),
             "artifacts": lambda: generate(str(path), tmp_path / "out"),
             "onnxblock": in_onnxblock,
             "engine": lambda: OrtGradientForwardBackward(str(path))}
    with pytest.raises(InvalidModelError, match=(
            rf"{path}: the external data of an initializer cannot be read: "
            rf".*tensor name: W.*{says}")) as info:
        calls[entry]()
    assert isinstance(info.value.__cause__, onnx.checker.ValidationError)


@pytest.mark.parametrize("entry", ["fit", "engine", "api"])
def test_truncated_model_bytes_are_named(entry, tmp_path):
    data = linear_model().SerializeToString()
    X, y = regression()
    path = tmp_path / "truncated.onnx"
    path.write_bytes(data[:len(data) // 2])
    calls = {"fit": lambda: estimator(data[:len(data) // 2]).fit(X, y),
             "engine": lambda: OrtGradientForwardBackward(data[:-7]),
             "api": lambda: api_module(tmp_path, train_model=str(path))}
    with pytest.raises(InvalidModelError, match=(
            r"(the \d+ bytes given are|truncated\.onnx is) not (a serialized )?"
            r"(ONNX model|an ONNX model)")):
        calls[entry]()


# --------------------------------------------------------------- model checks

def duplicate_node_output():
    model = linear_model()
    model.graph.node[0].output[0] = "Y"
    model.graph.node[1].input[0] = "Y"
    return model


def unsorted_nodes():
    model = linear_model()
    nodes = list(model.graph.node)[::-1]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def duplicate_graph_output():
    model = linear_model()
    model.graph.output.append(model.graph.output[0])
    return model


def short_initializer(raw=True):
    model = linear_model()
    weight = model.graph.initializer[0]
    if not raw:
        weight.CopyFrom(helper.make_tensor("W", TensorProto.FLOAT, [4, 1],
                                           [0.5, 0.5, 0.5, 0.5]))
    weight.dims[:] = [8, 1]
    return model


BAD_GRAPHS = {
    # case: (model, what the message says)
    "duplicate node output": (duplicate_node_output,
                              r"'Y' has been used as output names multiple "
                              "times"),
    "unsorted nodes": (unsorted_nodes, r"topologically sorted, however input "
                       r"'XW' of node: name: OpType: Add"),
    "duplicate graph output": (duplicate_graph_output,
                               r"lists the graph outputs \['Y'\] more than "
                               "once"),
    "short raw initializer": (short_initializer,
                              r"initializer 'W' declares shape \(8, 1\) \(8 "
                              r"float values\) but its data holds 16 bytes"),
    "short typed initializer": (lambda: short_initializer(raw=False),
                                r"initializer 'W' declares shape \(8, 1\) \(8 "
                                r"float values\) but its data holds 4 values "
                                "in float_data"),
}


@pytest.mark.parametrize("case", sorted(BAD_GRAPHS))
@pytest.mark.parametrize("entry", ["fit", "engine", "artifacts"])
def test_graphs_onnxruntime_refuses_are_refused_naming_the_culprit(
        case, entry, tmp_path):
    make, says = BAD_GRAPHS[case]
    model = make()
    before = model.SerializeToString()
    X, y = regression()
    calls = {"fit": lambda: estimator(model).fit(X, y),
             "engine": lambda: OrtGradientForwardBackward(model, ["W", "B"]),
             "artifacts": lambda: generate(model, tmp_path / "out")}
    with pytest.raises(InvalidModelError, match=says):
        calls[entry]()
    assert model.SerializeToString() == before
    assert not (tmp_path / "out").exists()


def test_a_fit_refused_for_its_graph_keeps_the_fitted_state():
    X, y = regression()
    est = estimator(linear_model()).fit(X, y)
    expected = est.predict(X)
    est.set_params(model_onnx=unsorted_nodes())
    with pytest.raises(InvalidModelError, match="topologically sorted"):
        est.fit(X, y)
    est.set_params(model_onnx=linear_model())
    np.testing.assert_array_equal(est.predict(X), expected)


# ----------------------------------------------------------- api checkpoints

@pytest.fixture
def sgd_artifacts(tmp_path):
    generate(linear_model(), tmp_path)
    return tmp_path


@pytest.mark.parametrize("step", [2 ** 63 - 1, 10 ** 30])
def test_checkpoint_step_beyond_int64_is_refused_at_load(sgd_artifacts, step):
    state, module, optimizer = build_module(sgd_artifacts)
    state.optimizer_state.step = step
    api.CheckpointState.save_checkpoint(state, str(sgd_artifacts / "huge"),
                                        include_optimizer_state=True)
    with pytest.raises(ValueError, match=(
            rf"huge: checkpoint field optimizer.step: {step} leaves no next "
            rf"step: .* at most {2 ** 63 - 2}")):
        api.CheckpointState.load_checkpoint(str(sgd_artifacts / "huge"))


def test_optimizer_step_at_the_last_int64_count_is_refused(sgd_artifacts):
    state, module, optimizer = build_module(sgd_artifacts)
    X, y = regression(n=4)
    module(X.astype(np.float32), y.astype(np.float32)[:, None])
    weights = state.parameters["W"].data.copy()
    optimizer._state.step = 2 ** 63 - 1
    with pytest.raises(ValueError, match=(
            rf"step count {2 ** 63 - 1} leaves no next step")):
        optimizer.step()
    np.testing.assert_array_equal(state.parameters["W"].data, weights)
    optimizer._state.step = 2 ** 63 - 2  # the last count with a next step
    optimizer.step()
    assert optimizer.step_count == 2 ** 63 - 1
    assert not np.array_equal(state.parameters["W"].data, weights)


# ------------------------------------------------------------------ messages

@pytest.mark.parametrize("make", [
    lambda: estimator(linear_model()),
    lambda: MLPRegressor(max_iter=1),
])
def test_y_of_rank_3_names_the_ranks_allowed_and_its_shape(make):
    X, y = regression()
    with pytest.raises(ValueError, match=(
            r"y must have shape \(n_samples,\) or \(n_samples, n_outputs\) "
            r"\(1-D or 2-D\), got shape \(60, 1, 1\)")):
        make().fit(X, y.reshape(-1, 1, 1))


def test_classifier_y_and_sample_weight_of_rank_3_name_their_shape():
    X, y = regression()
    labels = (y > 0).astype(np.int64)
    with pytest.raises(ValueError, match=r"y must have shape .*\(1-D or "
                       r"2-D\), got shape \(60, 1, 1\)"):
        MLPClassifier(max_iter=1).fit(X, labels.reshape(-1, 1, 1))
    with pytest.raises(ValueError, match=r"sample_weight must have shape "
                       r"\(n_samples,\) \(1-D\), got shape \(60, 1, 1\)"):
        OrtGradientForwardBackwardClassifier(
            linear_model(n_outputs=2, softmax=True), max_iter=1).fit(
                X, labels, sample_weight=np.ones((60, 1, 1)))


def off_path_model(op_type, domain="", x_shape=(None, 3)):
    """X -> op_type (no weight upstream) -> MatMul with the weight W."""
    nodes = [helper.make_node(op_type, ["X"], ["X2"], name="pre", domain=domain),
             helper.make_node("MatMul", ["X2", "W"], ["Y"], name="mm")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(
            "X", TensorProto.FLOAT, None if x_shape is None else list(x_shape))],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.ones((3, 2), np.float32), "W")])
    imports = [helper.make_opsetid("", 17)]
    if domain:
        imports.append(helper.make_opsetid(domain, 1))
    return helper.make_model(graph, opset_imports=imports)


def test_missing_rank_names_the_op_off_the_weights_path_that_lost_it():
    with pytest.raises(ValueError, match=(
            r"The gradient of MatMul node 'mm' needs the rank of its input "
            r"'X2', which shape inference could not tell: 'X2' is an output "
            r"of com.example.Foo node 'pre', whose output shape onnx's shape "
            r"inference does not give; declare the shape of 'X2'")):
        build_gradient_models(off_path_model("Foo", "com.example"), ["W"])


def test_missing_rank_names_the_graph_input_without_a_shape():
    with pytest.raises(ValueError, match=(
            r"MatMul node 'mm' needs the rank of its input 'X2', .*: the graph "
            r"input 'X' declares no shape")):
        build_gradient_models(off_path_model("Hardmax", x_shape=None), ["W"])
    # the same graph with X's shape declared differentiates
    assert build_gradient_models(off_path_model("Hardmax"), ["W"])
