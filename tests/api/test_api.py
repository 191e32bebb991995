"""onnxtrain.api: optimizers against numpy references, checkpoints, the
learning rate schedule, gradient accumulation and the Module helpers."""
import gc
import json
import zipfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto

import onnxtrain.onnxblock as onnxblock
from onnxtrain import api, artifacts
from onnxtrain.optim import ClipByGlobalNorm, chain
from onnxtrain.runtime import to_ortvalue
from onnxtrain.update_rules import AdamRule, SGDRule
from test_artifacts_models import PARAM_SHAPES, batch, two_head_model

TRAINABLE = ["weight1", "bias1", "weight2", "bias2"]
FROZEN = ["weight3", "bias3"]


def make_artifacts(directory, optimizer, dtype=np.float64, **kwargs):
    return artifacts.generate_artifacts(
        two_head_model(dtype), requires_grad=TRAINABLE, frozen_params=FROZEN,
        loss=onnxblock.loss.MSELoss(), loss_input_names=["output1"],
        optimizer=optimizer, artifact_directory=directory, **kwargs)


def open_training(paths):
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    module = api.Module(paths["training_model"], state, paths["eval_model"])
    return state, module, api.Optimizer(paths["optimizer_model"], module)


# numpy references ---------------------------------------------------------
class SGDReference:
    """p <- p - lr g."""

    state_names = ()

    def update(self, param, grad, state, lr, step):
        return param - lr * grad


class AdamWReference:
    """HuggingFace transformers' AdamW (decay on the updated parameter)."""

    state_names = ("exp_avg", "exp_avg_sq")

    def __init__(self, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0,
                 bias_correction=True):
        self.betas, self.eps = betas, eps
        self.weight_decay, self.bias_correction = weight_decay, bias_correction

    def update(self, param, grad, state, lr, step):
        b1, b2 = self.betas
        state["exp_avg"] = b1 * state["exp_avg"] + (1 - b1) * grad
        state["exp_avg_sq"] = b2 * state["exp_avg_sq"] + (1 - b2) * grad * grad
        step_size = lr
        if self.bias_correction:
            step_size = lr * np.sqrt(1 - b2 ** step) / (1 - b1 ** step)
        param = param - step_size * state["exp_avg"] / (
            np.sqrt(state["exp_avg_sq"]) + self.eps)
        if self.weight_decay > 0:
            param = param - lr * self.weight_decay * param
        return param


class AdamRuleReference:
    """onnxtrain's AdamRule: PyTorch's AdamW ordering (the parameter decays
    before the step), eps added to sqrt(v) as scikit-learn does."""

    state_names = ("m", "v")

    def __init__(self, betas, eps, weight_decay):
        self.betas, self.eps, self.weight_decay = betas, eps, weight_decay

    def update(self, param, grad, state, lr, step):
        b1, b2 = self.betas
        param = param - lr * self.weight_decay * param
        state["m"] = b1 * state["m"] + (1 - b1) * grad
        state["v"] = b2 * state["v"] + (1 - b2) * grad * grad
        step_size = lr * np.sqrt(1 - b2 ** step) / (1 - b1 ** step)
        return param - step_size * state["m"] / (np.sqrt(state["v"]) + self.eps)


def clip_reference(grads, max_norm):
    """torch.nn.utils.clip_grad_norm_."""
    norm = np.sqrt(sum((g * g).sum() for g in grads.values()))
    factor = min(1.0, max_norm / (norm + 1e-6))
    return {k: g * factor for k, g in grads.items()}


