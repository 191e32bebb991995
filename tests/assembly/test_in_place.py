"""The fused step's update split into several If nodes
(assembly/in_place.py): the values of the flat step, every If after every
other reader of the parameters it overwrites, the first group's If run
first, and a non-finite loss keeping every parameter."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxtrain.assembly.in_place import ALIASING_OPS, update_in_place
from onnxtrain.graph.scopes import node_reads
from onnxtrain.runtime import FusedRunner, to_ortvalue

N_FEATURES, BATCH = 6, 8


@pytest.fixture(scope="module")
def deep_fit(mlp_onnx):
    """A fused-step fit (momentum) of an MLP of three hidden layers: four
    weights and four biases, each with a velocity."""
    from onnxtrain.estimators import OrtGradientForwardBackwardOptimizer
    from onnxtrain.optim import LearningRateSGDNesterov
    rng = np.random.RandomState(0)
    X = rng.randn(4 * BATCH, N_FEATURES).astype(np.float32)
    y = np.tanh(X @ rng.randn(N_FEATURES)).astype(np.float32)
    est = OrtGradientForwardBackwardOptimizer(
        mlp_onnx(hidden=(12, 10, 7), n_features=N_FEATURES), max_iter=1,
        batch_size=BATCH, random_state=0, training_path="fused",
        learning_rate=LearningRateSGDNesterov(0.05, learning_rate="constant",
                                              nesterov=False))
    return X, y, est.fit(X, y)


def _groups(trainer):
    """The flat step and its update split into one If per parameter pair."""
    flat = trainer.fused_graph("flat step", False)
    return flat, update_in_place(flat, min_group_bytes=0, max_groups=1000)


def _ifs(step):
    return [n for n in step.model.graph.node if n.op_type == "If"]


def _run(step, start, X, y):
    runner = FusedRunner(step)
    runner.set_parameters([to_ortvalue(v.copy()) for v in start])
    losses = []
    for first in range(0, X.shape[0], BATCH):
        feeds = {step.data_inputs[0]: X[first:first + BATCH],
                 step.data_inputs[1]: y[first:first + BATCH].reshape(-1, 1)}
        losses.append(float(runner.run(feeds, {"learning_rate": 0.05, "step": 1.0,
                                               "penalty_scale": 1 / BATCH})))
    return losses, [v.numpy() for v in runner.parameters]


def test_each_parameter_group_gets_its_own_if(deep_fit):
    flat, step = _groups(deep_fit[2]._trainer)
    outputs = {o.name for o in flat.model.graph.output[1:]}
    ifs = _ifs(step)
    # a weight and its velocity share their update's nodes: one If per pair
    assert len(ifs) == len(outputs) // 2 == 8
    assert {o for n in ifs for o in n.output} >= outputs
    assert step.in_place == outputs
    onnx.checker.check_model(step.model, full_check=True)
    # the default sizes keep a model of a few kB in one If
    assert len(_ifs(update_in_place(flat))) == 1


def test_grouped_update_computes_what_the_flat_step_does(deep_fit):
    X, y, est = deep_fit
    trainer = est._trainer
    flat, grouped = _groups(trainer)
    start = [v.numpy().copy() for v in trainer._flat_parameters()]
    (losses, params), (flat_losses, flat_params) = [
        _run(step, start, X, y) for step in (grouped, flat)]
    np.testing.assert_allclose(losses, flat_losses, rtol=1e-6)
    for a, b, s in zip(params, flat_params, start):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
        assert not np.array_equal(a, s)


def _views(graph, names):
    """``names`` and the values the aliasing ops make of them."""
    views, grown = set(names), True
    while grown:
        grown = False
        for node in graph.node:
            if node.op_type in ALIASING_OPS and set(node.input) & views:
                new = set(node.output) - views
                views |= new
                grown = grown or bool(new)
    return views


def _ancestors(graph, node):
    producer = {o: n for n in graph.node for o in n.output}
    seen, stack = [], [node]
    while stack:
        for name in node_reads(stack.pop()):
            parent = producer.get(name)
            if parent is not None and all(parent is not s for s in seen):
                seen.append(parent)
                stack.append(parent)
    return seen


def test_every_if_runs_after_the_other_readers_of_its_parameters(deep_fit):
    """A hidden layer's input gradient reads its weight after the weight's
    gradient exists: its output goes through that weight's If, which the
    next layers' gradients then wait for."""
    flat, step = _groups(deep_fit[2]._trainer)
    graph = step.model.graph
    sources = dict(zip([o.name for o in graph.output[1:]], step.parameter_inputs))
    passed = 0
    for node in _ifs(step):
        written = [sources[o] for o in node.output if o in step.in_place]
        views = _views(graph, written)
        before = _ancestors(graph, node)
        readers = [n for n in graph.node if n is not node and views & node_reads(n)]
        assert readers and all(any(r is a for a in before) for r in readers)
        passed += len([o for o in node.output if o not in sources])
    assert passed >= 2  # the input gradients of the deeper hidden layers


