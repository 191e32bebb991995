"""onnxcustom's public pieces beyond the estimators, on onnxtrain:
``OrtDataLoader`` (``onnxtrain.data_loader``), ``onnx_derivative`` and
``DerivativeOptions`` (``onnxtrain.grad_helper``), the forward/backward
factory of ``onnxcustom.training.ortgradient`` (``onnxtrain.ortgradient``),
learning-rate objects refusing an unknown schedule when built, and the
estimators' ``scores`` (old name of ``losses``)."""
import gc
import importlib.util
import os
import pickle

import numpy as np
import onnx
import onnxruntime
import pytest
from numpy.testing import assert_allclose
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.capi._pybind_state import OrtValue as C_OrtValue
from sklearn.datasets import make_regression
from sklearn.linear_model import LinearRegression

from onnxtrain import (LearningRateSGD, LearningRateSGDNesterov,
                       OrtGradientForwardBackwardOptimizer, add_loss_output,
                       to_onnx)
from onnxtrain.data_loader import OrtDataLoader
from onnxtrain.exceptions import DeviceError
from onnxtrain.grad_helper import DerivativeOptions, onnx_derivative
from onnxtrain.ortgradient import OrtGradientForwardBackward
from onnxtrain.runtime import to_ortvalue

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _run(model, feeds):
    session = onnxruntime.InferenceSession(model.SerializeToString())
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds)))


# ------------------------------------------------------------ data loader

def _data(n=23, dtype=np.float64):
    X = np.arange(n * 3, dtype=dtype).reshape(n, 3)
    return X, np.arange(n, dtype=dtype) * 10, np.linspace(1, 2, n)


def test_data_loader_in_order_covers_every_row_last_batch_smaller():
    X, y, w = _data()
    loader = OrtDataLoader(X, y, w, batch_size=5, random_iter=False)
    batches = list(loader.iter_numpy())
    assert [b[0].shape[0] for b in batches] == [5, 5, 5, 5, 3]
    assert_allclose(np.vstack([b[0] for b in batches]), X)
    assert_allclose(np.vstack([b[1] for b in batches]), y.reshape(-1, 1))
    assert_allclose(np.concatenate([b[2] for b in batches]), w)
    assert loader.desc == [((23, 3), np.float64), ((23, 1), np.float64),
                           ((23,), np.float64)]
    assert len(loader) == 23 and len(loader.data_ort) == 3
    assert repr(loader) == "OrtDataLoader(..., ..., batch_size=5, device='cpu')"


def test_data_loader_random_iter_is_a_permutation_keeping_rows_together():
    X, y, _ = _data()
    loader = OrtDataLoader(X, y, batch_size=4, random_iter=True)
    np.random.seed(0)
    batches = list(loader.iter_numpy())
    xs = np.vstack([b[0] for b in batches])
    ys = np.vstack([b[1] for b in batches]).ravel()
    assert sorted(ys.tolist()) == sorted(y.tolist())
    assert ys.tolist() != y.tolist()  # shuffled (seed 0)
    assert_allclose(ys, xs[:, 0] / 3 * 10)  # each X row with its own y


def test_data_loader_ortvalues_equal_numpy_batches_and_own_their_buffer():
    X, y, _ = _data(dtype=np.float32)
    loader = OrtDataLoader(X, y, batch_size=10, random_iter=False)
    ort = list(loader.iter_ortvalue())
    assert all(isinstance(v, C_OrtValue) for b in ort for v in b)
    for (xo, yo), (xn, yn) in zip(ort, loader.iter_numpy()):
        assert_allclose(xo.numpy(), xn)
        assert_allclose(yo.numpy(), yn)
    del loader, X
    gc.collect()  # the batches own their buffers (no view of freed arrays)
    assert ort[0][0].numpy()[1, 2] == 5 and ort[-1][1].numpy()[-1, 0] == 220
    # the engine's feeds accept them as they are
    assert_allclose(to_ortvalue(ort[0][0]).numpy(), ort[0][0].numpy())


def test_data_loader_pickles_and_batch_size_zero_gives_one_batch():
    X, y, w = _data()
    loader = pickle.loads(pickle.dumps(
        OrtDataLoader(X, y, w, batch_size=0, random_iter=False)))
    (batch,) = list(loader.iter_ortvalue())
    assert_allclose(batch[0].numpy(), X)
    assert_allclose(batch[2].numpy(), w)