OPTIMIZER_ROWS = [
    ("SGD", onnxblock.optim.SGD(), SGDReference(), None),
    ("AdamW", onnxblock.optim.AdamW(), AdamWReference(), None),
    ("AdamW-decay", onnxblock.optim.AdamW(betas=(0.8, 0.95), eps=1e-8,
                                          weight_decay=0.1),
     AdamWReference((0.8, 0.95), 1e-8, 0.1), None),
    ("AdamW-no-bias-correction",
     onnxblock.optim.AdamW(bias_correction=False, weight_decay=0.01),
     AdamWReference(weight_decay=0.01, bias_correction=False), None),
    ("AdamW-clip", onnxblock.optim.AdamW(clip_grad=onnxblock.optim.ClipGradNorm(0.05)),
     AdamWReference(), 0.05),
    # an update rule chained with links (onnxtrain.optim.chain)
    ("chain-clip-SGD", chain(ClipByGlobalNorm(0.05), SGDRule()), SGDReference(), 0.05),
    ("chain-clip-Adam-decay",
     chain(ClipByGlobalNorm(0.05), AdamRule(0.8, 0.95, 1e-8, weight_decay=0.1)),
     AdamRuleReference((0.8, 0.95), 1e-8, 0.1), 0.05),
]


# float32: Adam's steps are ~lr per element whatever the parameter's size,
# so float32 rounding shows as an absolute error of ~1e-7 on small entries
@pytest.mark.parametrize("dtype, rtol, atol", [(np.float64, 1e-10, 1e-13),
                                               (np.float32, 1e-5, 1e-6)])
@pytest.mark.parametrize("row", OPTIMIZER_ROWS, ids=[r[0] for r in OPTIMIZER_ROWS])
def test_optimizer_steps_match_numpy_reference(tmp_path, row, dtype, rtol, atol):
    _, block, reference, max_norm = row
    state, module, optimizer = open_training(make_artifacts(tmp_path, block, dtype))
    expected = {n: state.parameters[n].data.astype(np.float64) for n in TRAINABLE}
    moments = {n: {s: np.zeros_like(expected[n]) for s in reference.state_names}
               for n in TRAINABLE}
    rates = [0.01, 0.05, 0.02, 0.1, 0.03, 0.07]
    for step, lr in enumerate(rates, start=1):
        x, t1, _ = batch(8, dtype, seed=step)
        module(x, t1)
        grads = {n: state.parameters[n].grad.astype(np.float64) for n in TRAINABLE}
        if max_norm is not None:
            norm = np.sqrt(sum((g * g).sum() for g in grads.values()))
            assert norm > max_norm  # the clipping is active
            grads = clip_reference(grads, max_norm)
        optimizer.set_learning_rate(lr)
        optimizer.step()
        module.lazy_reset_grad()
        for name in TRAINABLE:
            expected[name] = reference.update(expected[name], grads[name],
                                              moments[name], lr, step)
            # the next gradients are taken at the graph's parameters
            np.testing.assert_allclose(state.parameters[name].data,
                                       expected[name], rtol=rtol, atol=atol)
            expected[name] = state.parameters[name].data.astype(np.float64)
    assert optimizer.step_count == len(rates)
    for name in TRAINABLE:
        for key, value in moments[name].items():
            np.testing.assert_allclose(
                np.asarray(state.optimizer_state.as_arrays()["states"][name][key]),
                value, rtol=max(rtol, 1e-4), atol=atol)


def test_optimizer_scalars_once_and_no_output_copies():
    # the learning-rate cast, the bias-corrected step size and the decay are
    # shared by the updates of all parameters of one element type (the
    # 24-layer encoder's AdamW graph had them once per parameter: 391 times)
    from onnxtrain.onnxblock.optim import build_optimizer_model
    specs = [(f"p{i}", TensorProto.FLOAT, [3, i + 1]) for i in range(5)]
    specs.append(("q", TensorProto.DOUBLE, [2]))
    model = build_optimizer_model(onnxblock.optim.AdamW(weight_decay=0.1), specs)
    onnx.checker.check_model(model, full_check=True)  # types too
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("Pow") == 2 * 2  # beta_1^t and beta_2^t per element type
    casts = [n for n in model.graph.node if n.op_type == "Cast"
             and n.input[0] == "learning_rate"]
    assert len(casts) == 2
    assert ops.count("Sqrt") == len(specs) + 2  # one per parameter, one per type
    # the updates write the outputs themselves (no Identity copy per output)
    assert "Identity" not in ops
    produced = {o for n in model.graph.node for o in n.output}
    assert all(o.name in produced for o in model.graph.output)