def test_first_gradients_update_first(deep_fit):
    """onnxruntime runs a graph depth-first from the nodes no node reads,
    the last one first: an If of the output layer, whose gradients the
    backward pass computes first, is the graph's last node."""
    flat, step = _groups(deep_fit[2]._trainer)
    last = step.model.graph.node[-1]
    assert last.op_type == "If"
    output_layer = {f"{w}__new" for w in flat.weights[-2:]}  # coefficient, intercept
    assert output_layer & set(last.output)
    # the first layer's, computed last, is not
    assert not {f"{w}__new" for w in flat.weights[:2]} & set(last.output)


def test_non_finite_loss_keeps_every_group(deep_fit):
    X, y, est = deep_fit
    _, step = _groups(est._trainer)
    runner = FusedRunner(step)
    runner.set_parameters([to_ortvalue(v.numpy().copy())
                           for v in est._trainer._flat_parameters()])
    values = [v.numpy().copy() for v in runner.parameters]
    bad = X[:BATCH].copy()
    bad[2, 3] = np.inf
    loss = runner.run({step.data_inputs[0]: bad,
                       step.data_inputs[1]: y[:BATCH].reshape(-1, 1)},
                      {"learning_rate": 0.05, "step": 1.0, "penalty_scale": 1 / BATCH})
    assert not np.isfinite(loss)
    for value, old in zip(runner.parameters, values):
        np.testing.assert_array_equal(value.numpy(), old)


