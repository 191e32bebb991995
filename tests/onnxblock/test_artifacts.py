"""generate_artifacts: the seed-000 example, layouts, errors before writing,
no mutation of the caller's model."""
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxtrain.onnxblock as onnxblock
from onnxtrain import api, artifacts
from test_artifacts_models import (ARTIFACT_FILES, batch, chdir, run_seed,
                                   two_head_model)

TRAINABLE = ["weight1", "bias1", "weight2", "bias2"]
FROZEN = ["weight3", "bias3"]


@pytest.fixture(scope="module")
def seed_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("seed000")
    run_seed(directory)
    return directory


def _session(path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_seed_writes_the_four_artifacts_on_plain_onnxruntime(seed_dir):
    for name in ARTIFACT_FILES:
        assert (seed_dir / name).is_file(), name
    for name in ARTIFACT_FILES[:3]:
        model = onnx.load(str(seed_dir / name))
        onnx.checker.check_model(model, full_check=True)
        assert {n.domain for n in model.graph.node} <= {""}
        assert {o.domain for o in model.opset_import} <= {"", "ai.onnx"}
        assert model.ir_version <= 10  # onnxruntime 1.17+ reads it
        _session(seed_dir / name)
    training = _session(seed_dir / "training_model.onnx")
    inputs = [i.name for i in training.get_inputs()]
    assert inputs == (["input", "target1", "target2"] + FROZEN + TRAINABLE
                      + [f"{p}_grad.accumulation.buffer" for p in TRAINABLE]
                      + ["lazy_reset_grad"])
    outputs = [o.name for o in training.get_outputs()]
    assert outputs[1:] == [f"{p}_grad.accumulation.out" for p in TRAINABLE]
    evaluation = _session(seed_dir / "eval_model.onnx")
    assert [i.name for i in evaluation.get_inputs()] == inputs[:9]


def test_seed_loss_is_the_weighted_average_of_the_mses(seed_dir):
    state = api.CheckpointState.load_checkpoint(seed_dir / "checkpoint")
    module = api.Module(str(seed_dir / "training_model.onnx"), state,
                        str(seed_dir / "eval_model.onnx")).eval()
    x, t1, t2 = batch()
    p = {k: v.data for k, v in state.parameters.items()}
    h = np.maximum(x @ p["weight3"] + p["bias3"], 0)
    expected = 0.4 * ((h @ p["weight1"] + p["bias1"] - t1) ** 2).mean() + \
        0.6 * ((h @ p["weight2"] + p["bias2"] - t2) ** 2).mean()
    np.testing.assert_allclose(module(x, t1, t2), [expected], rtol=1e-5)


def test_seed_training_loop_lowers_the_loss_and_keeps_frozen(seed_dir):
    state = api.CheckpointState.load_checkpoint(seed_dir / "checkpoint")
    frozen = {n: state.parameters[n].data for n in FROZEN}
    trained = {n: state.parameters[n].data for n in TRAINABLE}
    module = api.Module(seed_dir / "training_model.onnx", state,
                        seed_dir / "eval_model.onnx")
    optimizer = api.Optimizer(seed_dir / "optimizer_model.onnx", module)
    optimizer.set_learning_rate(0.05)
    x, t1, t2 = batch()
    losses = []
    for _ in range(40):
        losses.append(float(module(x, t1, t2)[0]))
        optimizer.step()
        module.lazy_reset_grad()
    assert losses[-1] < 0.7 * losses[0]
    assert optimizer.step_count == 40
    for name, value in frozen.items():
        assert np.array_equal(state.parameters[name].data, value)
        assert state.parameters[name].grad is None
    for name, value in trained.items():
        assert not np.allclose(state.parameters[name].data, value)


def test_seed_float64_gradients_match_finite_differences(tmp_path):
    run_seed(tmp_path, dtype=np.float64)
    state = api.CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    module = api.Module(tmp_path / "training_model.onnx", state,
                        tmp_path / "eval_model.onnx")
    x, t1, t2 = batch(8, np.float64)
    module(x, t1, t2)
    module.eval()
    eps = 1e-6
    for name in TRAINABLE:
        param = state.parameters[name]
        value, grad = param.data, param.grad
        assert grad.dtype == np.float64 and grad.shape == value.shape
        numeric = np.zeros_like(value)
        for idx in np.ndindex(value.shape):
            shifted = []
            for sign in (1, -1):
                moved = value.copy()
                moved[idx] += sign * eps
                state.parameters[name] = moved
                shifted.append(module(x, t1, t2)[0])
            numeric[idx] = (shifted[0] - shifted[1]) / (2 * eps)
        state.parameters[name] = value
        np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-9)


