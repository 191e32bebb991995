"""The update of big weights over segments after the fused step
(runtime/segmented_update.py): which weights it takes, the segments'
update equal to the whole weight's, and a fit deferring its weights equal
to one updating them inside the step graph."""
import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxtrain.estimators import OrtGradientForwardBackwardOptimizer
from onnxtrain.losses.penalties import ElasticLearningPenalty, NoLearningPenalty
from onnxtrain.optim import (ClipByValue, LearningRateAdam, LearningRateAdamW,
                             LearningRateChain, LearningRateSGD,
                             LearningRateSGDNesterov)
from onnxtrain.runtime import segmented_update, to_ortvalue
from onnxtrain.runtime.devices import parse_device
from onnxtrain.runtime.sessions import default_session_options

RATES = {
    "sgd": lambda: LearningRateSGD(0.05, learning_rate="constant"),
    "momentum": lambda: LearningRateSGDNesterov(0.05, learning_rate="constant",
                                                nesterov=False),
    "nesterov": lambda: LearningRateSGDNesterov(0.05, learning_rate="constant"),
    "adam": lambda: LearningRateAdam(0.01),
    "adamw": lambda: LearningRateAdamW(0.01, weight_decay=0.1),
}


def test_deferred_weights_are_big_static_unpenalized_and_elementwise():
    shapes = {"big": (64, 64), "small": (63, 64), "dynamic": ("n", 4096),
              "bias": (4096,)}
    adam = LearningRateAdam()
    choose = segmented_update.deferred_weights
    assert choose(adam, shapes, minimum=4096) == ["big", "bias"]
    assert choose(adam, shapes, NoLearningPenalty(), ["big"], minimum=4096) == [
        "big", "bias"]
    # a penalty reads the weight for the loss: its weights stay in the step
    assert choose(adam, shapes, ElasticLearningPenalty(), ["big"], minimum=4096) == [
        "bias"]
    # a link may read a whole gradient (norm clipping): nothing is deferred
    chain = LearningRateChain([("clip", ClipByValue(0.5)), ("adam", adam)])
    assert choose(chain, shapes, minimum=4096) == []
    assert choose(adam, shapes) == []  # under DEFERRED_MIN_ELEMENTS
    assert segmented_update.DEFERRED_MIN_ELEMENTS == 1 << 22


@pytest.mark.parametrize("rate", sorted(RATES))
def test_segments_update_as_the_whole_weight_does(rate):
    # 65 elements in segments of at most 7: 7 * 5 then 6 * 5, every start
    # but the first off a multiple of the segment size
    learning_rate = RATES[rate]()
    learning_rate.init_learning_rate()
    assert segmented_update.segment_sizes([65], 7) == [7] * 5 + [6] * 5
    model = segmented_update.segment_update_model(learning_rate, 1, 17)
    assert model is not None
    rng = np.random.default_rng(0)
    shape = (5, 13)
    start = {"w": rng.standard_normal(shape), "w_grad": rng.standard_normal(shape)}
    start.update((f"w_{s}", rng.random(shape)) for s in learning_rate.state_names)
    start = {k: v.astype(np.float32) for k, v in start.items()}
    device = parse_device("cpu")
    values = {k: to_ortvalue(v.copy(), device, owned=True) for k, v in start.items()}
    update = segmented_update.SegmentedUpdate(
        model, device, default_session_options(1), learning_rate.state_names,
        maximum=7)
    update.bind([(values["w"], values["w_grad"],
                  [values[f"w_{s}"] for s in learning_rate.state_names])])
    whole = onnxruntime.InferenceSession(
        learning_rate.update_model([("w", shape)], 1, 17).SerializeToString(),
        providers=["CPUExecutionProvider"])
    expected = dict(start)
    for step in (1, 2, 3):
        scalars = learning_rate.step_scalars(step)
        update.run(scalars)
        feeds = {i.name: expected[i.name] for i in whole.get_inputs()
                 if i.name in expected}
        feeds.update((i.name, np.array(scalars.get(i.name, {"loss": 0.0}.get(
            i.name, 1.0)), dtype=np.float32)) for i in whole.get_inputs()
            if i.name not in expected)
        outputs = dict(zip([o.name for o in whole.get_outputs()], whole.run(None, feeds)))
        expected["w"] = outputs["w_new"]
        for s in learning_rate.state_names:
            expected[f"w_{s}"] = outputs[f"w_{s}_new"]
        for name in ["w"] + [f"w_{s}" for s in learning_rate.state_names]:
            np.testing.assert_allclose(values[name].numpy(), expected[name],
                                       rtol=1e-6, atol=1e-7, err_msg=name)
    assert not np.allclose(values["w"].numpy(), start["w"])
    np.testing.assert_array_equal(values["w_grad"].numpy(), start["w_grad"])


