"""The roll-back copy of the weights (onnxtrain.training.rollback): the
finiteness check without a full-size temporary, exact on every value, and
the copy kept in a temporary file above a size, which a divergence puts
back exactly as the copy kept in memory does."""
import copy
import os
import pickle
import warnings

import numpy as np
import pytest
from numpy.testing import assert_array_equal
from sklearn.base import clone

import onnxtrain.training.rollback as rollback
from onnxtrain.exceptions import ConvergenceWarning
from onnxtrain.neural_network import MLPRegressor
from onnxtrain.runtime import to_ortvalue
from onnxtrain.training.callbacks import Callback
from onnxtrain.training.rollback import WeightsCopy, all_finite
from test_reliability_runtime import diverging, regression

BLOCK = rollback._BLOCK
#: an MLP fit whose loss becomes infinite after a few epochs
MLP = dict(hidden_layer_sizes=(8,), solver="sgd", learning_rate="constant",
           learning_rate_init=0.1, momentum=0.0, alpha=0.0, batch_size=10,
           max_iter=20, shuffle=False, tol=0.0, n_iter_no_change=np.inf,
           random_state=0, activation="identity")


# ------------------------------------------------------------- all_finite

@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("bad", [[np.inf], [-np.inf], [np.nan], [np.inf, -np.inf]],
                         ids=["inf", "-inf", "nan", "both infs"])
@pytest.mark.parametrize("where", [0, BLOCK - 1, BLOCK, 3 * BLOCK + 5],
                         ids=["first", "end of block 1", "block 2", "last"])
def test_one_non_finite_value_is_found(dtype, bad, where):
    values = np.random.RandomState(0).randn(3 * BLOCK + 6).astype(dtype)
    for i, value in enumerate(bad):
        values[where - i if where else where + i] = value
    assert np.isfinite(values).sum() == values.size - len(bad)
    assert all_finite(values) is False
    assert all_finite(values.reshape(6, -1)) is False


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_huge_finite_values_are_finite(dtype):
    # float32, float64: their sum overflows, the blocks decide (float16
    # values sum in float32, which does not overflow)
    values = np.full(2 * BLOCK + 3, np.finfo(dtype).max, dtype=dtype)
    if dtype != np.float16:
        with np.errstate(over="ignore"):
            assert not np.isfinite(np.add.reduce(values))
    assert all_finite(values) is True
    values[-1] = np.nan
    assert all_finite(values) is False


def test_float16_sums_in_float32():
    # 2**17 ones sum to 131072, beyond float16's 65504: not a non-finite value
    ones = np.ones(1 << 17, dtype=np.float16)
    with np.errstate(over="ignore"):
        assert not np.isfinite(np.add.reduce(ones, dtype=np.float16))
    assert all_finite(ones) is True


def test_other_arrays():
    assert all_finite(np.arange(10)) is True
    assert all_finite(np.zeros((0, 3), dtype=np.float32)) is True
    assert all_finite(np.array(np.float32(np.nan))) is False  # rank 0
    values = np.zeros((50, 40), dtype=np.float32)
    values[3, 7] = np.inf
    assert all_finite(values[:, 1::2].T) is False  # not contiguous
    assert all_finite(values[:, ::2].T) is True
    rng = np.random.RandomState(1)
    for _ in range(20):  # the same answer as numpy's
        values = rng.randn(rng.randint(1, 3 * BLOCK)).astype(np.float32)
        values[rng.randint(values.size, size=rng.randint(0, 3))] = rng.choice(
            [np.inf, -np.inf, np.nan, 3e38])
        assert all_finite(values) == np.isfinite(values).all()


# ----------------------------------------------------------- WeightsCopy

def _ortvalues(arrays):
    return [to_ortvalue(a.copy(), "cpu", owned=True) for a in arrays]


@pytest.mark.parametrize("cpu", [True, False], ids=["cpu", "device-like"])
def test_file_copy_round_trip(monkeypatch, cpu):
    # cpu=False reads each weight to the host and writes it back with
    # update_inplace, as from a GPU (here on CPU OrtValues)
    monkeypatch.setattr(rollback, "ROLLBACK_FILE_MIN_BYTES", 0)
    rng = np.random.RandomState(0)
    arrays = [rng.randn(7, 5).astype(np.float32), np.array(2.5),
              rng.randn(3).astype(np.float16), np.zeros((0, 4), np.float32)]
    weights = _ortvalues(arrays)
    kept = WeightsCopy(cpu)
    assert kept.keep(weights) and kept.in_file and kept.arrays is None
    size = os.fstat(kept._file.fileno()).st_size
    assert size == sum(a.nbytes for a in arrays)
    for w in weights:  # later steps change the weights
        w.numpy()[...] = 7
    weights[0].numpy()[0, 0] = np.nan
    assert not kept.keep(weights)  # refused: the file keeps the last copy
    weights[0].numpy()[0, 0] = 1
    kept.restore(weights)
    for w, a in zip(weights, arrays, strict=True):
        assert w.numpy().dtype == a.dtype
        assert_array_equal(w.numpy(), a)
    for _ in range(3):  # rewritten in place: the file does not grow
        assert kept.keep(weights)
    assert os.fstat(kept._file.fileno()).st_size == size
    kept.close()
    assert kept._file is None


