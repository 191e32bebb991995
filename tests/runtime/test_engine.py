"""The forward/backward engine ``OrtGradientForwardBackward`` on skl2onnx
MLP graphs: forward against onnxruntime on the original graph, backward
against central finite differences in float64, inputs as numpy or
OrtValue, devices and the models it exposes."""
import pickle

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from numpy.testing import assert_allclose
from onnx import TensorProto, helper, numpy_helper

from onnxtrain import DeviceError, OrtGradientForwardBackward
from onnxtrain.runtime import Device, parse_device, to_ortvalue

MLP_WEIGHTS = ["coefficient", "intercepts", "coefficient1", "intercepts1"]


def _reference(model, X):
    """The original graph (weights as initializers) run by onnxruntime."""
    sess = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"])
    return sess.run(None, {"X": X})[0]


def _initializers(model):
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


@pytest.fixture(scope="module")
def X5():
    return np.random.RandomState(3).randn(13, 5).astype(np.float32)


def test_default_weights_and_graph_initializers(mlp_onnx):
    model = mlp_onnx()
    engine = OrtGradientForwardBackward(model, device="cpu")
    assert engine.weights_to_train == MLP_WEIGHTS  # never the int64 shape_tensor
    assert engine.input_names == ["X"]
    assert engine.output_names == ["variable"]
    assert str(engine.device) == "cpu"
    inits = _initializers(model)
    for name, value in zip(engine.weights_to_train, engine.get_weights()):
        assert_allclose(value, inits[name], rtol=0, atol=0)


@pytest.mark.parametrize("activation", ["relu", "tanh", "logistic", "identity"])
def test_forward_equals_inference_graph(mlp_onnx, X5, activation):
    model = mlp_onnx(hidden=(8, 3), activation=activation)
    expected = _reference(model, X5)
    engine = OrtGradientForwardBackward(model, device="cpu")
    train_out = engine.forward([X5], training=True)
    assert len(train_out) == 1
    assert_allclose(train_out[0].numpy(), expected, rtol=1e-6, atol=1e-6)
    infer_out = engine.forward([X5], training=False)
    assert_allclose(infer_out[0].numpy(), expected, rtol=1e-6, atol=1e-6)
    assert infer_out[0].numpy().shape == (13, 1)


def test_forward_follows_set_weights(mlp_onnx, X5):
    """Predictions use the engine's weights, not the graph's initializers."""
    model = mlp_onnx()
    engine = OrtGradientForwardBackward(model)
    rng = np.random.RandomState(0)
    new = {n: rng.randn(*w.shape).astype(np.float32)
           for n, w in zip(engine.weights_to_train, engine.get_weights())}
    engine.set_weights(new)
    changed = onnx.ModelProto()
    changed.CopyFrom(model)
    for init in changed.graph.initializer:
        if init.name in new:
            init.CopyFrom(numpy_helper.from_array(new[init.name], init.name))
    out = engine.forward([X5], training=False)[0].numpy()
    assert_allclose(out, _reference(changed, X5), rtol=1e-5, atol=1e-6)
    assert not np.allclose(out, _reference(model, X5), atol=1e-3)


def _loss_like(engine, X, G):
    """sum(prediction * G): its gradient is what backward([G]) returns."""
    out = engine.forward([X], training=False)[0].numpy()
    return float(np.sum(out.astype(np.float64) * G))


def _finite_differences(engine, X, G, eps=1e-6):
    base = [w.astype(np.float64) for w in engine.get_weights()]
    grads = []
    for k, w in enumerate(base):
        grad = np.zeros_like(w)
        for idx in np.ndindex(w.shape):
            values = []
            for sign in (1, -1):
                moved = [b.copy() for b in base]
                moved[k][idx] += sign * eps
                engine.set_weights(moved)
                values.append(_loss_like(engine, X, G))
            grad[idx] = (values[0] - values[1]) / (2 * eps)
        grads.append(grad)
    engine.set_weights(base)
    return grads


