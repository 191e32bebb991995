"""Behaviours of onnxruntime-training's on-device API that ported code relies
on (pinned by onnxruntime's own tests, counted by
benchmarks/compat_ort_suite.py): OrtValues in and out of Module, parameter
iteration, nominal checkpoints, onnxblock composition without trainable
parameters, optimizer models over tensor sequences, ORT-format artifacts,
and loss target names that would compare the model with itself."""
import importlib.util
import os

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime import OrtValue

import onnxtrain.onnxblock as onnxblock
from onnxtrain import api, artifacts
from test_api import AdamWReference, clip_reference

W0 = np.array([[0.5, -1.0], [0.25, 2.0], [-0.75, 1.5]], dtype=np.float32)
B0 = np.array([0.1, -0.2], dtype=np.float32)


def linear_model(opset=17):
    """y = x @ W + b, x float32 (N, 3)."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"]),
         helper.make_node("Add", ["xw", "b"], ["y"])], "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
        [numpy_helper.from_array(W0, "W"), numpy_helper.from_array(B0, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def data(seed=0, n=4):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, 3)).astype(np.float32),
            rng.standard_normal((n, 2)).astype(np.float32))


def mse(x, t, w=W0, b=B0):
    return float(((x @ w + b - t) ** 2).mean())


class MSEBlock(onnxblock.TrainingBlock):
    def __init__(self):
        super().__init__()
        self.loss = onnxblock.loss.MSELoss()

    def build(self, output_name):
        return self.loss(output_name)


def run(model, feeds, names=None):
    session = onnxruntime.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    return session.run(names, feeds)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return artifacts.generate_artifacts(
        linear_model(), requires_grad=["W"], frozen_params=["b"],
        loss=artifacts.LossType.MSELoss, optimizer=artifacts.OptimType.AdamW,
        artifact_directory=tmp_path_factory.mktemp("ort"), nominal_checkpoint=True,
        ort_format=True)


def open_module(paths, checkpoint="checkpoint", suffix="model"):
    state = api.CheckpointState.load_checkpoint(paths[checkpoint])
    module = api.Module(paths[f"training_{suffix}"], state, paths[f"eval_{suffix}"])
    return state, module, api.Optimizer(paths[f"optimizer_{suffix}"], module)


# api ----------------------------------------------------------------------
def test_module_returns_ortvalues_for_ortvalue_inputs(paths):
    _, module, _ = open_module(paths)
    x, t = data()
    loss = module(OrtValue.ortvalue_from_numpy(x), OrtValue.ortvalue_from_numpy(t))
    assert isinstance(loss, OrtValue)
    np.testing.assert_allclose(loss.numpy(), mse(x, t), rtol=1e-6)
    mixed = module.eval()(OrtValue.ortvalue_from_numpy(x), t)  # one array: arrays
    assert isinstance(mixed, np.ndarray)
    np.testing.assert_allclose(mixed, mse(x, t), rtol=1e-6)


def test_contiguous_parameters_are_ortvalues_both_ways(paths):
    state, module, _ = open_module(paths)
    flat = module.get_contiguous_parameters(trainable_only=False)
    assert isinstance(flat, OrtValue)
    np.testing.assert_array_equal(flat.numpy(), np.concatenate([W0.ravel(), B0]))
    module.copy_buffer_to_parameters(
        OrtValue.ortvalue_from_numpy(np.arange(6, dtype=np.float32)), True)
    np.testing.assert_array_equal(state.parameters["W"].data,
                                  np.arange(6, dtype=np.float32).reshape(3, 2))
    np.testing.assert_array_equal(state.parameters["b"].data, B0)


def test_parameters_iterate_as_name_parameter_pairs(paths):
    state, module, _ = open_module(paths)
    pairs = [(name, param.name, param.requires_grad) for name, param in state.parameters]
    assert pairs == [("W", "W", True), ("b", "b", False)]
    assert len(state.parameters) == 2 and "W" in state.parameters
    assert "x" not in state.parameters
    assert list(state.parameters.keys()) == ["W", "b"]
    # as onnxruntime: a trained parameter's gradient reads zeros before the
    # first call, a frozen one's is None
    np.testing.assert_array_equal(state.parameters["W"].grad, np.zeros((3, 2)))
    assert state.parameters["b"].grad is None
    x, t = data()
    module(x, t)
    expected = 2 * x.T @ (x @ W0 + B0 - t) / t.size
    np.testing.assert_allclose(state.parameters["W"].grad, expected, rtol=1e-5)


def test_nominal_checkpoint_raises_until_loaded(paths):
    nominal, module, optimizer = open_module(paths, "nominal_checkpoint")
    x, t = data()
    assert "W" in nominal.parameters and module.get_parameters_size(False) == 8
    with pytest.raises(RuntimeError, match="Please load the parameter states first"):
        nominal.parameters["W"]
    with pytest.raises(RuntimeError, match="Please load all the parameter states first"):
        nominal.parameters["W"] = W0
    for call in (module.get_contiguous_parameters, lambda: module(x, t),
                 optimizer.step, lambda: module.eval()(x, t)):
        with pytest.raises(RuntimeError, match="Please load the model parameters first."):
            call()
    with pytest.raises(RuntimeError, match="Please load the parameter states first"):
        api.CheckpointState.save_checkpoint(nominal, os.devnull)
    module.train()
    _, full, full_optimizer = open_module(paths)
    module.copy_buffer_to_parameters(full.get_contiguous_parameters(), False)
    np.testing.assert_array_equal(nominal.parameters["b"].data, B0)
    np.testing.assert_allclose(module(x, t), mse(x, t), rtol=1e-6)
    module.lazy_reset_grad()  # the same gradients as full's one call
    assert module(x, t) == full(x, t)
    optimizer.step()
    full_optimizer.step()
    np.testing.assert_array_equal(module.get_contiguous_parameters().numpy(),
                                  full.get_contiguous_parameters().numpy())


def test_ort_format_artifacts_train_as_the_onnx_ones(paths):
    for key in ("training_model", "eval_model", "optimizer_model"):
        assert paths[f"{key}_ort"] == paths[key][:-len(".onnx")] + ".ort"
        with open(paths[f"{key}_ort"], "rb") as f:
            assert f.read(8)[4:8] == b"ORTM"
    results = []
    for suffix in ("model", "model_ort"):
        state, module, optimizer = open_module(paths, suffix=suffix)
        x, t = data(3)
        losses = [float(module(x, t))]
        optimizer.step()
        losses.append(float(module.eval()(x, t)))
        results.append((losses, state.parameters["W"].data))
    np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-6)
    np.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-6)
    assert results[0][0][1] < results[0][0][0]
    with pytest.raises(ValueError, match="ONNX format"):
        module.export_model_for_inferencing(os.devnull, ["y"])


def test_string_inputs_run_through_cast(tmp_path):
    class StringBlock(onnxblock.ForwardBlock):
        def __init__(self):
            super().__init__()
            self.cast = onnxblock.blocks.Cast(to=TensorProto.FLOAT)
            self.linear = onnxblock.blocks.Linear(3, 2)

        def build(self, name):
            return self.linear(self.cast(name))

    block = StringBlock()
    with onnxblock.empty_base() as accessor:
        accessor.model.graph.input.append(
            helper.make_tensor_value_info("s", TensorProto.STRING, ["N", 3]))
        block("s")
    model = block.to_model_proto()
    names = [i.name for i in model.graph.initializer]
    paths = artifacts.generate_artifacts(model, requires_grad=names,
                                         loss=artifacts.LossType.MSELoss,
                                         artifact_directory=tmp_path)
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    module = api.Module(paths["training_model"], state, paths["eval_model"])
    strings = np.array([["1.5", "-2", "0.25"], ["3", "0", "1e-1"]])
    target = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    weight, bias = (state.parameters[n].data for n in names)
    expected = ((strings.astype(np.float32) @ weight.T + bias - target) ** 2).mean()
    np.testing.assert_allclose(module(strings, target), expected, rtol=1e-6)
    np.testing.assert_allclose(module.eval()(strings, target), expected, rtol=1e-6)


# onnxblock ----------------------------------------------------------------
def test_base_yields_an_accessor_of_the_edited_model():
    with onnxblock.base(linear_model()) as accessor:
        assert accessor.model is onnxblock.current_base().model
        assert accessor.graph is accessor.model.graph
        assert accessor.opset_import[0].version == 17


def test_training_block_without_trainable_parameter_builds():
    block = MSEBlock()
    block.requires_grad("b", False)
    with onnxblock.base(linear_model()):
        block("y")
    trainable, frozen = block.parameters()
    assert trainable == [] and [t.name for t in frozen] == ["b"]
    training, evaluation = block.to_model_proto()
    assert [o.name for o in training.graph.output] == [training.graph.output[0].name]
    x, t = data()
    feeds = {"x": x, "target": t, "b": B0, "lazy_reset_grad": np.array(True)}
    np.testing.assert_allclose(run(training, feeds)[0], mse(x, t), rtol=1e-6)
    del feeds["lazy_reset_grad"]
    np.testing.assert_allclose(run(evaluation, feeds)[0], mse(x, t), rtol=1e-6)


def test_generate_artifacts_without_requires_grad(tmp_path):
    paths = artifacts.generate_artifacts(linear_model(), loss=artifacts.LossType.MSELoss,
                                         artifact_directory=tmp_path / "a")
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    assert len(state.parameters) == 0
    module = api.Module(paths["training_model"], state, paths["eval_model"])
    x, t = data(1)
    np.testing.assert_allclose(module(x, t), mse(x, t), rtol=1e-6)
    with pytest.raises(ValueError, match="optimizer model needs trainable parameters"):
        artifacts.generate_artifacts(linear_model(), loss=artifacts.LossType.MSELoss,
                                     optimizer=artifacts.OptimType.SGD,
                                     artifact_directory=tmp_path / "b")
    assert not (tmp_path / "b").exists()


def test_requires_grad_on_an_input_outputs_its_gradient():
    block = MSEBlock()
    block.requires_grad("x")
    with onnxblock.base(linear_model()):
        block("y")
    training, _ = block.to_model_proto()
    inputs = [i.name for i in training.graph.input]
    assert inputs == ["x", "target", "x_grad.accumulation.buffer", "lazy_reset_grad"]
    x, t = data()
    grad = 2 * (x @ W0 + B0 - t) @ W0.T / t.size
    buffer = np.full_like(x, 0.5)
    for reset, expected in ((True, grad), (False, grad + buffer)):
        out = run(training, {"x": x, "target": t, "x_grad.accumulation.buffer": buffer,
                             "lazy_reset_grad": np.array(reset)},
                  ["x_grad.accumulation.out"])[0]
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-7)


def _optimizer_model(optimizer, trainable=("W", "b")):
    block = MSEBlock()
    for name in trainable:
        block.requires_grad(name)
    with onnxblock.base(linear_model()):
        block("y")
    with onnxblock.empty_base() as accessor:
        flag = optimizer(block.parameters())
    return flag, accessor.model


@pytest.mark.parametrize("max_norm", [None, 0.5, 100.0])
def test_adamw_over_tensor_sequences_matches_numpy(max_norm):
    clip = None if max_norm is None else onnxblock.optim.ClipGradNorm(max_norm)
    flag, model = _optimizer_model(onnxblock.optim.AdamW(weight_decay=0.01,
                                                         clip_grad=clip))
    assert flag == "updated_flag"
    assert [i.name for i in model.graph.input] == [
        "learning_rate", "step", "params", "gradients", "first_order_moments",
        "second_order_moments"]
    rng = np.random.default_rng(5)
    params = {"W": W0, "b": B0}
    grads = {n: rng.standard_normal(p.shape).astype(np.float32) for n, p in params.items()}
    moments = {n: {"exp_avg": 0.1 * g, "exp_avg_sq": 0.2 * g * g} for n, g in grads.items()}
    feeds = {"learning_rate": np.array([0.05], np.float32), "step": np.array([3]),
             "params": list(params.values()), "gradients": list(grads.values()),
             "first_order_moments": [m["exp_avg"] for m in moments.values()],
             "second_order_moments": [m["exp_avg_sq"] for m in moments.values()]}
    out = dict(zip(["updated_flag", "params.updated", "first_order_moments.updated",
                    "second_order_moments.updated"], run(model, feeds)))
    assert out["updated_flag"].tolist() == [True]
    if max_norm is not None:
        grads = clip_reference(grads, max_norm)
    reference = AdamWReference(weight_decay=0.01)
    for i, name in enumerate(params):
        expected = reference.update(params[name].astype(np.float64), grads[name],
                                    moments[name], 0.05, 3)
        np.testing.assert_allclose(out["params.updated"][i], expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out["first_order_moments.updated"][i],
                                   moments[name]["exp_avg"], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("optimizer", [
    lambda clip: onnxblock.optim.AdamW(weight_decay=0.01, clip_grad=clip),
    lambda clip: onnxblock.optim.SGD(clip_grad=clip)], ids=["AdamW", "SGD"])
@pytest.mark.parametrize("max_norm", [None, 0.5])
def test_api_optimizer_runs_the_manual_workflow(tmp_path, optimizer, max_norm):
    """onnxruntime-training's manual workflow: the TrainingBlock's model,
    the optimizer block's sequence model and onnxblock.save_checkpoint,
    loaded by api.Module and api.Optimizer, train as the artifacts of
    generate_artifacts with the same optimizer do (steps, moments, and
    the checkpoint of both)."""
    clip = None if max_norm is None else onnxblock.optim.ClipGradNorm(max_norm)
    block = MSEBlock()
    block.requires_grad("W")
    block.requires_grad("b")
    with onnxblock.base(linear_model()):
        block("y")
    training, _ = block.to_model_proto()
    with onnxblock.empty_base() as accessor:
        optimizer(clip)(block.parameters())
    onnx.save(training, tmp_path / "training.onnx")
    onnx.save(accessor.model, tmp_path / "optimizer.onnx")
    onnxblock.save_checkpoint(block.parameters(), tmp_path / "manual.ckpt")
    paths = artifacts.generate_artifacts(
        linear_model(), requires_grad=["W", "b"], loss=artifacts.LossType.MSELoss,
        optimizer=optimizer(clip), artifact_directory=tmp_path / "artifacts")
    runs = []
    for train, opt, ckpt in (
            (tmp_path / "training.onnx", tmp_path / "optimizer.onnx",
             tmp_path / "manual.ckpt"),
            (paths["training_model"], paths["optimizer_model"], paths["checkpoint"])):
        state = api.CheckpointState.load_checkpoint(ckpt)
        module = api.Module(train, state)
        opt = api.Optimizer(opt, module)
        opt.set_learning_rate(0.1)
        losses = []
        x, t = data(0)
        for _ in range(3):
            losses.append(float(module(x, t)))
            opt.step()
            module.lazy_reset_grad()
        api.CheckpointState.save_checkpoint(state, tmp_path / f"after{len(runs)}.ckpt",
                                            include_optimizer_state=True)
        saved = api.CheckpointState.load_checkpoint(tmp_path / f"after{len(runs)}.ckpt")
        runs.append((losses, {n: saved.parameters[n].data for n in ("W", "b")},
                     saved.optimizer_state))
    np.testing.assert_allclose(runs[0][0], runs[1][0], rtol=1e-6)
    assert runs[0][0][-1] < runs[0][0][0]
    for name in ("W", "b"):
        np.testing.assert_allclose(runs[0][1][name], runs[1][1][name], rtol=1e-6)
        assert not np.allclose(runs[0][1][name], {"W": W0, "b": B0}[name])
    assert runs[0][2].step == runs[1][2].step == 3
    for name, states in runs[1][2].states.items():
        assert set(runs[0][2].states[name]) == set(states)
        for key, value in states.items():
            np.testing.assert_allclose(np.asarray(runs[0][2].states[name][key]),
                                       np.asarray(value), rtol=1e-6, atol=1e-8)


def test_sgd_over_tensor_sequences_and_errors():
    _, model = _optimizer_model(onnxblock.optim.SGD(), trainable=("W",))
    g = np.full_like(W0, 2.0)
    out = run(model, {"learning_rate": np.array([0.1], np.float32),
                      "step": np.array([1]), "params": [W0], "gradients": [g]},
              ["params.updated"])[0]
    np.testing.assert_allclose(out[0], W0 - 0.2, rtol=1e-6)
    with pytest.raises(ValueError, match="at least one trainable parameter"):
        _optimizer_model(onnxblock.optim.SGD(), trainable=())


@pytest.mark.parametrize("max_norm", [0.1, 1000.0])
def test_clip_grad_norm_on_a_gradient_sequence(max_norm):
    class Clip(onnxblock.ForwardBlock):
        def __init__(self):
            super().__init__()
            self.clip = onnxblock.optim.ClipGradNorm(max_norm)

        def build(self, name):
            return self.clip(name)

    block = Clip()
    with onnxblock.empty_base() as accessor:
        accessor.model.graph.input.append(helper.make_tensor_sequence_value_info(
            "gradients", TensorProto.FLOAT, None))
        output = block("gradients")
    model = block.to_model_proto()
    assert [o.name for o in model.graph.output] == [output]
    grads = {"a": W0, "b": B0, "c": np.array(3.0, np.float32)}
    clipped = run(model, {"gradients": list(grads.values())})[0]
    expected = clip_reference({k: v.astype(np.float64) for k, v in grads.items()},
                              max_norm)
    for got, want in zip(clipped, expected.values()):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_save_checkpoint_and_load_it_into_a_model(tmp_path):
    block = MSEBlock()
    block.requires_grad("W")
    block.requires_grad("b", False)
    with onnxblock.base(linear_model()):
        block("y")
    path = tmp_path / "checkpoint"
    onnxblock.save_checkpoint(block.parameters(), path)
    state = api.CheckpointState.load_checkpoint(path)
    assert [(n, p.requires_grad) for n, p in state.parameters] == [("W", True), ("b", False)]
    target = linear_model()
    for init in target.graph.initializer:
        init.CopyFrom(numpy_helper.from_array(
            np.zeros_like(numpy_helper.to_array(init)), init.name))
    onnxblock.load_checkpoint_to_model(path, target)
    values = {i.name: numpy_helper.to_array(i) for i in target.graph.initializer}
    np.testing.assert_array_equal(values["W"], W0)
    np.testing.assert_array_equal(values["b"], B0)
    other = linear_model()
    other.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.zeros(3, np.float32), "b"))
    before = other.SerializeToString()
    with pytest.raises(ValueError, match="'b' is float32 of shape \\(2,\\)"):
        onnxblock.load_checkpoint_to_model(path, other)
    assert other.SerializeToString() == before
    onnxblock.save_checkpoint(block.parameters(), tmp_path / "nominal", nominal_checkpoint=True)
    with pytest.raises(ValueError, match="nominal checkpoint"):
        onnxblock.load_checkpoint_to_model(tmp_path / "nominal", other)


def test_label_encoder_block_maps_labels():
    class Encode(onnxblock.ForwardBlock):
        def __init__(self):
            super().__init__()
            self.encode = onnxblock.blocks.LabelEncoder(
                default_int64=-7, keys_int64s=[3, 5, 9], values_int64s=[0, 1, 2])

        def build(self, name):
            return self.encode(name)

    block = Encode()
    with onnxblock.empty_base() as accessor:
        accessor.model.graph.input.append(
            helper.make_tensor_value_info("labels", TensorProto.INT64, ["N"]))
        block("labels")
    model = block.to_model_proto()
    assert {o.domain for o in model.opset_import} == {"", "ai.onnx.ml"}
    out = run(model, {"labels": np.array([9, 3, 4, 5])})[0]
    assert out.tolist() == [2, 0, -7, 1]
    with pytest.raises(ValueError, match="exactly one keys_\\* list"):
        onnxblock.blocks.LabelEncoder(keys_int64s=[1], keys_strings=["a"],
                                      values_int64s=[0])


# loss target names --------------------------------------------------------
class _TargetNamed(onnxblock.Block):
    def __init__(self, target_name):
        self._loss = onnxblock.loss.MSELoss()
        self._target = target_name

    def build(self, output_name):
        return self._loss(output_name, target_name=self._target)


@pytest.mark.parametrize("target", ["y", "xw"])
def test_target_equal_to_the_prediction_or_its_inputs_is_refused(tmp_path, target):
    model = linear_model()
    if target == "xw":  # a second model output, computed from the weights
        model.graph.output.append(helper.make_tensor_value_info("xw", TensorProto.FLOAT,
                                                                ["N", 2]))
    with pytest.raises(ValueError, match=f"target name '{target}' is already a value"):
        artifacts.generate_artifacts(model, requires_grad=["W"], loss=_TargetNamed(target),
                                     loss_input_names=["y"],
                                     artifact_directory=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_target_computed_from_inputs_only_is_used():
    class Scaled(onnxblock.TrainingBlock):
        def __init__(self):
            super().__init__()
            self.loss = onnxblock.loss.MSELoss()

        def build(self, output_name):
            scaled = onnxblock.blocks.Mul()("t", onnxblock.blocks.Constant(2.0)())
            return self.loss(output_name, target_name=scaled)

    block = Scaled()
    model = linear_model()
    model.graph.input.append(helper.make_tensor_value_info("t", TensorProto.FLOAT, ["N", 2]))
    with onnxblock.base(model):
        block("y")
    _, evaluation = block.to_model_proto()
    x, t = data()
    np.testing.assert_allclose(run(evaluation, {"x": x, "t": t})[0], mse(x, 2 * t),
                               rtol=1e-6)


def test_optimizer_model_takes_the_base_opset(tmp_path):
    paths = artifacts.generate_artifacts(linear_model(opset=14), requires_grad=["W"],
                                         loss=artifacts.LossType.L1Loss,
                                         optimizer=artifacts.OptimType.AdamW,
                                         artifact_directory=tmp_path)
    for key in ("training_model", "eval_model", "optimizer_model"):
        assert onnx.load(paths[key]).opset_import[0].version == 14


# the counting script -------------------------------------------------------
def test_suite_script_rewrites_imports_only():
    path = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks",
                        "compat_ort_suite.py")
    spec = importlib.util.spec_from_file_location("compat_ort_suite", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    source = "\n".join([
        "import onnxruntime",
        "import onnxruntime.training.onnxblock as onnxblock",
        "from onnxruntime.training import artifacts",
        "from onnxruntime.training.api import CheckpointState, Module",
        "from onnxruntime import OrtValue",
        '    device = "cuda"',
        'x = "onnxruntime.training"'])
    assert script.rewrite_source(source, cuda_to_cpu=True).splitlines() == [
        "import onnxruntime",
        "import onnxtrain.onnxblock as onnxblock",
        "from onnxtrain import artifacts",
        "from onnxtrain.api import CheckpointState, Module",
        "from onnxruntime import OrtValue",
        '    device = "cpu"',
        'x = "onnxruntime.training"']
    assert '    device = "cuda"' in script.rewrite_source(source, cuda_to_cpu=False)


def test_optimizer_composition_refuses_other_arguments():
    with onnxblock.empty_base():
        with pytest.raises(TypeError, match="the \\(trainable, frozen\\) pair"):
            onnxblock.optim.AdamW()([numpy_helper.from_array(W0, "W")])


def test_module_runs_a_training_model_with_an_input_gradient(tmp_path):
    block = MSEBlock()
    block.requires_grad("W")
    block.requires_grad("x")
    with onnxblock.base(linear_model()):
        block("y")
    onnxblock.save_checkpoint(block.parameters(), tmp_path / "checkpoint")
    state = api.CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    module = api.Module(block.to_model_proto()[0], state)
    x, t = data(2)
    np.testing.assert_allclose(module(x, t), mse(x, t), rtol=1e-6)
    np.testing.assert_allclose(state.parameters["W"].grad,
                               2 * x.T @ (x @ W0 + B0 - t) / t.size, rtol=1e-5)
