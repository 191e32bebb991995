"""The cyclic garbage collector paused during graph builds
(onnxtrain._gc.gc_paused): restored afterwards, nested and concurrent
sections, a caller's disabled collector left disabled."""
import gc
import threading

import pytest

from onnxtrain import artifacts
from onnxtrain._gc import gc_paused
from test_artifacts_models import two_head_model


@pytest.fixture
def collector_enabled():
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_paused_inside_and_restored_after(collector_enabled):
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():  # nested
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer section still runs
    assert gc.isenabled()


def test_restored_after_an_exception(collector_enabled):
    @gc_paused
    def fails():
        assert not gc.isenabled()
        raise KeyError("x")

    with pytest.raises(KeyError):
        fails()
    assert gc.isenabled()


def test_a_disabled_collector_stays_disabled(collector_enabled):
    gc.disable()
    with gc_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_threads_enable_it_when_the_last_section_exits(collector_enabled):
    entered, release = threading.Barrier(2), threading.Event()
    states = []

    def first():
        with gc_paused():
            entered.wait()
            release.wait()
        states.append(gc.isenabled())

    thread = threading.Thread(target=first)
    thread.start()
    with gc_paused():
        entered.wait()
    # this thread's section is over, the other's is not
    assert not gc.isenabled()
    release.set()
    thread.join()
    assert states == [True] and gc.isenabled()


def test_generate_artifacts_pauses_it_and_restores_it(collector_enabled, tmp_path,
                                                      monkeypatch):
    seen = []
    build = artifacts.build_optimizer_model

    def spy(*args, **kwargs):
        seen.append(gc.isenabled())
        return build(*args, **kwargs)

    monkeypatch.setattr(artifacts, "build_optimizer_model", spy)
    artifacts.generate_artifacts(
        two_head_model(), requires_grad=["weight1", "bias1"],
        loss=artifacts.LossType.MSELoss, loss_input_names=["output1"],
        optimizer=artifacts.OptimType.SGD, artifact_directory=tmp_path)
    assert seen == [False]
    assert gc.isenabled()