@pytest.mark.parametrize("activation", ["relu", "tanh", "logistic"])
def test_backward_equals_finite_differences_float64(mlp_onnx, activation):
    model = mlp_onnx(hidden=(6, 4), activation=activation, n_features=3, n_outputs=2,
                     dtype=np.float64)
    engine = OrtGradientForwardBackward(model, device="cpu")
    assert engine.weights_to_train == MLP_WEIGHTS + ["coefficient2", "intercepts2"]
    rng = np.random.RandomState(1)
    X = rng.randn(9, 3)
    G = rng.randn(9, 2)
    out = engine.forward([X], training=True)
    assert out[0].numpy().dtype == np.float64
    grads = [g.numpy() for g in engine.backward([G])]
    numeric = _finite_differences(engine, X, G)
    assert len(grads) == len(numeric) == 6
    for name, g, n in zip(engine.weights_to_train, grads, numeric):
        assert g.shape == n.shape, name
        assert g.dtype == np.float64, name
        err = np.max(np.abs(g - n)) / max(np.max(np.abs(n)), 1e-12)
        assert err < 1e-6, (name, err)


def test_backward_subset_of_weights(mlp_onnx):
    """Training only some weights: one gradient per trained weight, equal to
    the full engine's gradient of that weight."""
    model = mlp_onnx(dtype=np.float64)
    X = np.random.RandomState(2).randn(7, 5)
    G = np.random.RandomState(3).randn(7, 1)
    full = OrtGradientForwardBackward(model)
    full.forward([X])
    full_grads = dict(zip(full.weights_to_train, full.backward([G])))
    part = OrtGradientForwardBackward(model, ["intercepts1", "coefficient"])
    assert part.weights_to_train == ["intercepts1", "coefficient"]
    part.forward([X])
    grads = part.backward([G])
    assert len(grads) == 2
    assert_allclose(grads[0].numpy(), full_grads["intercepts1"].numpy(), rtol=1e-12)
    assert_allclose(grads[1].numpy(), full_grads["coefficient"].numpy(), rtol=1e-12)
    # the last layer's bias gradient is the column sum of G
    assert_allclose(grads[0].numpy(), G.sum(axis=0, keepdims=True), rtol=1e-12)


def test_numpy_and_ortvalue_inputs(mlp_onnx, X5):
    model = mlp_onnx()
    engine = OrtGradientForwardBackward(model)
    G = np.random.RandomState(4).randn(13, 1).astype(np.float32)
    out_np = engine.forward([X5])[0].numpy()
    grads_np = [g.numpy() for g in engine.backward([G])]
    out_ov = engine.forward([to_ortvalue(X5)])[0].numpy()
    grads_ov = [g.numpy() for g in engine.backward([to_ortvalue(G)])]
    out_dict = engine.forward({"X": ort.OrtValue.ortvalue_from_numpy(X5)})[0].numpy()
    grads_single = [g.numpy() for g in engine.backward(G)]
    assert_allclose(out_ov, out_np, rtol=0, atol=0)
    assert_allclose(out_dict, out_np, rtol=0, atol=0)
    for a, b, c in zip(grads_np, grads_ov, grads_single):
        assert_allclose(b, a, rtol=0, atol=0)
        assert_allclose(c, a, rtol=0, atol=0)
    # float64 numpy input into a float32 graph: cast to the input's type
    out64 = engine.forward([X5.astype(np.float64)])[0].numpy()
    assert out64.dtype == np.float32
    assert_allclose(out64, out_np, rtol=0, atol=0)


def test_backward_needs_training_forward(mlp_onnx, X5):
    engine = OrtGradientForwardBackward(mlp_onnx())
    G = np.ones((13, 1), dtype=np.float32)
    with pytest.raises(RuntimeError, match="forward"):
        engine.backward([G])
    engine.forward([X5], training=False)
    with pytest.raises(RuntimeError, match="forward"):
        engine.backward([G])
    engine.forward([X5], training=True)
    assert len(engine.backward([G])) == 4
    with pytest.raises(ValueError, match="grad_outputs"):
        engine.backward([G, G])


