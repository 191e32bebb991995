"""Every training loss against its scikit-learn metric, its own finite
differences, gradient descent, repeated rows and the ONNX checker.

One row of :data:`CASES` per loss configuration; every class registered in
``resolve_learning_loss``'s alias table must have at least one row.
"""
from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from numpy.testing import assert_allclose
from onnx import TensorProto, numpy_helper
from scipy.special import expit, softmax
from sklearn.metrics import (log_loss, mean_absolute_error, mean_poisson_deviance,
                             mean_squared_error)
from sklearn.neural_network._base import LOSS_FUNCTIONS as MLP_LOSSES

from gradcheck import central_differences
from onnxtrain.losses.learning_losses import (_LOSSES, AbsoluteLearningLoss, BaseLearningLoss,
                              CrossEntropyLearningLoss, ElasticLearningLoss,
                              NegLogLearningLoss, PoissonLearningLoss,
                              SquareLearningLoss, resolve_learning_loss)

ELEM = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE,
        np.float16: TensorProto.FLOAT16}


# ------------------------------------------------------------ data makers

def _regression(rng, shape):
    return rng.randn(*shape), rng.randn(*shape)


def _binary_scores(rng, shape):
    return rng.randint(0, 2, size=shape).astype(np.float64), 3 * rng.randn(*shape)


def _binary_probabilities(rng, shape):
    return (rng.randint(0, 2, size=shape).astype(np.float64),
            rng.uniform(0.02, 0.98, size=shape))


def _one_hot(rng, n, c):
    labels = rng.randint(0, c, size=n)
    labels[:c] = np.arange(c)  # every class present
    return np.eye(c)[labels]


def _class_probabilities(rng, shape):
    return _one_hot(rng, *shape), softmax(rng.randn(*shape), axis=1)


def _class_logits(rng, shape):
    return _one_hot(rng, *shape), 2 * rng.randn(*shape)


def _counts(rng, shape):
    y = rng.poisson(2.0, size=shape).astype(np.float64)
    y.flat[0] = 0.0  # xlogy(0, .) = 0
    return y, np.exp(0.5 * rng.randn(*shape))


# -------------------------------------------------- scikit-learn references

def _columns(y, p):
    n = p.shape[0]
    return y.reshape(n, -1), p.reshape(n, -1)


def _ref_square(y, p, w):
    return 0.5 * mean_squared_error(y, p, sample_weight=w)


def _ref_absolute(y, p, w):
    return mean_absolute_error(y, p, sample_weight=w)


def _ref_elastic(l1, l2):
    def ref(y, p, w):
        return (l1 * mean_absolute_error(y, p, sample_weight=w)
                + l2 * mean_squared_error(y, p, sample_weight=w))
    return ref


def _ref_binary(to_probability):
    def ref(y, p, w):
        y, p = _columns(y, to_probability(p))
        return sum(log_loss(y[:, j], p[:, j], sample_weight=w, labels=[0, 1])
                   for j in range(p.shape[1]))
    return ref


def _ref_multiclass(to_probability):
    def ref(y, p, w):
        return log_loss(y.argmax(axis=1), to_probability(p), sample_weight=w,
                        labels=np.arange(p.shape[1]))
    return ref


def _ref_poisson(y, p, w):
    y, p = _columns(y, p)
    return sum(0.5 * mean_poisson_deviance(y[:, j], p[:, j], sample_weight=w)
               for j in range(p.shape[1]))


def _mlp(name, to_probability=lambda p: p):
    """scikit-learn MLP's own loss function (``_base.LOSS_FUNCTIONS``)."""
    def ref(y, p, w):
        y, p = _columns(y, to_probability(p))
        return MLP_LOSSES[name](y, p, w)
    return ref


def _clip(eps):
    return lambda p: np.clip(p, eps, 1 - eps)


# ------------------------------------------------------------------ the table

@dataclass
class Case:
    make: object                 # () -> loss object
    data: object                 # (rng, shape) -> (y, prediction) float64
    reference: object            # (y, p, w) -> the scikit-learn metric
    shapes: tuple = ((7,), (7, 1), (7, 3))
    mlp_reference: object = None  # scikit-learn MLP's loss function
    grad_scale_k: bool = False   # Y_grad = k * dY/dp (SquareLearningLoss only)
    lr: float = 1.0              # gradient-descent step (times n_rows)