# gradients and module helpers ------------------------------------------------
@pytest.fixture(scope="module")
def sgd_paths(tmp_path_factory):
    return make_artifacts(tmp_path_factory.mktemp("sgd"), artifacts.OptimType.SGD,
                          nominal_checkpoint=True)


def test_gradients_accumulate_until_lazy_reset(sgd_paths):
    state, module, _ = open_training(sgd_paths)
    # as onnxruntime: zeros for trained parameters before the first call
    assert all(not state.parameters[n].grad.any() for n in TRAINABLE)
    assert all(state.parameters[n].grad is None for n in FROZEN)
    (x1, t1, _), (x2, t2, _) = batch(seed=1), batch(seed=2)
    module(x1, t1)
    g1 = {n: state.parameters[n].grad for n in TRAINABLE}
    module(x2, t2)
    summed = {n: state.parameters[n].grad for n in TRAINABLE}
    module.lazy_reset_grad()
    module(x2, t2)
    for name in TRAINABLE:
        g2 = state.parameters[name].grad
        # the loss reads output1 only: the second head gets zero gradients
        assert np.allclose(g2, 0) == (name in ("weight2", "bias2"))
        np.testing.assert_allclose(summed[name], g1[name] + g2, rtol=1e-12)
    assert all(state.parameters[n].grad is None for n in FROZEN)


def test_session_options_as_in_onnxruntime_training(sgd_paths, tmp_path):
    """Module's fifth argument, session_options, sets the properties of the
    module's and its optimizer's sessions (profiling writes a profile per
    session) and is left as given; the steps are those without it."""
    import onnxruntime
    options = onnxruntime.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / "profile")
    options.intra_op_num_threads = 1
    before = {f: getattr(options, f) for f in ("enable_mem_pattern", "enable_profiling",
                                               "graph_optimization_level")}
    results = []
    for given in (options, None):
        state = api.CheckpointState.load_checkpoint(sgd_paths["checkpoint"])
        module = api.Module(sgd_paths["training_model"], state, sgd_paths["eval_model"],
                            "cpu", given)
        optimizer = api.Optimizer(sgd_paths["optimizer_model"], module)
        x, t, _ = batch(seed=1)
        loss = module(x, t)
        optimizer.step()
        results.append((loss, {n: state.parameters[n].data for n in TRAINABLE}))
        del module, optimizer
    gc.collect()  # sessions write their profile when released
    assert len(list(tmp_path.glob("profile*.json"))) == 2  # training, optimizer
    assert {f: getattr(options, f) for f in before} == before
    np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-12)
    for name in TRAINABLE:
        np.testing.assert_allclose(results[0][1][name], results[1][1][name], rtol=1e-12)
    with pytest.raises(TypeError, match="SessionOptions"):
        api.Module(sgd_paths["training_model"], state, session_options={"threads": 1})


def test_sgd_uses_the_learning_rate_and_frozen_stay(sgd_paths):
    state, module, optimizer = open_training(sgd_paths)
    assert optimizer.get_learning_rate() == 0.001
    before = {n: p.data for n, p in state.parameters.items()}
    x, t1, _ = batch()
    module(x, t1)
    optimizer.set_learning_rate(0.25)
    optimizer.step()
    for name, value in before.items():
        if name in TRAINABLE:
            np.testing.assert_allclose(state.parameters[name].data,
                                       value - 0.25 * state.parameters[name].grad,
                                       rtol=1e-12)
        else:
            assert np.array_equal(state.parameters[name].data, value)