def _fit(mlp_onnx, rate, deferred, monkeypatch, X, y):
    monkeypatch.setattr(segmented_update, "DEFERRED_MIN_ELEMENTS",
                        96 if deferred else 1 << 60)
    est = OrtGradientForwardBackwardOptimizer(
        mlp_onnx(hidden=(12, 10), n_features=8), max_iter=3, batch_size=16,
        random_state=0, training_path="fused", learning_rate=RATES[rate](),
        warm_start=True)
    return est.fit(X, y)


@pytest.mark.parametrize("rate", ["momentum", "adamw"])
def test_a_fit_deferring_big_weights_trains_as_the_step_graph(mlp_onnx, monkeypatch,
                                                              rate):
    rng = np.random.RandomState(0)
    X = rng.randn(64, 8).astype(np.float32)
    y = np.tanh(X @ rng.randn(8)).astype(np.float32)
    plain = _fit(mlp_onnx, rate, False, monkeypatch, X, y)
    deferred = _fit(mlp_onnx, rate, True, monkeypatch, X, y)
    trainer = deferred._trainer
    # the weights of 8 x 12 and 12 x 10 elements; the biases and the last
    # layer's 10 stay in the graph
    assert len(trainer.graphs.deferred) == 2 and not plain._trainer.graphs.deferred
    step = trainer.fused_graph("step", False)
    outputs = [o.name for o in step.model.graph.output]
    for w in trainer.graphs.deferred:
        assert f"{w}__grad" in outputs and f"{w}__new" not in outputs
        assert w not in step.weights
    np.testing.assert_allclose(deferred.train_losses_, plain.train_losses_, rtol=1e-5)
    states = [e.get_state(include_optimizer=True) for e in (deferred, plain)]
    for a, b in zip(*[s["weights"] + [v for group in s["optimizer"] for v in group]
                      for s in states]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


def _bias_free_model():
    """``relu(sum_j X[:, j, :] * W1) @ W2``, no bias: the input gradient
    ``dY @ W2^T`` feeds W1's gradient alone."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((0.5 * rng.standard_normal((2, 300))).astype(
        np.float32), "W1"),
        numpy_helper.from_array((0.5 * rng.standard_normal((300, 1))).astype(
            np.float32), "W2"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "axis")]
    nodes = [helper.make_node("Mul", ["X", "W1"], ["h"]),
             helper.make_node("ReduceSum", ["h", "axis"], ["s"], keepdims=0),
             helper.make_node("Relu", ["s"], ["r"]),
             helper.make_node("MatMul", ["r", "W2"], ["Y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 2, 300])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 1])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_a_weight_written_in_place_is_read_first_by_a_deferred_gradient(monkeypatch):
    # W1 deferred, W2 updated in place by the step's If: the product
    # dY @ W2^T that only W1's gradient reads must run before the If
    rng = np.random.default_rng(1)
    X = rng.standard_normal((64, 2, 300)).astype(np.float32)
    y = rng.standard_normal(64).astype(np.float32)
    states = {}
    for path, minimum in [("split", 1 << 60), ("fused", 500)]:
        monkeypatch.setattr(segmented_update, "DEFERRED_MIN_ELEMENTS", minimum)
        est = OrtGradientForwardBackwardOptimizer(
            _bias_free_model(), weights_to_train=["W1", "W2"], max_iter=2,
            batch_size=16, training_path=path, warm_start=True,
            learning_rate=LearningRateSGD(0.01, learning_rate="constant")).fit(X, y)
        states[path] = est.get_state()
    assert est._trainer.graphs.deferred == ["W1"]
    assert est._trainer.fused_graph("step", False).in_place == {"W2__new"}
    for a, b in zip(states["fused"], states["split"]):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_states_given_in_another_dtype_are_cast_to_the_weights(mlp_onnx, monkeypatch):
    rng = np.random.RandomState(0)
    X = rng.randn(64, 8).astype(np.float32)
    y = np.tanh(X @ rng.randn(8)).astype(np.float32)
    runs = []
    for dtype in (np.float32, np.float64):
        est = _fit(mlp_onnx, "adam", True, monkeypatch, X, y)
        state = est.get_state(include_optimizer=True)
        state["optimizer"] = [[np.asarray(v, dtype=dtype) for v in group]
                              for group in state["optimizer"]]
        est.set_state(state)
        est.partial_fit(X, y)
        runs.append(est)
    assert {v.data_type() for group in runs[1]._trainer.state for v in group} == {
        "tensor(float)"}
    np.testing.assert_array_equal(runs[0].train_losses_, runs[1].train_losses_)


def test_values_of_another_type_or_size_are_refused():
    learning_rate = RATES["adam"]()
    update = segmented_update.SegmentedUpdate(
        segmented_update.segment_update_model(learning_rate, 1, 17),
        parse_device("cpu"), default_session_options(1), learning_rate.state_names)
    weight = to_ortvalue(np.zeros((4, 5), np.float32))
    for bad in (np.zeros((4, 5), np.float64), np.zeros((4, 4), np.float32)):
        with pytest.raises(ValueError, match="all must be float32 tensors"):
            update.bind([(weight, to_ortvalue(np.zeros((4, 5), np.float32)),
                          [to_ortvalue(bad), to_ortvalue(np.zeros((4, 5), np.float32))])])


def test_a_non_finite_loss_leaves_deferred_weights_as_they_were(mlp_onnx, monkeypatch):
    rng = np.random.RandomState(0)
    X = rng.randn(64, 8).astype(np.float32)
    y = np.tanh(X @ rng.randn(8)).astype(np.float32)
    est = _fit(mlp_onnx, "adam", True, monkeypatch, X, y)
    trainer = est._trainer
    before = [v.numpy().copy() for v in trainer._flat_parameters()]
    bad = X[:16].copy()
    bad[3, 2] = np.nan
    loss = trainer.fused_step(bad, y[:16].reshape(-1, 1), None, np.float32)
    assert not np.isfinite(loss)
    for a, b in zip(trainer._flat_parameters(), before):
        np.testing.assert_array_equal(a.numpy(), b)
    # and a finite one updates them
    trainer.fused_step(X[:16], y[:16].reshape(-1, 1), None, np.float32)
    index = trainer.engine.weights_to_train.index(trainer.graphs.deferred[0])
    assert not np.array_equal(trainer.engine.weights[index].numpy(),
                              before[index * 3])


@pytest.mark.parametrize("rate", ["momentum", "adamw"])
def test_deferred_convolutions_with_running_statistics_train_as_the_split_path(
        monkeypatch, rate):
    # w2 (108 elements) and fc (48) deferred, w1 and the BatchNormalization
    # scale and bias updated in place, the running statistics among the
    # runner's parameters after the states
    from test_in_place import _bn_cnn
    rng = np.random.default_rng(1)
    X = rng.standard_normal((32, 1, 4, 4)).astype(np.float32)
    y = rng.standard_normal(32).astype(np.float32)
    fits = {}
    for path, minimum in [("split", 1 << 60), ("fused", 48)]:
        monkeypatch.setattr(segmented_update, "DEFERRED_MIN_ELEMENTS", minimum)
        fits[path] = OrtGradientForwardBackwardOptimizer(
            _bn_cnn(), weights_to_train=["w1", "scale", "bias", "w2", "fc"], max_iter=2,
            batch_size=8, training_path=path, warm_start=True,
            learning_rate=RATES[rate]()).fit(X, y)
    trainer = fits["fused"]._trainer
    assert trainer.graphs.deferred == ["w2", "fc"]
    assert trainer.buffer_names
    np.testing.assert_allclose(fits["fused"].train_losses_, fits["split"].train_losses_,
                               rtol=1e-5)
    states = [f.get_state(include_optimizer=True) for f in (fits["fused"], fits["split"])]
    for key in ("weights", "optimizer"):
        for a, b in zip(*[[np.asarray(x) for x in _leaves(s[key])] for s in states]):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    buffers = [f._trainer.get_buffers() for f in (fits["fused"], fits["split"])]
    for name in buffers[0]:
        np.testing.assert_allclose(buffers[0][name], buffers[1][name], rtol=1e-5)


def _leaves(values):
    """The arrays of a list of arrays or of lists of arrays."""
    for value in values:
        if isinstance(value, (list, tuple)):
            yield from _leaves(value)
        else:
            yield value
