"""What onnxcustom's unit tests (``_unittests/ut_training``) pin, on
onnxtrain: ``to_onnx`` with mlprodict's options, ``add_loss_output`` with
onnxcustom's parameters, ``fit(use_numpy=)``, (n, 1) sample weights,
weighted ``losses``, ``select``, ``loop``, ``save_onnx_graph``,
``onnx_rename_weights`` and the estimator repr."""
import os

import numpy as np
import onnx
import onnxruntime
import pytest
from numpy.testing import assert_allclose
from sklearn.datasets import make_classification, make_regression
from sklearn.exceptions import NotFittedError
from sklearn.linear_model import LinearRegression, LogisticRegression

from onnxtrain import (ElasticLearningPenalty, LearningRateSGD,
                       LearningRateSGDNesterov, OrtGradientForwardBackwardOptimizer,
                       OrtGradientOptimizer, add_loss_output, to_onnx)
from onnxtrain.losses import (AbsoluteLearningLoss, BaseLearningLoss,
                              ElasticLearningLoss, NegLogLearningLoss)
from onnxtrain.models import onnx_rename_weights
from onnxtrain.optim import BaseLearningRate
from onnxtrain.penalties import BaseLearningPenalty, NoLearningPenalty

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _regression(n=40):
    X, y = make_regression(n, n_features=3, bias=2, random_state=0)
    X, y = X.astype(np.float32), (y / 50).astype(np.float32)
    lr = LinearRegression().fit(X, y)
    return X, y, lr, to_onnx(lr, X[:1], target_opset=15,
                             black_op={"LinearRegressor"})


def _binary(n=40):
    X, y = make_classification(n, n_features=4, random_state=0)
    X = X.astype(np.float32)
    clf = LogisticRegression().fit(X, y)
    return X, y, clf, to_onnx(clf, X[:1], target_opset=15,
                              black_op={"LinearClassifier"},
                              options={"zipmap": False})


def _run(model, feeds):
    session = onnxruntime.InferenceSession(model.SerializeToString())
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds)))


# --------------------------------------------------------------- to_onnx

def test_to_onnx_passes_black_op_to_skl2onnx():
    X, _, lr, onx = _regression()  # the seed's own call
    ops = {n.op_type for n in onx.graph.node}
    assert "LinearRegressor" not in ops and {"MatMul", "Add"} <= ops
    assert {i.name for i in onx.graph.initializer} >= {"coef", "intercept"}
    assert_allclose(_run(onx, {"X": X})["variable"].ravel(), lr.predict(X),
                    rtol=1e-5)
    named = to_onnx(lr, X[:1], name="linear", target_opset=15,
                    white_op={"MatMul", "Add", "Reshape"}, black_op=None)
    assert named.graph.name == "linear"
    assert {n.op_type for n in named.graph.node} <= {"MatMul", "Add", "Reshape"}


# ------------------------------------------------------- add_loss_output

@pytest.mark.parametrize("score_name,kwargs,per_row", [
    ("squared_error", {}, lambda d: 0.5 * d ** 2),
    ("l2", {}, lambda d: 0.5 * d ** 2),
    ("absolute_error", {}, np.abs),
    ("l1", {}, np.abs),
    ("elastic", {"l1_weight": 0.1, "l2_weight": 0.9},
     lambda d: 0.1 * np.abs(d) + 0.9 * d ** 2),
])
def test_add_loss_output_scores(score_name, kwargs, per_row):
    X, y, lr, onx = _regression()
    target = (y + np.linspace(-1, 1, len(y))).astype(np.float32)
    w = np.linspace(0.5, 2, len(y)).astype(np.float32)
    d = lr.predict(X) - target
    loss = add_loss_output(onx, score_name, weight_name="weight", **kwargs)
    out = _run(loss, {"X": X, "label": target.reshape(-1, 1), "weight": w})
    assert list(out) == ["loss", "variable"]
    assert_allclose(out["loss"], (w * per_row(d)).sum() / w.sum(), rtol=1e-4)