def test_forward_input_errors(mlp_onnx, X5):
    engine = OrtGradientForwardBackward(mlp_onnx())
    with pytest.raises(ValueError, match="missing inputs"):
        engine.forward({"Y": X5})
    with pytest.raises(ValueError, match="takes 1 inputs"):
        engine.forward([X5, X5])


def test_set_weights_errors_and_copies(mlp_onnx):
    engine = OrtGradientForwardBackward(mlp_onnx())
    weights = engine.get_weights()
    weights[0][...] = 123.0  # a copy: the engine's weights do not change
    assert not np.any(engine.get_weights()[0] == 123.0)
    with pytest.raises(ValueError, match="coefficient"):
        engine.set_weights([np.zeros((4, 8), np.float32)] + engine.get_weights()[1:])
    with pytest.raises(ValueError, match="expected 4 tensors"):
        engine.set_weights(engine.get_weights()[:3])
    with pytest.raises(ValueError, match="intercepts1"):
        engine.set_weights(dict(zip(MLP_WEIGHTS[:3], engine.get_weights())))
    by_name = {n: np.full(w.shape, 0.5, np.float64)
               for n, w in zip(MLP_WEIGHTS, engine.get_weights())}
    engine.set_weights(by_name)
    for w in engine.get_weights():
        assert w.dtype == np.float32 and np.all(w == 0.5)
    # the engine copies arrays: editing them afterwards changes nothing
    given = [np.full(w.shape, 0.25, np.float32) for w in engine.get_weights()]
    engine.set_weights(given)
    for g in given:
        g[...] = -7.0
    for w in engine.get_weights():
        assert np.all(w == 0.25)


def test_get_weights_into_given_arrays(mlp_onnx):
    engine = OrtGradientForwardBackward(mlp_onnx())
    out = [np.full(w.shape, -1.0, w.dtype) for w in engine.get_weights()]
    got = engine.get_weights(out=out)
    assert got is out  # the same arrays, the weights copied in
    for a, b in zip(out, engine.get_weights()):
        assert_allclose(a, b, rtol=0, atol=0)
    out[0][...] = 9.0  # still copies: the engine's weights do not change
    assert not np.any(engine.get_weights()[0] == 9.0)
    # arrays of another shape, dtype or count, or read-only: new arrays
    for wrong in ([a.astype(np.float64) for a in out], out[:3],
                  [np.zeros((2, 2), np.float32)] + out[1:]):
        fresh = engine.get_weights(out=wrong)
        assert fresh is not wrong and all(a is not b for a, b in zip(fresh, wrong))
    out[1].flags.writeable = False
    assert engine.get_weights(out=out) is not out


def test_unknown_weights_list_candidates(mlp_onnx):
    with pytest.raises(ValueError, match=r"\['nope'\].*candidates.*coefficient"):
        OrtGradientForwardBackward(mlp_onnx(), ["coefficient", "nope"])
    with pytest.raises(ValueError, match="shape_tensor"):
        OrtGradientForwardBackward(mlp_onnx(), ["shape_tensor"])


def test_model_not_modified(mlp_onnx, X5):
    model = mlp_onnx()
    before = model.SerializeToString()
    engine = OrtGradientForwardBackward(model)
    engine.forward([X5])
    engine.backward([np.ones((13, 1), np.float32)])
    engine.set_weights([np.zeros_like(w) for w in engine.get_weights()])
    assert model.SerializeToString() == before


