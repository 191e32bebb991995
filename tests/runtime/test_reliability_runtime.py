"""Reliability of the runtime, the estimators and api.Module (issue 14,
items 1, 2, 3, 5, 6, 8, 9 and 11): no crash and no silent wrong result
under threads, bad values and bad shapes; divergence keeps weights that
were finite; a fit failing before its first step changes nothing; clear
messages. Grouped by kind: threads, bad values, shapes, divergence, failed
fit leaves state, messages."""
import threading
import warnings

import numpy as np
import onnx
import pytest
from numpy.testing import assert_allclose, assert_array_equal
from onnx import helper, numpy_helper
from sklearn.exceptions import NotFittedError

import onnxtrain.onnxblock as onnxblock
from onnxtrain import OrtGradientForwardBackward, add_loss_output, api, artifacts
from onnxtrain.cli import main
from onnxtrain.estimators import (OrtGradientForwardBackwardClassifier,
                                  OrtGradientForwardBackwardOptimizer,
                                  OrtGradientOptimizer)
from onnxtrain.exceptions import ConvergenceError, ConvergenceWarning
from onnxtrain.neural_network import MLPRegressor
from onnxtrain.optim import (LearningRateAdam, LearningRateAdamW,
                             LearningRateSGD, LearningRateSGDNesterov)
from test_artifacts_models import batch, two_head_model

N_THREADS = 8


# ------------------------------------------------------------------ helpers