def test_export_for_inferencing_matches_the_eval_model(tmp_path):
    paths = artifacts.generate_artifacts(
        two_head_model(), requires_grad=TRAINABLE, frozen_params=FROZEN,
        loss=artifacts.LossType.MSELoss, optimizer=artifacts.OptimType.SGD,
        artifact_directory=tmp_path, prefix="m_", loss_input_names=["output1"],
        additional_output_names=["output1", "output2"])
    assert sorted(paths) == ["checkpoint", "eval_model", "optimizer_model",
                             "training_model"]
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    module = api.Module(paths["training_model"], state, paths["eval_model"])
    optimizer = api.Optimizer(paths["optimizer_model"], module)
    x, t1, _ = batch()
    for _ in range(3):
        module(x, t1)
        optimizer.step()
        module.lazy_reset_grad()
    module.eval()
    _, out1, out2 = module(x, t1)
    exported = module.export_model_for_inferencing(
        tmp_path / "inference.onnx", ["output1", "output2"])
    sess = _session(tmp_path / "inference.onnx")
    assert [i.name for i in sess.get_inputs()] == ["input"]
    got1, got2 = sess.run(None, {"input": x})
    np.testing.assert_array_equal(got1, out1)
    np.testing.assert_array_equal(got2, out2)
    assert len(exported.graph.initializer) == 6


# errors before anything is written ------------------------------------------
class _TwoInputs(onnxblock.Block):
    def __init__(self):
        self._loss = onnxblock.loss.MSELoss()

    def build(self, a, b):
        return self._loss(a)


def _single_output_model():
    model = two_head_model()
    del model.graph.output[1]
    return model


@pytest.mark.parametrize("kwargs, error, pattern", [
    (dict(model=_single_output_model(), loss=_TwoInputs()), ValueError,
     r"takes 2 input\(s\) but the loss receives 1: \['output1'\]"),
    (dict(loss=_TwoInputs(), loss_input_names=["output1", "output2", "trunk"]),
     ValueError, r"takes 2 input\(s\) but the loss receives 3: "
                 r"\['output1', 'output2', 'trunk'\]"),
    (dict(frozen_params=["weight3", "weight1"]), ValueError,
     r"\['weight1'\] are in both requires_grad and frozen_params"),
    (dict(requires_grad=["weight1", "nope"]), ValueError,
     r"\['nope'\] are not initializers"),
    (dict(loss=artifacts.LossType.MSELoss), ValueError,
     r"2 outputs \['output1', 'output2'\].*loss_input_names"),
    (dict(requires_grad=[]), ValueError, "requires_grad is empty"),
    (dict(additional_output_names=["missing"]), ValueError, "missing"),
    (dict(custom_op_library="lib.so"), NotImplementedError, "custom_op_library"),
    (dict(loss="MSELoss"), TypeError, "LossType"),
])
def test_errors_are_raised_before_writing(tmp_path, kwargs, error, pattern):
    arguments = dict(model=two_head_model(), requires_grad=TRAINABLE,
                     frozen_params=FROZEN, loss=_WeightedLoss(),
                     optimizer=artifacts.OptimType.AdamW,
                     artifact_directory=tmp_path / "out")
    arguments.update(kwargs)
    with pytest.raises(error, match=pattern):
        artifacts.generate_artifacts(**arguments)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("loss_type, name", [
    (artifacts.LossType.MSELoss, "target"),
    (artifacts.LossType.CrossEntropyLoss, "labels")])