def test_add_loss_output_penalty():
    X, y, lr, onx = _regression()
    loss = add_loss_output(onx, penalty={"coef": {"l1": 0.5, "l2": 0.25},
                                         "intercept": 2.0})
    out = _run(loss, {"X": X, "label": y.reshape(-1, 1)})
    d = lr.predict(X) - y
    expected = (0.5 * d ** 2).mean() + 0.5 * np.abs(lr.coef_).sum() + \
        0.25 * (lr.coef_ ** 2).sum() + 2.0 * lr.intercept_ ** 2
    assert_allclose(out["loss"], expected, rtol=1e-4)
    with pytest.raises(ValueError, match=r"penalty on \['nope'\]"):
        add_loss_output(onx, penalty={"nope": 1.0})
    with pytest.raises(ValueError, match="keys must be 'l1' or 'l2'"):
        add_loss_output(onx, penalty={"coef": {"l3": 1.0}})


def test_add_loss_output_log_on_a_classifier_renames_its_label():
    X, y, clf, onx = _binary()
    assert "label" in [o.name for o in onx.graph.output]
    loss = add_loss_output(onx, "log", output_index="probabilities",
                           weight_name="weight")
    inputs = {i.name: i.type.tensor_type.elem_type for i in loss.graph.input}
    assert inputs == {"X": onnx.TensorProto.FLOAT, "label": onnx.TensorProto.INT64,
                      "weight": onnx.TensorProto.FLOAT}
    w = np.linspace(1, 2, len(y)).astype(np.float32)
    out = _run(loss, {"X": X, "label": y.reshape(-1, 1).astype(np.int64),
                      "weight": w})
    p = np.clip(clf.predict_proba(X)[:, 1], 1e-6, 1 - 1e-6)
    expected = -(w * (y * np.log(p) + (1 - y) * np.log(1 - p))).sum() / w.sum()
    assert_allclose(out["loss"], expected, rtol=1e-4)
    assert onx.graph.output[0].name == "label"  # the caller's model untouched
    assert add_loss_output(onx, "log", output_index=1).graph.output[1].name == \
        "probabilities"


def test_add_loss_output_errors():
    X, _, _, classifier = _binary()
    with pytest.raises(ValueError, match="output_index must say which one"):
        add_loss_output(classifier)
    with pytest.raises(ValueError, match="'nope' is not an output"):
        add_loss_output(classifier, output_index="nope")
    with pytest.raises(ValueError, match=r"names \['X'\] are inputs"):
        add_loss_output(classifier, output_index=1, label_name="X")
    with pytest.raises(ValueError, match="must differ"):
        add_loss_output(classifier, output_index=1, weight_name="label")
    with pytest.raises(TypeError, match="cannot be given with a loss object"):
        add_loss_output(classifier, AbsoluteLearningLoss(), output_index=1, eps=1)
    with pytest.raises(ValueError, match="Unknown learning_loss"):
        add_loss_output(classifier, "nope", output_index=1)


def test_ort_gradient_optimizer_trains_a_log_loss_graph():
    X, y, _, onx = _binary()
    loss = add_loss_output(onx, "log", output_index=1)
    est = OrtGradientOptimizer(loss, ["coef", "intercept"], max_iter=30,
                               learning_rate=LearningRateSGD(0.1, learning_rate="constant"),
                               random_state=0, init="random").fit(X, y.reshape(-1, 1))
    assert est.train_losses_[-1] < 0.5 * est.train_losses_[0]
    assert est.losses(X, y) == pytest.approx(est.train_losses_[-1], rel=0.2)


# ----------------------------------------------------- fit(use_numpy=...)