CASES = {
    "square": Case(SquareLearningLoss, _regression, _ref_square,
                   mlp_reference=_mlp("squared_error"), grad_scale_k=True, lr=0.3),
    "absolute": Case(AbsoluteLearningLoss, _regression, _ref_absolute, lr=0.05),
    "elastic": Case(lambda: ElasticLearningLoss(l1_weight=0.3, l2_weight=0.7),
                    _regression, _ref_elastic(0.3, 0.7), lr=0.1),
    "elastic_default": Case(ElasticLearningLoss, _regression,
                            _ref_elastic(0.5, 0.5), lr=0.1),
    "neglog_sigmoid": Case(NegLogLearningLoss, _binary_scores, _ref_binary(expit),
                           mlp_reference=_mlp("binary_log_loss", expit), lr=1.0),
    "neglog_probability": Case(
        lambda: NegLogLearningLoss(probability_function=None), _binary_probabilities,
        _ref_binary(_clip(1e-5)), mlp_reference=_mlp("binary_log_loss"), lr=0.005),
    "cross_entropy": Case(CrossEntropyLearningLoss, _class_probabilities,
                          _ref_multiclass(lambda p: p), shapes=((8, 4), (8, 2)),
                          mlp_reference=_mlp("log_loss"), lr=0.005),
    "cross_entropy_logits": Case(
        lambda: CrossEntropyLearningLoss(from_logits=True), _class_logits,
        _ref_multiclass(lambda z: softmax(z, axis=1)), shapes=((8, 4), (8, 2)),
        mlp_reference=_mlp("log_loss", lambda z: softmax(z, axis=1)), lr=1.0),
    "poisson": Case(PoissonLearningLoss, _counts, _ref_poisson,
                    mlp_reference=_mlp("poisson"), lr=0.05),
}

#: (case, shape) pairs.
SHAPED = [pytest.param(name, shape, id=f"{name}-{'x'.join(map(str, shape))}")
          for name, case in CASES.items() for shape in case.shapes]
WEIGHTED = pytest.mark.parametrize("weighted", [False, True],
                                   ids=["unweighted", "weighted"])


# ------------------------------------------------------------------ helpers

_SESSIONS = {}


def _session(name, dtype, weighted, rank, opset=17):
    """Build the case's graph, check it, and cache its session."""
    key = (name, dtype, weighted, rank, opset)
    if key not in _SESSIONS:
        loss = CASES[name].make()
        model = loss.build_onnx(ELEM[dtype], opset,
                                weight_name="weight" if weighted else None, rank=rank)
        assert model is loss.loss_grad_onnx_
        onnx.checker.check_model(model, full_check=True)
        _SESSIONS[key] = ort.InferenceSession(model.SerializeToString(),
                                              providers=["CPUExecutionProvider"])
    return _SESSIONS[key]


def _run(sess, y, p, w=None):
    feeds = {"X1": y, "X2": p}
    if w is not None:
        feeds["weight"] = w
    value, grad = sess.run(["Y", "Y_grad"], feeds)
    assert value.shape == () and value.dtype == p.dtype
    assert grad.shape == p.shape and grad.dtype == p.dtype
    return float(value), grad


def _data(name, shape, seed=0):
    rng = np.random.RandomState(seed)
    y, p = CASES[name].data(rng, shape)
    w = rng.randint(1, 5, size=shape[0]) * rng.uniform(0.5, 1.5, size=shape[0])
    return y, p, w


# ------------------------------------------------------------------ the table

def test_every_registered_loss_has_a_row():
    """A loss class reachable through ``resolve_learning_loss`` without a row
    in :data:`CASES` fails here."""
    covered = {type(case.make()) for case in CASES.values()}
    missing = {cls.__name__ for cls in _LOSSES.values()} - {c.__name__ for c in covered}
    assert not missing, f"losses without a test row: {sorted(missing)}"
    for name, cls in _LOSSES.items():
        assert isinstance(resolve_learning_loss(name), cls)


