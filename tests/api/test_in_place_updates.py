"""Outputs written into their inputs' memory (graph/aliasing.py): the api
Optimizer updates parameters and moments in place and the Module writes
each gradient into the previous call's buffer, with the values of the
numpy references; graphs where that would be wrong are refused."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxtrain.onnxblock as onnxblock
from onnxtrain.graph.aliasing import writes_after_reads
from onnxtrain.runtime import SessionRunner, to_ortvalue
from test_api import (TRAINABLE, AdamWReference, SGDReference, make_artifacts,
                      open_training)
from test_artifacts_models import batch


def _graph(nodes, outputs=("w.updated",)):
    vi = helper.make_tensor_value_info
    inputs = [vi(n, TensorProto.FLOAT, [3]) for n in ("w", "g", "m")]
    return helper.make_graph(nodes, "g", inputs,
                             [vi(o, TensorProto.FLOAT, [3]) for o in outputs])


def test_elementwise_update_whose_other_reads_come_first_is_in_place():
    graph = _graph([helper.make_node("Mul", ["w", "g"], ["wg"]),
                    helper.make_node("Add", ["wg", "g"], ["u"]),
                    helper.make_node("Sub", ["w", "u"], ["w.updated"])])
    assert writes_after_reads(graph, [("w", "w.updated")]) == {("w", "w.updated")}


def test_gemm_writing_over_a_buffer_it_reads_through_a_where_is_in_place():
    # the artifacts' accumulating weight gradient: Gemm(A, B, Where(c, 0, w))
    graph = _graph([helper.make_node("Where", ["c", "z", "w"], ["masked"]),
                    helper.make_node("Gemm", ["g", "m", "masked"], ["w.updated"])])
    assert writes_after_reads(graph, [("w", "w.updated")]) == {("w", "w.updated")}
    # vectors accumulated together: Split(Where(c, G, Concat(w, m) + G))
    graph = _graph([helper.make_node("Concat", ["w", "m"], ["wm"], axis=0),
                    helper.make_node("Add", ["wm", "g"], ["s"]),
                    helper.make_node("Split", ["s"], ["w.updated", "m.updated"],
                                     axis=0)], ["w.updated", "m.updated"])
    assert writes_after_reads(graph, [("w", "w.updated"), ("m", "m.updated")]) == {
        ("w", "w.updated"), ("m", "m.updated")}
    # a Gemm reading w itself may read it after writing part of its output
    graph = _graph([helper.make_node("Gemm", ["g", "m", "w"], ["w.updated"])])
    assert writes_after_reads(graph, [("w", "w.updated")]) == set()


@pytest.mark.parametrize("nodes", [
    # another output reads w and need not run before the update
    [helper.make_node("Sub", ["w", "g"], ["w.updated"]),
     helper.make_node("Mul", ["w", "m"], ["other"])],
    # the writer is not element-wise
    [helper.make_node("MatMul", ["w", "g"], ["w.updated"])],
    # read inside a subgraph of a node that is not an ancestor
    [helper.make_node("Sub", ["w", "g"], ["w.updated"]),
     helper.make_node("If", ["c"], ["other"], then_branch=helper.make_graph(
         [helper.make_node("Identity", ["w"], ["t"])], "then", [],
         [helper.make_tensor_value_info("t", TensorProto.FLOAT, [3])]),
         else_branch=helper.make_graph(
         [helper.make_node("Identity", ["m"], ["e"])], "else", [],
         [helper.make_tensor_value_info("e", TensorProto.FLOAT, [3])]))],
    # onnxruntime fuses MatMul + Add into a Gemm reading w while writing it
    [helper.make_node("MatMul", ["w", "m"], ["wm"]),
     helper.make_node("Add", ["wm", "g"], ["w.updated"])],
    # onnxruntime drops the Identity: the MatMul would write into w
    [helper.make_node("Mul", ["w", "g"], ["wg"]),
     helper.make_node("Identity", ["wg"], ["w.updated"])],
    # a Reshape's output shares w's memory: its reader may come later
    [helper.make_node("Sub", ["w", "g"], ["w.updated"]),
     helper.make_node("Reshape", ["w", "m"], ["other"])],
], ids=["later-reader", "not-elementwise", "subgraph-reader", "fused-reader",
        "identity-writer", "aliasing-reader"])
def test_updates_that_would_read_overwritten_values_are_refused(nodes):
    graph = _graph(nodes, ["w.updated"] + (["other"] if len(nodes) > 1 else []))
    assert writes_after_reads(graph, [("w", "w.updated")]) == set()


def test_runner_writes_into_the_given_value_and_returns_it():
    graph = _graph([helper.make_node("Sub", ["w", "g"], ["w.updated"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    runner = SessionRunner(model)
    w = to_ortvalue(np.array([1, 2, 3], np.float32))
    g = np.array([0.5, 0.25, 1], np.float32)
    out, = runner({"w": w, "g": g, "m": g}, into={"w.updated": w})
    assert out is w
    np.testing.assert_array_equal(w.numpy(), [0.5, 1.75, 2])


@pytest.mark.parametrize("block, reference", [
    (onnxblock.optim.SGD(), SGDReference()),
    (onnxblock.optim.AdamW(weight_decay=0.01), AdamWReference(weight_decay=0.01)),
], ids=["SGD", "AdamW"])
def test_optimizer_and_module_write_in_place_with_the_reference_values(
        tmp_path, block, reference):
    paths = make_artifacts(tmp_path, block, np.float64)
    model = onnx.load(paths["optimizer_model"])
    state, module, optimizer = open_training(paths)
    n_states = len(reference.state_names)
    # every update of the artifacts' optimizer model qualifies
    assert len(optimizer._in_place) == len(TRAINABLE) * (1 + n_states)
    assert {o.name for o in model.graph.output} == optimizer._in_place
    expected = {n: state.parameters[n].data for n in TRAINABLE}
    moments = {n: {s: np.zeros_like(expected[n]) for s in reference.state_names}
               for n in TRAINABLE}
    objects = None
    for step, lr in enumerate([0.01, 0.05, 0.02], start=1):
        x, t1, _ = batch(8, np.float64, seed=step)
        module(x, t1)
        grads = {n: state.parameters[n].grad for n in TRAINABLE}
        optimizer.set_learning_rate(lr)
        optimizer.step()
        module.lazy_reset_grad()
        raw = {n: state.parameters.raw(n) for n in TRAINABLE}
        now = {n: (raw[n]._value, raw[n]._grad,
                   *state.optimizer_state.states[n].values()) for n in TRAINABLE}
        if objects is not None:  # the same buffers as the step before
            assert all(a is b for n in TRAINABLE for a, b in zip(now[n], objects[n]))
        objects = now
        for name in TRAINABLE:
            expected[name] = reference.update(expected[name], grads[name],
                                              moments[name], lr, step)
            np.testing.assert_allclose(state.parameters[name].data, expected[name],
                                       rtol=1e-10, atol=1e-13)


def test_accumulated_gradients_are_written_into_their_buffer(tmp_path):
    state, module, _ = open_training(make_artifacts(tmp_path, onnxblock.optim.SGD()))
    sums = {n: 0 for n in TRAINABLE}
    buffers = None
    for step in range(1, 4):  # no lazy_reset_grad: the gradients add up
        x, t1, _ = batch(8, np.float64, seed=step)
        module(x, t1)
        # the gradient of this batch alone, from a module of its own
        _, alone, _ = open_training(make_artifacts(tmp_path / str(step),
                                                   onnxblock.optim.SGD()))
        alone(x, t1)
        for name in TRAINABLE:
            sums[name] = sums[name] + alone._state.parameters[name].grad
            np.testing.assert_allclose(state.parameters[name].grad, sums[name],
                                       rtol=1e-12, atol=1e-14)
        now = [state.parameters.raw(n)._grad for n in TRAINABLE]
        if buffers is not None:
            assert all(a is b for a, b in zip(now, buffers))
        buffers = now


def test_optimizer_state_arrays_given_are_not_written(tmp_path):
    from onnxtrain import api
    from onnxtrain.api.state import OptimizerState
    paths = make_artifacts(tmp_path, onnxblock.optim.AdamW())
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    module = api.Module(paths["training_model"], state, paths["eval_model"])
    rng = np.random.default_rng(0)
    given = {n: {k: np.abs(rng.standard_normal(state.parameters[n].data.shape))
                 for k in ("exp_avg", "exp_avg_sq")} for n in TRAINABLE}
    copies = {n: {k: v.copy() for k, v in d.items()} for n, d in given.items()}
    state.optimizer_state = OptimizerState(states=given)  # e.g. a resumed training
    values = {n: state.parameters[n].data for n in TRAINABLE}
    for flat in (True, False):
        optimizer = api.Optimizer(paths["optimizer_model"], module)
        if not flat:
            optimizer._flat = None
            optimizer._runner = SessionRunner(onnx.load(paths["optimizer_model"]))
        x, t1, _ = batch(8, np.float64, seed=1)
        module(x, t1)
        optimizer.step()
        module.lazy_reset_grad()
        for name in TRAINABLE:
            for key, array in given[name].items():
                np.testing.assert_array_equal(array, copies[name][key])
            assert not np.array_equal(state.parameters[name].data, values[name])


# one update over flat buffers (api/_flat.py) ---------------------------------
@pytest.mark.parametrize("block, flat", [
    (onnxblock.optim.SGD(), True),
    (onnxblock.optim.AdamW(weight_decay=0.01), True),
    # the clipping's joint norm is not in the metadata: run as given
    (onnxblock.optim.AdamW(clip_grad=onnxblock.optim.ClipGradNorm(0.05)), False),
], ids=["SGD", "AdamW", "AdamW-clip"])
def test_flat_update_only_for_the_models_generate_artifacts_writes(tmp_path, block, flat):
    paths = make_artifacts(tmp_path, block, np.float32)
    _, _, optimizer = open_training(paths)
    assert (optimizer._flat is not None) is flat
    if flat:  # the same model with one node edited is run as given
        model = onnx.load(paths["optimizer_model"])
        node = next(n for n in model.graph.node if n.op_type == "Sub")
        node.op_type = "Add"
        onnx.save(model, paths["optimizer_model"])
        assert open_training(paths)[2]._flat is None


def _step_against_reference(state, module, optimizer, step, lr, reference, moments,
                            atol=0):
    """One training call and optimizer step on batch ``step``; every
    trained parameter then equals the numpy ``reference``'s update
    (``moments``: name -> state dict, updated)."""
    x, t1, _ = batch(8, np.float64, seed=step)
    before = {n: state.parameters[n].data for n in TRAINABLE}
    module(x, t1)
    grads = {n: state.parameters[n].grad for n in TRAINABLE}
    optimizer.set_learning_rate(lr)
    optimizer.step()
    module.lazy_reset_grad()
    for name in TRAINABLE:
        expected = reference.update(before[name], grads[name], moments[name], lr, step)
        np.testing.assert_allclose(state.parameters[name].data, expected,
                                   rtol=1e-12, atol=atol)


def test_flat_update_shares_the_buffers_and_reads_assigned_values(tmp_path):
    state, module, optimizer = open_training(make_artifacts(tmp_path, onnxblock.optim.SGD()))
    assert optimizer._flat is not None
    for step, lr in enumerate([0.01, 0.05], start=1):
        if step == 2:  # assigned by the user between steps: copied in
            state.parameters["weight1"] = np.full(state.parameters["weight1"].shape, 0.5)
        _step_against_reference(state, module, optimizer, step, lr, SGDReference(),
                                {n: {} for n in TRAINABLE})
    flat = optimizer._flat.flat
    for name in TRAINABLE:
        raw = state.parameters.raw(name)
        assert np.shares_memory(raw._value.numpy(), flat["value"])
        assert np.shares_memory(raw._grad.numpy(), flat["grad"])


def test_segments_are_equal_ranges_of_at_most_the_segment_size():
    from onnxtrain.api._flat import SEGMENT_SIZE, segment_sizes
    # 41 elements, at most 8 a segment: 6 segments of 7 or 6
    assert segment_sizes([3, 5, 10, 2, 1, 20], maximum=8) == [7, 7, 7, 7, 7, 6]
    assert segment_sizes([1, 2, 3], maximum=1) == [1] * 6
    assert segment_sizes([4, 4], maximum=100) == [8]
    assert segment_sizes([], maximum=8) == [0]
    # resnet18's weights: its largest one (2359296) spans segments, whose
    # temporaries stay of at most SEGMENT_SIZE elements
    sizes = [9408, 64, 64, 2359296, 512, 512, 589824, 512]
    segments = segment_sizes(sizes)
    assert sum(segments) == sum(sizes) and len(segments) == 3
    assert max(segments) <= SEGMENT_SIZE and max(segments) - min(segments) <= 1
    assert SEGMENT_SIZE == 1 << 20


@pytest.mark.parametrize("maximum", [1, 12, 1 << 20], ids=["each", "split", "one"])
@pytest.mark.parametrize("block, reference", [
    (onnxblock.optim.SGD(), SGDReference()),
    (onnxblock.optim.AdamW(weight_decay=0.01), AdamWReference(weight_decay=0.01)),
], ids=["SGD", "AdamW"])
def test_flat_update_over_segments_computes_the_reference(tmp_path, monkeypatch,
                                                          maximum, block, reference):
    # segments of one element, of 10 (the first parameter, of 15, spans
    # two) and one segment for all
    import onnxtrain.api._flat as flat_module
    monkeypatch.setattr(flat_module, "SEGMENT_SIZE", maximum)
    state, module, optimizer = open_training(make_artifacts(tmp_path, block))
    sizes = [state.parameters[n].data.size for n in TRAINABLE]
    segments = flat_module.segment_sizes(sizes, maximum)
    assert sizes == [15, 3, 10, 2]
    assert segments == {1: [1] * 30, 12: [10, 10, 10], 1 << 20: [30]}[maximum]
    assert len(optimizer._flat.feeds) == len(segments) * (2 + len(reference.state_names))
    moments = {n: {k: np.zeros_like(state.parameters[n].data)
                   for k in reference.state_names} for n in TRAINABLE}
    for step, lr in enumerate([0.01, 0.05, 0.02], start=1):
        _step_against_reference(state, module, optimizer, step, lr, reference, moments,
                                atol=1e-15)


def test_flat_update_not_for_a_model_with_a_constant_changed(tmp_path):
    paths = make_artifacts(tmp_path, onnxblock.optim.AdamW(), np.float32)
    assert open_training(paths)[2]._flat is not None
    model = onnx.load(paths["optimizer_model"])
    eps = next(i for i in model.graph.initializer
               if np.isclose(onnx.numpy_helper.to_array(i), 1e-6).all())
    eps.CopyFrom(onnx.numpy_helper.from_array(np.array(0.5, eps_dtype(eps)), eps.name))
    onnx.save(model, paths["optimizer_model"])
    state, module, optimizer = open_training(paths)
    assert optimizer._flat is None  # run as given: eps 0.5 changes the step
    x, t1, _ = batch(8, np.float32, seed=1)
    module(x, t1)
    grads = {n: state.parameters[n].grad.astype(np.float64) for n in TRAINABLE}
    before = {n: state.parameters[n].data.astype(np.float64) for n in TRAINABLE}
    optimizer.set_learning_rate(0.1)
    optimizer.step()
    reference = AdamWReference(eps=0.5)
    for name in TRAINABLE:
        moments = {s: np.zeros_like(before[name]) for s in reference.state_names}
        expected = reference.update(before[name], grads[name], moments, 0.1, 1)
        np.testing.assert_allclose(state.parameters[name].data, expected,
                                   rtol=1e-5, atol=1e-6)


def eps_dtype(tensor):
    return onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)


# found while reviewing the in-place updates (they predate them) ------------
def test_contiguous_parameters_stay_valid_after_the_ortvalue_is_dropped(tmp_path):
    import gc
    state, module, _ = open_training(make_artifacts(tmp_path, onnxblock.optim.SGD()))
    expected = np.concatenate([p.data.reshape(-1) for _, p in state.parameters])
    flat = module.get_contiguous_parameters(trainable_only=False).numpy()
    gc.collect()
    junk = [np.full(expected.size, -7.0) for _ in range(50)]  # reuse freed memory
    np.testing.assert_array_equal(flat, expected)
    del junk


def test_a_second_optimizer_after_steps_continues_from_the_moments(tmp_path):
    from onnxtrain import api
    paths = make_artifacts(tmp_path, onnxblock.optim.AdamW(), np.float64)
    state, module, optimizer = open_training(paths)
    module(*batch(8, np.float64, seed=1)[:2])
    optimizer.step()
    moments = {n: {k: np.array(v.numpy(), copy=True)
                   for k, v in state.optimizer_state.states[n].items()} for n in TRAINABLE}
    second = api.Optimizer(paths["optimizer_model"], module)  # raised TypeError
    assert second.step_count == 1
    for name in TRAINABLE:
        for key, value in state.optimizer_state.states[name].items():
            np.testing.assert_array_equal(np.asarray(value.numpy()), moments[name][key])


def test_rank_0_parameter_keeps_its_shape_through_a_checkpoint(tmp_path):
    from onnxtrain.api.checkpoint import read_checkpoint, write_checkpoint
    path = str(tmp_path / "checkpoint")
    write_checkpoint(path, [("s", np.array(0.7, np.float32), True)], {}, None)
    value = read_checkpoint(path)["parameters"][0][1]
    assert value.shape == () and value == np.float32(0.7)


def test_empty_parameter_keeps_its_shape_through_a_checkpoint(tmp_path):
    from onnxtrain.api.checkpoint import read_checkpoint, write_checkpoint
    path = str(tmp_path / "checkpoint")
    write_checkpoint(path, [("e", np.zeros((0, 3), np.float32), True),
                            ("w", np.arange(6, dtype=np.float32).reshape(2, 3), True)],
                     {}, None)
    (_, empty, _), (_, w, _) = read_checkpoint(path)["parameters"]
    assert empty.shape == (0, 3)
    np.testing.assert_array_equal(w, np.arange(6, dtype=np.float32).reshape(2, 3))


# ------------------------------------------- the estimators' fused step
# (training_graphs.update_in_place: the update inside an If on the loss)

@pytest.fixture(scope="module")
def mlp_fit(mlp_onnx):
    """A fused-step fit of an MLP with momentum (weights and velocities)."""
    from onnxtrain.estimators import OrtGradientForwardBackwardOptimizer
    from onnxtrain.optim import LearningRateSGDNesterov
    rng = np.random.RandomState(0)
    X = rng.randn(64, 5).astype(np.float32)
    y = np.tanh(X @ rng.randn(5)).astype(np.float32)
    est = OrtGradientForwardBackwardOptimizer(
        mlp_onnx(hidden=(8,), n_features=5), max_iter=2, batch_size=16, random_state=0,
        training_path="fused", learning_rate=LearningRateSGDNesterov(
            0.05, learning_rate="constant", nesterov=False))
    return X, y, est.fit(X, y)


def _step_feeds(step, X, y):
    return {step.data_inputs[0]: X, step.data_inputs[1]: y.reshape(-1, 1)}


def _scalars():
    return {"learning_rate": 0.05, "step": 1.0, "penalty_scale": 1 / 16}


def test_fused_step_writes_weights_and_states_over_their_inputs(mlp_fit):
    X, y, est = mlp_fit
    trainer = est._trainer
    flat, step = trainer.fused_graph("flat step", False), trainer.fused_graph("step", False)
    outputs = [o.name for o in flat.model.graph.output][1:]
    pairs = list(zip(flat.parameter_inputs, outputs))
    # in the flat graph the output layer's input gradient reads its weight
    # and may run after the update: not every output may overwrite its input
    assert writes_after_reads(flat.model.graph, pairs) < set(pairs)
    assert step.in_place == set(outputs)  # the If runs after every reader
    assert step.model.graph.node[-1].op_type == "If"
    onnx.checker.check_model(step.model, full_check=True)
    before = trainer._flat_parameters()
    pointers = [v.data_ptr() for v in before]
    values = [v.numpy().copy() for v in before]
    est.partial_fit(X, y)
    after = trainer._flat_parameters()
    assert [v.data_ptr() for v in after] == pointers
    assert all(a is b for a, b in zip(after, before))
    assert all(not np.array_equal(v.numpy(), old) for v, old in zip(after, values))


def test_in_place_step_computes_what_the_flat_step_does(mlp_fit):
    from onnxtrain.runtime import FusedRunner
    X, y, est = mlp_fit
    trainer = est._trainer
    runners = [FusedRunner(trainer.fused_graph(kind, False))
               for kind in ("step", "flat step")]
    start = [v.numpy().copy() for v in trainer._flat_parameters()]
    for runner in runners:
        runner.set_parameters([to_ortvalue(v.copy()) for v in start])
    for first in range(0, 64, 16):
        losses = [runner.run(_step_feeds(runner.step, X[first:first + 16],
                                         y[first:first + 16]), _scalars())
                  for runner in runners]
        np.testing.assert_allclose(losses[0], losses[1], rtol=1e-6)
    for a, b in zip(*[runner.parameters for runner in runners]):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7)
    assert not np.allclose(runners[0].parameters[0].numpy(), start[0])


def test_non_finite_loss_leaves_the_in_place_parameters_as_they_were(mlp_fit):
    from onnxtrain.runtime import FusedRunner
    X, y, est = mlp_fit
    runner = FusedRunner(est._trainer.fused_graph("step", False))
    given = [to_ortvalue(v.numpy().copy()) for v in est._trainer._flat_parameters()]
    runner.set_parameters(given)
    values = [v.numpy().copy() for v in runner.parameters]
    bad = X[:16].copy()
    bad[3, 1] = np.nan
    loss = runner.run(_step_feeds(runner.step, bad, y[:16]), _scalars())
    assert not np.isfinite(loss)
    for value, old in zip(runner.parameters, values):
        np.testing.assert_array_equal(value.numpy(), old)
    runner.run(_step_feeds(runner.step, X[:16], y[:16]), _scalars())
    assert not np.array_equal(runner.parameters[0].numpy(), values[0])
    runner.release()
    with pytest.raises(RuntimeError, match="call set_parameters first"):
        runner.run(_step_feeds(runner.step, X[:16], y[:16]), _scalars())


@pytest.mark.parametrize("kind", ["step", "flat step"])
def test_caller_values_are_copied_before_they_are_written(mlp_fit, kind):
    """The runner writes over copies unless told the values are its own
    (the in-place outputs at every run, the others every second run, into
    the first buffer); an estimator's set_state copies OrtValues (the
    engine would keep them)."""
    from onnxtrain.runtime import FusedRunner
    X, y, est = mlp_fit
    runner = FusedRunner(est._trainer.fused_graph(kind, False))
    given = [to_ortvalue(v.numpy().copy()) for v in est._trainer._flat_parameters()]
    values = [v.numpy().copy() for v in given]
    runner.set_parameters(given)
    for first in (0, 16, 32):
        runner.run(_step_feeds(runner.step, X[first:first + 16],
                               y[first:first + 16]), _scalars())
    for value, old in zip(given, values):
        np.testing.assert_array_equal(value.numpy(), old)
    assert not np.array_equal(runner.parameters[0].numpy(), values[0])
    weights = [to_ortvalue(w) for w in est.get_state()]
    copies = [w.numpy().copy() for w in weights]
    est.set_state(weights)
    # the runners let the replaced weights go (not kept for the estimator's life)
    assert all(r.parameters is None for r in est._trainer._fused.values())
    est.partial_fit(X, y)
    for value, old in zip(weights, copies):
        np.testing.assert_array_equal(value.numpy(), old)
    assert not np.array_equal(est.get_state()[0], copies[0])


def test_off_the_cpu_the_step_stays_flat(mlp_fit):
    """The If form is built for the CPU only (not run on a GPU yet): the
    trainer passes in_place=False off the CPU, which
    test_training_paths.py::test_cuda_paths_match_cpu checks on a GPU."""
    from onnxtrain.training_graphs import TrainingGraphs
    graphs = mlp_fit[2]._trainer.graphs
    flat = TrainingGraphs(graphs.model, graphs.weights, graphs.learning_rate,
                          graphs.spec, buffer_names=graphs.buffer_names,
                          types=graphs.types, in_place=False)
    step = flat.get("step", False)
    assert step is flat.get("flat step", False) and not step.in_place
    assert "If" not in {n.op_type for n in step.model.graph.node}
    assert graphs.get("step", False).in_place


@pytest.mark.parametrize("l1, l2", [(0.0, 0.01), (0.01, 0.0), (0.01, 0.01)])
def test_penalized_weights_are_updated_in_place(mlp_onnx, l1, l2):
    """A penalty reads the weight element-wise (Sign, Mul), inside the If;
    a zero coefficient adds no term (scikit-learn's MLP alpha: L2 only)."""
    from onnxtrain.estimators import OrtGradientForwardBackwardOptimizer
    from onnxtrain.penalties import ElasticLearningPenalty
    rng = np.random.RandomState(0)
    X = rng.randn(32, 4).astype(np.float32)
    y = X.sum(axis=1).astype(np.float32)
    fits = [OrtGradientForwardBackwardOptimizer(
        mlp_onnx(hidden=(5,), n_features=4), max_iter=3, batch_size=8, random_state=0,
        training_path=path, learning_rate=0.05,
        learning_penalty=ElasticLearningPenalty(l1, l2)).fit(X, y)
        for path in ("fused", "split")]
    step = fits[0]._trainer.fused_graph("step", False)
    outputs = {o.name for o in step.model.graph.output[1:]}
    assert step.in_place == outputs
    flat = fits[0]._trainer.fused_graph("flat step", False).model
    assert ("Sign" in {n.op_type for n in flat.graph.node}) == bool(l1)
    np.testing.assert_allclose(fits[0].train_losses_, fits[1].train_losses_, rtol=1e-5)
    for a, b in zip(fits[0].get_state(), fits[1].get_state()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_step_loss_read_from_its_own_output_value(mlp_fit):
    """A step's rank-0 loss is written into one OrtValue the runner reads
    after each run (not through get_outputs): each returned loss is a copy,
    and equals the loss graph's on the same weights."""
    from onnxtrain.runtime import FusedRunner
    X, y, est = mlp_fit
    runner = FusedRunner(est._trainer.fused_graph("step", False))
    assert runner._loss is not None
    runner.set_parameters([to_ortvalue(v.numpy().copy())
                           for v in est._trainer._flat_parameters()])
    before = est.predict(X[:16]).reshape(-1)
    first = runner.run(_step_feeds(runner.step, X[:16], y[:16]), _scalars())
    kept = float(first)
    second = runner.run(_step_feeds(runner.step, X[16:32], y[16:32]), _scalars())
    assert float(first) == kept and float(second) != kept
    # SquareLearningLoss of the graph's own prediction: 0.5 * mean of d**2
    np.testing.assert_allclose(kept, 0.5 * np.mean((before - y[:16]) ** 2), rtol=1e-5)


def _bn_model():
    """Conv -> BatchNormalization (training mode) -> Flatten -> Gemm."""
    rng = np.random.default_rng(0)
    vi = helper.make_tensor_value_info
    arr = onnx.numpy_helper.from_array
    inits = [arr(rng.standard_normal((2, 1, 3, 3)).astype(np.float32), "w"),
             arr(np.ones(2, np.float32), "scale"), arr(np.zeros(2, np.float32), "bias"),
             arr(np.zeros(2, np.float32), "mean"), arr(np.ones(2, np.float32), "var"),
             arr(rng.standard_normal((32, 1)).astype(np.float32), "fc")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"],
                              ["bn", "mean_out", "var_out"], training_mode=1),
             helper.make_node("Flatten", ["bn"], ["f"]),
             helper.make_node("MatMul", ["f", "fc"], ["y"])]
    graph = helper.make_graph(nodes, "g", [vi("x", TensorProto.FLOAT, ["N", 1, 4, 4])],
                              [vi("y", TensorProto.FLOAT, ["N", 1])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_running_statistics_kept_after_a_non_finite_loss():
    """The running statistics go through the If (copied in by an Identity:
    computed before it, in a second buffer) and a non-finite step keeps
    them, the weights and the velocities."""
    from onnxtrain.estimators import OrtGradientForwardBackwardOptimizer
    from onnxtrain.optim import LearningRateSGDNesterov
    rng = np.random.default_rng(1)
    X = rng.standard_normal((16, 1, 4, 4)).astype(np.float32)
    y = rng.standard_normal(16).astype(np.float32)
    est = OrtGradientForwardBackwardOptimizer(
        _bn_model(), weights_to_train=["w", "scale", "bias", "fc"], max_iter=1,
        batch_size=8, training_path="fused", warm_start=True,
        learning_rate=LearningRateSGDNesterov(0.01, learning_rate="constant",
                                              nesterov=False)).fit(X, y)
    trainer = est._trainer
    step = trainer.fused_graph("step", False)
    (if_node,) = [n for n in step.model.graph.node if n.op_type == "If"]
    from onnxtrain.training_mode import updated_name
    statistics = {updated_name(b) for b in step.buffers}
    assert len(statistics) == 2 and statistics <= set(if_node.output)
    # weights and velocities written in place, the statistics not
    assert step.in_place == set(if_node.output) - statistics
    buffers = {k: v.copy() for k, v in trainer.get_buffers().items()}
    weights = [w.copy() for w in est.get_state()]
    bad = X.copy()
    bad[:, 0, 0, 0] = 3e38  # finite; the batch variance overflows in every batch
    from sklearn.exceptions import ConvergenceWarning
    with pytest.warns(ConvergenceWarning):
        est.set_params(exc=False).partial_fit(bad, y)
    for name, value in trainer.get_buffers().items():
        np.testing.assert_array_equal(value, buffers[name])
    for a, b in zip(est.get_state(), weights):
        np.testing.assert_array_equal(a, b)
    est.partial_fit(X, y)
    assert not all(np.array_equal(v, buffers[k]) for k, v in trainer.get_buffers().items())


def test_a_weight_read_by_a_running_statistic_is_written_after_it():
    """A running statistic computed from a weight itself: its node runs
    before the If, which copies the statistic in, so the weight is still
    written over in place, with the flat step's values."""
    from onnxtrain.runtime import FusedRunner
    from onnxtrain.training_graphs import TrainingStep, update_in_place
    vi = helper.make_tensor_value_info
    f = TensorProto.FLOAT
    mu = onnx.numpy_helper.from_array(np.array(0.9, np.float32), "mu")
    nodes = [helper.make_node("Mul", ["x", "w"], ["h"]),
             helper.make_node("ReduceSum", ["h"], ["loss"], keepdims=0),
             helper.make_node("Identity", ["x"], ["g"]),
             helper.make_node("Mul", ["v", "mu"], ["vm"]),
             helper.make_node("Add", ["vm", "g"], ["v__new"]),
             helper.make_node("Sub", ["w", "v__new"], ["w__new"]),
             helper.make_node("Mul", ["b", "mu"], ["bm"]),
             helper.make_node("Add", ["bm", "w"], ["b__new"])]
    graph = helper.make_graph(
        nodes, "g", [vi(n, f, [3]) for n in ("x", "w", "v", "b")],
        [vi("loss", f, [])] + [vi(n, f, [3]) for n in ("w__new", "v__new", "b__new")],
        [mu])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    flat = TrainingStep(model, ["x"], [], ["w"], [["v"]], ["b"],
                        update_values=frozenset({"vm", "v__new", "w__new"}))
    step = update_in_place(flat)
    assert step.in_place == {"v__new", "w__new"}
    (if_node,) = [n for n in step.model.graph.node if n.op_type == "If"]
    assert list(if_node.output) == ["w__new", "v__new", "b__new"]
    runners = [FusedRunner(s) for s in (step, flat)]
    start = [np.array([1.0, 2.0, 3.0], np.float32), np.zeros(3, np.float32),
             np.ones(3, np.float32)]
    for runner in runners:
        runner.set_parameters([to_ortvalue(a.copy()) for a in start])
    for k in range(3):
        x = np.array([0.5, -1.0, 2.0], np.float32) * (k + 1)
        losses = [float(r.run({"x": x}, {})) for r in runners]
        assert losses[0] == losses[1]
    for a, b in zip(*[r.parameters for r in runners]):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("momentum", [0.9, 0.0])
def test_batch_statistics_read_from_the_node(momentum):
    """node_statistics=True (the CPU step): the node's momentum set to 0
    makes its running-statistics outputs the batch's mean and population
    variance, which the update and the gradient rule read: the same
    running statistics as the graph's own computation, gradients against
    central differences, two ReduceMeans fewer. A model's own node of
    momentum 0 keeps it and its statistics computed by the graph."""
    from gradcheck import check_gradients, run, session
    from onnxtrain.autodiff import build_fused_model
    from onnxtrain.training_mode import (NODE_STATISTICS, updated_name,
                                         with_running_statistics_updates)
    rng = np.random.default_rng(3)
    arr = onnx.numpy_helper.from_array
    vi = helper.make_tensor_value_info
    D = TensorProto.DOUBLE
    stats = {"mean": np.array([0.5, -1.0]), "var": np.array([2.0, 0.5])}
    weights = {"scale": np.array([1.5, -0.5]), "bias": np.array([0.1, 0.2]),
               "fc": rng.standard_normal((32, 1))}
    nodes = [helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"],
                              ["bn", "mean_out", "var_out"], training_mode=1,
                              momentum=momentum),
             helper.make_node("Flatten", ["bn"], ["f"]),
             helper.make_node("MatMul", ["f", "fc"], ["y"])]
    model = helper.make_model(helper.make_graph(
        nodes, "g", [vi("x", D, ["N", 2, 4, 4])], [vi("y", D, ["N", 1])],
        [arr(v, k) for k, v in {**weights, **stats}.items()]),
        opset_imports=[helper.make_opsetid("", 17)])
    x = rng.normal(2.0, 3.0, size=(5, 2, 4, 4))
    for from_node in (False, True):
        new, buffers, _ = with_running_statistics_updates(
            model, node_statistics=from_node)
        (node,) = [n for n in new.graph.node if n.op_type == "BatchNormalization"]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["momentum"] == pytest.approx(0.0 if from_node else momentum)
        assert node.name.startswith(NODE_STATISTICS) == from_node
        ops = [n.op_type for n in new.graph.node]
        assert ops.count("ReduceMean") == (0 if from_node else 2)
        feeds = dict(weights, x=x, **stats)
        check_gradients(new, ["x", "scale", "bias"], feeds, outputs=["y"])
        got = run(session(new), feeds)
        for name, observed in (("mean", x.mean(axis=(0, 2, 3))),
                               ("var", x.var(axis=(0, 2, 3), ddof=1))):
            # the attribute is a float32
            m = float(np.float32(momentum))
            expected = stats[name] * m + observed * (1 - m)
            np.testing.assert_allclose(got[updated_name(name)], expected, rtol=1e-12)
        # non-finite running statistics (a variance that overflowed): the
        # node's zeros stay zeros, its outputs and the gradients finite
        bad = dict(feeds, mean=np.array([np.inf, 0.0]), var=np.array([1.0, np.nan]))
        fused, bg = build_fused_model(new, ["x", "scale", "bias"], ["y"])
        grads = run(session(fused), dict(bad, **{bg.grad_output_names[0]: np.ones((5, 1))}))
        for name in bg.grad_names:
            assert np.isfinite(grads[name]).all(), (from_node, name)


def test_the_cpu_step_reads_the_batch_statistics_and_recovers_from_an_overflow():
    """The estimators' CPU step reads each node's batch statistics; a batch
    whose variance overflows (a finite loss: the statistics become inf) does
    not make the later steps' gradients NaN."""
    import warnings
    from onnxtrain.estimators import OrtGradientForwardBackwardOptimizer
    from onnxtrain.optim import LearningRateSGDNesterov
    from onnxtrain.training_mode import NODE_STATISTICS
    rng = np.random.default_rng(1)
    X = rng.standard_normal((32, 1, 4, 4)).astype(np.float32)
    y = rng.standard_normal(32).astype(np.float32)
    est = OrtGradientForwardBackwardOptimizer(
        _bn_model(), weights_to_train=["w", "scale", "bias", "fc"], max_iter=1,
        batch_size=16, training_path="fused", exc=False, shuffle=False,
        learning_rate=LearningRateSGDNesterov(0.01, learning_rate="constant",
                                              nesterov=False)).fit(X, y)
    step = est._trainer.fused_graph("step", False)
    (bn,) = [n for n in step.model.graph.node if n.op_type == "BatchNormalization"]
    assert bn.name.startswith(NODE_STATISTICS)
    assert [a.f for a in bn.attribute if a.name == "momentum"] == [0.0]
    bad = X[:16].copy()
    bad[0, 0, 1, 1] = 1e20  # the batch variance overflows float32
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no ConvergenceWarning
        est.partial_fit(bad, y[:16])
        assert not np.isfinite(est._trainer.get_buffers()["var"]).all()
        for _ in range(3):
            est.partial_fit(X, y)
    assert np.isfinite(est.train_losses_).all()
    assert all(np.isfinite(w).all() for w in est.get_state())