def test_use_numpy_changes_nothing_and_is_checked():
    X, y, _, onx = _regression()
    loss = add_loss_output(onx)
    for make in (lambda: OrtGradientForwardBackwardOptimizer(onx, max_iter=3,
                                                             random_state=0),
                 lambda: OrtGradientOptimizer(loss, max_iter=3, random_state=0)):
        states = [make().fit(X, y, use_numpy=flag).get_state()
                  for flag in (None, True, False)]
        for state in states[1:]:
            assert_allclose(state[0], states[0][0], rtol=0)
        with pytest.raises(TypeError, match="use_numpy must be None or a bool"):
            make().fit(X, y, use_numpy="yes")


# ------------------------------------------------------- sample weights

def test_column_sample_weights_equal_vectors():
    X, y, _, onx = _regression()
    w = np.linspace(0.5, 2, len(y)).astype(np.float32)
    fb = [OrtGradientForwardBackwardOptimizer(onx, max_iter=3, random_state=0)
          .fit(X, y, weight).get_state() for weight in (w, w.reshape(-1, 1))]
    assert_allclose(fb[0][0], fb[1][0], rtol=1e-6)
    weighted = add_loss_output(onx, weight_name="weight")
    own = [OrtGradientOptimizer(weighted, max_iter=3, random_state=0)
           .fit(X, y, weight).get_state() for weight in (w, w.reshape(-1, 1))]
    assert_allclose(own[0][0], own[1][0], rtol=1e-6)
    with pytest.raises(ValueError, match="sample_weight must have shape"):
        OrtGradientForwardBackwardOptimizer(onx).fit(X, y, np.ones((len(y), 2)))


def test_weighted_losses():
    X, y, _, onx = _regression()
    w = np.linspace(0.5, 2, len(y)).astype(np.float32)
    est = OrtGradientForwardBackwardOptimizer(onx, max_iter=2, random_state=0)
    est.fit(X, y)
    assert_allclose(est.losses(X, y, w.reshape(-1, 1)), est.losses(X, y) * w,
                    rtol=1e-6)
    own = OrtGradientOptimizer(add_loss_output(onx, weight_name="weight"),
                               max_iter=2, random_state=0).fit(X, y)
    prediction = _run(own.get_trained_onnx(onx), {"X": X})["variable"].ravel()
    per_row = 0.5 * (prediction - y) ** 2
    assert own.losses(X, y, w) == pytest.approx((w * per_row).sum() / w.sum(),
                                                rel=1e-4)
    assert own.losses(X, y) == pytest.approx(per_row.mean(), rel=1e-4)


def test_weights_for_a_graph_without_weight_input_are_refused():
    X, y, _, onx = _regression()
    est = OrtGradientOptimizer(add_loss_output(onx), max_iter=2)
    with pytest.raises(ValueError, match="no sample-weight input"):
        est.fit(X, y, np.ones(len(y)))
    with pytest.raises(NotFittedError):
        est.get_state()  # nothing was trained


# -------------------------------------------------- select, loop, repr

def test_select():
    loss = ElasticLearningLoss(l1_weight=0.2)
    assert BaseLearningLoss.select(loss) is loss
    selected = BaseLearningLoss.select("elastic", l1_weight=0.1, l2_weight=0.9)
    assert isinstance(selected, ElasticLearningLoss)
    assert (selected.l1_weight, selected.l2_weight) == (0.1, 0.9)
    assert isinstance(BaseLearningLoss.select("NegLogLearningLoss", eps=1e-3),
                      NegLogLearningLoss)
    assert isinstance(BaseLearningPenalty.select(None), NoLearningPenalty)
    assert BaseLearningPenalty.select("l1l2", l1=0.1).l1 == 0.1
    assert BaseLearningRate.select(0.5).eta0 == 0.5
    assert BaseLearningRate.select("Nesterov", momentum=0.5).momentum == 0.5
    with pytest.raises(ValueError, match="Unknown learning_loss 'nope'"):
        BaseLearningLoss.select("nope")
    with pytest.raises(ValueError, match="Invalid parameter"):
        BaseLearningLoss.select("elastic", l3_weight=1)
    with pytest.raises(TypeError, match="cannot be given"):
        BaseLearningPenalty.select(ElasticLearningPenalty(), l1=1)