def linear_model(n_features=4, n_outputs=1, softmax=False, seed=0,
                 dtype=np.float32):
    """X (N, n_features) -> X @ W + B (N, n_outputs) [-> Softmax]."""
    rng = np.random.RandomState(seed)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inits = [numpy_helper.from_array(
                 (0.3 * rng.randn(n_features, n_outputs)).astype(dtype), "W"),
             numpy_helper.from_array(np.zeros(n_outputs, dtype=dtype), "B")]
    nodes = [helper.make_node("MatMul", ["X", "W"], ["XW"]),
             helper.make_node("Add", ["XW", "B"], ["Z" if softmax else "Y"])]
    if softmax:
        nodes.append(helper.make_node("Softmax", ["Z"], ["Y"], axis=1))
    graph = helper.make_graph(
        nodes, "linear", [helper.make_tensor_value_info("X", elem, [None, n_features])],
        [helper.make_tensor_value_info("Y", elem, [None, n_outputs])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def regression(n=60, n_features=4, seed=0, scale=1.0):
    rng = np.random.RandomState(seed)
    X = rng.randn(n, n_features) * scale
    return X, X @ rng.randn(n_features) + 0.5


def regressor(**kwargs):
    params = dict(max_iter=3, random_state=0,
                  learning_rate=LearningRateSGD(0.01, learning_rate="constant"))
    params.update(kwargs)
    return OrtGradientForwardBackwardOptimizer(linear_model(), **params)


def run_threads(work, n_threads=N_THREADS):
    """Run ``work(i)`` in ``n_threads`` threads started together; returns
    their results, re-raising the first exception."""
    barrier = threading.Barrier(n_threads)
    results, errors = [None] * n_threads, []

    def target(i):
        try:
            barrier.wait()
            results[i] = work(i)
        except BaseException as exc:  # collected, re-raised in the caller
            errors.append(exc)

    threads = [threading.Thread(target=target, args=(i,)) for i in range(n_threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def repeated_calls(call, inputs, expected, calls):
    """A work function: ``calls`` calls on the thread's own input, counting
    the results that differ from the serial ones (shape or values)."""
    def work(i):
        wrong = 0
        for _ in range(calls):
            got = call(inputs[i])
            if not all(np.shape(g) == np.shape(e) and np.array_equal(g, e)
                       for g, e in zip(_tuple(got), _tuple(expected[i]))):
                wrong += 1
        return wrong
    return work


def _tuple(value):
    return value if isinstance(value, tuple) else (value,)


def thread_blocks(n_features=4, seed=3):
    """One input per thread, each with its own number of rows (so that rows
    of another thread show in the shape too)."""
    rng = np.random.RandomState(seed)
    return [rng.randn(20 + 3 * i, n_features) for i in range(N_THREADS)]


@pytest.fixture(scope="module")
def two_head_artifacts(tmp_path_factory):
    """Artifacts of the two-head model whose batch dims are unnamed (None)."""
    model = two_head_model()
    for value in list(model.graph.input) + list(model.graph.output):
        value.type.tensor_type.shape.dim[0].Clear()
    folder = tmp_path_factory.mktemp("artifacts")
    return artifacts.generate_artifacts(
        model, requires_grad=["weight1", "bias1"],
        frozen_params=["weight3", "bias3", "weight2", "bias2"],
        loss=onnxblock.loss.MSELoss(), loss_input_names=["output1"],
        optimizer=onnxblock.optim.SGD(), artifact_directory=str(folder))


def open_module(paths, training_model=None):
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    return state, api.Module(training_model or paths["training_model"], state,
                             paths["eval_model"])


# ------------------------------------------------------------------ threads

class TestThreads:
    """8 threads calling one fitted object get their own rows, as serially."""

    def test_regressor_predict(self):
        X, y = regression()
        est = regressor().fit(X, y)
        blocks = thread_blocks()
        expected = [est.predict(b) for b in blocks]
        wrong = run_threads(repeated_calls(est.predict, blocks, expected, 60))
        assert wrong == [0] * N_THREADS

    def test_classifier_predict_proba(self):
        rng = np.random.RandomState(0)
        X = rng.randn(90, 4)
        y = np.array(["a", "b", "c"])[X[:, :2].sum(axis=1).argsort() % 3]
        est = OrtGradientForwardBackwardClassifier(
            linear_model(n_outputs=3, softmax=True), max_iter=2,
            random_state=0).fit(X, y)
        blocks = thread_blocks()
        expected = [est.predict_proba(b) for b in blocks]
        assert all(np.allclose(e.sum(axis=1), 1, atol=1e-5) for e in expected)
        wrong = run_threads(repeated_calls(est.predict_proba, blocks, expected, 60))
        assert wrong == [0] * N_THREADS

    def test_mlp_predict(self):
        X, y = regression(n=80)
        est = MLPRegressor(hidden_layer_sizes=(6,), max_iter=3, random_state=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est.fit(X, y)
        blocks = thread_blocks()
        expected = [est.predict(b) for b in blocks]
        wrong = run_threads(repeated_calls(est.predict, blocks, expected, 60))
        assert wrong == [0] * N_THREADS

    def test_unpickled_estimator_builds_its_trainer_once(self):
        import pickle

        X, y = regression()
        est = pickle.loads(pickle.dumps(regressor().fit(X, y)))
        trainers = run_threads(lambda i: (est.predict(X), est._trainer)[1])
        assert all(t is trainers[0] for t in trainers)

    def test_module_eval(self, two_head_artifacts):
        _, module = open_module(two_head_artifacts)
        module.eval()
        inputs = [batch(10 + i, seed=i)[:2] for i in range(N_THREADS)]
        expected = [module(*args) for args in inputs]
        wrong = run_threads(repeated_calls(lambda args: module(*args), inputs,
                                           expected, 60))
        assert wrong == [0] * N_THREADS

    def test_module_train_accumulates_every_call(self, two_head_artifacts):
        state, module = open_module(two_head_artifacts)
        inputs = [batch(10 + i, seed=i)[:2] for i in range(N_THREADS)]
        grads = []
        for args in inputs:  # serial: each call's loss and gradient alone
            module.lazy_reset_grad()
            loss = module(*args)
            grads.append((loss, state.parameters["weight1"].grad.copy()))
        module.lazy_reset_grad()
        calls = 20
        wrong = run_threads(repeated_calls(lambda args: module(*args), inputs,
                                           [g[0] for g in grads], calls))
        assert wrong == [0] * N_THREADS
        # every call added its gradient once (in some order)
        total = calls * sum(g[1] for g in grads)
        assert_allclose(state.parameters["weight1"].grad, total, rtol=1e-4)


# --------------------------------------------------------------- bad values

BAD_RATES = [LearningRateSGD(-0.001), LearningRateAdam(-0.01),
             LearningRateSGDNesterov(float("nan")), LearningRateAdamW(float("inf")),
             LearningRateSGDNesterov(0.01, momentum=-0.5),
             LearningRateAdam(beta_2=1.0)]


class TestBadValues:

    @pytest.mark.parametrize("rate", BAD_RATES, ids=repr)
    def test_learning_rate_refused_at_fit(self, rate):
        X, y = regression()
        est = regressor(learning_rate=rate)
        name = next(n for n in ("momentum", "beta_2", "eta0") if n in repr(rate))
        with pytest.raises(ValueError, match=name):
            est.fit(X, y)
        assert not hasattr(est, "weights_to_train_")
        assert est.learning_rate is rate  # the caller's object, untouched

    @pytest.mark.parametrize("value", ["-1", "nan", "inf", "0"])
    def test_cli_learning_rate_refused_before_reading(self, value, capsys):
        # the files do not exist: the rate is refused before anything is read
        with pytest.raises(SystemExit) as info:
            main(["train", "no-model.onnx", "no-data.csv", "--target", "y",
                  "--output", "out.onnx", "--learning-rate", value])
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert "--learning-rate" in err and repr(value) in err

    def test_values_beyond_float32_refused(self):
        X, y = regression()
        est = regressor().fit(X, y)
        weights = est.get_state()
        huge = X.copy()
        huge[5, 2] = 1e39
        calls = {"fit": lambda: est.fit(huge, y),
                 "partial_fit": lambda: est.partial_fit(huge, y),
                 "predict": lambda: est.predict(huge),
                 "score": lambda: est.score(huge, y),
                 "fit y": lambda: est.fit(X, y * 1e39),
                 "sample_weight": lambda: est.fit(X, y, np.full(len(y), 1e39))}
        for what, call in calls.items():
            with pytest.raises(ValueError, match="range of float32"):
                call()
        for a, b in zip(est.get_state(), weights):
            assert_array_equal(a, b)
        # a float64 graph takes them
        est = OrtGradientForwardBackwardOptimizer(
            linear_model(dtype=np.float64), max_iter=1, random_state=0,
            learning_rate=LearningRateSGD(1e-80, learning_rate="constant"))
        big = X * 1e39
        est.fit(big, y)
        W, B = est.get_state()
        assert_allclose(est.predict(big), big @ W.ravel() + B[0], rtol=1e-12)


    def test_module_refuses_values_beyond_float32(self, two_head_artifacts):
        state, module = open_module(two_head_artifacts)
        x, target, _ = batch(10)
        weights = state.parameters["weight1"].data.copy()
        huge = x.astype(np.float64)
        huge[3, 1] = -1e39
        big_target = target.astype(np.float64)
        big_target[7, 2] = 1e39
        calls = {"input": lambda: module(huge, target),
                 "target": lambda: module(x, big_target),
                 "eval input": lambda: module.eval()(huge, target)}
        for what, call in calls.items():
            module.train()
            with pytest.raises(ValueError, match=(
                    rf"Input '{what.split()[-1]}' of the "
                    rf"{'eval' if 'eval' in what else 'training'} model has "
                    r"values up to 1e\+39 .*range of float32")):
                call()
            # refused before running: no gradient, no change of the weights
            assert not state.parameters["weight1"].grad.any(), what
            assert_array_equal(state.parameters["weight1"].data, weights)
        # the caller's arrays are untouched, and within range float64 is cast
        assert huge[3, 1] == -1e39 and huge.dtype == np.float64
        module.train()
        loss = module(x.astype(np.float64), target.astype(np.float64))
        assert_allclose(loss, module(x, target), rtol=1e-6)
        assert np.isfinite(loss)


# ------------------------------------------------------------------- shapes

class TestShapes:

    def test_module_refuses_a_one_row_target_for_a_batch(self, two_head_artifacts):
        state, module = open_module(two_head_artifacts)
        x, target, _ = batch(10)
        assert module._input_specs["train"]["target"][1][0] is None  # unnamed
        with pytest.raises(ValueError, match="10 and 1 rows"):
            module(x, target[:1])
        # nothing ran: the gradient reads zeros as before any call (onnxruntime)
        assert not state.parameters["weight1"].grad.any()

    def test_batch_check_table(self):
        from onnxtrain.api.module import check_batch

        f32 = np.dtype(np.float32)
        rows = {"x": np.zeros((10, 4)), "t": np.zeros((1, 3))}
        for x_dim, t_dim, refused in [(None, None, True), ("batch", None, True),
                                      (None, "batch", True), ("seq", "batch", False),
                                      (10, None, False)]:
            specs = {"x": (f32, (x_dim, 4), "tensor(float)"),
                     "t": (f32, (t_dim, 3), "tensor(float)")}
            if refused:
                with pytest.raises(ValueError, match="batches of 10 and 1 rows"):
                    check_batch(specs, ["x", "t"], list(rows.values()), "model")
            else:  # named apart, or x has a fixed size: nothing to compare
                check_batch(specs, ["x", "t"], list(rows.values()), "model")

    def test_module_eval_refuses_a_one_row_target(self, two_head_artifacts):
        _, module = open_module(two_head_artifacts)
        x, target, _ = batch(10)
        with pytest.raises(ValueError, match="10 and 1 rows"):
            module.eval()(x, target[:1])

    def test_module_turns_a_broadcast_error_into_a_clear_one(self, two_head_artifacts):
        model = onnx.load(two_head_artifacts["training_model"])
        target = next(i for i in model.graph.input if i.name == "target")
        target.type.tensor_type.shape.dim[1].Clear()  # width unknown
        state, module = open_module(two_head_artifacts, model)
        x, target1, target2 = batch(10)
        with pytest.raises(ValueError, match=r"input \(10, 4\), target \(10, 2\)"):
            module(x, target2)
        assert not state.parameters["weight1"].grad.any()  # nothing ran
        loss = module(x, target1)  # the module still works
        assert loss.shape == () and np.isfinite(loss)

    def test_loss_output_estimator_refuses_y_wider_than_prediction(self):
        X, _ = regression()
        y2 = np.column_stack([X[:, 0], X[:, 1]])
        est = OrtGradientOptimizer(add_loss_output(linear_model()), max_iter=2,
                                   random_state=0)
        with pytest.raises(ValueError, match="y has 2 columns but 'Y'.* has 1"):
            est.fit(X, y2)
        assert not hasattr(est, "weights_to_train_")
        est.fit(X, y2[:, :1])  # one column: trains
        assert est.n_iter_ == 2


# --------------------------------------------------------------- divergence

def diverging(path, max_iter, **kwargs):
    """A fit whose loss grows each epoch and becomes infinite at epoch 4."""
    return OrtGradientForwardBackwardOptimizer(
        linear_model(), max_iter=max_iter, training_path=path, random_state=0,
        learning_rate=LearningRateSGD(0.05, learning_rate="constant"), **kwargs)


def skl2onnx_graph(kind):
    """A float32 skl2onnx graph of a LinearRegression or of an MLPRegressor
    with 5 relu units, for 4 features (fitted by scikit-learn; a fresh
    onnxtrain fit redraws its weights)."""
    from sklearn.linear_model import LinearRegression
    from sklearn.neural_network import MLPRegressor as SkMLPRegressor

    from onnxtrain import to_onnx
    X, y = regression()
    skl = LinearRegression() if kind == "linear" else SkMLPRegressor(
        hidden_layer_sizes=(5,), max_iter=2, random_state=1234)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        skl.fit(X, y)
    return to_onnx(skl, X[:1].astype(np.float32), target_opset=15)


def sklearn_initial_weights(layer_sizes, seed):
    """The weights scikit-learn's MLP ``_init_coef`` draws (relu: bound
    sqrt(6 / (fan_in + fan_out)), coefficients then intercept, layer by
    layer), which a fresh fit of a skl2onnx graph starts from."""
    rng = np.random.RandomState(seed)
    weights = []
    for fan_in, fan_out in zip(layer_sizes[:-1], layer_sizes[1:]):
        bound = np.sqrt(6.0 / (fan_in + fan_out))
        weights.append(rng.uniform(-bound, bound, (fan_in, fan_out)))
        weights.append(rng.uniform(-bound, bound, fan_out))
    return [w.astype(np.float32) for w in weights]


def predict_with(weights, X):
    """The prediction of those weights (relu between the layers)."""
    out = X.astype(np.float32)
    for i in range(0, len(weights), 2):
        if i:
            out = np.maximum(out, 0)
        out = out @ weights[i] + weights[i + 1]
    return out.ravel()


FIRST_EPOCH_DIVERGES = [(kind, path) for kind in ("linear", "mlp")
                        for path in ("split", "fused", "loop")]


class TestDivergence:

    def _fresh(self, kind, path, exc):
        # learning rate 1e9: the loss is infinite before epoch 1 ends
        return OrtGradientForwardBackwardOptimizer(
            skl2onnx_graph(kind), max_iter=5, training_path=path, exc=exc,
            random_state=0, init="random", learning_rate=LearningRateSGD(
                1e9, learning_rate="constant"))

    def _assert_initial_state(self, est, kind, X):
        start = sklearn_initial_weights([4, 1] if kind == "linear" else [4, 5, 1], 0)
        assert est.n_iter_ == 0 and est.train_losses_ == [] and est.t_ == 0
        for got, expected in zip(est.get_state(), start, strict=True):
            assert_allclose(got.ravel(), expected.ravel(), rtol=1e-6)
        prediction = est.predict(X)
        assert np.isfinite(prediction).all()
        assert_allclose(prediction, predict_with(start, X), rtol=1e-5, atol=1e-6)

    @pytest.mark.parametrize("kind,path", FIRST_EPOCH_DIVERGES)
    def test_fresh_fit_diverging_in_epoch_1_raises_keeping_the_initial_weights(
            self, kind, path):
        X, y = regression()
        est = self._fresh(kind, path, exc=True)
        with pytest.raises(ConvergenceError, match=(
                "inf at epoch 1; the last finite weights are kept: those this "
                "fit started from")):
            est.fit(X, y)
        self._assert_initial_state(est, kind, X)

    @pytest.mark.parametrize("kind,path", FIRST_EPOCH_DIVERGES)
    def test_fresh_fit_diverging_in_epoch_1_warns_keeping_the_initial_weights(
            self, kind, path):
        X, y = regression()
        est = self._fresh(kind, path, exc=False)
        with pytest.warns(ConvergenceWarning, match="those this fit started from"):
            assert est.fit(X, y) is est
        self._assert_initial_state(est, kind, X)

    @pytest.mark.parametrize("path", ["split", "fused", "loop"])
    def test_keeps_the_weights_of_the_last_finite_epoch(self, path):
        X, y = regression(n=100, scale=10)
        est = diverging(path, 30, exc=False)
        with pytest.warns(ConvergenceWarning, match="end of epoch 3") as record:
            est.fit(X, y)
        assert "became inf at epoch 4" in str(record[0].message)
        assert est.n_iter_ == len(est.train_losses_) == 3
        reference = diverging(path, 3).fit(X, y)  # stops where it diverged
        for a, b in zip(est.get_state(), reference.get_state()):
            assert_allclose(a, b, rtol=1e-6)
        assert_allclose(est.predict(X), reference.predict(X), rtol=1e-6)

    @pytest.mark.parametrize("path", ["split", "fused"])
    def test_partial_fits_copy_into_the_same_arrays(self, path):
        # each call keeps the weights it starts from in the arrays of the
        # last copy (no new 45 MB for resnet18 per call); a diverging call
        # goes back to its own starting weights, not to an older call's
        X, y = regression(n=100, scale=10)
        est = diverging(path, 1, exc=False)
        est.partial_fit(X, y)
        arrays = est._trainer.finite_copy.arrays
        assert arrays is not None and est._run.finite_weights is None
        est.partial_fit(X, y)
        assert est._trainer.finite_copy.arrays is arrays
        est.partial_fit(X, y)
        start = [w.copy() for w in est.get_state()]
        with pytest.warns(ConvergenceWarning, match="end of epoch 3"):
            est.partial_fit(X, y)  # the loss becomes infinite in epoch 4
        assert est._trainer.finite_copy.arrays is arrays
        for a, b in zip(est.get_state(), start, strict=True):
            assert_allclose(a, b, rtol=0)

    def test_no_copy_of_non_finite_weights(self):
        # a copy is made only of finite weights, and a refused copy leaves
        # the arrays of the last one as they were
        X, y = regression(n=100, scale=10)
        est = diverging("fused", 1).fit(X, y)
        trainer = est._trainer
        copy = trainer.finite_weights_copy()
        first = copy.arrays
        kept = [a.copy() for a in first]
        assert_allclose(first[0], est.get_state()[0], rtol=0)
        weights = est.get_state()
        weights[0] = np.full_like(weights[0], np.nan)
        trainer.set_weights(weights)
        assert trainer.finite_weights_copy() is None
        assert trainer.finite_copy.arrays is first
        for a, b in zip(first, kept, strict=True):
            assert_allclose(a, b, rtol=0)
        weights[0] = kept[0] + 1
        trainer.set_weights(weights)
        assert trainer.finite_weights_copy() is copy
        assert copy.arrays is first  # the same arrays, new values
        assert_allclose(first[0], kept[0] + 1, rtol=0)

    def test_raising_keeps_them_too(self):
        X, y = regression(n=100, scale=10)
        est = diverging("fused", 30)
        with pytest.raises(ConvergenceError, match="end of epoch 3"):
            est.fit(X, y)
        reference = diverging("fused", 3).fit(X, y)
        for a, b in zip(est.get_state(), reference.get_state()):
            assert_allclose(a, b, rtol=1e-6)

    @pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
    def test_early_stopping_keeps_the_best_validation_weights(self):
        X, y = regression(n=100, scale=10)
        est = diverging("fused", 50, early_stopping=True, n_iter_no_change=100)
        est.set_params(learning_rate=LearningRateSGD(0.02, learning_rate="constant"))
        with pytest.raises(ConvergenceError, match="best validation score"):
            est.fit(X, y)
        best = int(np.argmax(est.validation_scores_)) + 1
        assert best < est.n_iter_
        reference = diverging("fused", best, early_stopping=True,
                              n_iter_no_change=100)
        reference.set_params(learning_rate=LearningRateSGD(
            0.02, learning_rate="constant")).fit(X, y)
        assert_allclose(est.predict(X), reference.predict(X), rtol=1e-6)

    @pytest.mark.parametrize("path", ["split", "fused"])
    def test_overflowing_update_never_kept(self, path):
        # the first batch's loss is finite (1e36) but its update overflows
        # float32: the weights become infinite, the next loss is NaN
        rng = np.random.RandomState(0)
        X = rng.uniform(0.5, 1, (40, 4)) * 1e17
        y = np.zeros(40)
        model = linear_model()
        start = [numpy_helper.to_array(i) for i in model.graph.initializer]
        est = OrtGradientForwardBackwardOptimizer(
            model, max_iter=2, batch_size=10, warm_start=True, exc=False,
            training_path=path,
            learning_rate=LearningRateSGD(1e3, learning_rate="constant"))
        with pytest.warns(ConvergenceWarning, match="this fit started from"):
            est.fit(X, y)
        for a, b in zip(est.get_state(), start):
            assert_array_equal(a, b)
        assert np.isfinite(est.predict(X)).all()


# ------------------------------------------------ failed fit leaves state

BEFORE_FIRST_STEP = {
    "training_path": dict(training_path="bogus"),
    "nan rate": dict(learning_rate=LearningRateSGD(float("nan"))),
    "negative rate": dict(learning_rate=LearningRateAdam(-0.01)),
}


def fitted_attributes(est):
    return {k: (v.copy() if isinstance(v, (list, np.ndarray)) else v)
            for k, v in vars(est).items() if k.endswith("_") and not k.startswith("_")}


class TestFailedFitLeavesState:

    @pytest.mark.parametrize("case", list(BEFORE_FIRST_STEP) + ["huge X"])
    def test_fitted_estimator_unchanged(self, case):
        X, y = regression()
        est = regressor(max_iter=2).fit(X, y)
        weights, attributes = est.get_state(), fitted_attributes(est)
        if case == "huge X":
            X = X.copy()
            X[0, 0] = 1e39
        else:
            est.set_params(**BEFORE_FIRST_STEP[case])
        with pytest.raises((ValueError, TypeError)):
            est.fit(X, y)
        for a, b in zip(est.get_state(), weights):
            assert_array_equal(a, b)
        after = fitted_attributes(est)
        assert after.keys() == attributes.keys()
        for key, value in attributes.items():
            assert after[key] is value or np.array_equal(after[key], value), key

    @pytest.mark.parametrize("case", list(BEFORE_FIRST_STEP))
    def test_unfitted_estimator_stays_unfitted(self, case):
        X, y = regression()
        est = regressor(**BEFORE_FIRST_STEP[case])
        with pytest.raises((ValueError, TypeError)):
            est.fit(X, y)
        assert fitted_attributes(est) == {}
        with pytest.raises(NotFittedError):
            est.predict(X)

    def test_partial_fit_with_early_stopping_refused_as_scikit_learn_does(self):
        """No held-out split in partial_fit: it raised onnxruntime's error
        on a None validation set at the first epoch's end."""
        X, y = regression()
        est = regressor(max_iter=2).fit(X, y)
        weights = est.get_state()
        est.set_params(early_stopping=True)
        with pytest.raises(ValueError, match="partial_fit does not support early"):
            est.partial_fit(X, y)
        for a, b in zip(est.get_state(), weights):
            assert_array_equal(a, b)
        fresh = regressor(early_stopping=True)
        with pytest.raises(ValueError, match="partial_fit does not support early"):
            fresh.partial_fit(X, y)
        assert fitted_attributes(fresh) == {}
        assert est.fit(X, y).validation_scores_  # fit still stops early

    def test_unavailable_path_refused_before_the_weights_change(self):
        X, y = regression()
        est = regressor(max_iter=2).fit(X, y)
        weights = est.get_state()
        weight = np.ones(len(y))
        weight[:10] = 0  # the first batch has zero weight: no 'loop'
        est.set_params(training_path="loop")
        with pytest.raises(ValueError, match="training_path='loop'"):
            est.fit(X, y, sample_weight=weight)
        for a, b in zip(est.get_state(), weights):
            assert_array_equal(a, b)


# ----------------------------------------------------------------- messages

class TestMessages:

    def test_weights_to_train_not_names(self):
        X, y = regression()
        with pytest.raises(TypeError, match="weights_to_train must be None or "
                           "a list of initializer names"):
            regressor(weights_to_train=42).fit(X, y)
        with pytest.raises(TypeError, match="got 42"):
            OrtGradientForwardBackward(linear_model(), weights_to_train=42)
        with pytest.raises(TypeError, match="weights_to_train"):
            regressor(weights_to_train=["W", 3]).fit(X, y)

    def test_loss_block_returning_none(self, tmp_path):
        class NoLoss(onnxblock.Block):
            def build(self, output_name):
                return None

        with pytest.raises(TypeError, match=r"NoLoss.build\(\) returned None"):
            artifacts.generate_artifacts(
                two_head_model(), requires_grad=["weight1"],
                loss=NoLoss(), loss_input_names=["output1"],
                optimizer=onnxblock.optim.SGD(), artifact_directory=str(tmp_path))

    def test_batch_fixed_to_one_names_the_fix(self, tmp_path):
        model = two_head_model()
        for value in list(model.graph.input) + list(model.graph.output):
            dim = value.type.tensor_type.shape.dim[0]
            dim.Clear()
            dim.dim_value = 1
        paths = artifacts.generate_artifacts(
            model, requires_grad=["weight1", "bias1"],
            frozen_params=["weight3", "bias3", "weight2", "bias2"],
            loss=onnxblock.loss.MSELoss(), loss_input_names=["output1"],
            optimizer=onnxblock.optim.SGD(), artifact_directory=str(tmp_path))
        state, module = open_module(paths)
        x, target, _ = batch(10)
        with pytest.raises(ValueError, match="fixed to 1: export it with a "
                           "dynamic batch dimension"):
            module(x, target)
        assert not state.parameters["weight1"].grad.any()  # nothing ran
        assert module(x[:1], target[:1]).shape == ()

    def test_estimator_batch_fixed_to_one_names_the_fix(self):
        model = linear_model()
        for value in list(model.graph.input) + list(model.graph.output):
            dim = value.type.tensor_type.shape.dim[0]
            dim.Clear()
            dim.dim_value = 1
        X, y = regression()
        est = OrtGradientForwardBackwardOptimizer(model, max_iter=2, random_state=0)
        with pytest.raises(ValueError, match="X has 60 rows but the model input "
                           "'X' has a fixed batch dimension of 1: export the "
                           "model with a dynamic batch dimension"):
            est.fit(X, y)
        assert fitted_attributes(est) == {}  # refused before training

    def test_module_refuses_an_empty_batch(self, two_head_artifacts):
        state, module = open_module(two_head_artifacts)
        x, target, _ = batch(10)
        with pytest.raises(ValueError, match="0 rows"):
            module(x[:0], target[:0])
        with pytest.raises(ValueError, match="0 rows"):
            module.eval()(x[:0], target[:0])
        assert not state.parameters["weight1"].grad.any()  # nothing ran
