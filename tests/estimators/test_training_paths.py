"""The three execution paths (split, fused step, in-graph loop) compute the
same steps: same loss curves and same weights."""
import warnings

import numpy as np
import onnx
from onnx import TensorProto, helper
import pytest
from numpy.testing import assert_allclose
from sklearn.exceptions import ConvergenceWarning
from sklearn.neural_network import MLPClassifier, MLPRegressor

from onnxtrain import ConvergenceError, to_onnx
from onnxtrain.estimators import (OrtGradientForwardBackwardClassifier,
                                  OrtGradientForwardBackwardOptimizer)
from onnxtrain.optim import (AddDecayedWeights, ClipByGlobalNorm, ClipByValue,
                             LearningRateAdam, LearningRateAdamW,
                             LearningRateSGD, LearningRateSGDNesterov, chain)
from onnxtrain.penalties import ElasticLearningPenalty

PATHS = ["split", "fused", "loop"]


@pytest.fixture(scope="module")
def regression():
    rng = np.random.RandomState(0)
    X = rng.randn(105, 5).astype(np.float32)
    y = np.tanh(X @ rng.randn(5)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        skl = MLPRegressor(hidden_layer_sizes=(8,), max_iter=1).fit(X, y)
    return X, y, to_onnx(skl, X[:1])


SETTINGS = [
    ("sgd-constant", dict(learning_rate=LearningRateSGD(0.02, learning_rate="constant"))),
    ("sgd-invscaling", dict(learning_rate=LearningRateSGD(0.05))),
    ("momentum", dict(learning_rate=LearningRateSGDNesterov(
        0.01, learning_rate="constant", nesterov=False))),
    ("nesterov", dict(learning_rate=LearningRateSGDNesterov(0.01))),
    ("adam", dict(learning_rate=LearningRateAdam(0.01))),
    ("adamw-penalty", dict(learning_rate=LearningRateAdamW(0.01),
                           learning_penalty=ElasticLearningPenalty(0.001, 0.01))),
    ("chain-clip-decay-adamw", dict(
        learning_rate=chain(ClipByValue(0.5), ClipByGlobalNorm(0.1),
                            AddDecayedWeights(0.01), LearningRateAdamW(0.01)),
        learning_penalty=ElasticLearningPenalty(0.001, 0.01))),
    ("shuffle", dict(learning_rate=0.02, shuffle=True)),
    ("validation-tol", dict(learning_rate=0.02, tol=1e-4, n_iter_no_change=3)),
    ("sample-weight", dict(learning_rate=0.02)),
]


@pytest.mark.parametrize("name,settings", SETTINGS, ids=[s[0] for s in SETTINGS])
def test_paths_agree_on_regression(regression, name, settings):
    X, y, onx = regression
    sample_weight = (np.arange(X.shape[0]) % 3 + 1).astype(np.float32) \
        if name == "sample-weight" else None
    results = {}
    for path in PATHS:
        est = OrtGradientForwardBackwardOptimizer(
            onx, max_iter=12, random_state=0, training_path=path, **settings)
        kwargs = {} if name != "validation-tol" else dict(X_val=X[:30], y_val=y[:30])
        est.fit(X, y, sample_weight=sample_weight, **kwargs)
        assert est.training_path_ == path
        results[path] = est
    reference = results["split"]
    for path in ("fused", "loop"):
        assert_allclose(results[path].train_losses_, reference.train_losses_,
                        rtol=1e-5)
        for a, b in zip(results[path].get_state(), reference.get_state()):
            assert_allclose(a, b, rtol=1e-5, atol=1e-7)
        if reference.validation_losses_:
            assert_allclose(results[path].validation_losses_,
                            reference.validation_losses_, rtol=1e-5)


@pytest.mark.parametrize("path", PATHS)
def test_clipping_by_global_norm_on_every_path(regression, path):
    """One SGD step on one batch, clipped: the weights move by exactly
    lr * max_norm * n / (n + 1e-6) in joint 2-norm, n the gradient's norm,
    far above max_norm here (PyTorch's clip_grad_norm_); three epochs end
    where the split path's do."""
    X, y, onx = regression
    rate, max_norm = 0.1, 0.01

    def fit(path, max_iter):
        return OrtGradientForwardBackwardOptimizer(
            onx, max_iter=max_iter, batch_size=X.shape[0], training_path=path,
            learning_rate=chain(ClipByGlobalNorm(max_norm),
                                LearningRateSGD(rate, learning_rate="constant"))
        ).fit(X, y)

    est = fit(path, 1)
    assert est.training_path_ == path
    start = {i.name: onnx.numpy_helper.to_array(i) for i in onx.graph.initializer}
    moved = np.sqrt(sum(float(((w.astype(np.float64) - start[name]) ** 2).sum())
                        for name, w in zip(est.weights_to_train_, est.get_state())))
    assert moved == pytest.approx(rate * max_norm, rel=1e-4)
    for a, b in zip(fit(path, 3).get_state(), fit("split", 3).get_state()):
        assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_paths_agree_on_classifier():
    rng = np.random.RandomState(1)
    X = rng.randn(90, 4).astype(np.float32)
    y = (X[:, 0] + X[:, 1] > 0).astype(int) + (X[:, 2] > 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        skl = MLPClassifier(hidden_layer_sizes=(6,), max_iter=1).fit(X, y)
    onx = to_onnx(skl, X[:1], options={"zipmap": False})
    fits = [OrtGradientForwardBackwardClassifier(
        onx, learning_rate=0.1, max_iter=8, random_state=0,
        training_path=path).fit(X, y) for path in PATHS]
    for est in fits[1:]:
        assert_allclose(est.train_losses_, fits[0].train_losses_, rtol=1e-5)
        assert_allclose(est.predict_proba(X), fits[0].predict_proba(X), rtol=1e-5)


def test_auto_takes_the_loop(regression):
    X, y, onx = regression
    est = OrtGradientForwardBackwardOptimizer(onx, max_iter=2).fit(X, y)
    assert est.training_path_ == "loop"


def test_auto_takes_the_fused_step_for_big_parameters(regression, monkeypatch):
    """Above LOOP_MAX_PARAMETER_BYTES the Loop's extra copies of the
    parameters cost more than they save; the bytes counted are the weights'
    and the optimizer state's (two velocities here double them)."""
    from onnxtrain.estimators import _base
    X, y, onx = regression
    rate = LearningRateSGDNesterov(0.01, learning_rate="constant", momentum=0.9)
    est = OrtGradientForwardBackwardOptimizer(onx, learning_rate=rate, max_iter=1)
    est.fit(X, y)
    weights = sum(w.nbytes for w in est.get_state())
    assert est._trainer.parameter_bytes() == 2 * weights
    monkeypatch.setattr(_base, "LOOP_MAX_PARAMETER_BYTES", 2 * weights - 1)
    assert est.fit(X, y).training_path_ == "fused"
    monkeypatch.setattr(_base, "LOOP_MAX_PARAMETER_BYTES", 2 * weights)
    assert est.fit(X, y).training_path_ == "loop"


@pytest.mark.parametrize("hidden, path", [(600, "loop"), (1200, "fused")])
def test_auto_leaves_the_loop_above_8_mib(hidden, path):
    """A 1000-600-1 MLP with momentum holds 4.8 MB of weights and
    velocities, under LOOP_MAX_PARAMETER_BYTES (8 MiB): the loop; with 1200
    hidden units 9.6 MB, above: the fused step."""
    rng = np.random.RandomState(0)
    X = rng.randn(16, 1000).astype(np.float32)
    coef = [rng.randn(1000, hidden).astype(np.float32) * 0.01,
            rng.randn(hidden, 1).astype(np.float32) * 0.01]
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "w1"], ["h"]),
         helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "w2"], ["y"])], "mlp",
        [vi("X", TensorProto.FLOAT, [None, 1000])], [vi("y", TensorProto.FLOAT, [None, 1])],
        [onnx.numpy_helper.from_array(c, n) for c, n in zip(coef, ["w1", "w2"])])
    onx = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    rate = LearningRateSGDNesterov(0.01, learning_rate="constant", nesterov=False)
    est = OrtGradientForwardBackwardOptimizer(onx, learning_rate=rate, max_iter=1,
                                              batch_size=8).fit(X, X[:, 0])
    assert est._trainer.parameter_bytes() == 2 * 4 * (1001 * hidden)
    assert est.training_path_ == path


