"""``OrtGradientForwardBackwardOptimizer``: the seed 004 code path, step for
step parity with scikit-learn's ``MLPRegressor`` (SGD), the scikit-learn
contract (clone, pickle, GridSearchCV), data validation, warm start,
non-finite losses, validation losses and sample weights."""
import copy
import io
import logging
import pickle

import joblib
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from numpy.testing import assert_allclose
from onnx import TensorProto, helper, numpy_helper
from sklearn.base import clone
from sklearn.datasets import load_diabetes, make_regression
from sklearn.exceptions import ConvergenceWarning, NotFittedError
from sklearn.metrics import r2_score
from sklearn.model_selection import GridSearchCV, cross_val_score, train_test_split
from sklearn.neural_network import MLPRegressor
from sklearn.preprocessing import StandardScaler
from sklearn.utils import check_random_state

import onnxtrain
from onnxtrain import (ConvergenceError, LearningRateSGD,
                       OrtGradientForwardBackwardOptimizer, get_train_initializer,
                       to_onnx)
from onnxtrain.initializers import glorot_uniform_weights

pytestmark = pytest.mark.filterwarnings(
    "ignore:Stochastic Optimizer:sklearn.exceptions.ConvergenceWarning")

MLP_WEIGHTS = ["coefficient", "intercepts", "coefficient1", "intercepts1"]


def constant(eta0=0.01):
    return LearningRateSGD(eta0=eta0, learning_rate="constant")


def sklearn_weights(skl):
    """scikit-learn's MLP weights in onnxtrain's order (coef, intercept per
    layer), intercepts as (1, n) like skl2onnx's initializers."""
    result = []
    for coef, intercept in zip(skl.coefs_, skl.intercepts_):
        result += [coef, intercept.reshape(1, -1)]
    return result


def sklearn_initial_weights(hidden, activation, n_features, n_outputs, dtype,
                            random_state=0):
    """The weights scikit-learn's MLP starts from (its own ``_initialize``)."""
    skl = MLPRegressor(hidden_layer_sizes=hidden, activation=activation)
    skl._random_state = check_random_state(random_state)
    layer_units = [n_features, *hidden, n_outputs]
    skl._initialize(np.zeros((2, n_outputs)), layer_units, dtype)
    return sklearn_weights(skl)


# ------------------------------------------------------------- seed 004

def _seed_data():
    X, y, coef = make_regression(n_features=2, bias=2, random_state=0, coef=True)
    return X.astype(np.float32), y.astype(np.float32), coef


def _seed_graph(X, y):
    lr = MLPRegressor(hidden_layer_sizes=tuple(), activation="identity", max_iter=50,
                      batch_size=10, solver="sgd", alpha=0, learning_rate_init=1e-2,
                      n_iter_no_change=200, momentum=0, nesterovs_momentum=False)
    lr.fit(X, y)
    return to_onnx(lr, X[:1], target_opset=15, black_op={"LinearRegressor"})


def _numpy_linear_sgd(X, y, coef, intercept, max_iter, batch_size, eta):
    """Mini-batch SGD of 0.5 * mean((X @ coef + intercept - y)**2) in
    float64, ``eta(epoch)`` constant within an epoch; returns the weights and
    the epoch losses (row-weighted mean of the batch losses)."""
    X, y = X.astype(np.float64), y.astype(np.float64).reshape(-1, 1)
    coef, intercept = coef.astype(np.float64), intercept.astype(np.float64)
    losses = []
    for epoch in range(max_iter):
        total = 0.0
        for start in range(0, len(X), batch_size):
            xb, yb = X[start:start + batch_size], y[start:start + batch_size]
            d = xb @ coef + intercept - yb
            total += 0.5 * np.mean(d ** 2) * len(xb)
            coef = coef - eta(epoch) * xb.T @ d / len(xb)
            intercept = intercept - eta(epoch) * d.sum(axis=0, keepdims=True) / len(xb)
        losses.append(total / len(X))
    return coef, intercept, losses


