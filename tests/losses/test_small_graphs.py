"""The small graphs of the training loop, run with onnxruntime and checked
against numpy / scikit-learn oracles: the loss and its gradient dE/dY
(``loss_grad_onnx_``), the learning-rate schedules and the SGD update
(``axpy_onnx_``)."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from numpy.testing import assert_allclose
from onnx import TensorProto
from sklearn.metrics import mean_squared_error

from gradcheck import central_differences
from onnxtrain import LearningRateSGD, SquareLearningLoss
from onnxtrain.losses import resolve_learning_loss
from onnxtrain.optim import resolve_learning_rate

ELEM = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE}


def _session(model):
    onnx.checker.check_model(model, full_check=True)
    return ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"])


def _loss_session(dtype, weighted, rank=2):
    loss = SquareLearningLoss()
    model = loss.build_onnx(ELEM[dtype], 17, weight_name="weight" if weighted else None,
                            rank=rank)
    assert model is loss.loss_grad_onnx_
    return _session(model)


def _run_loss(sess, y, p, w=None):
    feeds = {"X1": y, "X2": p}
    if w is not None:
        feeds["weight"] = w
    value, grad = sess.run(["Y", "Y_grad"], feeds)
    assert value.shape == ()
    assert grad.shape == p.shape and grad.dtype == p.dtype
    return float(value), grad


def _loss_data(dtype, n, k, seed=0):
    rng = np.random.RandomState(seed)
    shape = (n,) if k is None else (n, k)
    y = rng.randn(*shape).astype(dtype)
    p = rng.randn(*shape).astype(dtype)
    w = rng.randint(1, 5, size=n).astype(dtype) * rng.uniform(0.5, 1.5, size=n).astype(dtype)
    return y, p, w


# ---------------------------------------------------------------- the loss

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_square_loss_matches_scikit_learn(dtype, k, weighted):
    """Y = 0.5 * mean_squared_error(y, p, sample_weight=w), which is
    scikit-learn's MLP ``squared_loss`` (0.5 * np.average((y - p)**2,
    weights=w, axis=0).mean()); Y_grad = w * (p - y) / sum(w), the delta
    scikit-learn back-propagates. 7 rows: an (N,1) x (N,) broadcast to N x N
    would give other values."""
    y, p, w = _loss_data(dtype, 7, k)
    sess = _loss_session(dtype, weighted)
    value, grad = _run_loss(sess, y, p, w if weighted else None)
    sw = w if weighted else None
    y64, p64 = y.astype(np.float64), p.astype(np.float64)
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    assert_allclose(value, 0.5 * mean_squared_error(y64, p64, sample_weight=sw), rtol=rtol)
    assert_allclose(value, 0.5 * np.average((y64 - p64) ** 2, weights=sw, axis=0).mean(),
                    rtol=rtol)
    row_w = np.ones(7) if sw is None else sw.astype(np.float64)
    expected_grad = row_w[:, None] * (p64 - y64) / row_w.sum()
    assert_allclose(grad, expected_grad, rtol=rtol, atol=1e-7)


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_square_loss_rank_one(weighted):
    """Predictions of shape (n,): same values as the (n, 1) layout."""
    y, p, w = _loss_data(np.float64, 6, None, seed=3)
    sw = w if weighted else None
    value, grad = _run_loss(_loss_session(np.float64, weighted, rank=1), y, p, sw)
    value2, grad2 = _run_loss(_loss_session(np.float64, weighted, rank=2),
                              y[:, None], p[:, None], sw)
    assert_allclose(value, 0.5 * mean_squared_error(y, p, sample_weight=sw), rtol=1e-12)
    assert_allclose(value, value2, rtol=1e-12)
    assert_allclose(grad, grad2.ravel(), rtol=1e-12)


def test_square_loss_unit_weights_equal_unweighted():
    y, p, _ = _loss_data(np.float64, 9, 2, seed=5)
    value, grad = _run_loss(_loss_session(np.float64, False), y, p)
    value_w, grad_w = _run_loss(_loss_session(np.float64, True), y, p, np.ones(9))
    assert_allclose(value_w, value, rtol=1e-12)
    assert_allclose(grad_w, grad, rtol=1e-12)


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("k", [1, 3])
def test_square_loss_gradient_finite_differences(weighted, k):
    """k = 1: Y_grad is exactly dY/dp. k outputs: Y_grad is k * dY/dp, because
    scikit-learn's loss averages over outputs but its delta does not (the
    scale onnxtrain must follow to reproduce ``loss_curve_``)."""
    y, p, w = _loss_data(np.float64, 5, k, seed=7)
    sw = w if weighted else None
    sess = _loss_session(np.float64, weighted)
    _, grad = _run_loss(sess, y, p, sw)
    numeric = central_differences(lambda q: _run_loss(sess, y, q, sw)[0], p)
    assert_allclose(grad, k * numeric, rtol=1e-7, atol=1e-10)


def test_square_loss_float16_and_bad_types():
    model = SquareLearningLoss().build_onnx(TensorProto.FLOAT16, 17)
    y = np.array([[1.0], [2.0]], dtype=np.float16)
    p = np.array([[2.0], [4.0]], dtype=np.float16)
    value, grad = _run_loss(_session(model), y, p)
    assert value == pytest.approx(0.5 * (1 + 4) / 2, rel=1e-3)
    assert_allclose(grad.astype(np.float32), [[0.5], [1.0]], rtol=1e-3)
    with pytest.raises(ValueError, match="float element type"):
        SquareLearningLoss().build_onnx(TensorProto.INT64, 17)
    with pytest.raises(ValueError, match="rank"):
        SquareLearningLoss().build_onnx(TensorProto.FLOAT, 17, rank=3)


def test_loss_per_row():
    y = np.array([[1.0, 2.0], [0.0, 0.0], [3.0, -1.0]])
    p = np.array([[2.0, 2.0], [1.0, -1.0], [3.0, 1.0]])
    assert_allclose(SquareLearningLoss().loss_per_row(y, p),
                    [0.5 * 0.5, 0.5 * 1.0, 0.5 * 2.0])


@pytest.mark.parametrize("name", ["square_error", "square", "squared_error",
                                  "SquareLearningLoss"])
def test_resolve_learning_loss_aliases(name):
    assert isinstance(resolve_learning_loss(name), SquareLearningLoss)


def test_resolve_learning_loss_errors_and_copies():
    given = SquareLearningLoss()
    resolved = resolve_learning_loss(given)
    assert isinstance(resolved, SquareLearningLoss) and resolved is not given
    with pytest.raises(ValueError, match="square_error"):
        resolve_learning_loss("hinge")
    with pytest.raises(TypeError):
        resolve_learning_loss(3)


# ------------------------------------------------------- learning rates

def _numpy_schedule(kind, eta0, alpha, power_t, t):
    if kind == "constant":
        return eta0
    if kind == "invscaling":
        return eta0 / (t + 1) ** power_t
    typw = np.sqrt(1.0 / np.sqrt(alpha))
    eta_h = typw / max(1.0, 2 * (1.0 + typw))
    t0 = 1.0 / (eta_h * alpha)
    return eta0 * t0 / (t0 + t)


@pytest.mark.parametrize("kind", ["constant", "invscaling", "optimal"])
def test_learning_rate_schedules(kind):
    lr = LearningRateSGD(eta0=0.05, alpha=0.01, power_t=0.3, learning_rate=kind)
    for t in [0, 1, 2, 7, 100, 12345]:
        expected = _numpy_schedule(kind, 0.05, 0.01, 0.3, t)
        assert lr.schedule(t) == pytest.approx(expected, rel=1e-12)
    assert lr.init_learning_rate().value == pytest.approx(0.05, rel=1e-12)
    assert lr.update_learning_rate(9).value == pytest.approx(
        _numpy_schedule(kind, 0.05, 0.01, 0.3, 9), rel=1e-12)
    if kind != "constant":
        assert lr.schedule(10) < lr.schedule(1) < lr.schedule(0)


def test_learning_rate_defaults_and_unknown_schedule():
    lr = LearningRateSGD()
    assert (lr.eta0, lr.alpha, lr.power_t, lr.learning_rate) == (
        0.01, 0.0001, 0.25, "invscaling")
    assert lr.schedule(15) == pytest.approx(0.01 / 16 ** 0.25)
    with pytest.raises(ValueError, match="adaptive"):
        LearningRateSGD(learning_rate="bogus").schedule(0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sgd_update_graph_matches_numpy(dtype):
    """N steps of the update graph, fed back into itself, equal W - eta * G
    in numpy with the schedule's eta at every step; the learning rate is an
    input of the graph, not a constant baked in."""
    shapes = [("coefficient", (3, 2)), ("intercepts", (1, 2)), ("scalar", ())]
    lr = LearningRateSGD(eta0=0.1, learning_rate="invscaling", power_t=0.5)
    model = lr.build_onnx(shapes, ELEM[dtype], 17)
    assert model is lr.axpy_onnx_
    assert [i.name for i in model.graph.input] == [
        "learning_rate", "step", "loss", "penalty_scale", "coefficient",
        "coefficient_grad",
        "intercepts", "intercepts_grad", "scalar", "scalar_grad"]
    assert [o.name for o in model.graph.output] == [
        "coefficient_new", "intercepts_new", "scalar_new", "loss_total"]
    sess = _session(model)
    rng = np.random.RandomState(0)
    weights = {n: np.asarray(rng.randn(*s), dtype=dtype) for n, s in shapes}
    expected = {n: w.astype(np.float64) for n, w in weights.items()}
    lr.init_learning_rate()
    for step in range(6):
        grads = {n: np.asarray(rng.randn(*s), dtype=dtype) for n, s in shapes}
        feeds = {"learning_rate": np.array(lr.value, dtype=dtype),
                 "step": np.array(step + 1, dtype=dtype),
                 "loss": np.array(0.5, dtype=dtype),
                 "penalty_scale": np.array(1.0, dtype=dtype)}
        for n in weights:
            feeds[n], feeds[f"{n}_grad"] = weights[n], grads[n]
            expected[n] = expected[n] - lr.value * grads[n].astype(np.float64)
        outputs = sess.run(None, feeds)
        assert outputs[-1] == pytest.approx(0.5)  # no penalty: the loss as is
        weights = dict(zip(weights, outputs[:-1]))
        lr.update_learning_rate(step + 1)
    assert lr.value == pytest.approx(0.1 / np.sqrt(7))
    for n, w in weights.items():
        assert w.dtype == dtype
        assert_allclose(w, expected[n], rtol=1e-5 if dtype == np.float32 else 1e-13,
                        atol=1e-6 if dtype == np.float32 else 1e-14)


def test_update_graph_bad_type():
    with pytest.raises(ValueError, match="float element type"):
        LearningRateSGD().build_onnx([("w", (2,))], TensorProto.INT32, 17)


def test_resolve_learning_rate():
    from_float = resolve_learning_rate(0.5)
    assert isinstance(from_float, LearningRateSGD)
    assert (from_float.eta0, from_float.learning_rate) == (0.5, "invscaling")
    assert resolve_learning_rate("SGD").get_params() == LearningRateSGD().get_params()
    given = LearningRateSGD(eta0=0.2, learning_rate="constant")
    resolved = resolve_learning_rate(given)
    assert resolved is not given and resolved.get_params() == given.get_params()
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="learning_rate"):
            resolve_learning_rate(bad)
    with pytest.raises(ValueError, match="AdamX"):
        resolve_learning_rate("AdamX")
    with pytest.raises(TypeError):
        resolve_learning_rate([0.1])