def test_non_finite_loss_stops_at_the_same_step_on_every_path(regression):
    X, y, onx = regression
    states = []
    for path in PATHS:
        est = OrtGradientForwardBackwardOptimizer(
            onx, learning_rate=LearningRateSGD(1e4, learning_rate="constant"),
            max_iter=5, random_state=0, training_path=path)
        with pytest.raises(ConvergenceError):
            est.fit(X, y)
        state = est.get_state()
        assert all(np.isfinite(w).all() for w in state)
        states.append(state)
    for other in states[1:]:
        for a, b in zip(other, states[0]):
            assert_allclose(a, b, rtol=1e-5)


def test_old_opset_falls_back_to_split(regression):
    X, y, _ = regression
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        skl = MLPRegressor(hidden_layer_sizes=(4,), max_iter=1).fit(X, y)
    onx = to_onnx(skl, X[:1], target_opset=11)
    est = OrtGradientForwardBackwardOptimizer(onx, max_iter=2).fit(X, y)
    assert est.training_path_ == "split"
    with pytest.raises(ValueError, match="training_path='loop' is not available"):
        OrtGradientForwardBackwardOptimizer(onx, max_iter=2,
                                            training_path="loop").fit(X, y)
    with pytest.raises(ValueError, match="training_path must be one of"):
        OrtGradientForwardBackwardOptimizer(onx, training_path="fast").fit(X, y)