def test_module_parameter_helpers(sgd_paths):
    state, module, _ = open_training(sgd_paths)
    sizes = dict((n, int(np.prod(s))) for n, s in PARAM_SHAPES)
    assert module.get_parameters_size() == sum(sizes[n] for n in TRAINABLE)
    assert module.get_parameters_size(trainable_only=False) == sum(sizes.values())
    flat = module.get_contiguous_parameters().numpy()  # an OrtValue, as onnxruntime
    order = [n for n, _ in PARAM_SHAPES]  # training-model order
    np.testing.assert_array_equal(
        flat, np.concatenate([state.parameters[n].data.ravel() for n in order]))
    trainable = module.get_contiguous_parameters(trainable_only=True).numpy()
    module.copy_buffer_to_parameters(2 * trainable)
    np.testing.assert_array_equal(module.get_contiguous_parameters(True).numpy(),
                                  2 * trainable)
    np.testing.assert_array_equal(module.get_contiguous_parameters().numpy()[:25],
                                  flat[:25])
    with pytest.raises(ValueError, match="29 elements; the parameters have 30"):
        module.copy_buffer_to_parameters(trainable[:-1])
    assert module.input_names() == ["input", "target"]
    assert module.output_names() == [module.output_names()[0]]
    with pytest.raises(ValueError, match="takes 2 inputs"):
        module(batch()[0])


def test_parameter_assignment_copies_in(sgd_paths):
    state = api.CheckpointState.load_checkpoint(sgd_paths["checkpoint"])
    value = np.zeros(3)
    state.parameters["bias1"] = value
    value[:] = 5
    np.testing.assert_array_equal(state.parameters["bias1"].data, np.zeros(3))
    state.parameters["bias1"].data[:] = 7  # .data is a copy
    np.testing.assert_array_equal(state.parameters["bias1"].data, np.zeros(3))
    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        state.parameters["bias1"] = np.zeros(4)
    with pytest.raises(KeyError, match="nope"):
        state.parameters["nope"]


def test_module_and_optimizer_errors(sgd_paths, tmp_path):
    state, module, optimizer = open_training(sgd_paths)
    with pytest.raises(RuntimeError, match="no gradient"):
        optimizer.step()
    lone = api.Module(sgd_paths["training_model"], state).eval()
    with pytest.raises(RuntimeError, match="eval_model_uri"):
        lone(*batch()[:2])
    partial = api.CheckpointState(
        [p for n, p in state.parameters.items() if n != "bias3"])
    with pytest.raises(ValueError, match="no parameter 'bias3'"):
        api.Module(sgd_paths["training_model"], partial)
    with pytest.raises(ValueError, match="metadata"):
        api.Module(two_head_model(), state)


# the model is float64, the batch float32 (a cast within the kind is allowed)
@pytest.mark.parametrize("inputs, error, pattern", [
    (lambda x, t: (x[:, :3], t), ValueError,
     r"Input 'input' of the training model has shape \('batch', 4\); got shape "
     r"\(16, 3\)"),
    (lambda x, t: (x, t[:, :2]), ValueError,
     r"Input 'target' of the training model has shape \('batch', 3\)"),
    (lambda x, t: (x[0], t), ValueError, r"'input'.*got shape \(4,\)"),
    (lambda x, t: (x, t[:5]), ValueError,
     r"Inputs 'input' and 'target' of the training model share dimension "
     r"'batch'; got sizes 16 and 5"),
    (lambda x, t: (x.astype(str), t), TypeError,
     r"Input 'input' of the training model is float64; got <U\d+, which is "
     r"not cast to it"),
    (lambda x, t: (x, t.astype(complex)), TypeError, r"'target'.*complex128"),
    (lambda x, t: (x.astype(object), t), TypeError, r"'input'.*got object"),
    (lambda x, t: (to_ortvalue(x), t), TypeError,
     r"'input' of the training model is float64; got an OrtValue of float32"),
])
def test_module_checks_inputs_before_running(sgd_paths, inputs, error, pattern):
    state, module, _ = open_training(sgd_paths)
    x, t1, _ = batch()
    with pytest.raises(error, match=pattern):
        module(*inputs(x, t1))
    assert all(not state.parameters[n].grad.any() for n in TRAINABLE)
    with pytest.raises(error, match=pattern.replace("training", "eval")):
        module.eval()(*inputs(x, t1))
    # accepted: a cast within the kind (float32, int64 into float64), OrtValues
    # of the input's dtype
    module.train()
    expected = module(x, t1)
    assert module(x.astype(np.float64), to_ortvalue(t1.astype(np.float64))) == \
        pytest.approx(expected, rel=1e-12)
    rounded = np.rint(x)
    assert module(rounded.astype(np.int64), t1) == module(rounded, t1)