@pytest.mark.filterwarnings("ignore:The y_prob values do not sum to one")
@pytest.mark.parametrize("name,shape", SHAPED)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@WEIGHTED
def test_value_matches_scikit_learn(name, shape, dtype, weighted):
    """Y equals the scikit-learn metric (and scikit-learn MLP's own loss
    function where it has one) on random data; 7 or 8 rows, so that an
    (N, 1) x (N,) broadcast to N x N would show."""
    case = CASES[name]
    y, p, w = _data(name, shape)
    sw = w if weighted else None
    value, _ = _run(_session(name, dtype, weighted, len(shape)), y.astype(dtype),
                    p.astype(dtype), None if sw is None else sw.astype(dtype))
    y64, p64 = y.astype(dtype).astype(np.float64), p.astype(dtype).astype(np.float64)
    sw64 = None if sw is None else sw.astype(dtype).astype(np.float64)
    rtol = 2e-6 if dtype == np.float32 else 1e-12
    expected = case.reference(y64, p64, sw64)
    assert_allclose(value, expected, rtol=rtol)
    if case.mlp_reference is not None:
        assert_allclose(value, case.mlp_reference(y64, p64, sw64), rtol=rtol)


@pytest.mark.parametrize("name,shape", SHAPED)
@WEIGHTED
def test_gradient_matches_finite_differences(name, shape, weighted):
    """Y_grad is the derivative of Y (float64 central differences), for
    rank 1 and rank 2 predictions; SquareLearningLoss keeps scikit-learn's
    scale, k times the derivative."""
    case = CASES[name]
    y, p, w = _data(name, shape, seed=1)
    sw = w if weighted else None
    sess = _session(name, np.float64, weighted, len(shape))
    _, grad = _run(sess, y, p, sw)
    numeric = central_differences(lambda q: _run(sess, y, q, sw)[0], p)
    k = p.size // p.shape[0] if case.grad_scale_k else 1
    assert_allclose(grad, k * numeric, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gradient_descent_lowers_the_loss(name, dtype):
    """p <- p - lr * Y_grad on a free prediction, every step through
    onnxruntime, lowers the weighted loss at every step (a gradient of the
    wrong sign, onnxcustom's absolute loss, climbs)."""
    case = CASES[name]
    shape = case.shapes[-1]
    y, p, w = _data(name, shape, seed=2)
    y, p, w = y.astype(dtype), p.astype(dtype), w.astype(dtype)
    sess = _session(name, dtype, True, len(shape))
    lr = dtype(case.lr * shape[0])
    values = []
    for _ in range(6):
        value, grad = _run(sess, y, p, w)
        values.append(value)
        p = p - lr * grad
    values.append(_run(sess, y, p, w)[0])
    assert all(np.isfinite(values))
    assert np.all(np.diff(values) < 0), values
    assert values[-1] < 0.98 * values[0], values


@pytest.mark.parametrize("name,shape", SHAPED)
def test_integer_weights_equal_repeated_rows(name, shape):
    """Integer weights give the value of the data with each row repeated
    that many times, and each row's gradient is the sum of its copies'."""
    y, p, _ = _data(name, shape, seed=3)
    counts = np.array([1, 3, 2, 1, 4, 2, 1, 3][:shape[0]])
    sess_w = _session(name, np.float64, True, len(shape))
    sess = _session(name, np.float64, False, len(shape))
    value_w, grad_w = _run(sess_w, y, p, counts.astype(np.float64))
    value_r, grad_r = _run(sess, np.repeat(y, counts, axis=0), np.repeat(p, counts, axis=0))
    assert_allclose(value_w, value_r, rtol=1e-12)
    rows = np.repeat(np.arange(shape[0]), counts)
    summed = np.stack([grad_r[rows == i].sum(axis=0) for i in range(shape[0])])
    assert_allclose(grad_w, summed, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name,shape", SHAPED)
def test_unit_weights_equal_unweighted(name, shape):
    y, p, _ = _data(name, shape, seed=4)
    value, grad = _run(_session(name, np.float64, False, len(shape)), y, p)
    value_w, grad_w = _run(_session(name, np.float64, True, len(shape)), y, p,
                           np.ones(shape[0]))
    assert_allclose(value_w, value, rtol=1e-12)
    assert_allclose(grad_w, grad, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name,shape", SHAPED)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_loss_per_row_is_consistent_with_the_value(name, shape, dtype):
    """The weighted mean of ``loss_per_row`` is Y (so an estimator's
    ``losses(X, y)`` agrees with its training loss)."""
    y, p, w = _data(name, shape, seed=5)
    y, p, w = y.astype(dtype), p.astype(dtype), w.astype(dtype)
    value, _ = _run(_session(name, dtype, True, len(shape)), y, p, w)
    rows = CASES[name].make().loss_per_row(y, p)
    assert rows.shape == (shape[0],)
    assert_allclose(np.average(rows, weights=w.astype(np.float64)), value,
                    rtol=2e-6 if dtype == np.float32 else 1e-12)


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("opset", [13, 17, 18, 21])
def test_graphs_pass_the_checker_at_several_opsets(name, opset):
    """full_check at several opsets, constants in the prediction's type only,
    and the same value at every opset."""
    shape = CASES[name].shapes[-1]
    y, p, w = _data(name, shape, seed=6)
    for dtype in (np.float32, np.float64):
        loss = CASES[name].make()
        model = loss.build_onnx(ELEM[dtype], opset, weight_name="w", rank=len(shape))
        onnx.checker.check_model(model, full_check=True)
        assert model.opset_import[0].version == opset
        for init in model.graph.initializer:
            assert init.data_type in (ELEM[dtype], TensorProto.INT64), init.name
    value, _ = _run(_session(name, np.float64, True, len(shape), opset=opset), y, p, w)
    value17, _ = _run(_session(name, np.float64, True, len(shape)), y, p, w)
    assert_allclose(value, value17, rtol=1e-14)


@pytest.mark.parametrize("name", list(CASES))
def test_float16_runs(name):
    shape = CASES[name].shapes[-1]
    y, p, w = _data(name, shape, seed=7)
    value, grad = _run(_session(name, np.float16, True, len(shape)), y.astype(np.float16),
                       p.astype(np.float16), w.astype(np.float16))
    expected, expected_grad = _run(_session(name, np.float64, True, len(shape)), y, p, w)
    assert_allclose(value, expected, rtol=2e-2)
    assert np.isfinite(grad).all()
    assert_allclose(grad.astype(np.float64), expected_grad, rtol=5e-2, atol=5e-3)


# ------------------------------------------------------------ loss specifics

def test_absolute_gradient_points_uphill():
    """onnxcustom's defect: its absolute-loss gradient was -w sign(p - y)."""
    y = np.array([[0.0], [0.0], [1.0]])
    p = np.array([[1.0], [-2.0], [1.5]])
    w = np.array([1.0, 2.0, 1.0])
    value, grad = _run(_session("absolute", np.float64, True, 2), y, p, w)
    assert value == pytest.approx((1 + 2 * 2 + 0.5) / 4)
    assert_allclose(grad, [[0.25], [-0.5], [0.25]])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_neglog_sigmoid_large_scores_stay_finite(dtype):
    """|score| = 50 (and 1e4): softplus(s) - y s, never log(sigmoid(s)) of
    a probability that rounded to 0 or 1."""
    y = np.array([[0.0], [1.0], [1.0], [0.0], [1.0], [0.0]], dtype=dtype)
    s = np.array([[50.0], [-50.0], [50.0], [-50.0], [1e4], [-1e4]], dtype=dtype)
    w = np.ones(6, dtype=dtype)
    for weighted in (False, True):
        value, grad = _run(_session("neglog_sigmoid", dtype, weighted, 2), y, s,
                           w if weighted else None)
        assert np.isfinite(value) and np.isfinite(grad).all()
        assert value == pytest.approx(100 / 6, rel=1e-6)
        assert_allclose(grad.ravel(), np.array([1, -1, 0, 0, 0, 0]) / 6, atol=1e-7)
    rows = NegLogLearningLoss().loss_per_row(y, s)
    assert_allclose(rows, [50, 50, 0, 0, 0, 0], atol=1e-6)


def test_neglog_probabilities_are_clipped():
    """Probabilities 0 and 1 are clipped to [eps, 1 - eps]: the value is
    log_loss of the clipped probabilities, and the gradient is 0 where the
    clip is active (the derivative of the clipped value)."""
    eps = 1e-5
    y = np.array([1.0, 0.0, 1.0, 0.0, 1.0])
    p = np.array([0.0, 1.0, 1.0, 0.0, 0.3])
    value, grad = _run(_session("neglog_probability", np.float64, False, 1), y, p)
    assert_allclose(value, log_loss(y, np.clip(p, eps, 1 - eps), labels=[0, 1]),
                    rtol=1e-12)
    assert_allclose(grad, [0, 0, 0, 0, -1 / 0.3 / 5], rtol=1e-12)


def test_neglog_probability_and_sigmoid_agree():
    """The same rows through both modes: the value on sigmoid(s) equals the
    value on s, and the chain rule links the gradients."""
    y, s, w = _data("neglog_sigmoid", (7, 1), seed=8)
    value_s, grad_s = _run(_session("neglog_sigmoid", np.float64, True, 2), y, s, w)
    p = expit(s)
    value_p, grad_p = _run(_session("neglog_probability", np.float64, True, 2), y, p, w)
    assert_allclose(value_p, value_s, rtol=1e-9)
    assert_allclose(grad_p * p * (1 - p), grad_s, rtol=1e-8, atol=1e-12)


def test_cross_entropy_binary_concat_output():
    """A binary classifier's output Concat(1 - p, p) with targets (1 - y, y):
    the binary log loss, and the gradient flowing back through the Concat
    (g[:, 1] - g[:, 0]) is the binary loss's gradient with respect to p."""
    y, p, w = _data("neglog_probability", (7,), seed=9)
    value_b, grad_b = _run(_session("neglog_probability", np.float64, True, 1), y, p, w)
    two_y = np.stack([1 - y, y], axis=1)
    two_p = np.stack([1 - p, p], axis=1)
    value_c, grad_c = _run(_session("cross_entropy", np.float64, True, 2), two_y, two_p, w)
    assert_allclose(value_c, value_b, rtol=1e-12)
    assert_allclose(value_c, log_loss(y, p, sample_weight=w), rtol=1e-12)
    assert_allclose(grad_c[:, 1] - grad_c[:, 0], grad_b, rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cross_entropy_from_logits_is_stable(dtype):
    """Logits of +-1000 give a finite value (LogSoftmax) and the gradient
    softmax(z) - y."""
    y = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], dtype=dtype)
    z = np.array([[1000.0, 0.0, -1000.0], [1000.0, 0.0, -1000.0]], dtype=dtype)
    value, grad = _run(_session("cross_entropy_logits", dtype, False, 2), y, z)
    assert value == pytest.approx(500.0, rel=1e-6)
    assert_allclose(grad, np.array([[0.0, 0, 0], [1, -1, 0]]) / 2, atol=1e-7)
    assert_allclose(CrossEntropyLearningLoss(from_logits=True).loss_per_row(y, z),
                    [0, 1000], atol=1e-6)


def test_cross_entropy_loss_per_row_takes_class_indices():
    y, p, _ = _data("cross_entropy", (8, 4), seed=10)
    loss = CrossEntropyLearningLoss()
    assert_allclose(loss.loss_per_row(y.argmax(axis=1), p), loss.loss_per_row(y, p))


def test_poisson_is_half_the_mean_poisson_deviance():
    """For one output, scikit-learn MLP's poisson_loss (what the graph
    computes) is half of sklearn.metrics.mean_poisson_deviance."""
    y, p, w = _data("poisson", (7,), seed=11)
    for sw in (None, w):
        value, grad = _run(_session("poisson", np.float64, sw is not None, 1), y, p, sw)
        assert_allclose(2 * value, mean_poisson_deviance(y, p, sample_weight=sw),
                        rtol=1e-12)
        row_w = np.ones(7) if sw is None else sw
        assert_allclose(grad, (1 - y / p) * row_w / row_w.sum(), rtol=1e-12)


def test_poisson_floor():
    """Predictions below eps are floored (finite value, zero gradient)."""
    y = np.array([0.0, 2.0, 1.0])
    p = np.array([-1.0, 0.0, 2.0])
    value, grad = _run(_session("poisson", np.float64, False, 1), y, p)
    mu = np.maximum(p, 1e-12)
    expected = np.mean(np.where(y > 0, y * np.log(np.where(y > 0, y, 1) / mu), 0) - y + mu)
    assert np.isfinite(value) and value == pytest.approx(expected, rel=1e-12)
    assert_allclose(grad, [0, 0, (1 - 0.5) / 3])


# ------------------------------------------------------- parameters, aliases

@pytest.mark.parametrize("name,cls", [
    ("square_error", SquareLearningLoss), ("square", SquareLearningLoss),
    ("squared_error", SquareLearningLoss),
    ("absolute_error", AbsoluteLearningLoss), ("absolute", AbsoluteLearningLoss),
    ("elastic_error", ElasticLearningLoss), ("elastic", ElasticLearningLoss),
    ("log", NegLogLearningLoss), ("neglog", NegLogLearningLoss),
    ("logloss", NegLogLearningLoss), ("log_loss", NegLogLearningLoss),
    ("cross_entropy", CrossEntropyLearningLoss), ("poisson", PoissonLearningLoss),
    ("SquareLearningLoss", SquareLearningLoss),
    ("AbsoluteLearningLoss", AbsoluteLearningLoss),
    ("ElasticLearningLoss", ElasticLearningLoss),
    ("NegLogLearningLoss", NegLogLearningLoss),
    ("CrossEntropyLearningLoss", CrossEntropyLearningLoss),
    ("PoissonLearningLoss", PoissonLearningLoss),
])
def test_resolve_aliases(name, cls):
    loss = resolve_learning_loss(name)
    assert type(loss) is cls
    assert loss.get_params() == cls().get_params()


def test_resolve_unknown_and_objects():
    with pytest.raises(ValueError) as info:
        resolve_learning_loss("hinge")
    for accepted in ("absolute_error", "cross_entropy", "poisson", "log",
                     "NegLogLearningLoss"):
        assert repr(accepted) in str(info.value)
    given = ElasticLearningLoss(l1_weight=0.1, l2_weight=2.0)
    resolved = resolve_learning_loss(given)
    assert resolved is not given and resolved.get_params() == given.get_params()
    with pytest.raises(TypeError):
        resolve_learning_loss(ElasticLearningLoss)


def test_default_parameters():
    assert ElasticLearningLoss().get_params() == {"l1_weight": 0.5, "l2_weight": 0.5}
    assert NegLogLearningLoss().get_params() == {
        "eps": 1e-5, "probability_function": "sigmoid"}
    assert CrossEntropyLearningLoss().get_params() == {"eps": 1e-7, "from_logits": False}
    assert PoissonLearningLoss().get_params() == {"eps": 1e-12}
    assert all(issubclass(cls, BaseLearningLoss) for cls in _LOSSES.values())


@pytest.mark.parametrize("loss,match", [
    (ElasticLearningLoss(l1_weight=-1.0), "l1_weight"),
    (ElasticLearningLoss(l2_weight=float("nan")), "l2_weight"),
    (NegLogLearningLoss(probability_function="softmax"), "probability_function"),
    (NegLogLearningLoss(eps=0.0), "eps"),
    (CrossEntropyLearningLoss(eps=1.0), "eps"),
    (CrossEntropyLearningLoss(from_logits="yes"), "from_logits"),
    (PoissonLearningLoss(eps=-1e-3), "eps"),
])
def test_bad_parameters_fail_at_build(loss, match):
    with pytest.raises(ValueError, match=match):
        loss.build_onnx(TensorProto.FLOAT, 17)


def test_bad_rank_and_type():
    with pytest.raises(ValueError, match="rank 2"):
        CrossEntropyLearningLoss().build_onnx(TensorProto.FLOAT, 17, rank=1)
    for cls in set(_LOSSES.values()):
        with pytest.raises(ValueError, match="float element type"):
            cls().build_onnx(TensorProto.INT64, 17)
        with pytest.raises(ValueError, match="rank"):
            cls().build_onnx(TensorProto.FLOAT, 17, rank=3)


def test_probability_function_none_spelling():
    y, p, _ = _data("neglog_probability", (7, 1), seed=12)
    values = []
    for spelling in (None, "none"):
        model = NegLogLearningLoss(probability_function=spelling).build_onnx(
            TensorProto.DOUBLE, 17)
        sess = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"])
        values.append(_run(sess, y, p)[0])
    assert values[0] == values[1]


def test_clip_bounds_in_each_type():
    """eps is stored in the prediction's type; 1 - eps that rounds to 1
    becomes the largest number below 1 (float16)."""
    for dtype in (np.float16, np.float32, np.float64):
        model = NegLogLearningLoss(probability_function=None).build_onnx(ELEM[dtype], 17)
        bounds = sorted(float(numpy_helper.to_array(i)) for i in model.graph.initializer
                        if i.data_type == ELEM[dtype] and i.dims == []
                        and 0 < float(numpy_helper.to_array(i)) < 1)
        lo, hi = bounds[0], bounds[-1]
        assert 0 < lo <= 1e-4 and hi < 1
        assert np.asarray(hi, dtype=dtype) < 1