def test_fused_graphs_are_valid_onnx(regression):
    X, y, onx = regression
    est = OrtGradientForwardBackwardOptimizer(
        onx, learning_rate=LearningRateAdam(0.01), max_iter=1,
        training_path="loop").fit(X, y)
    trainer = est._trainer
    for kind in ("step", "loop", "epochs"):
        graph = trainer.fused_graph(kind, False)
        onnx.checker.check_model(graph.model, full_check=True)
        ops = {n.op_type for n in graph.model.graph.node}
        domains = {n.domain for n in graph.model.graph.node}
        assert domains <= {"", "ai.onnx"}
        if kind != "step":
            assert ops & {"Loop"}


@pytest.mark.skipif(
    "CUDAExecutionProvider" not in __import__("onnxruntime").get_available_providers(),
    reason="needs onnxruntime-gpu and a CUDA device")
@pytest.mark.parametrize("path", PATHS)
def test_cuda_paths_match_cpu(regression, path):
    """device='cuda' keeps the loop on the GPU and computes the CPU's steps."""
    X, y, onx = regression
    fits = [OrtGradientForwardBackwardOptimizer(
        onx, learning_rate=0.02, max_iter=5, random_state=0, training_path=path,
        device=device).fit(X, y) for device in ("cpu", "cuda")]
    assert_allclose(fits[1].train_losses_, fits[0].train_losses_, rtol=1e-4)
    for a, b in zip(fits[1].get_state(), fits[0].get_state()):
        assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    # the in-place If step is the CPU's only (training_graphs.update_in_place)
    assert [fit._trainer.graphs.in_place for fit in fits] == [True, False]


def _one_sgd_step(model, weights, X, y, lr, elem_type=TensorProto.FLOAT):
    """(new weights, step graph) of build_training_step with SGD at ``lr``."""
    import onnxruntime
    from onnxtrain.losses import SquareLearningLoss
    from onnxtrain.assembly.training_graphs import (build_training_step, loss_emitter,
                                                    update_emitter)
    dtype = helper.tensor_dtype_to_np_dtype(elem_type)
    rate = LearningRateSGD(lr, learning_rate="constant")
    loss = loss_emitter(SquareLearningLoss(), elem_type, 2)
    update = update_emitter(rate, list(weights), elem_type)
    step = build_training_step(model, list(weights), loss, update, rate.state_names,
                               rate.scalar_names)
    sess = onnxruntime.InferenceSession(step.model.SerializeToString(),
                                        providers=["CPUExecutionProvider"])
    feeds = {"X": X.astype(dtype), "target__": y.astype(dtype),
             "learning_rate": np.array(lr, dtype), "step": np.array(1, dtype),
             "penalty_scale": np.array(1 / len(X), dtype)}
    feeds.update({w: v.astype(dtype) for w, v in weights.items()})
    feeds = {i.name: feeds[i.name] for i in sess.get_inputs()}
    return sess.run(None, feeds)[1:], step.model