#: 'optimal': typw = sqrt(1 / sqrt(1e-4)) = 10, eta_h = 10 / 22,
#: t0 = 1 / (eta_h * 1e-4).
_T0 = 1 / ((10 / 22) * 1e-4)


@pytest.mark.parametrize("schedule,expected", [
    ("constant", lambda t: 0.01 + 0 * t),
    ("invscaling", lambda t: 0.01 / (t + 1) ** 0.25),
    ("optimal", lambda t: 0.01 * _T0 / (_T0 + t)),
])
def test_learning_rate_loop(schedule, expected):
    rate = LearningRateSGD(learning_rate=schedule)
    values = list(rate.loop(50))
    assert_allclose(values, expected(np.arange(50)), rtol=1e-12)
    assert rate.value == pytest.approx(expected(50), rel=1e-12)  # t = n at the end
    assert list(rate.loop(3)) == values[:3]  # a new loop starts again


def test_repr_lists_every_parameter_in_constructor_order():
    X, y, _, onx = _regression()
    est = OrtGradientForwardBackwardOptimizer(onx, max_iter=2)
    assert repr(est).startswith("OrtGradientForwardBackwardOptimizer(model_onnx=")
    est.fit(X, y)
    assert "learning_rate=LearningRateSGD(eta0=0.01, alpha=0.0001, power_t=0.25, " \
        "learning_rate='invscaling')" in repr(est)


# ----------------------------------------- save_onnx_graph, rename weights

def test_save_onnx_graph(tmp_path):
    X, y, _, onx = _regression()
    est = OrtGradientForwardBackwardOptimizer(
        onx, learning_rate=LearningRateSGDNesterov(1e-3), max_iter=2)
    before = est.save_onnx_graph(bytes)
    assert list(before) == ["model_onnx"]
    assert onnx.load_from_string(before["model_onnx"]) == onx
    est.fit(X, y)
    saved = est.save_onnx_graph(str(tmp_path), prefix="p_")
    as_bytes = est.save_onnx_graph(bytes)
    assert saved.keys() == as_bytes.keys()
    axpy = saved["learning_rate"]["axpy_onnx_"]
    assert os.path.basename(axpy) == "p_LRateSGDNesterov.learning_rate.axpy_onnx_.onnx"
    assert os.path.basename(saved["model_onnx"]) == "p_GradFBOptimizer.model_onnx.onnx"
    assert onnx.load(axpy) == est.learning_rate.axpy_onnx_
    assert onnx.load_from_string(as_bytes["learning_loss"]["loss_grad_onnx_"]) == \
        est.learning_loss.loss_grad_onnx_
    # every file written loads (the engine keeps its model without the
    # weights' values: left out)
    def files(tree):
        for value in tree.values():
            yield from files(value) if isinstance(value, dict) else [value]
    written = list(files(saved))
    assert len(written) >= 3
    for path in written:
        onnx.checker.check_model(onnx.load(path))
    with pytest.warns(UserWarning, match="already exists"):
        est.save_onnx_graph(str(tmp_path), prefix="p_")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        est.save_onnx_graph(str(tmp_path / "nope"))
    assert est.learning_rate.save_onnx_graph(bytes).keys() == {"axpy_onnx_"}


def test_onnx_rename_weights():
    X, _, lr, onx = _regression()
    renamed = onnx_rename_weights(onx)
    names = [i.name for i in renamed.graph.initializer]
    assert names == ["I0_coef", "I1_intercept", "I2_shape_tensor"]
    assert names == sorted(names)
    assert [i.name for i in onx.graph.initializer][0] == "coef"  # untouched
    assert_allclose(_run(renamed, {"X": X})["variable"],
                    _run(onx, {"X": X})["variable"])
    est = OrtGradientForwardBackwardOptimizer(renamed, ["I0_coef", "I1_intercept"],
                                              max_iter=2, random_state=0).fit(X, X[:, 0])
    assert est.weights_to_train_ == ["I0_coef", "I1_intercept"]