def test_target_names_colliding_with_the_model_are_refused(tmp_path, loss_type, name):
    model = two_head_model()
    model.graph.node[0].output[0] = name
    model.graph.node[1].input[0] = name
    with pytest.raises(ValueError, match=f"input '{name}'.*computes or stores"):
        artifacts.generate_artifacts(model, requires_grad=TRAINABLE, loss=loss_type,
                                     loss_input_names=["output1"],
                                     artifact_directory=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_graph_input_named_target_is_the_target(tmp_path):
    """As in onnxruntime-training (and TrainingBlock), the model's own
    input named 'target' is the built-in loss's target: one input, the
    loss against it."""
    W = np.array([[1.0, -2.0], [0.5, 0.0], [2.0, 1.0]], dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"]),
         helper.make_node("Identity", ["target"], ["t_copy"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3]),
         helper.make_tensor_value_info("target", TensorProto.FLOAT, ["N", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2]),
         helper.make_tensor_value_info("t_copy", TensorProto.FLOAT, ["N", 2])],
        [numpy_helper.from_array(W, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    paths = artifacts.generate_artifacts(model, requires_grad=["W"],
                                         loss=artifacts.LossType.MSELoss,
                                         loss_input_names=["y"],
                                         artifact_directory=tmp_path)
    module = api.Module(paths["training_model"],
                        api.CheckpointState.load_checkpoint(paths["checkpoint"]))
    assert module.input_names() == ["x", "target"]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    t = rng.standard_normal((4, 2)).astype(np.float32)
    np.testing.assert_allclose(module(x, t), ((x @ W - t) ** 2).mean(), rtol=1e-6)


class _WeightedLoss(onnxblock.Block):
    def __init__(self):
        self._mse = onnxblock.loss.MSELoss()
        self._l1 = onnxblock.loss.L1Loss()

    def build(self, output1, output2):
        return onnxblock.blocks.Add()(self._mse(output1, target_name="target1"),
                                      self._l1(output2, target_name="target2"))


class _TwoLossesOnOneOutput(onnxblock.Block):
    def build(self, output1, output2):
        first = onnxblock.loss.MSELoss()(output1, target_name="target1")
        second = onnxblock.loss.MSELoss()(output1, target_name="target2")
        third = onnxblock.loss.L1Loss(reduction="sum")(output1, target_name="target1")
        return onnxblock.blocks.Add()(onnxblock.blocks.Add()(first, second), third)


def test_two_loss_blocks_on_the_same_output_do_not_clash(tmp_path):
    paths = artifacts.generate_artifacts(
        two_head_model(), requires_grad=TRAINABLE[:2], loss=_TwoLossesOnOneOutput(),
        artifact_directory=tmp_path)
    assert "optimizer_model" not in paths
    model = onnx.load(paths["training_model"])
    node_names = [n.name for n in model.graph.node if n.name]
    values = [o for n in model.graph.node for o in n.output]
    assert len(node_names) == len(set(node_names))
    assert len(values) == len(set(values))
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    assert [n for n, p in state.parameters.items() if p.requires_grad] == TRAINABLE[:2]
    module = api.Module(paths["training_model"], state, paths["eval_model"])
    assert module.input_names() == ["input", "target1", "target2"]
    x, t1, _ = batch()
    t2 = t1 + 1
    assert list(state.parameters.keys()) == TRAINABLE[:2]  # other initializers stay constants
    p = {i.name: onnx.numpy_helper.to_array(i)
         for i in two_head_model().graph.initializer}
    out1 = np.maximum(x @ p["weight3"] + p["bias3"], 0) @ p["weight1"] + p["bias1"]
    expected = ((out1 - t1) ** 2).mean() + ((out1 - t2) ** 2).mean() + \
        np.abs(out1 - t1).sum()
    np.testing.assert_allclose(module(x, t1, t2), expected, rtol=1e-5)


# the caller's model is never modified ---------------------------------------
def test_caller_model_is_not_mutated(tmp_path):
    model = two_head_model()
    before = model.SerializeToString()
    artifacts.generate_artifacts(model, requires_grad=TRAINABLE,
                                 frozen_params=FROZEN, loss=_WeightedLoss(),
                                 optimizer=artifacts.OptimType.AdamW,
                                 artifact_directory=tmp_path, nominal_checkpoint=True)
    assert model.SerializeToString() == before
    assert (tmp_path / "nominal_checkpoint").is_file()


def _with_initializer(tensor):
    model = two_head_model()
    model.graph.initializer.append(tensor)
    return model


def test_non_float_parameter_refused_with_its_own_message(tmp_path):
    # the build leaves the trained weights' values out of its copy: an
    # integer initializer asked for training still gets the clear message,
    # not a failure reading a value the copy does not hold
    model = _with_initializer(numpy_helper.from_array(np.array([1, 2], np.int64),
                                                      "counts"))
    with pytest.raises(ValueError, match=r"\['counts'\] are not float"):
        artifacts.generate_artifacts(model, requires_grad=TRAINABLE + ["counts"],
                                     loss=_WeightedLoss(),
                                     artifact_directory=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_checkpoint_dtype_refused_before_any_file_is_written(tmp_path):
    # the checkpoint is streamed into its file after the models: its
    # arguments are checked before the first file
    model = _with_initializer(helper.make_tensor("names", TensorProto.STRING,
                                                 [1], [b"a"]))
    with pytest.raises(TypeError, match="bool, int and float arrays"):
        artifacts.generate_artifacts(model, requires_grad=TRAINABLE,
                                     frozen_params=FROZEN + ["names"],
                                     loss=_WeightedLoss(),
                                     artifact_directory=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_checkpoint_holds_the_values_of_the_callers_model(tmp_path):
    # the trained weights' values are read from the caller's model (the
    # build's copy holds none), the frozen ones from the copy
    model = two_head_model(seed=3)
    paths = artifacts.generate_artifacts(
        model, requires_grad=TRAINABLE, frozen_params=FROZEN,
        loss=_WeightedLoss(), optimizer=artifacts.OptimType.AdamW,
        artifact_directory=tmp_path)
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    order = [i.name for i in model.graph.initializer if i.name in TRAINABLE + FROZEN]
    assert list(state.parameters.keys()) == order
    for name, parameter in state.parameters.items():
        np.testing.assert_array_equal(parameter.data, inits[name])
        assert parameter.requires_grad == (name in TRAINABLE)
    training = onnx.load(paths["training_model"])
    assert not {i.name for i in training.graph.initializer} & set(TRAINABLE + FROZEN)
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".partial")]


class _ReadingAndEditingLoss(onnxblock.Block):
    """A custom loss that reads a trained weight in ``base``, runs the
    checker on it and edits the weight (onnxblock lets a block edit its
    base model)."""

    def __init__(self):
        self._mse = onnxblock.loss.MSELoss()
        self.read = None

    def build(self, output1, output2):
        inits = {i.name: i for i in self.base.graph.initializer}
        self.read = numpy_helper.to_array(inits["weight1"]).copy()
        onnx.checker.check_model(self.base)
        inits["weight1"].CopyFrom(numpy_helper.from_array(
            np.zeros_like(self.read), "weight1"))
        return self._mse(output1, target_name="target1")


def test_a_custom_loss_block_sees_and_edits_the_weights_values(tmp_path):
    # the build leaves the trained weights' values out of its copy only
    # with a built-in loss: a custom block keeps reading, checking and
    # editing them, and its edit reaches the checkpoint
    model = two_head_model(seed=4)
    loss = _ReadingAndEditingLoss()
    paths = artifacts.generate_artifacts(model, requires_grad=TRAINABLE,
                                         loss=loss, artifact_directory=tmp_path)
    original = numpy_helper.to_array(
        {i.name: i for i in model.graph.initializer}["weight1"])
    np.testing.assert_array_equal(loss.read, original)
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    np.testing.assert_array_equal(state.parameters["weight1"].data,
                                  np.zeros_like(original))
    np.testing.assert_array_equal(state.parameters["bias1"].data, numpy_helper.to_array(
        {i.name: i for i in model.graph.initializer}["bias1"]))


def test_model_with_external_data_path_and_proto(tmp_path):
    source = tmp_path / "ext"
    source.mkdir()
    onnx.save(two_head_model(), str(source / "model.onnx"),
              save_as_external_data=True, location="weights.bin",
              size_threshold=0)
    files = {p.name: p.read_bytes() for p in source.iterdir()}
    assert "weights.bin" in files
    loaded = onnx.load(str(source / "model.onnx"))
    before = loaded.SerializeToString()
    for i, model in enumerate([source / "model.onnx", str(source / "model.onnx"),
                               loaded]):
        paths = artifacts.generate_artifacts(
            model, requires_grad=TRAINABLE, frozen_params=FROZEN,
            loss=_WeightedLoss(), optimizer=artifacts.OptimType.SGD,
            artifact_directory=tmp_path / f"out{i}")
        state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
        np.testing.assert_array_equal(
            state.parameters["weight1"].data,
            onnx.numpy_helper.to_array(two_head_model().graph.initializer[2]))
    assert loaded.SerializeToString() == before
    assert {p.name: p.read_bytes() for p in source.iterdir()} == files
    unloaded = onnx.load(str(source / "model.onnx"), load_external_data=False)
    with pytest.raises(ValueError, match="external data"):
        artifacts.generate_artifacts(unloaded, requires_grad=TRAINABLE,
                                     artifact_directory=tmp_path / "never")
    assert not (tmp_path / "never").exists()


def test_loss_none_uses_the_first_output_and_writes_to_cwd(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]),
         helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        [onnx.numpy_helper.from_array(np.ones((3, 1), np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    with chdir(tmp_path):
        artifacts.generate_artifacts(model, requires_grad=["w"], prefix="p_")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "p_checkpoint", "p_eval_model.onnx", "p_training_model.onnx"]


def test_a_str_names_one_parameter(tmp_path):
    """requires_grad="weight1" is one name (not the characters of it), as
    the estimators' weights_to_train; the artifacts train that parameter
    and keep frozen_params="weight3" as a frozen input."""
    paths = artifacts.generate_artifacts(
        two_head_model(np.float64), requires_grad="weight1",
        frozen_params="weight3", loss=onnxblock.loss.MSELoss(),
        loss_input_names=["output1"], optimizer=artifacts.OptimType.SGD,
        artifact_directory=tmp_path)
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    assert {n: p.requires_grad for n, p in state.parameters.items()} == \
        {"weight1": True, "weight3": False}
    module = api.Module(paths["training_model"], state, paths["eval_model"])
    optimizer = api.Optimizer(paths["optimizer_model"], module)
    before = {n: p.data for n, p in state.parameters.items()}
    x, t1, _ = batch(dtype=np.float64)
    module(x, t1)
    grad = state.parameters["weight1"].grad
    assert np.abs(grad).max() > 1e-3
    optimizer.set_learning_rate(0.5)
    optimizer.step()
    np.testing.assert_allclose(state.parameters["weight1"].data,
                               before["weight1"] - 0.5 * grad, rtol=1e-12)
    np.testing.assert_array_equal(state.parameters["weight3"].data,
                                  before["weight3"])


def _floor_model():
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["t"]),
         helper.make_node("Floor", ["t"], ["y"])], "floor",
        [helper.make_tensor_value_info("x", f, ["N", 3])],
        [helper.make_tensor_value_info("y", f, ["N", 3])],
        [onnx.numpy_helper.from_array(np.ones(3, np.float32), "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_parameters_reaching_the_loss_only_through_floor(tmp_path):
    """The message names the parameters and the op that stops their
    gradient (autodiff said 'No output among [...] depends on ...')."""
    with pytest.raises(ValueError, match=r"Trainable parameters \['w'\] reach the "
                       r"loss '\w+' only through non-differentiable ops \(Floor\)"):
        artifacts.generate_artifacts(_floor_model(), requires_grad="w",
                                     loss=artifacts.LossType.MSELoss,
                                     artifact_directory=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_artifacts_take_the_lowest_ir_version_their_opsets_need(tmp_path):
    """onnx's make_model writes its newest IR version, which runtimes of an
    earlier release refuse (onnxruntime-node 1.31 reads IR 13 at most):
    the artifacts are written at the IR version of their opsets, unless
    the model uses element types of a newer IR (a Cast to float8)."""
    W = np.array([[1.0, -2.0], [0.5, 0.0], [2.0, 1.0]], dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
        [numpy_helper.from_array(W, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert model.ir_version == onnx.IR_VERSION > 8
    paths = artifacts.generate_artifacts(model, requires_grad=["W"],
                                         loss=artifacts.LossType.MSELoss,
                                         optimizer=artifacts.OptimType.AdamW,
                                         artifact_directory=tmp_path / "plain")
    for kind in ("training_model", "eval_model", "optimizer_model"):
        assert onnx.load(paths[kind]).ir_version == 8  # opset 17's
    x = np.ones((2, 3), dtype=np.float32)
    ort.InferenceSession(paths["eval_model"], providers=["CPUExecutionProvider"])
    module = api.Module(paths["training_model"],
                        api.CheckpointState.load_checkpoint(paths["checkpoint"]))
    np.testing.assert_allclose(module(x, np.zeros((2, 2), np.float32)),
                               ((x @ W) ** 2).mean(), rtol=1e-6)
    # a float8 cast (IR 9) keeps the model's version
    graph.node.extend([helper.make_node("Cast", ["x"], ["x8"], to=TensorProto.FLOAT8E4M3FN),
                       helper.make_node("Cast", ["x8"], ["x2"], to=TensorProto.FLOAT)])
    graph.output.append(helper.make_tensor_value_info("x2", TensorProto.FLOAT, ["N", 3]))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    paths = artifacts.generate_artifacts(model, requires_grad=["W"],
                                         loss=artifacts.LossType.MSELoss,
                                         loss_input_names=["y"],
                                         additional_output_names=["x2"],
                                         artifact_directory=tmp_path / "float8")
    assert onnx.load(paths["eval_model"]).ir_version == onnx.IR_VERSION