def _linear_model(elem_type=TensorProto.FLOAT, with_if=False):
    """Y = X @ W + B, or Y = If(cond, X @ W + B, -(X @ W + B)) with cond true."""
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("MatMul", ["X", "W"], ["h0"]),
             helper.make_node("Add", ["h0", "B"], ["h" if with_if else "Y"])]
    inits = [helper.make_tensor("B", elem_type, [1, 1], [0.0])]
    if with_if:
        then_g = helper.make_graph([helper.make_node("Identity", ["h"], ["t"])], "then",
                                   [], [vi("t", elem_type, None)])
        else_g = helper.make_graph([helper.make_node("Neg", ["h"], ["e"])], "else",
                                   [], [vi("e", elem_type, None)])
        nodes.append(helper.make_node("If", ["cond"], ["Y"], then_branch=then_g,
                                      else_branch=else_g))
        inits.append(helper.make_tensor("cond", TensorProto.BOOL, [], [True]))
    inits.append(helper.make_tensor("W", elem_type, [3, 1], [0.0] * 3))
    graph = helper.make_graph(nodes, "g", [vi("X", elem_type, [None, 3])],
                              [vi("Y", elem_type, [None, 1])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("with_if, elem_type, folded", [
    (False, TensorProto.FLOAT, True),
    # subgraphs may read dE/dY from the enclosing scope: not folded
    (True, TensorProto.FLOAT, False),
    # in float16 the per-row seed times the rate would lose digits: not folded
    (False, TensorProto.FLOAT16, False)])
def test_fused_sgd_step_applies_the_learning_rate_once(with_if, elem_type, folded):
    """The fused step scales dE/dY by the learning rate (one Mul) instead of
    every weight gradient when that is exact, and its step equals numpy's
    W - lr * X^T (X W + B - y) / n either way."""
    rng = np.random.default_rng(3)
    X, y = rng.normal(size=(20, 3)), rng.normal(size=(20, 1))
    weights = {"W": rng.normal(size=(3, 1)), "B": rng.normal(size=(1, 1))}
    (w_new, b_new), step = _one_sgd_step(_linear_model(elem_type, with_if), weights,
                                         X, y, 0.05, elem_type)
    readers = [n for n in step.graph.node if "learning_rate" in n.input]
    assert len(readers) == (1 if folded else 2)
    residual = (X @ weights["W"] + weights["B"] - y) / len(X)
    rtol = 1e-5 if elem_type == TensorProto.FLOAT else 5e-3
    assert_allclose(w_new, weights["W"] - 0.05 * X.T @ residual, rtol=rtol, atol=rtol)
    assert_allclose(b_new, weights["B"] - 0.05 * residual.sum(axis=0, keepdims=True),
                    rtol=rtol, atol=rtol)


def test_engine_keeps_its_model_without_the_weight_values(regression):
    # the engine's model serves only to build the split and prediction
    # graphs (weights as inputs): the trained weights' values live in
    # engine.weights, not a second time in the model
    X, y, onx = regression
    est = OrtGradientForwardBackwardOptimizer(onx, max_iter=3, random_state=0,
                                              training_path="split",
                                              learning_rate=0.02).fit(X, y)
    engine = est._trainer.engine
    inits = {i.name: i for i in engine.model.graph.initializer}
    for name, value in zip(engine.weights_to_train, engine.weights):
        tensor = inits[name]
        assert not tensor.raw_data and not tensor.float_data
        assert tuple(tensor.dims) == tuple(value.shape())
    # the split path trained and predicts from engine.weights
    trained = {i.name: onnx.numpy_helper.to_array(i)
               for i in est.get_trained_onnx().graph.initializer}
    for name, value in zip(engine.weights_to_train, engine.weights):
        assert_allclose(trained[name], value.numpy())
    first = {i.name: onnx.numpy_helper.to_array(i) for i in onx.graph.initializer}
    assert any(not np.allclose(first[n], trained[n]) for n in engine.weights_to_train)
    from onnxruntime import InferenceSession
    sess = InferenceSession(est.get_trained_onnx().SerializeToString(),
                            providers=["CPUExecutionProvider"])
    assert_allclose(est.predict(X).reshape(-1),
                    sess.run(None, {sess.get_inputs()[0].name: X})[0].reshape(-1),
                    rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("path", PATHS)
def test_estimator_and_trainer_keep_no_second_copy_of_the_weights(regression, path):
    """Once a trainer holds the weights, the estimator's cached graph and the
    trainer's graphs keep them without values; a new fit rebuilds the graph
    with them and starts from the graph's own weights again."""
    X, y, onx = regression
    onx = onnx.ModelProto.FromString(onx.SerializeToString())
    onx.producer_name = "test"  # not skl2onnx: fits start from its weights
    est = OrtGradientForwardBackwardOptimizer(onx, max_iter=3, random_state=0,
                                              training_path=path, learning_rate=0.02)
    first = est.fit(X, y).train_losses_
    names = set(est.weights_to_train_)
    for model in (est._training_model(), est._trainer.model,
                  est._trainer.graphs.model):
        for tensor in model.graph.initializer:
            if tensor.name in names:
                assert not tensor.raw_data and not tensor.float_data
                assert len(tensor.dims) > 0
    assert est.fit(X, y).train_losses_ == first
    start = {i.name: onnx.numpy_helper.to_array(i) for i in onx.graph.initializer}
    again = est.set_params(max_iter=1).fit(X[:8], y[:8])
    # the first step's loss is the graph's own weights' loss
    fresh = OrtGradientForwardBackwardOptimizer(
        onx, max_iter=1, random_state=0, training_path=path,
        learning_rate=0.02).fit(X[:8], y[:8])
    assert again.train_losses_ == fresh.train_losses_
    assert all(np.array_equal(start[i.name], onnx.numpy_helper.to_array(i))
               for i in onx.graph.initializer)


# ------------------------------------------------ loop graphs: linear build
def test_rename_many_reads_renames_once_outside_shadowing_subgraphs():
    from onnxtrain.autodiff.backward import rename_many_reads
    vi = helper.make_tensor_value_info
    # the branch defines its own "b" (shadowing) and outputs the outer "a"
    branch = helper.make_graph(
        [helper.make_node("Neg", ["c"], ["b"]), helper.make_node("Add", ["a", "b"], ["s"])],
        "branch", [], [vi("s", TensorProto.FLOAT, [1]), vi("a", TensorProto.FLOAT, [1])])
    nodes = [helper.make_node("Mul", ["a", "b"], ["m"]),
             helper.make_node("If", ["cond"], ["r", "r2"], then_branch=branch,
                              else_branch=branch)]
    rename_many_reads(nodes, {"a": "a2", "b": "b2", "a2": "a3"})
    assert list(nodes[0].input) == ["a2", "b2"]  # once: not a2 -> a3
    then = nodes[1].attribute[1].g if nodes[1].attribute[1].name == "then_branch" \
        else nodes[1].attribute[0].g
    assert [list(n.input) for n in then.node] == [["c"], ["a2", "b"]]
    assert [o.name for o in then.output] == ["s", "a2"]
    assert list(nodes[0].output) == ["m"]  # writes are not renamed


def _subgraph_walks_of_a_loop_build(mlp_onnx, regression_data, monkeypatch, depth):
    """Calls of ``subgraphs`` while a fit builds the loop graphs of an MLP
    of ``depth`` hidden layers (2 carried weights and 2 states a layer)."""
    import importlib
    # the module (the package exports a function of the same name)
    backward = importlib.import_module("onnxtrain.autodiff.backward")
    calls = [0]
    real = backward.subgraphs

    def counted(node):
        calls[0] += 1
        return real(node)

    monkeypatch.setattr(backward, "subgraphs", counted)
    X, y = regression_data
    est = OrtGradientForwardBackwardOptimizer(
        mlp_onnx(hidden=(4,) * depth), max_iter=1, batch_size=50, training_path="loop",
        learning_rate=LearningRateSGDNesterov(0.01, learning_rate="constant"))
    est.fit(X, y)
    return calls[0]


def test_loop_graphs_take_linear_renaming_work(mlp_onnx, regression_data, monkeypatch):
    """Renaming the carried values of the loop bodies walks the nodes once,
    not once per carried value (quadratic: 12 s of a MobileNetV2's first
    fit, 420 carried values over 3,000 nodes)."""
    small = _subgraph_walks_of_a_loop_build(mlp_onnx, regression_data, monkeypatch, 4)
    large = _subgraph_walks_of_a_loop_build(mlp_onnx, regression_data, monkeypatch, 16)
    # 4x the layers: 4x the nodes and the carried values; the walk per
    # value made it ~16x
    assert large < 6 * small, (small, large)