@pytest.mark.parametrize("bad", [-1.0, -1e-12, float("nan"), float("inf"), "0.1",
                                 None, True, [0.1]])
def test_set_learning_rate_refuses_bad_values(sgd_paths, bad):
    """onnxruntime-training stored any float; a negative or non-finite one
    makes training climb or diverge, so onnxtrain refuses it (0 is allowed:
    a linear warmup starts there)."""
    _, _, optimizer = open_training(sgd_paths)
    with pytest.raises(ValueError, match="learning_rate must be a finite float "
                                         ">= 0, got"):
        optimizer.set_learning_rate(bad)
    assert optimizer.get_learning_rate() == 0.001
    optimizer.set_learning_rate(0)
    assert optimizer.get_learning_rate() == 0.0
    optimizer.set_learning_rate(np.float32(0.5))
    assert optimizer.get_learning_rate() == 0.5
    optimizer.set_learning_rate(np.array(0.25))  # a 0-d array, as float() takes
    assert optimizer.get_learning_rate() == 0.25


@pytest.mark.parametrize("args, pattern", [
    ((2.5, 10, 0.1), "warmup_step_count must be an int >= 0, got 2.5"),
    ((-1, 10, 0.1), "warmup_step_count must be an int >= 0, got -1"),
    ((2, "10", 0.1), "total_step_count must be an int >= 0, got '10'"),
    ((2, 10, -0.1), "initial_lr must be a finite float >= 0, got -0.1"),
    ((2, 10, float("nan")), "initial_lr must be a finite float >= 0, got nan"),
])
def test_linear_lr_scheduler_refuses_bad_values(sgd_paths, args, pattern):
    _, _, optimizer = open_training(sgd_paths)
    with pytest.raises(ValueError, match=pattern):
        api.LinearLRScheduler(optimizer, *args)
    assert optimizer.get_learning_rate() == 0.001


# checkpoints -------------------------------------------------------------
def test_checkpoint_round_trip_is_exact_and_resumes(tmp_path):
    paths = make_artifacts(tmp_path, onnxblock.optim.AdamW(weight_decay=0.1))
    state, module, optimizer = open_training(paths)
    optimizer.set_learning_rate(0.0123456789)
    for seed in range(3):
        x, t1, _ = batch(seed=seed)
        module(x, t1)
        optimizer.step()
        module.lazy_reset_grad()
    properties = {"epoch": 3, "big": 2 ** 70, "best_loss": 0.1 + 0.2,
                  "tiny": 5e-324, "name": "run-α/β"}
    for key, value in properties.items():
        state.properties[key] = value
    path = tmp_path / "saved"
    api.CheckpointState.save_checkpoint(state, path, include_optimizer_state=True)
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        header = json.loads(archive.read("header.json"))
    assert "header.json" in names and all(
        n == "header.json" or (n.startswith("arrays/") and n.endswith(".bin"))
        for n in names)
    assert header["format"] == "onnxtrain.checkpoint" and header["version"] == 1

    loaded = api.CheckpointState.load_checkpoint(path)
    assert list(loaded.parameters.keys()) == list(state.parameters.keys())
    for name, param in state.parameters.items():
        other = loaded.parameters[name]
        assert other.requires_grad == param.requires_grad
        assert other.data.dtype == param.data.dtype
        assert other.data.tobytes() == param.data.tobytes()
    assert dict(loaded.properties) == properties
    assert {k: type(v) for k, v in loaded.properties.items()} == \
        {k: type(v) for k, v in properties.items()}
    saved_opt, loaded_opt = (s.optimizer_state.as_arrays() for s in (state, loaded))
    assert loaded_opt["step"] == 3
    assert loaded_opt["learning_rate"] == 0.0123456789
    for name in TRAINABLE:
        for key in ("exp_avg", "exp_avg_sq"):
            assert loaded_opt["states"][name][key].tobytes() == \
                saved_opt["states"][name][key].tobytes()

    # resuming from the checkpoint takes exactly the same next step
    resumed = api.Module(paths["training_model"], loaded, paths["eval_model"])
    resumed_opt = api.Optimizer(paths["optimizer_model"], resumed)
    x, t1, _ = batch(seed=9)
    for mod, opt in ((module, optimizer), (resumed, resumed_opt)):
        mod(x, t1)
        opt.step()
    for name in TRAINABLE:
        assert loaded.parameters[name].data.tobytes() == \
            state.parameters[name].data.tobytes()

    api.CheckpointState.save_checkpoint(state, tmp_path / "plain")
    assert api.CheckpointState.load_checkpoint(tmp_path / "plain").optimizer_state is None