def _bn_cnn():
    """Conv -> BatchNormalization (training mode) -> Relu -> Conv ->
    Flatten -> MatMul: two convolutions whose weights go to two groups, and
    running statistics."""
    rng = np.random.default_rng(0)
    vi = helper.make_tensor_value_info
    arr = onnx.numpy_helper.from_array
    inits = [arr(rng.standard_normal((4, 1, 3, 3)).astype(np.float32), "w1"),
             arr(np.ones(4, np.float32), "scale"), arr(np.zeros(4, np.float32), "bias"),
             arr(np.zeros(4, np.float32), "mean"), arr(np.ones(4, np.float32), "var"),
             arr(0.3 * rng.standard_normal((3, 4, 3, 3)).astype(np.float32), "w2"),
             arr(0.3 * rng.standard_normal((48, 1)).astype(np.float32), "fc")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"],
                              ["bn", "mean_out", "var_out"], training_mode=1),
             helper.make_node("Relu", ["bn"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Flatten", ["c2"], ["f"]),
             helper.make_node("MatMul", ["f", "fc"], ["y"])]
    graph = helper.make_graph(nodes, "g", [vi("x", TensorProto.FLOAT, ["N", 1, 4, 4])],
                              [vi("y", TensorProto.FLOAT, ["N", 1])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_grouped_convolutions_and_statistics_match_the_flat_step():
    """The running statistics go through the last group's If; the lowered
    convolutions read their weights through Reshapes (views), whose
    readers run before the weights' If too."""
    from onnxtrain.estimators import OrtGradientForwardBackwardOptimizer
    from onnxtrain.graph.training_mode import updated_name
    from onnxtrain.optim import LearningRateSGDNesterov
    rng = np.random.default_rng(1)
    X = rng.standard_normal((16, 1, 4, 4)).astype(np.float32)
    y = rng.standard_normal(16).astype(np.float32)
    est = OrtGradientForwardBackwardOptimizer(
        _bn_cnn(), weights_to_train=["w1", "scale", "bias", "w2", "fc"], max_iter=1,
        batch_size=8, training_path="fused", warm_start=True,
        learning_rate=LearningRateSGDNesterov(0.01, learning_rate="constant",
                                              nesterov=False)).fit(X, y)
    trainer = est._trainer
    flat = trainer.fused_graph("flat step", False)
    grouped = update_in_place(flat, min_group_bytes=0, max_groups=1000)
    ifs = _ifs(grouped)
    assert len(ifs) >= 3
    statistics = {updated_name(b) for b in grouped.buffers}
    holding = [n for n in ifs if statistics & set(n.output)]
    assert len(holding) == 1 and statistics <= set(holding[0].output)
    assert not statistics & grouped.in_place
    assert grouped.in_place == {o.name for o in flat.model.graph.output[1:]} - statistics
    # the lowered Conv's transposed weight (a reader of a view of w2) keeps
    # its product as its only reader, which onnxruntime folds it into: the
    # product's output goes through the If instead
    nodes = list(grouped.model.graph.node)
    views = _views(grouped.model.graph, ["w2"])
    transposes = [n for n in nodes if n.op_type == "Transpose" and views & set(n.input)]
    assert transposes
    for t in transposes:
        readers = [n for n in nodes if t.output[0] in node_reads(n)]
        assert [n.op_type for n in readers] == ["MatMul"], readers
    start = [v.numpy().copy() for v in trainer._flat_parameters()]
    results = []
    for step in (grouped, flat):
        runner = FusedRunner(step)
        runner.set_parameters([to_ortvalue(v.copy()) for v in start])
        for first in (0, 8, 0):
            runner.run({step.data_inputs[0]: X[first:first + 8],
                        step.data_inputs[1]: y[first:first + 8].reshape(-1, 1)},
                       {"learning_rate": 0.01, "step": 1.0, "penalty_scale": 1 / 8})
        results.append([v.numpy() for v in runner.parameters])
    for a, b, s in zip(*results, start):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        assert not np.array_equal(a, s)


def test_float16_adam_fused_trains_as_the_split_path():
    # onnxruntime runs float16 on the CPU as float32 behind Casts: the
    # update's If read its gradient-only values rounded to float16 at its
    # boundary, and a second moment of 0 (epsilon 1e-8 is 0 in float16) sent
    # a step to -15; float16 fits take the flat step
    from onnx import numpy_helper

    from onnxtrain.estimators import OrtGradientForwardBackwardOptimizer
    from onnxtrain.optim import LearningRateAdam
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((0.1 * rng.standard_normal((40, 4))).astype(np.float16),
                                     "W"),
             numpy_helper.from_array(np.zeros((1, 4), np.float16), "B")]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["h"]),
         helper.make_node("Add", ["h", "B"], ["Y"])], "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT16, [None, 40])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT16, [None, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    X = rng.standard_normal((64, 40)).astype(np.float16)
    y = rng.standard_normal((64, 4)).astype(np.float16)
    fits = {path: OrtGradientForwardBackwardOptimizer(
        model, max_iter=3, batch_size=16, training_path=path, warm_start=True,
        learning_rate=LearningRateAdam(0.01)).fit(X, y) for path in ("split", "fused")}
    np.testing.assert_allclose(fits["fused"].train_losses_, fits["split"].train_losses_,
                               rtol=1e-3)
    assert not fits["fused"]._trainer.fused_graph("step", False).in_place