def test_data_loader_errors():
    X, y, w = _data()
    with pytest.raises(ValueError, match=r"y has shape \(22,\)"):
        OrtDataLoader(X, y[:-1])
    with pytest.raises(ValueError, match="sample_weight"):
        OrtDataLoader(X, y, w[:3])
    with pytest.raises(ValueError, match="batch_size"):
        OrtDataLoader(X, y, batch_size=-1)
    with pytest.raises(DeviceError, match="cpu2"):
        OrtDataLoader(X, y, device="cpu2")


# --------------------------------------------------------- onnx_derivative

def _tanh_model(dtype=TensorProto.DOUBLE):
    """Y = tanh(X @ W + B) * X[:, :1]."""
    npd = np.float64 if dtype == TensorProto.DOUBLE else np.float32
    rng = np.random.default_rng(0)
    W = numpy_helper.from_array(rng.normal(size=(3, 2)).astype(npd), "W")
    B = numpy_helper.from_array(rng.normal(size=(2,)).astype(npd), "B")
    starts = numpy_helper.from_array(np.array([0], np.int64), "starts")
    ends = numpy_helper.from_array(np.array([1], np.int64), "ends")
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    nodes = [helper.make_node("MatMul", ["X", "W"], ["xw"]),
             helper.make_node("Add", ["xw", "B"], ["z"]),
             helper.make_node("Tanh", ["z"], ["t"]),
             helper.make_node("Slice", ["X", "starts", "ends", "axes"], ["x0"]),
             helper.make_node("Mul", ["t", "x0"], ["Y"])]
    graph = helper.make_graph(
        nodes, "tanh", [helper.make_tensor_value_info("X", dtype, [None, 3])],
        [helper.make_tensor_value_info("Y", dtype, [None, 2])],
        [W, B, starts, ends, axes])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _forward(X, W, B):
    return np.tanh(X @ W + B) * X[:, :1]


def _finite_difference(f, value, eps=1e-6):
    grad = np.zeros_like(value)
    for idx in np.ndindex(value.shape):
        plus, minus = value.copy(), value.copy()
        plus[idx] += eps
        minus[idx] -= eps
        grad[idx] = (f(plus) - f(minus)) / (2 * eps)
    return grad


def test_onnx_derivative_matches_finite_differences():
    model = _tanh_model()
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    W, B = inits["W"], inits["B"]
    grad = onnx_derivative(model)
    assert [i.name for i in grad.graph.input] == ["X", "W", "B", "Y_grad"]
    assert [o.name for o in grad.graph.output] == ["X_grad", "W_grad", "B_grad"]
    rng = np.random.default_rng(1)
    X, G = rng.normal(size=(4, 3)), rng.normal(size=(4, 2))
    got = _run(grad, {"X": X, "W": W, "B": B, "Y_grad": G})
    # vector-Jacobian products: d/dv sum(G * Y(v))
    assert_allclose(got["X_grad"], _finite_difference(
        lambda x: (G * _forward(x, W, B)).sum(), X), rtol=1e-6, atol=1e-8)
    assert_allclose(got["W_grad"], _finite_difference(
        lambda w: (G * _forward(X, w, B)).sum(), W), rtol=1e-6, atol=1e-8)
    assert_allclose(got["B_grad"], _finite_difference(
        lambda b: (G * _forward(X, W, b)).sum(), B), rtol=1e-6, atol=1e-8)


def test_onnx_derivative_keep_outputs_and_fill_grad():
    model = _tanh_model()
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    X = np.random.default_rng(2).normal(size=(5, 3))
    feeds = {"X": X, "W": inits["W"], "B": inits["B"]}
    kept = onnx_derivative(model, options=DerivativeOptions.KeepOutputs)
    assert [o.name for o in kept.graph.output] == ["Y", "X_grad", "W_grad",
                                                   "B_grad"]
    ones = _run(kept, dict(feeds, Y_grad=np.ones((5, 2))))
    assert_allclose(ones["Y"], _forward(X, inits["W"], inits["B"]), rtol=1e-12)
    filled = onnx_derivative(model, options=DerivativeOptions.KeepOutputs
                             | DerivativeOptions.FillGrad)
    assert "Y_grad" not in [i.name for i in filled.graph.input]
    got = _run(filled, feeds)
    for name in ("Y", "X_grad", "W_grad", "B_grad"):
        assert_allclose(got[name], ones[name], rtol=1e-12)