def test_properties_accept_int_float_str_only(sgd_paths):
    state = api.CheckpointState.load_checkpoint(sgd_paths["checkpoint"])
    for bad in (True, [1], None, b"x"):
        with pytest.raises(TypeError, match="int, float or str"):
            state.properties["bad"] = bad
    with pytest.raises(ValueError, match="no optimizer state"):
        api.CheckpointState.save_checkpoint(state, "unused",
                                            include_optimizer_state=True)


def test_nominal_checkpoint_holds_names_shapes_dtypes_only(sgd_paths):
    path = sgd_paths["nominal_checkpoint"]
    with zipfile.ZipFile(path) as archive:
        assert archive.namelist() == ["header.json"]
        header = json.loads(archive.read("header.json"))
    assert header["nominal"] is True
    assert [(p["name"], tuple(p["shape"]), p["dtype"], p["requires_grad"], p["data"])
            for p in header["parameters"]] == [
        (n, s, "<f8", n in TRAINABLE, None) for n, s in PARAM_SHAPES]
    nominal = api.CheckpointState.load_checkpoint(path)
    assert nominal.nominal
    assert [(n, p.shape, p.dtype) for n, p in nominal.parameters] == [
        (n, s, np.float64) for n, s in PARAM_SHAPES]
    full = api.CheckpointState.load_checkpoint(sgd_paths["checkpoint"])
    module = api.Module(sgd_paths["training_model"], nominal)
    reference = api.Module(sgd_paths["training_model"], full)
    module.copy_buffer_to_parameters(reference.get_contiguous_parameters(), False)
    x, t1, _ = batch()
    np.testing.assert_array_equal(module(x, t1), reference(x, t1))


def test_not_a_checkpoint_is_refused(tmp_path):
    path = tmp_path / "bad"
    path.write_bytes(b"\x80\x04pickle")
    with pytest.raises(ValueError, match="not an onnxtrain checkpoint"):
        api.CheckpointState.load_checkpoint(path)


# learning rate schedule ------------------------------------------------------
def test_linear_lr_scheduler_values(sgd_paths):
    state, module, optimizer = open_training(sgd_paths)
    scheduler = api.LinearLRScheduler(optimizer, warmup_step_count=4,
                                      total_step_count=10, initial_lr=0.1)
    expected = [0.0, 0.025, 0.05, 0.075, 0.1, 0.1 * 5 / 6, 0.1 * 4 / 6, 0.05,
                0.1 * 2 / 6, 0.1 / 6, 0.0, 0.0]
    seen = [optimizer.get_learning_rate()]
    x, t1, _ = batch()
    for _ in range(len(expected) - 1):
        module(x, t1)
        optimizer.step()
        scheduler.step()
        seen.append(optimizer.get_learning_rate())
    np.testing.assert_allclose(seen, expected, rtol=1e-12, atol=1e-15)
    assert scheduler.get_lr(2) == pytest.approx(0.05)
    with pytest.raises(ValueError, match="warmup_step_count <= total_step_count"):
        api.LinearLRScheduler(optimizer, 10, 4, 0.1)
    api.LinearLRScheduler(optimizer, 0, 0, 0.1)
    assert optimizer.get_learning_rate() == 0.0