def test_seed_004_code_path(capsys):
    """The seed's code with only its imports changed (data seeded, no plots).

    The seed's ``learning_rate=1e-2`` is ``LearningRateSGD(eta0=0.01)``, the
    'invscaling' schedule: epoch k runs with eta0 / (k + 1) ** 0.25. After
    200 epochs the coefficients are within 0.2% of make_regression's, but
    the intercept is only within ~1.5% (measured 1.35%-1.57% over 40 Glorot
    initial draws; 24% on make_regression's random_state=1): the same SGD in
    numpy gives the same numbers (``test_seed_settings_follow_numpy_sgd``),
    so this is the schedule's pace, not a defect. The 1% goal is met by
    the constant schedule of the seed's MLPRegressor
    (``test_seed_004_constant_learning_rate_reaches_1_percent``).
    """
    from onnxruntime import get_device
    X, y, coef = _seed_data()
    X_train, X_test, y_train, y_test = train_test_split(X, y, random_state=0)
    onx = _seed_graph(X, y)
    onx_bytes = onx.SerializeToString()

    inits = get_train_initializer(onx)
    weights = {k: v for k, v in inits.items() if k != "shape_tensor"}
    assert list((k, v[0].shape) for k, v in weights.items()) == [
        ("coefficient", (2, 1)), ("intercepts", (1, 1))]

    device = "cuda" if get_device().upper() == "GPU" else "cpu"
    train_session = OrtGradientForwardBackwardOptimizer(
        onx, list(weights), device=device, verbose=1, learning_rate=1e-2,
        warm_start=False, max_iter=200, batch_size=10)
    assert train_session.fit(X, y) is train_session
    assert "OrtGradientForwardBackwardOptimizer(" in repr(train_session)
    assert "200/200" in capsys.readouterr().err  # verbose=1: a tqdm bar

    state_tensors = train_session.get_state()
    assert [s.shape for s in state_tensors] == [(2, 1), (1, 1)]
    assert_allclose(state_tensors[0].ravel(), coef, rtol=0.01)
    assert abs(state_tensors[1].item() - 2) < 0.02 * 2  # see the docstring
    losses = train_session.train_losses_
    assert len(losses) == 200 and train_session.n_iter_ == 200
    assert losses[-1] < 1e-5 * losses[0]
    # epoch k ran with eta0 / (k + 1) ** 0.25; the value left is the next
    # epoch's (the seed printed 0.01 / 200 ** 0.25: onnxcustom ran epochs 0
    # and 1 both with eta0, then epoch k with eta0 / k ** 0.25)
    assert train_session.learning_rate.value == pytest.approx(0.01 / 201 ** 0.25)

    session = train_session.train_session_
    onx_loss = session.cls_type_._optimized_pre_grad_model
    onx_gradient = session.cls_type_._trained_onnx
    assert onx_loss is session.inference_model
    assert onx_gradient is session.gradient_model
    assert [o.name for o in onx_gradient.graph.output] == [
        "coefficient_grad", "intercepts_grad"]
    loss_graph = train_session.learning_loss.loss_grad_onnx_
    axpy_graph = train_session.learning_rate.axpy_onnx_
    assert [o.name for o in loss_graph.graph.output] == ["Y", "Y_grad"]
    assert [o.name for o in axpy_graph.graph.output] == [
        "coefficient_new", "intercepts_new", "loss_total"]
    assert onx.SerializeToString() == onx_bytes
    assert r2_score(y_test, train_session.predict(X_test)) > 0.9999


def test_seed_settings_follow_numpy_sgd():
    """The seed's run (invscaling per epoch) equals the same SGD in numpy."""
    X, y, _ = _seed_data()
    onx = _seed_graph(X, y)
    est = OrtGradientForwardBackwardOptimizer(
        onx, ["coefficient", "intercepts"], learning_rate=1e-2, max_iter=200,
        batch_size=10, random_state=3, init="random").fit(X, y)
    start = glorot_uniform_weights(onx, ["coefficient", "intercepts"], 3)
    coef, intercept, losses = _numpy_linear_sgd(
        X, y, start["coefficient"], start["intercepts"], 200, 10,
        lambda epoch: 0.01 / (epoch + 1) ** 0.25)
    assert_allclose(est.get_state()[0], coef, rtol=1e-4)
    assert_allclose(est.get_state()[1], intercept, rtol=1e-4)
    assert_allclose(est.train_losses_[:50], losses[:50], rtol=1e-4)


def test_seed_004_constant_learning_rate_reaches_1_percent():
    X, y, coef = _seed_data()
    onx = _seed_graph(X, y)
    est = OrtGradientForwardBackwardOptimizer(
        onx, ["coefficient", "intercepts"], learning_rate=constant(1e-2),
        max_iter=200, batch_size=10, random_state=0).fit(X, y)
    coef_trained, intercept = est.get_state()
    assert_allclose(coef_trained.ravel(), coef, rtol=0.01)
    assert_allclose(intercept.ravel(), [2.0], rtol=0.01)


# -------------------------------------------------- scikit-learn parity

@pytest.mark.parametrize("hidden,activation,n_features,n_outputs", [
    ((8,), "relu", 5, 1), ((8,), "logistic", 5, 1), ((6, 4), "tanh", 3, 2),
    ((), "identity", 4, 1), ((8,), "relu", 5, 3)])
def test_glorot_weights_equal_scikit_learn(mlp_onnx, hidden, activation, n_features,
                                           n_outputs):
    model = mlp_onnx(hidden=hidden, activation=activation, n_features=n_features,
                     n_outputs=n_outputs)
    names = onnxtrain.models.select_weights(model)
    drawn = glorot_uniform_weights(model, names, 0)
    expected = sklearn_initial_weights(hidden, activation, n_features, n_outputs,
                                       np.float32)
    assert list(drawn) == names and len(names) == len(expected)
    for name, value in zip(names, expected):
        assert drawn[name].dtype == np.float32
        assert_allclose(drawn[name], value, rtol=0, atol=0, err_msg=name)
    if activation == "logistic":  # factor 2: bound sqrt(2 / (5 + 8))
        assert np.abs(drawn["coefficient"]).max() <= np.sqrt(2 / 13)
        assert np.abs(drawn["coefficient"]).max() > np.sqrt(2 / 13) * 0.8
    other = glorot_uniform_weights(model, names, 1)
    assert not np.allclose(other[names[0]], drawn[names[0]])