def test_onnx_derivative_selects_weights_and_inputs():
    model = _tanh_model()
    only_x = onnx_derivative(model, weights=[])
    assert [i.name for i in only_x.graph.input] == ["X", "Y_grad"]
    assert [o.name for o in only_x.graph.output] == ["X_grad"]
    assert {"W", "B"} <= {i.name for i in only_x.graph.initializer}
    only_w = onnx_derivative(model, weights=["W"], inputs=[])
    assert [o.name for o in only_w.graph.output] == ["W_grad"]
    full = onnx_derivative(model)
    X, G = np.ones((2, 3)), np.full((2, 2), 0.5)
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    expected = _run(full, {"X": X, "W": inits["W"], "B": inits["B"],
                           "Y_grad": G})
    assert_allclose(_run(only_x, {"X": X, "Y_grad": G})["X_grad"],
                    expected["X_grad"], rtol=1e-12)
    assert model.graph.input[0].name == "X" and len(model.graph.input) == 1


def test_onnx_derivative_errors():
    model = _tanh_model()
    with pytest.raises(TypeError, match="DerivativeOptions"):
        onnx_derivative(model, options=2)
    with pytest.raises(ValueError, match="KeepOutputs"):
        onnx_derivative(model, options=DerivativeOptions.FillGrad)
    with pytest.raises(NotImplementedError, match="YieldOp"):
        onnx_derivative(model, options=DerivativeOptions.KeepYieldOp)
    with pytest.raises(ValueError, match="no input or weight"):
        onnx_derivative(model, weights=[], inputs=[])
    with pytest.raises(ValueError, match="neither initializers nor inputs"):
        onnx_derivative(model, weights=["nope"])


def _linear_loss_model():
    X, y = make_regression(30, n_features=3, bias=2, random_state=0)
    X, y = X.astype(np.float32), (y / 50).astype(np.float32)
    lr = LinearRegression().fit(X, y)
    onx = to_onnx(lr, X[:1], target_opset=15, black_op={"LinearRegressor"})
    return X, y, lr, add_loss_output(onx)


def test_onnx_derivative_loss_option(tmp_path):
    X, y, lr, model = _linear_loss_model()
    path = str(tmp_path / "grad.onnx")
    grad = onnx_derivative(model, options=DerivativeOptions.Loss, loss="loss",
                           label="label", path_name=path)
    assert onnx.load(path).SerializeToString() == grad.SerializeToString()
    names = [o.name for o in grad.graph.output]
    assert names == ["loss", "variable", "X_grad", "coef_grad",
                     "intercept_grad"]
    assert {i.name for i in grad.graph.input} == {"X", "label", "coef",
                                                  "intercept"}
    coef = lr.coef_.reshape(-1, 1).astype(np.float32) + 0.1
    intercept = np.array([lr.intercept_ - 0.2], np.float32)
    got = _run(grad, {"X": X, "label": y.reshape(-1, 1), "coef": coef,
                      "intercept": intercept})
    # loss = mean((X @ coef + b - y) ** 2) / 2
    d = (X @ coef).ravel() + intercept[0] - y
    assert_allclose(got["loss"], 0.5 * (d ** 2).mean(), rtol=1e-5)
    assert_allclose(got["coef_grad"].ravel(), X.T @ d / len(d), rtol=1e-4)
    assert_allclose(got["intercept_grad"], [d.mean()], rtol=1e-4, atol=1e-7)
    assert_allclose(got["X_grad"], np.outer(d, coef.ravel()) / len(d),
                    rtol=1e-4, atol=1e-7)
    with pytest.raises(ValueError, match="not an output"):
        onnx_derivative(model, options=DerivativeOptions.Loss, loss="nope",
                        label="label", path_name=path)
    with pytest.raises(ValueError, match="label is required"):
        onnx_derivative(model, options=DerivativeOptions.Loss, loss="loss",
                        path_name=path)
    with pytest.raises(ValueError, match="weights must be None"):
        onnx_derivative(model, weights=["coef"], loss="loss", label="label",
                        options=DerivativeOptions.Loss, path_name=path)


