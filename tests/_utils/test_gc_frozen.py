"""The process's objects frozen for the cyclic garbage collector during
graph builds (onnxtrain._utils.gc.gc_frozen): unfrozen afterwards, nested and
concurrent sections, the collector never disabled, a process's own
gc.freeze() left alone, and the builds that use it."""
import gc
import threading
import weakref

import numpy as np
import pytest

from onnxtrain import artifacts
from onnxtrain._utils.gc import gc_frozen
from test_artifacts_models import two_head_model


@pytest.fixture
def nothing_frozen():
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    yield
    gc.unfreeze()


def test_frozen_inside_and_unfrozen_after(nothing_frozen):
    with gc_frozen():
        assert gc.get_freeze_count() > 0
        assert gc.isenabled()
        with gc_frozen():  # nested
            assert gc.get_freeze_count() > 0
        assert gc.get_freeze_count() > 0  # the outer section still runs
    assert gc.get_freeze_count() == 0
    assert gc.isenabled()


def test_unfrozen_after_an_exception(nothing_frozen):
    @gc_frozen
    def fails():
        assert gc.get_freeze_count() > 0
        raise KeyError("x")

    with pytest.raises(KeyError):
        fails()
    assert gc.get_freeze_count() == 0


class _Node:
    pass


def _cycle(keep=None):
    node = _Node()
    node.self = node
    if keep is not None:
        keep.append(node)
    return weakref.ref(node)


def test_older_objects_are_left_out_of_the_passes_until_the_end(nothing_frozen):
    # garbage of the oldest generation is frozen: a collection inside the
    # section leaves it (a disabled collector would not: gc.collect() runs
    # anyway), one after the section collects it; a cycle made inside is
    # collected inside
    kept = []
    old = _cycle(kept)
    gc.collect()  # a survivor: now in the oldest generation
    kept.clear()
    with gc_frozen():
        new = _cycle()
        gc.collect()
        assert old() is not None and new() is None
    gc.collect()
    assert old() is None


def test_young_garbage_is_collected_not_frozen(nothing_frozen):
    # frozen, a young cycle (e.g. a dropped estimator's) would wait for a
    # full collection long after the section
    young = _cycle()
    with gc_frozen():
        assert young() is None


def test_a_disabled_collector_stays_disabled(nothing_frozen):
    was = gc.isenabled()
    gc.disable()
    try:
        with gc_frozen():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        if was:
            gc.enable()


def test_a_process_own_freeze_is_left_alone(nothing_frozen):
    gc.freeze()
    count = gc.get_freeze_count()
    with gc_frozen():
        pass
    assert gc.get_freeze_count() == count


def test_threads_unfreeze_when_the_last_section_exits(nothing_frozen):
    entered, release = threading.Barrier(2), threading.Event()
    counts = []

    def first():
        with gc_frozen():
            entered.wait()
            release.wait()
        counts.append(gc.get_freeze_count())

    thread = threading.Thread(target=first)
    thread.start()
    with gc_frozen():
        entered.wait()
    # this thread's section is over, the other's is not
    assert gc.get_freeze_count() > 0
    release.set()
    thread.join()
    assert counts == [0] and gc.get_freeze_count() == 0


def test_generate_artifacts_freezes_and_unfreezes(nothing_frozen, tmp_path,
                                                  monkeypatch):
    seen = []
    build = artifacts.build_optimizer_model

    def spy(*args, **kwargs):
        seen.append(gc.get_freeze_count() > 0)
        return build(*args, **kwargs)

    monkeypatch.setattr(artifacts, "build_optimizer_model", spy)
    artifacts.generate_artifacts(
        two_head_model(), requires_grad=["weight1", "bias1"],
        loss=artifacts.LossType.MSELoss, loss_input_names=["output1"],
        optimizer=artifacts.OptimType.SGD, artifact_directory=tmp_path)
    assert seen == [True]
    assert gc.get_freeze_count() == 0


def test_the_estimators_builds_freeze(nothing_frozen, monkeypatch, mlp_onnx,
                                      regression_data):
    # the trainer's build and the fused graph's
    import onnxtrain.training.step_runner as trainer_module
    import onnxtrain.training_graphs as graphs_module
    from onnxtrain import OrtGradientForwardBackwardOptimizer
    seen = {}
    runner, step = trainer_module.StepRunner.__init__, graphs_module._training_step

    def runner_spy(self, *args, **kwargs):
        seen["trainer"] = gc.get_freeze_count() > 0
        return runner(self, *args, **kwargs)

    def step_spy(*args, **kwargs):
        seen["step"] = gc.get_freeze_count() > 0
        return step(*args, **kwargs)

    monkeypatch.setattr(trainer_module.StepRunner, "__init__", runner_spy)
    monkeypatch.setattr(graphs_module, "_training_step", step_spy)
    X, y = regression_data
    est = OrtGradientForwardBackwardOptimizer(mlp_onnx(), max_iter=1,
                                              training_path="fused")
    est.fit(X.astype(np.float32), y.astype(np.float32))
    assert seen == {"trainer": True, "step": True}
    assert gc.get_freeze_count() == 0