def test_glorot_weights_float64(mlp_onnx):
    model = mlp_onnx(dtype=np.float64)
    drawn = glorot_uniform_weights(model, MLP_WEIGHTS, 0)
    expected = sklearn_initial_weights((8,), "relu", 5, 1, np.float64)
    for name, value in zip(MLP_WEIGHTS, expected):
        assert drawn[name].dtype == np.float64
        assert_allclose(drawn[name], value, rtol=0, atol=0)


@pytest.mark.parametrize("n_outputs", [1, 3])
def test_parity_with_mlp_regressor(mlp_onnx, sgd_mlp, regression_data, n_outputs):
    """20 epochs of SGD on 105 rows (last batch of 5): the loss curve and the
    weights equal scikit-learn's."""
    X, y = regression_data
    if n_outputs > 1:
        y = np.column_stack([y, -y, 0.5 * y + X[:, 1]]).astype(np.float32)
    skl = sgd_mlp(hidden_layer_sizes=(8,), max_iter=20, batch_size=10).fit(X, y)
    est = OrtGradientForwardBackwardOptimizer(
        mlp_onnx(n_outputs=n_outputs), learning_rate=constant(0.01), max_iter=20,
        batch_size=10, random_state=0, init="random").fit(X, y)
    assert est.weights_to_train_ == MLP_WEIGHTS
    assert len(est.train_losses_) == len(skl.loss_curve_) == 20
    assert_allclose(est.train_losses_, skl.loss_curve_, rtol=1e-4)
    for name, value, expected in zip(MLP_WEIGHTS, est.get_state(), sklearn_weights(skl)):
        assert_allclose(value, expected, rtol=1e-4, atol=1e-5, err_msg=name)
    assert_allclose(est.predict(X), skl.predict(X), rtol=1e-4, atol=1e-4)
    assert est.t_ == skl.t_ == 20 * 105
    assert est.n_iter_ == skl.n_iter_ == 20


def test_parity_with_sample_weight(mlp_onnx, sgd_mlp, regression_data):
    """Weighted batches take the gradient w (p - y) / sum(w) like scikit-learn
    (the epoch loss differs on purpose: onnxtrain averages the batch losses by
    their weights, scikit-learn by their rows)."""
    X, y = regression_data
    w = np.random.RandomState(5).randint(1, 4, size=len(X)).astype(np.float32)
    skl = sgd_mlp(hidden_layer_sizes=(8,), max_iter=10, batch_size=10)
    skl.fit(X, y, sample_weight=w)
    est = OrtGradientForwardBackwardOptimizer(
        mlp_onnx(), learning_rate=constant(0.01), max_iter=10, batch_size=10,
        random_state=0, init="random").fit(X, y, sample_weight=w)
    for name, value, expected in zip(MLP_WEIGHTS, est.get_state(), sklearn_weights(skl)):
        assert_allclose(value, expected, rtol=1e-4, atol=1e-5, err_msg=name)


def test_diabetes_r2_matches_scikit_learn(mlp_onnx, sgd_mlp):
    data = load_diabetes()
    X_train, X_test, y_train, y_test = train_test_split(
        data.data, data.target, test_size=0.25, random_state=0)
    scaler = StandardScaler().fit(X_train)
    X_train = scaler.transform(X_train).astype(np.float32)
    X_test = scaler.transform(X_test).astype(np.float32)
    mean, std = y_train.mean(), y_train.std()
    y_train = ((y_train - mean) / std).astype(np.float32)
    y_test = ((y_test - mean) / std).astype(np.float32)

    skl = sgd_mlp(hidden_layer_sizes=(16,), max_iter=50, batch_size=32)
    skl.fit(X_train, y_train)
    est = OrtGradientForwardBackwardOptimizer(
        mlp_onnx(hidden=(16,), n_features=10), learning_rate=constant(0.01),
        max_iter=50, batch_size=32, random_state=0, init="random").fit(X_train, y_train)
    r2_skl = skl.score(X_test, y_test)
    r2_ort = est.score(X_test, y_test)
    assert r2_skl > 0.3  # the model learned something
    assert abs(r2_ort - r2_skl) < 0.02
    assert r2_ort == pytest.approx(r2_score(y_test, est.predict(X_test)), rel=1e-12)
    assert_allclose(est.train_losses_, skl.loss_curve_, rtol=1e-3)


# ------------------------------------------------------------ dtypes, shapes

def _fit(model, X, y, **kwargs):
    params = dict(learning_rate=constant(0.01), max_iter=3, batch_size=10,
                  random_state=0)
    params.update(kwargs)
    return OrtGradientForwardBackwardOptimizer(model, **params).fit(X, y)


def test_float64_graph_trains_in_float64(mlp_onnx, regression_data):
    X, y = regression_data
    X64, y64 = X.astype(np.float64), y.astype(np.float64)
    est = _fit(mlp_onnx(dtype=np.float64), X64, y64)
    assert [w.dtype for w in est.get_state()] == [np.float64] * 4
    assert est.predict(X64).dtype == np.float64
    est32 = _fit(mlp_onnx(), X, y)
    assert [w.dtype for w in est32.get_state()] == [np.float32] * 4
    # same arithmetic in two precisions
    assert_allclose(est.train_losses_, est32.train_losses_, rtol=1e-4)
    assert not np.array_equal(est.train_losses_, est32.train_losses_)