def test_exposed_models_pass_full_check(mlp_onnx):
    engine = OrtGradientForwardBackward(mlp_onnx(hidden=(8, 3)))
    for model in (engine.forward_model, engine.gradient_model, engine.inference_model):
        onnx.checker.check_model(model, full_check=True)
    grad_outputs = [o.name for o in engine.gradient_model.graph.output]
    assert grad_outputs == [f"{w}_grad" for w in engine.weights_to_train]
    inference_inputs = [i.name for i in engine.inference_model.graph.input]
    assert inference_inputs == ["X"] + engine.weights_to_train
    # seed 004's names for the same models
    assert engine.cls_type_._optimized_pre_grad_model is engine.inference_model
    assert engine.cls_type_._trained_onnx is engine.gradient_model


def test_engine_is_not_picklable(mlp_onnx):
    with pytest.raises(TypeError, match="pickle the estimator"):
        pickle.dumps(OrtGradientForwardBackward(mlp_onnx()))


# ------------------------------------------------------------------ devices

def test_cuda_without_provider_raises_device_error(mlp_onnx):
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("CUDAExecutionProvider is available")
    with pytest.raises(DeviceError, match="onnxruntime-gpu"):
        OrtGradientForwardBackward(mlp_onnx(), device="cuda")
    with pytest.raises(DeviceError, match="CUDAExecutionProvider"):
        parse_device("cuda:1")


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "gpu", "cpu:zero", ""])
def test_invalid_device_raises_device_error(mlp_onnx, device):
    with pytest.raises(DeviceError, match="Unknown device"):
        OrtGradientForwardBackward(mlp_onnx(), device=device)


def test_parse_device():
    assert parse_device("cpu") == Device("cpu", 0)
    assert parse_device(" CPU ") == Device("cpu", 0)
    assert parse_device(Device("cpu")) == Device("cpu", 0)
    assert Device("cuda", 1).providers[0] == ("CUDAExecutionProvider", {"device_id": 1})
    assert str(Device("cuda", 2)) == "cuda:2"


@pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(),
                    reason="needs onnxruntime-gpu and a GPU")
def test_cuda_matches_cpu(mlp_onnx, X5):
    model = mlp_onnx()
    G = np.random.RandomState(0).randn(13, 1).astype(np.float32)
    results = []
    for device in ("cpu", "cuda:0"):
        engine = OrtGradientForwardBackward(model, device=device)
        out = engine.forward([X5])[0]
        results.append([out.numpy()] + [g.numpy() for g in engine.backward([G])])
    for a, b in zip(*results):
        assert_allclose(b, a, rtol=1e-4, atol=1e-5)


# ------------------------------------------------- rank-0 and rank-1 tensors

