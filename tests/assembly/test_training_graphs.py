"""The thin builders of assembly/training_graphs.py: the split path's
graphs go through the pipeline (prepare, reverse, finish) and give the
gradients of the low-level :func:`onnxtrain.autodiff.build_gradient_models`
and those of finite differences; the fused step takes the loss and the
update as emitters writing into its builder."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from gradcheck import numeric_gradient, relative_error, run, session, split_gradients
from onnxtrain.assembly.pipeline import prepare
from onnxtrain.assembly.training_graphs import (build_split_models, build_training_step,
                                                loss_emitter, update_emitter)
from onnxtrain.autodiff import build_gradient_models
from onnxtrain.graph.training_mode import with_running_statistics_updates
from onnxtrain.losses import SquareLearningLoss
from onnxtrain.optim import LearningRateSGD


def _model(nodes, x_shape, values, dtype=TensorProto.FLOAT):
    """The opset-17 model of ``nodes`` from X (``x_shape``) to Y (N, 1),
    its initializers ``values`` (name -> array, floats cast to ``dtype``)."""
    np_type = helper.tensor_dtype_to_np_dtype(dtype)
    inits = [numpy_helper.from_array(v if v.dtype.kind == "i" else v.astype(np_type), n)
             for n, v in values.items()]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", dtype, x_shape)],
                              [helper.make_tensor_value_info("Y", dtype, [None, 1])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _mlp(dtype=TensorProto.DOUBLE):
    """Y = tanh(X W1 + b1) W2: (N, 3) -> (N, 1)."""
    rng = np.random.default_rng(0)
    values = {"W1": rng.normal(size=(3, 4)), "b1": rng.normal(size=(4,)),
              "W2": rng.normal(size=(4, 1))}
    nodes = [helper.make_node("MatMul", ["X", "W1"], ["h0"]),
             helper.make_node("Add", ["h0", "b1"], ["h1"]),
             helper.make_node("Tanh", ["h1"], ["h"]),
             helper.make_node("MatMul", ["h", "W2"], ["Y"])]
    return _model(nodes, [None, 3], values, dtype)


def _cnn(batchnorm):
    """X (N, 2, 3, 3) -> Conv 3x3 pads 1 (3 channels, 9 output pixels:
    lowered to a product by the pipeline) [-> BatchNormalization in
    training mode] -> Relu -> (N, 27) -> MatMul -> Y (N, 1)."""
    rng = np.random.default_rng(1)
    values = {"W": 0.4 * rng.normal(size=(3, 2, 3, 3)), "B": rng.normal(size=(3,)),
              "W2": 0.2 * rng.normal(size=(27, 1)), "scale": 1 + rng.random(3),
              "bias": rng.normal(size=(3,)), "mean": rng.normal(size=(3,)),
              "var": 1 + rng.random(3)}
    values["shape"] = np.array([0, 27], np.int64)
    nodes = [helper.make_node("Conv", ["X", "W", "B"], ["conv"], pads=[1, 1, 1, 1])]
    if batchnorm:
        nodes.append(helper.make_node(
            "BatchNormalization", ["conv", "scale", "bias", "mean", "var"],
            ["normed", "bn_mean", "bn_var"], training_mode=1, momentum=0.8))
    nodes += [helper.make_node("Relu", ["normed" if batchnorm else "conv"], ["relu"]),
              helper.make_node("Reshape", ["relu", "shape"], ["flat"]),
              helper.make_node("MatMul", ["flat", "W2"], ["Y"])]
    return _model(nodes, [None, 2, 3, 3], values)


def _feeds(model, X, wrt, buffers=()):
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    feeds = {"X": X}
    feeds.update({n: inits[n] for n in list(wrt) + list(buffers)})
    return feeds


def test_split_models_of_the_pipeline_match_finite_differences():
    model = _mlp()
    wrt = ["W1", "b1", "W2"]
    X = np.random.default_rng(2).normal(size=(5, 3))
    models = build_split_models(prepare(model, wrt), wrt)
    feeds = _feeds(model, X, wrt)
    grad_y = np.random.default_rng(3).normal(size=(5, 1))
    _, grads = split_gradients(models, feeds, {"Y": grad_y})
    reference = build_gradient_models(model, wrt)
    _, expected = split_gradients(reference, feeds, {"Y": grad_y})
    inference = session(models.inference_model)
    for w in wrt:
        numeric = numeric_gradient(inference, feeds, w, {"Y": grad_y})
        assert relative_error(numeric, grads[w]) < 1e-7
        np.testing.assert_allclose(grads[w], expected[w], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("batchnorm", [False, True])
def test_split_models_of_the_pipeline_match_the_low_level_ones(batchnorm):
    """The pipeline lowers the small Conv and, on the CPU, lets the
    running statistics' updates read the node's batch statistics: the
    gradients, the outputs and the updated statistics stay those of
    build_gradient_models on the model with the plain updates."""
    model = _cnn(batchnorm)
    wrt = ["W", "B", "W2"] + (["scale", "bias"] if batchnorm else [])
    prepared = prepare(model, wrt, statistics={"node_statistics": True})
    assert "Conv" not in {n.op_type for n in prepared.model.graph.node}
    assert prepared.buffers == (["mean", "var"] if batchnorm else [])
    plain = with_running_statistics_updates(model)[0]
    outputs = ["Y"]
    models = build_split_models(prepared, wrt, outputs)
    reference = build_gradient_models(plain, wrt, outputs)
    X = np.random.default_rng(4).normal(size=(6, 2, 3, 3)).astype(np.float32)
    feeds = _feeds(model, X, wrt, prepared.buffers)
    grad_y = np.random.default_rng(5).normal(size=(6, 1)).astype(np.float32)
    forward, grads = split_gradients(models, feeds, {"Y": grad_y})
    expected_forward, expected = split_gradients(reference, feeds, {"Y": grad_y})
    names = ["Y"] + [f"{b}__new" for b in prepared.buffers]
    for name in names:
        np.testing.assert_allclose(forward[name], expected_forward[name],
                                   rtol=1e-5, atol=1e-5)
    for w in wrt:
        np.testing.assert_allclose(grads[w], expected[w], rtol=1e-4, atol=1e-5)
    prediction = run(session(models.inference_model), feeds)["Y"]
    np.testing.assert_allclose(prediction, forward["Y"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("graph_of", ["loss", "update"])
def test_training_step_refuses_graphs_for_the_loss_or_the_update(graph_of):
    """The loss and the update rule write their nodes into the step's
    builder; a graph (ModelProto) in their place is refused before any
    work, naming the argument."""
    model = _mlp(TensorProto.FLOAT)
    wrt = ["W1", "b1", "W2"]
    rate = LearningRateSGD(0.1, learning_rate="constant")
    loss = loss_emitter(SquareLearningLoss(), TensorProto.FLOAT, 2)
    update = update_emitter(rate, wrt, TensorProto.FLOAT)
    if graph_of == "loss":
        loss = SquareLearningLoss().build_onnx(TensorProto.FLOAT, 17, rank=2)
    else:
        update = rate.build_onnx([(w, None) for w in wrt], TensorProto.FLOAT, 17,
                                 None, [])
    name = f"{graph_of}_model"
    with pytest.raises(TypeError, match=f"{name} must be an emitter.*ModelProto"):
        build_training_step(model, wrt, loss, update, rate.state_names,
                            rate.scalar_names)


def test_training_graphs_build_the_split_models_of_their_model_once():
    """The runner's engine passes the graphs' own model: one build, cached;
    another model (the former signature's call) is differentiated as it
    is."""
    from onnxtrain.assembly.training_graphs import TrainingGraphs
    model = _mlp()
    wrt = ["W1", "b1", "W2"]
    graphs = TrainingGraphs(model, wrt, LearningRateSGD(0.1), None)
    models = graphs.split(graphs.model, ["Y"])
    assert graphs.split(None, ["Y"]) is models
    other = _mlp()
    other.graph.node[2].op_type = "Sigmoid"
    feeds = _feeds(other, np.random.default_rng(6).normal(size=(4, 3)), wrt)
    grad_y = np.ones((4, 1))
    grads = split_gradients(graphs.split(other, ["Y"]), feeds, {"Y": grad_y})[1]
    expected = split_gradients(build_gradient_models(other, wrt), feeds,
                               {"Y": grad_y})[1]
    assert graphs.split(None, ["Y"]) is models
    for w in wrt:
        np.testing.assert_allclose(grads[w], expected[w], rtol=1e-12)
        assert not np.allclose(grads[w], split_gradients(
            models, feeds, {"Y": grad_y})[1][w])


def _two_batchnorms():
    """X (N, 2, 3, 3) -> BatchNormalization -> Conv 1x1 -> BatchNormalization
    -> (N, 18) -> MatMul -> Y (N, 1); the nodes unnamed (a graph written by
    hand, or by a converter that leaves names out)."""
    rng = np.random.default_rng(7)
    values = {"s1": 1 + rng.random(2), "b1": rng.normal(size=(2,)), "m1": np.zeros(2),
              "v1": np.ones(2), "W": 0.5 * rng.normal(size=(2, 2, 1, 1)),
              "s2": 1 + rng.random(2), "b2": rng.normal(size=(2,)), "m2": np.zeros(2),
              "v2": np.ones(2), "W2": 0.3 * rng.normal(size=(18, 1))}
    values["shape"] = np.array([0, 18], np.int64)
    nodes = [helper.make_node("BatchNormalization", ["X", "s1", "b1", "m1", "v1"],
                              ["n1", "mean1", "var1"], training_mode=1),
             helper.make_node("Conv", ["n1", "W"], ["c"], kernel_shape=[1, 1]),
             helper.make_node("BatchNormalization", ["c", "s2", "b2", "m2", "v2"],
                              ["n2", "mean2", "var2"], training_mode=1),
             helper.make_node("Reshape", ["n2", "shape"], ["flat"]),
             helper.make_node("MatMul", ["flat", "W2"], ["Y"])]
    return _model(nodes, [None, 2, 3, 3], values)


def test_unnamed_batchnorms_train_alike_on_every_path():
    """The nodes reading their batch statistics get names of their own
    (onnxruntime refuses two nodes named alike), and the paths agree."""
    from onnxtrain import OrtGradientForwardBackwardOptimizer
    from onnxtrain.graph.training_mode import NODE_STATISTICS
    prepared = prepare(_two_batchnorms(), ["W", "W2"],
                       statistics={"node_statistics": True})
    names = [n.name for n in prepared.model.graph.node
             if n.op_type == "BatchNormalization"]
    assert len(set(names)) == 2 and all(n.startswith(NODE_STATISTICS) for n in names)
    rng = np.random.default_rng(8)
    X = rng.normal(size=(40, 2, 3, 3)).astype(np.float32)
    y = X.reshape(40, -1)[:, :4].sum(axis=1).astype(np.float32)
    fits = [OrtGradientForwardBackwardOptimizer(
        _two_batchnorms(), max_iter=3, batch_size=10, learning_rate=0.01,
        training_path=path).fit(X, y) for path in ("split", "fused", "loop")]
    for fit in fits[1:]:
        np.testing.assert_allclose(fit.train_losses_, fits[0].train_losses_, rtol=1e-5)
        for name, value in fits[0]._trainer.get_buffers().items():
            np.testing.assert_allclose(fit._trainer.get_buffers()[name], value,
                                       rtol=1e-5, atol=1e-6)
    assert not np.allclose(fits[0]._trainer.get_buffers()["m2"], 0)