def test_float64_X_into_float32_graph(mlp_onnx, regression_data):
    X, y = regression_data
    est = _fit(mlp_onnx(), X.astype(np.float64), y.astype(np.float64))
    ref = _fit(mlp_onnx(), X, y)
    assert est.predict(X.astype(np.float64)).dtype == np.float32
    assert_allclose(est.train_losses_, ref.train_losses_, rtol=0, atol=0)


def test_y_shape_n_and_n1_identical(mlp_onnx, regression_data):
    X, y = regression_data
    flat = _fit(mlp_onnx(), X, y)
    column = _fit(mlp_onnx(), X, y.reshape(-1, 1))
    assert_allclose(flat.train_losses_, column.train_losses_, rtol=0, atol=0)
    for a, b in zip(flat.get_state(), column.get_state()):
        assert_allclose(a, b, rtol=0, atol=0)
    assert flat.predict(X).shape == (105,)
    assert column.predict(X).shape == (105, 1)
    assert_allclose(column.predict(X).ravel(), flat.predict(X), rtol=0, atol=0)
    assert flat.losses(X, y).shape == (105,)
    assert_allclose(flat.losses(X, y), 0.5 * (flat.predict(X) - y) ** 2, rtol=1e-5)


def test_multi_output_predictions(mlp_onnx, regression_data):
    X, y = regression_data
    Y = np.column_stack([y, 2 * y, -y])
    est = _fit(mlp_onnx(n_outputs=3), X, Y)
    assert est.predict(X).shape == (105, 3)
    assert est.losses(X, Y).shape == (105,)
    expected = 0.5 * np.mean((est.predict(X) - Y) ** 2)
    assert np.mean(est.losses(X, Y)) == pytest.approx(expected, rel=1e-5)


def test_integer_y(mlp_onnx, regression_data):
    X, y = regression_data
    y_int = np.round(3 * y).astype(np.int64)
    est = _fit(mlp_onnx(), X, y_int)
    ref = _fit(mlp_onnx(), X, y_int.astype(np.float32))
    assert_allclose(est.train_losses_, ref.train_losses_, rtol=0, atol=0)
    assert est.predict(X).dtype == np.float32