def _linear_rank1_graph():
    """Y = X @ w + b with w of shape (3,), b rank 0 and Y of shape (N,)."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "w"], ["xw"]),
         helper.make_node("Add", ["xw", "b"], ["Y"])], "linear",
        [helper.make_tensor_value_info("X", TensorProto.DOUBLE, [None, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.DOUBLE, [None])],
        [numpy_helper.from_array(np.array([0.5, -1.0, 2.0]), "w"),
         numpy_helper.from_array(np.array(0.25), "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_rank0_tensors_keep_their_rank():
    """A rank-0 array stays rank 0 on the device (np.ascontiguousarray would
    make it (1,)), so a rank-0 weight keeps its shape and its gradient."""
    assert to_ortvalue(np.array(1.5, dtype=np.float32)).shape() == []
    model = _linear_rank1_graph()
    engine = OrtGradientForwardBackward(model, ["w", "b"])
    assert [w.shape for w in engine.get_weights()] == [(3,), ()]
    X = np.random.RandomState(0).randn(4, 3)
    G = np.array([1.0, -2.0, 0.5, 3.0])
    out = engine.forward([X])[0].numpy()
    assert_allclose(out, X @ [0.5, -1.0, 2.0] + 0.25, rtol=1e-12)
    w_grad, b_grad = [g.numpy() for g in engine.backward([G])]
    assert_allclose(w_grad, X.T @ G, rtol=1e-12)
    assert b_grad.shape == () and b_grad == pytest.approx(G.sum())
    engine.set_weights([np.zeros(3), np.array(1.0)])
    assert_allclose(engine.forward([X], training=False)[0].numpy(), np.ones(4))
    with pytest.raises(ValueError, match="'b' has shape"):
        engine.set_weights([np.zeros(3), np.array([1.0])])


# ------------------------------------------- weights without a gradient path

def _blocked_graph():
    """x (N, 3) -> Mul(x, w) -> Floor -> y; Cast(Mul(x, v) to int64) ->
    Cast back -> z; u is used by no node (w, v and u get no gradient)."""
    nodes = [helper.make_node("Mul", ["x", "w"], ["t"], name="scale"),
             helper.make_node("Floor", ["t"], ["y"], name="floor"),
             helper.make_node("Mul", ["x", "v"], ["s"]),
             helper.make_node("Cast", ["s"], ["si"], to=TensorProto.INT64),
             helper.make_node("Cast", ["si"], ["z"], to=TensorProto.FLOAT)]
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        nodes, "blocked", [helper.make_tensor_value_info("x", f, ["N", 3])],
        [helper.make_tensor_value_info("y", f, ["N", 3]),
         helper.make_tensor_value_info("z", f, ["N", 3])],
        [numpy_helper.from_array(np.ones(3, np.float32), n) for n in "wvu"])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("weights, pattern", [
    (["w"], r"weights_to_train \['w'\] reach the outputs only through "
            r"non-differentiable ops \(Floor node 'floor'\): their gradient is zero"),
    ("w", r"\['w'\] reach the outputs only through non-differentiable ops"),
    (["w", "v"], r"\['w', 'v'\] reach the outputs only through non-differentiable "
                 r"ops \(Floor node 'floor', Cast\)"),
    (["u"], r"weights_to_train \['u'\] do not reach the outputs"),
])
def test_weights_without_a_gradient_path_are_named(weights, pattern):
    """Explicit weights that reach the outputs only through ops without a
    gradient get a message naming them and those ops (not the autodiff's
    'No output among [] depends on ...'), before anything is built."""
    model = _blocked_graph()
    before = model.SerializeToString()
    with pytest.raises(ValueError, match=pattern):
        OrtGradientForwardBackward(model, weights)
    assert model.SerializeToString() == before


def test_an_op_with_float_values_and_int_indices_does_not_stop_the_gradient():
    """TopK passes the gradient through its values (its int64 indices beside
    them do not block it): only the Floor after it is named."""
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Mul", ["x", "w"], ["t"]),
             helper.make_node("TopK", ["t", "k"], ["values", "indices"],
                              name="topk"),
             helper.make_node("Floor", ["values"], ["y"], name="floor")]
    graph = helper.make_graph(
        nodes, "topk_floor", [helper.make_tensor_value_info("x", f, ["N", 3])],
        [helper.make_tensor_value_info("y", f, ["N", 2])],
        [numpy_helper.from_array(np.ones(3, np.float32), "w"),
         numpy_helper.from_array(np.array([2], np.int64), "k")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ValueError, match=r"non-differentiable ops \(Floor node "
                                         r"'floor'\): their gradient is zero"):
        OrtGradientForwardBackward(model, ["w"])


def test_estimator_names_weights_without_a_gradient_path():
    """The estimators train the first output, here Floor(x * w)."""
    from onnxtrain import OrtGradientForwardBackwardOptimizer
    model = _blocked_graph()
    X = np.ones((4, 3), np.float32)
    est = OrtGradientForwardBackwardOptimizer(model, "w", max_iter=1)
    with pytest.raises(ValueError, match=r"weights_to_train \['w'\] reach the "
                       r"outputs only through non-differentiable ops \(Floor "
                       r"node 'floor'\)"):
        est.fit(X, X)
    assert not hasattr(est, "train_losses_")