# -------------------------------------------- onnxcustom's forward/backward

def _linear():
    X, y = make_regression(20, n_features=4, bias=2, random_state=1)
    X, y = X.astype(np.float32), y.astype(np.float32)
    lr = LinearRegression().fit(X, y)
    onx = to_onnx(lr, X[:1], target_opset=15, black_op={"LinearRegressor"})
    coef = lr.coef_.astype(np.float32).reshape(-1, 1)
    return X, y, lr, onx, coef, np.array([lr.intercept_], np.float32)


def test_ortgradient_factory_layout_and_eval_session():
    X, _, lr, onx, coef, intercept = _linear()
    forback = OrtGradientForwardBackward(onx)
    cls = forback.cls_type_
    assert cls._onx_inp == cls._grad_input_names == ["X", "coef", "intercept"]
    assert cls._onx_out == cls._bw_fetches_names == [
        "X_grad", "coef_grad", "intercept_grad"]
    assert (cls._weights_to_train, cls._input_names, cls._output_names) == (
        ["coef", "intercept"], ["X"], ["variable"])
    got = cls._sess_eval.run(None, {"X": X, "coef": coef * 2,
                                    "intercept": intercept})
    assert_allclose(got[0].ravel(), X @ (2 * coef).ravel() + intercept,
                    rtol=1e-5)
    assert repr(forback) == "OrtGradientForwardBackward(...)"


def test_ortgradient_instance_forward_backward_values():
    X, _, lr, onx, coef, intercept = _linear()
    inst = OrtGradientForwardBackward(onx).new_instance()
    c_x = to_ortvalue(X)._ortvalue  # onnxcustom's callers fed C-level values
    assert isinstance(c_x, C_OrtValue)
    pred = inst.forward([c_x, coef, intercept], training=True)
    assert_allclose(pred[0].numpy().ravel(), lr.predict(X), rtol=1e-4)
    g = np.linspace(-1, 1, X.shape[0]).astype(np.float32).reshape(-1, 1)
    x_grad, coef_grad, b_grad = [v.numpy() for v in inst.backward([g])]
    assert_allclose(x_grad, g @ coef.T, rtol=1e-5)
    assert_allclose(coef_grad, X.T @ g, rtol=1e-4, atol=1e-5)
    assert_allclose(b_grad, g.sum(0), atol=1e-5)
    # onnxcustom's callers pass a (1, n) row for the (n, 1) output and a
    # (k,) weight for a (1, k) one: the same number of elements is reshaped
    again = [v.numpy() for v in inst.backward([g.reshape(1, -1)])]
    assert_allclose(again[1], coef_grad, rtol=1e-6)
    with pytest.raises(ValueError, match="expected"):
        inst.backward([g[:3]])
    with pytest.raises(ValueError, match="3 inputs"):
        inst.forward([X, coef])


def test_ortgradient_eval_forward_pickle_and_errors():
    X, _, lr, onx, coef, intercept = _linear()
    forback = pickle.loads(pickle.dumps(OrtGradientForwardBackward(onx)))
    inst = forback.new_instance()
    out = inst.forward({"X": X, "coef": coef, "intercept": intercept})
    assert_allclose(out[0].numpy().ravel(), lr.predict(X), rtol=1e-4)
    with pytest.raises(RuntimeError, match="training=True"):
        inst.backward([np.ones((X.shape[0], 1), np.float32)])
    with pytest.raises(ValueError, match="at least one"):
        OrtGradientForwardBackward(onx, weights_to_train=[])
    with pytest.raises(ValueError, match="providers"):
        OrtGradientForwardBackward(onx, providers=["NONE"])
    with pytest.raises(ValueError, match="must name every input"):
        OrtGradientForwardBackward(onx, input_names=["Z"])
    with pytest.raises(ValueError, match="nope"):
        OrtGradientForwardBackward(onx, weights_to_train=["nope"])
    with pytest.raises(TypeError, match="weights_to_train"):
        OrtGradientForwardBackward(onx, weights_to_train=[3])