def test_a_failing_file_leaves_the_copy_in_memory(monkeypatch):
    monkeypatch.setattr(rollback, "ROLLBACK_FILE_MIN_BYTES", 0)
    arrays = [np.arange(6, dtype=np.float32).reshape(2, 3)]
    weights = _ortvalues(arrays)
    kept = WeightsCopy(True)

    def full(file, array):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(rollback, "_write_all", full)
    with pytest.warns(RuntimeWarning, match="stays in memory.*No space left"):
        assert kept.keep(weights)
    assert not kept.in_file and kept._file is None
    assert kept.keep(weights) and not kept.in_file  # no second try, no warning
    weights[0].numpy()[...] = 0
    kept.restore(weights)
    assert_array_equal(weights[0].numpy(), arrays[0])


def test_in_memory_below_the_threshold(monkeypatch):
    monkeypatch.setattr(rollback, "ROLLBACK_FILE_MIN_BYTES", 1 << 30)
    arrays = [np.arange(6, dtype=np.float32).reshape(2, 3)]
    weights = _ortvalues(arrays)
    kept = WeightsCopy(True)
    assert kept.keep(weights) and not kept.in_file and kept._file is None
    weights[0].numpy()[...] = 0
    kept.restore(weights)
    assert_array_equal(weights[0].numpy(), arrays[0])
    assert kept.arrays[0] is not weights[0].numpy()


# ------------------------------------------------------------ divergence

def _force(monkeypatch, in_file):
    monkeypatch.setattr(rollback, "ROLLBACK_FILE_MIN_BYTES", 0 if in_file else 1 << 40)


@pytest.mark.parametrize("path", ["split", "fused", "loop"])
def test_file_and_memory_copies_restore_the_same_weights(monkeypatch, path):
    X, y = regression(n=100, scale=10)
    states = {}
    for in_file in (False, True):
        _force(monkeypatch, in_file)
        est = diverging(path, 30, exc=False)
        with pytest.warns(ConvergenceWarning, match="end of epoch 3"):
            est.fit(X, y)
        assert est._trainer.finite_copy.in_file is in_file
        assert est.n_iter_ == 3
        states[in_file] = est.get_state()
    reference = diverging(path, 3).fit(X, y).get_state()  # never diverged
    for a, b, c in zip(states[False], states[True], reference, strict=True):
        assert_array_equal(a, b)
        assert_array_equal(a, c)


@pytest.mark.parametrize("path", ["split", "fused"])
def test_partial_fit_rolls_back_to_its_start_from_the_file(monkeypatch, path):
    _force(monkeypatch, True)
    X, y = regression(n=100, scale=10)
    est = diverging(path, 1, exc=False)
    for _ in range(3):
        est.partial_fit(X, y)
    start = [w.copy() for w in est.get_state()]
    with pytest.warns(ConvergenceWarning, match="end of epoch 3"):
        est.partial_fit(X, y)
    assert est._trainer.finite_copy.in_file
    for a, b in zip(est.get_state(), start, strict=True):
        assert_array_equal(a, b)


def test_mlp_rolls_back_from_the_file(monkeypatch):
    # the MLP's loop (neural_network/_loop.py) puts the copy back too
    X, y = regression(n=50)
    weights = {}
    for in_file in (False, True):
        _force(monkeypatch, in_file)
        est = MLPRegressor(**MLP)
        with pytest.raises(ValueError, match="non-finite parameter"):
            est.fit(X, 100 * y)
        assert 0 < est.n_iter_ < MLP["max_iter"]
        assert est._run.runner.finite_copy.in_file is in_file
        weights[in_file] = est.coefs_ + est.intercepts_
    assert all(np.isfinite(w).all() for w in weights[True])
    for a, b in zip(weights[False], weights[True], strict=True):
        assert_array_equal(a, b)


class _PickleEachEpoch(Callback):
    def on_epoch_end(self, estimator, record):
        self.copies = [pickle.loads(pickle.dumps(estimator)),
                       copy.deepcopy(estimator)]


def test_pickled_without_the_file(monkeypatch):
    # during a fit (a callback) and after it: the file stays with the runner
    _force(monkeypatch, True)
    X, y = regression(n=100, scale=10)
    callback = _PickleEachEpoch()
    est = diverging("fused", 2, callbacks=[callback]).fit(X, y)
    assert est._trainer.finite_copy.in_file
    for other in callback.copies + [pickle.loads(pickle.dumps(est)), copy.deepcopy(est)]:
        assert other._run.finite_weights is None
        assert_array_equal(other.predict(X), est.predict(X))
    clone(est).fit(X, y)


def _open_files():
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="Linux /proc")
def test_no_file_descriptor_leaks(monkeypatch):
    _force(monkeypatch, True)
    X, y = regression(n=100, scale=10)
    est = diverging("fused", 2)
    est.fit(X, y)
    before = _open_files()
    for i in range(15):
        est.fit(X, y)  # a new runner each fit
        est.partial_fit(X, y)
        other = diverging("split" if i % 2 else "fused", 2, exc=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            other.fit(X, y)
        assert other._trainer.finite_copy.in_file
        del other
    assert _open_files() == before