def _linear_rank1_graph():
    """Y = X @ w + b in float32, w of shape (3,), b rank 0, Y of shape (N,)."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "w"], ["xw"]),
         helper.make_node("Add", ["xw", "b"], ["Y"])], "linear",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None])],
        [numpy_helper.from_array(np.zeros(3, np.float32), "w"),
         numpy_helper.from_array(np.array(0.0, np.float32), "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_rank1_output_and_rank0_weight():
    """A graph predicting (N,): y of shape (n,) or (n, 1) trains the same and
    predictions follow y's shape; a rank-0 weight stays rank 0 and the
    trained graph takes it back."""
    X = np.random.RandomState(0).randn(50, 3).astype(np.float32)
    y = (X @ [1.0, 2.0, 3.0] + 0.5).astype(np.float32)
    results = []
    for target in (y, y.reshape(-1, 1)):
        est = OrtGradientForwardBackwardOptimizer(
            _linear_rank1_graph(), ["w", "b"], learning_rate=constant(0.1), max_iter=60,
            random_state=0).fit(X, target)
        assert est.predict(X[:4]).shape == target[:4].shape
        results.append(est)
    flat, column = results
    assert_allclose(flat.train_losses_, column.train_losses_, rtol=0, atol=0)
    w, b = flat.get_state()
    assert w.shape == (3,) and b.shape == ()
    assert_allclose(w, [1.0, 2.0, 3.0], atol=1e-3)
    assert float(b) == pytest.approx(0.5, abs=1e-3)
    trained = flat.get_trained_onnx()
    inits = {i.name: numpy_helper.to_array(i) for i in trained.graph.initializer}
    assert inits["b"].shape == () and float(inits["b"]) == float(b)


# ------------------------------------------------------------- bad input

def test_init_only_stores(mlp_onnx):
    est = OrtGradientForwardBackwardOptimizer(mlp_onnx(), max_iter=-5, batch_size="x",
                                              learning_rate="bogus")
    assert est.max_iter == -5 and est.batch_size == "x"
    assert not hasattr(est, "train_losses_")
    with pytest.raises(NotFittedError):
        est.predict(np.zeros((2, 5), np.float32))
    with pytest.raises(NotFittedError):
        est.get_state()


def test_object_X_raises_type_error(mlp_onnx, regression_data):
    X, y = regression_data
    est = OrtGradientForwardBackwardOptimizer(mlp_onnx(), max_iter=1)
    for bad in (X.astype(object), np.array([["a"] * 5] * len(y), dtype=object)):
        with pytest.raises(TypeError, match=r"\bX\b.*dtype object"):
            est.fit(bad, y)
    assert not hasattr(est, "train_losses_")
    with pytest.raises(TypeError, match=r"\by\b.*dtype object"):
        est.fit(X, y.astype(object))


def test_nan_and_inf_raise(mlp_onnx, regression_data):
    X, y = regression_data
    est = OrtGradientForwardBackwardOptimizer(mlp_onnx(), max_iter=1)
    X_nan = X.copy()
    X_nan[3, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        est.fit(X_nan, y)
    y_inf = y.copy()
    y_inf[0] = np.inf
    with pytest.raises(ValueError, match="y"):
        est.fit(X, y_inf)
    assert not hasattr(est, "train_losses_")


def test_wrong_shapes_raise(mlp_onnx, regression_data):
    X, y = regression_data
    est = OrtGradientForwardBackwardOptimizer(mlp_onnx(), max_iter=1)
    with pytest.raises(ValueError, match="X has 4 features.*takes 5"):
        est.fit(X[:, :4], y)
    with pytest.raises(ValueError, match="y has 104 rows, X has 105"):
        est.fit(X, y[:-1])
    with pytest.raises(ValueError, match="sample_weight has negative"):
        est.fit(X, y, sample_weight=-np.ones(105))
    with pytest.raises(ValueError, match="together"):
        est.fit(X, y, X_val=X)
    assert not hasattr(est, "train_losses_")
    est.fit(X, y)
    with pytest.raises(ValueError, match="X has 6 features"):
        est.predict(np.zeros((2, 6), np.float32))


def test_unknown_weights_to_train(mlp_onnx, regression_data):
    X, y = regression_data
    est = OrtGradientForwardBackwardOptimizer(mlp_onnx(), ["coefficient", "W"])
    with pytest.raises(ValueError, match=r"\['W'\].*candidates: \['coefficient', "
                                         r"'intercepts', 'coefficient1', 'intercepts1'\]"):
        est.fit(X, y)


@pytest.mark.parametrize("params", [
    dict(max_iter=0), dict(max_iter=2.5), dict(max_iter=True), dict(batch_size=0),
    dict(batch_size=-3), dict(validation_every=0), dict(validation_every=1.5),
    dict(validation_every=-0.1), dict(validation_every="often"),
    dict(training_optimizer_name="Adam")])
def test_invalid_parameters_raise(mlp_onnx, regression_data, params):
    X, y = regression_data
    est = OrtGradientForwardBackwardOptimizer(mlp_onnx(), **params)
    name = next(iter(params))
    with pytest.raises(ValueError, match=name):
        est.fit(X, y)
    assert not hasattr(est, "train_losses_")


def test_inputs_not_mutated(mlp_onnx, regression_data):
    X, y = regression_data
    model = mlp_onnx()
    model_bytes = model.SerializeToString()
    X_in, y_in = X.copy(), y.copy()
    X_val, y_val = X[:20].astype(np.float64), y[:20].reshape(-1, 1).copy()
    X_val_in, y_val_in = X_val.copy(), y_val.copy()
    w = np.ones(105, dtype=np.float64)
    lr = constant(0.01)
    est = OrtGradientForwardBackwardOptimizer(model, learning_rate=lr, max_iter=2,
                                              random_state=0)
    est.fit(X_in, y_in, sample_weight=w, X_val=X_val, y_val=y_val)
    est.predict(X_in)
    assert_allclose(X_in, X, rtol=0, atol=0)
    assert_allclose(y_in, y, rtol=0, atol=0)
    assert_allclose(X_val, X_val_in, rtol=0, atol=0)
    assert_allclose(y_val, y_val_in, rtol=0, atol=0)
    assert np.all(w == 1)
    assert model.SerializeToString() == model_bytes
    assert est.model_onnx is model
    # the learning-rate object given is a parameter: fit works on a copy
    assert not hasattr(lr, "axpy_onnx_") and est.learning_rate is not lr


def test_get_state_is_a_copy_and_set_state(mlp_onnx, regression_data):
    X, y = regression_data
    est = _fit(mlp_onnx(), X, y)
    before = est.predict(X)
    state = est.get_state()
    for s in state:
        s[...] = 0.0
    assert_allclose(est.predict(X), before, rtol=0, atol=0)
    est.set_state(dict(zip(MLP_WEIGHTS, state)))
    assert_allclose(est.predict(X), 0.0, atol=0)
    with pytest.raises(ValueError, match="expected 4"):
        est.set_state(state[:2])


def test_get_trained_onnx(mlp_onnx, regression_data):
    X, y = regression_data
    model = mlp_onnx()
    est = _fit(model, X, y)
    trained = est.get_trained_onnx()
    inits = {i.name: numpy_helper.to_array(i) for i in trained.graph.initializer}
    for name, value in zip(MLP_WEIGHTS, est.get_state()):
        assert_allclose(inits[name], value, rtol=0, atol=0)
    sess = ort.InferenceSession(trained.SerializeToString(),
                                providers=["CPUExecutionProvider"])
    assert_allclose(sess.run(None, {"X": X})[0].ravel(), est.predict(X), rtol=1e-5,
                    atol=1e-6)
    original = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    assert not np.allclose(original["coefficient"], inits["coefficient"])


# -------------------------------------------------- pickle, clone, search

def test_pickle_and_joblib_round_trips(mlp_onnx, regression_data):
    X, y = regression_data
    est = _fit(mlp_onnx(), X, y)
    expected = est.predict(X)
    restored = pickle.loads(pickle.dumps(est))
    assert_allclose(restored.predict(X), expected, rtol=0, atol=0)
    buffer = io.BytesIO()
    joblib.dump(est, buffer)
    buffer.seek(0)
    from_joblib = joblib.load(buffer)
    assert_allclose(from_joblib.predict(X), expected, rtol=0, atol=0)
    assert from_joblib.train_losses_ == est.train_losses_
    # both continue training from the same weights
    est.set_params(warm_start=True).fit(X, y)
    restored.set_params(warm_start=True).fit(X, y)
    assert_allclose(restored.train_losses_, est.train_losses_, rtol=0, atol=0)
    assert_allclose(restored.predict(X), est.predict(X), rtol=0, atol=0)


def _same_param(a, b):
    if hasattr(a, "SerializeToString"):
        return a.SerializeToString() == b.SerializeToString()
    if hasattr(a, "get_params"):
        return type(a) is type(b) and a.get_params() == b.get_params()
    return a == b


def test_clone(mlp_onnx, regression_data):
    X, y = regression_data
    est = OrtGradientForwardBackwardOptimizer(mlp_onnx(), learning_rate=0.05,
                                              max_iter=2, random_state=0)
    unfitted = clone(est)
    assert unfitted.get_params()["learning_rate"] == 0.05
    assert unfitted.get_params()["learning_loss"] == "square_error"
    est.fit(X, y)
    copy_ = clone(est)
    assert not hasattr(copy_, "train_losses_")
    params, cloned = est.get_params(), copy_.get_params()
    assert params.keys() == cloned.keys()
    for key in params:
        assert _same_param(cloned[key], params[key]), key
    # after fit, learning_rate holds the resolved object (seed 004 reads
    # est.learning_rate.axpy_onnx_); the clone trains the same way
    assert_allclose(copy_.fit(X, y).predict(X), est.predict(X), rtol=0, atol=0)
    assert_allclose(unfitted.fit(X, y).predict(X), est.predict(X), rtol=0, atol=0)


def test_deepcopy_trains_its_own_weights(mlp_onnx, regression_data):
    X, y = regression_data
    est = _fit(mlp_onnx(), X, y)
    expected = est.predict(X)
    twin = copy.deepcopy(est)
    assert_allclose(twin.predict(X), expected, rtol=0, atol=0)
    twin.set_params(warm_start=True).fit(X, y)
    assert twin.train_losses_[0] < est.train_losses_[0]  # continued
    assert not np.allclose(twin.predict(X), expected)
    assert_allclose(est.predict(X), expected, rtol=0, atol=0)


def test_model_onnx_replaced_without_refit(mlp_onnx, regression_data):
    """set_params(model_onnx=other) leaves weights of the previous model:
    predict and the state refuse them (NotFittedError, not onnxruntime's
    RuntimeError nor the old model's predictions), also after a pickle; an
    equal copy of the model keeps the fit; fit, warm start included, trains
    the new model."""
    X, y = regression_data
    est = _fit(mlp_onnx(), X, y)
    expected = est.predict(X)
    same = onnx.load_model_from_string(est.model_onnx.SerializeToString())
    assert_allclose(est.set_params(model_onnx=same).predict(X), expected,
                    rtol=0, atol=0)
    est.set_params(model_onnx=mlp_onnx(hidden=(4,)))
    pattern = ("model_onnx changed since this OrtGradientForwardBackwardOptimizer "
               "was fitted.*Call 'fit' again")
    for call in (lambda e: e.predict(X), lambda e: e.score(X, y),
                 lambda e: e.get_state(), lambda e: e.get_trained_onnx()):
        with pytest.raises(NotFittedError, match=pattern):
            call(est)
    with pytest.raises(NotFittedError, match=pattern):
        pickle.loads(pickle.dumps(est)).predict(X)
    est.set_params(warm_start=True).fit(X, y)  # starts from the new graph
    assert [w.shape for w in est.get_state()] == [(5, 4), (1, 4), (4, 1), (1, 1)]
    assert est.predict(X).shape == (105,)


def test_grid_search(mlp_onnx, regression_data):
    X, y = regression_data
    base = OrtGradientForwardBackwardOptimizer(mlp_onnx(), max_iter=5, random_state=0)
    grid = GridSearchCV(base, {"learning_rate": [0.001, 0.01]}, cv=3, n_jobs=2)
    grid.fit(X, y)
    scores = [cross_val_score(clone(base).set_params(learning_rate=lr), X, y, cv=3).mean()
              for lr in (0.001, 0.01)]
    assert_allclose(grid.cv_results_["mean_test_score"], scores, rtol=1e-6)
    assert grid.best_params_ == {"learning_rate": 0.01}  # 5 epochs: faster wins
    assert scores[1] > scores[0]
    refit = clone(base).set_params(learning_rate=0.01).fit(X, y)
    assert_allclose(grid.best_estimator_.predict(X), refit.predict(X), rtol=0, atol=0)


# --------------------------------------------------------------- warm start

def test_init_model_starts_from_graph_init_random_draws(mlp_onnx, regression_data):
    """init='model' (default, with or without warm start) starts from the
    graph's weights; init='random' draws them (onnxcustom's cold start)."""
    X, y = regression_data
    model = mlp_onnx()
    graph = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    warm = _fit(model, X, y, warm_start=True, max_iter=1, learning_rate=constant(1e-7))
    default = _fit(model, X, y, max_iter=1, learning_rate=constant(1e-7))
    for name, w_warm, w_default in zip(MLP_WEIGHTS, warm.get_state(),
                                       default.get_state()):
        assert_allclose(w_default, w_warm, rtol=0, atol=0, err_msg=name)
    cold = _fit(model, X, y, init="random", max_iter=1, learning_rate=constant(1e-7))
    for name, w_warm, w_cold in zip(MLP_WEIGHTS, warm.get_state(), cold.get_state()):
        assert_allclose(w_warm, graph[name], atol=1e-5, err_msg=name)
        assert np.abs(w_cold - graph[name]).max() > 0.01, name


def test_warm_start_continues(mlp_onnx, regression_data):
    """Two warm fits of 4 epochs = one of 8 (constant schedule)."""
    X, y = regression_data
    est = _fit(mlp_onnx(), X, y, warm_start=True, max_iter=4)
    first = list(est.train_losses_)
    est.fit(X, y)
    second = list(est.train_losses_)
    assert second[0] < first[-1] < first[0]  # continues, does not restart
    assert est.n_iter_ == 4 and est.t_ == 8 * 105
    eight = _fit(mlp_onnx(), X, y, warm_start=True, max_iter=8)
    assert_allclose(first + second, eight.train_losses_, rtol=1e-6)
    for a, b in zip(est.get_state(), eight.get_state()):
        assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_cold_start_random_state(mlp_onnx, regression_data):
    X, y = regression_data
    est = _fit(mlp_onnx(), X, y, random_state=7, init="random")
    again = _fit(mlp_onnx(), X, y, random_state=7, init="random")
    other = _fit(mlp_onnx(), X, y, random_state=8, init="random")
    assert_allclose(again.train_losses_, est.train_losses_, rtol=0, atol=0)
    for a, b in zip(again.get_state(), est.get_state()):
        assert_allclose(a, b, rtol=0, atol=0)
    assert not np.allclose(other.train_losses_, est.train_losses_)
    # refitting the same estimator restarts from the same draw
    first = list(est.train_losses_)
    est.fit(X, y)
    assert_allclose(est.train_losses_, first, rtol=0, atol=0)
    assert est.t_ == 3 * 105


def test_cold_start_redraws_only_weights_to_train(regression_data):
    """warm_start=False draws new values for weights_to_train only: the
    other initializers of a skl2onnx MLP (the untrained weights and the
    int64 Reshape shape) come out of get_trained_onnx byte for byte."""
    X, y = regression_data
    skl = MLPRegressor(hidden_layer_sizes=(8, 4), max_iter=20, random_state=0)
    with pytest.warns(ConvergenceWarning):
        model = to_onnx(skl.fit(X, y), X[:1])
    original = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    assert original["shape_tensor"].dtype == np.int64
    trained_names = ["intercepts", "coefficient1"]
    est = OrtGradientForwardBackwardOptimizer(
        model, weights_to_train=trained_names, learning_rate=constant(1e-7),
        max_iter=1, batch_size=10, random_state=0, warm_start=False, init="random")
    for _ in range(2):  # the first fit and a refit both redraw
        est.fit(X, y)
        trained = {i.name: numpy_helper.to_array(i)
                   for i in est.get_trained_onnx().graph.initializer}
        assert trained.keys() == original.keys()
        for name in trained_names:  # redrawn (lr 1e-7 barely moves them)
            assert np.abs(trained[name] - original[name]).max() > 0.01, name
        for name in original.keys() - set(trained_names):
            assert trained[name].dtype == original[name].dtype, name
            assert trained[name].shape == original[name].shape, name
            assert trained[name].tobytes() == original[name].tobytes(), name
        # the fitted graph is the original one with the two redrawn weights
        sess = ort.InferenceSession(est.get_trained_onnx().SerializeToString(),
                                    providers=["CPUExecutionProvider"])
        hidden = np.maximum(X @ original["coefficient"] + trained["intercepts"], 0)
        hidden = np.maximum(hidden @ trained["coefficient1"]
                            + original["intercepts1"], 0)
        expected = hidden @ original["coefficient2"] + original["intercepts2"]
        assert_allclose(sess.run(None, {"X": X})[0], expected, rtol=1e-5,
                        atol=1e-5)


# -------------------------------------------------------- non-finite loss

def test_huge_learning_rate_raises_convergence_error(mlp_onnx, regression_data):
    X, y = regression_data
    est = OrtGradientForwardBackwardOptimizer(
        mlp_onnx(), learning_rate=constant(1e10), max_iter=5, random_state=0)
    with pytest.raises(ConvergenceError, match="loss became"):
        est.fit(X, y)
    state = est.get_state()
    assert len(state) == 4
    assert all(np.isfinite(w).all() for w in state)
    assert all(np.isfinite(est.train_losses_))
    assert np.isfinite(est.predict(X)).all()


def test_huge_learning_rate_warns_with_exc_false(mlp_onnx, regression_data):
    X, y = regression_data
    est = OrtGradientForwardBackwardOptimizer(
        mlp_onnx(), learning_rate=constant(1e10), max_iter=5, random_state=0,
        exc=False)
    with pytest.warns(ConvergenceWarning, match="loss became"):
        est.fit(X, y)
    assert est.n_iter_ < 5 and len(est.train_losses_) == est.n_iter_
    assert all(np.isfinite(w).all() for w in est.get_state())


# ---------------------------------------------------------- validation

def test_validation_losses(mlp_onnx, regression_data):
    X, y = regression_data
    X_train, y_train, X_val, y_val = X[:80], y[:80], X[80:], y[80:]
    est = OrtGradientForwardBackwardOptimizer(
        mlp_onnx(), learning_rate=constant(0.01), max_iter=10, validation_every=2,
        random_state=0).fit(X_train, y_train, X_val=X_val, y_val=y_val)
    assert len(est.validation_losses_) == 5
    expected = []
    for epochs in (2, 4, 6, 8, 10):
        partial = _fit(mlp_onnx(), X_train, y_train, max_iter=epochs)
        expected.append(0.5 * np.mean((partial.predict(X_val).astype(np.float64)
                                       - y_val) ** 2))
    assert_allclose(est.validation_losses_, expected, rtol=1e-5)
    last = 0.5 * np.mean((est.predict(X_val).astype(np.float64) - y_val) ** 2)
    assert est.validation_losses_[-1] == pytest.approx(last, rel=1e-5)
    assert np.mean(est.losses(X_val, y_val)) == pytest.approx(last, rel=1e-5)


def test_validation_every_fraction_never_zero(mlp_onnx, regression_data):
    X, y = regression_data
    est = OrtGradientForwardBackwardOptimizer(
        mlp_onnx(), max_iter=5, validation_every=0.1, random_state=0)
    est.fit(X[:80], y[:80], X_val=X[80:], y_val=y[80:])
    assert len(est.validation_losses_) == 5  # period max(1, int(0.5)) = 1
    assert est.validation_losses_[-1] == pytest.approx(
        np.mean(est.losses(X[80:], y[80:])), rel=1e-5)
    no_val = _fit(mlp_onnx(), X, y)
    assert no_val.validation_losses_ is None


# --------------------------------------------------------- sample weights

def test_integer_sample_weight_equals_repeated_rows(mlp_onnx, regression_data):
    """One batch per epoch: weights k on a row = the row repeated k times."""
    X, y = regression_data
    X, y = X[:40], y[:40]
    w = np.random.RandomState(0).randint(1, 4, size=40)
    weighted = OrtGradientForwardBackwardOptimizer(
        mlp_onnx(), learning_rate=constant(0.05), batch_size=1000, max_iter=5,
        random_state=0).fit(X, y, sample_weight=w)
    repeated = OrtGradientForwardBackwardOptimizer(
        mlp_onnx(), learning_rate=constant(0.05), batch_size=1000, max_iter=5,
        random_state=0).fit(np.repeat(X, w, axis=0), np.repeat(y, w))
    assert_allclose(weighted.train_losses_, repeated.train_losses_, rtol=1e-5)
    for a, b in zip(weighted.get_state(), repeated.get_state()):
        assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    unweighted = OrtGradientForwardBackwardOptimizer(
        mlp_onnx(), learning_rate=constant(0.05), batch_size=1000, max_iter=5,
        random_state=0).fit(X, y)
    assert not np.allclose(unweighted.train_losses_, weighted.train_losses_)


def test_zero_weight_batch_is_skipped(mlp_onnx, regression_data):
    """A batch whose rows all weigh 0 adds no loss and no step (its mean is
    0 / 0): the fit equals one on the other rows with the same batches."""
    X, y = regression_data
    w = np.ones(105)
    w[:10] = 0
    weighted = _fit(mlp_onnx(), X, y).fit(X, y, sample_weight=w)
    rest = _fit(mlp_onnx(), X[10:], y[10:])
    assert_allclose(weighted.train_losses_, rest.train_losses_, rtol=1e-6)
    for a, b in zip(weighted.get_state(), rest.get_state()):
        assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="sums to zero"):
        weighted.fit(X, y, sample_weight=np.zeros(105))


def test_unit_sample_weight_equals_none(mlp_onnx, regression_data):
    X, y = regression_data
    est = OrtGradientForwardBackwardOptimizer(
        mlp_onnx(), learning_rate=constant(0.01), max_iter=3, random_state=0)
    ones = est.fit(X, y, sample_weight=np.ones(105)).train_losses_
    none = clone(est).fit(X, y).train_losses_
    assert_allclose(ones, none, rtol=1e-6)


# ---------------------------------------------------------- verbose, log

def test_enable_logging_reports_epochs(mlp_onnx, regression_data, caplog):
    X, y = regression_data
    with caplog.at_level(logging.INFO, logger="onnxtrain"):
        est = _fit(mlp_onnx(), X, y, enable_logging=True, verbose=2)
    records = [r.getMessage() for r in caplog.records if r.name == "onnxtrain"]
    assert len(records) == 3
    assert records[0].startswith("epoch 1 loss=")
    assert repr(est.train_losses_[0]) in records[0]