# ------------------------------------------- learning rates and estimators

@pytest.mark.parametrize("cls", [LearningRateSGD, LearningRateSGDNesterov])
def test_learning_rate_refuses_unknown_schedule_when_built(cls):
    with pytest.raises(ValueError, match="'EXC'.*invscaling"):
        cls(learning_rate="EXC")
    assert cls(learning_rate="optimal").learning_rate == "optimal"


def test_scores_is_the_deprecated_name_of_losses():
    X, y, lr, onx, _, _ = _linear()
    est = OrtGradientForwardBackwardOptimizer(
        onx, ["coef", "intercept"], max_iter=2,
        learning_rate=LearningRateSGD(1e-3)).fit(X, y)
    w = np.linspace(1, 2, len(y)).astype(np.float32)
    with pytest.warns(DeprecationWarning, match="losses"):
        scores = est.scores(X, y, w)
    assert_allclose(scores, est.losses(X, y, w), rtol=1e-6)
    assert_allclose(scores, w * 0.5 * (est.predict(X) - y) ** 2, rtol=1e-4)


def test_to_ortvalue_wraps_c_level_ortvalues():
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    value = to_ortvalue(array)._ortvalue
    wrapped = to_ortvalue(value)
    assert isinstance(wrapped, onnxruntime.OrtValue)
    assert_allclose(wrapped.numpy(), array)


# ------------------------------------------------------ the counting script

def _suite_script():
    path = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks",
                        "compat_onnxcustom_suite.py")
    spec = importlib.util.spec_from_file_location("compat_onnxcustom_suite", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_suite_script_rewrites_imports_and_guards_only():
    script = _suite_script()
    source = "\n".join([
        "import numpy",
        "try:",
        "    from onnxruntime import TrainingSession",
        "except ImportError:",
        "    # no training",
        "    TrainingSession = None",
        "try:",
        "    import scipy",
        "except ImportError:",
        "    scipy = None",
        "from mlprodict.onnx_conv import to_onnx",
        "from onnxcustom import __max_supported_opset__ as opset",
        "from onnxcustom.training.sgd_learning_rate import LearningRateSGDRegressor",
        "        from onnxcustom.training.optimizers_partial import (",
        "            OrtGradientForwardBackwardOptimizer)",
        "from onnxcustom.utils.onnx_helper import onnx_rename_weights",
        "from onnxcustom.training import ConvergenceError",
        "from onnxcustom.training.orttraining import add_loss_output",
        "from mlprodict.onnxrt import OnnxInference",
        "from onnxcustom.plotting.unknown import thing",
        'x = "onnxcustom.training.excs"'])
    assert script.rewrite_source(source).splitlines() == [
        "import numpy",
        "TrainingSession = True  # onnxtrain: stock onnxruntime, own gradient graphs",
        "try:",
        "    import scipy",
        "except ImportError:",
        "    scipy = None",
        "from onnxtrain import to_onnx",
        "opset = 15",
        "from onnxtrain.optim import LearningRateSGD as LearningRateSGDRegressor",
        "        from onnxtrain import (",
        "            OrtGradientForwardBackwardOptimizer)",
        "from onnxtrain.models import onnx_rename_weights",
        "from onnxtrain import ConvergenceError",
        "from onnxtrain.models import add_loss_output",
        "from standins import OnnxInference",
        "from onnxcustom.plotting.unknown import thing",
        'x = "onnxcustom.training.excs"']


def test_suite_script_standins_run_a_model(tmp_path):
    script = _suite_script()
    (tmp_path / "standins_copy.py").write_text(script._STANDINS)
    spec = importlib.util.spec_from_file_location(
        "standins_copy", tmp_path / "standins_copy.py")
    standins = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(standins)
    model = _tanh_model(TensorProto.FLOAT)
    feeds = standins.random_feed(model.graph.input, batch=7)
    assert feeds["X"].shape == (7, 3) and feeds["X"].dtype == np.float32
    out = standins.OnnxInference(model).run(feeds)
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    assert_allclose(out["Y"], _forward(feeds["X"], inits["W"], inits["B"]),
                    rtol=1e-5, atol=1e-6)
