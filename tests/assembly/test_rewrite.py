"""onnxtrain.rewrite: ai.onnx.ml linear models rewritten into trainable
standard ops, and the probability / single-output graphs of classifiers,
checked against onnxruntime running the original graphs and against
scikit-learn."""
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from numpy.testing import assert_allclose
from onnx import TensorProto, helper, numpy_helper
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import (LinearRegression, LogisticRegression, Ridge,
                                  SGDRegressor)
from sklearn.neural_network import MLPClassifier
from skl2onnx import to_onnx

from onnxtrain.autodiff import build_gradient_models, trainable_initializers
from onnxtrain.rewrite import (prediction_graph, probability_graph,
                               rewrite_ml_linear_ops)

RNG = np.random.RandomState(0)
X = RNG.randn(60, 4).astype(np.float32)
SCORE = X @ RNG.randn(4) + 0.5
TARGETS = {
    "y1": SCORE + 0.1 * RNG.randn(60),
    "y3": X @ RNG.randn(4, 3) + RNG.randn(3),
    "binary": (SCORE > 0.5).astype(np.int64),
    "multi": np.digitize(SCORE, [-0.5, 1.5]).astype(np.int64),
    "multi_str": np.array(["cat", "dog", "emu"])[np.digitize(SCORE, [-0.5, 1.5])],
    "binary_str": np.array(["no", "yes"])[(SCORE > 0.5).astype(int)],
}
ML = "ai.onnx.ml"
LABEL_OPS = {"ZipMap", "ArgMax", "ArrayFeatureExtractor", "Gather", "LabelEncoder"}


def _session(model):
    return ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"])


def _run(model, x=X):
    return _session(model).run(None, {model.graph.input[0].name: x})


def _proba(value, classes):
    """A probability output as an array (ZipMap's list of dicts too)."""
    if isinstance(value, list):
        return np.array([[row[c] for c in classes] for row in value],
                        dtype=np.float32)
    return value


def _fit(estimator, target):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return estimator.fit(X, TARGETS[target])


_CACHE = {}


def _converted(kind, target, zipmap=None):
    """(fitted estimator, skl2onnx ModelProto); callers must not modify them."""
    key = (kind, target, zipmap)
    if key not in _CACHE:
        estimator = {
            "LinearRegression": LinearRegression,
            "SGDRegressor": lambda: SGDRegressor(random_state=0),
            "Ridge": Ridge,
            "LogisticRegression": LogisticRegression,
            "MLPClassifier": lambda: MLPClassifier(hidden_layer_sizes=(5,),
                                                   max_iter=300, random_state=0),
        }[kind]()
        _fit(estimator, target)
        options = None if zipmap is None else {"zipmap": zipmap}
        _CACHE[key] = estimator, to_onnx(estimator, X[:1], options=options)
    return _CACHE[key]


def _new_weights(original, rewritten):
    before = {i.name for i in original.graph.initializer}
    return [i.name for i in rewritten.graph.initializer
            if i.name not in before and i.data_type == TensorProto.FLOAT
            and len(i.dims) > 0]


def _check_no_ml_linear(model):
    for node in model.graph.node:
        assert not (node.domain == ML and node.op_type in (
            "LinearRegressor", "LinearClassifier", "Normalizer")), node


# --------------------------------------------------------------------------
# rewrite_ml_linear_ops on skl2onnx graphs
# --------------------------------------------------------------------------
@pytest.mark.parametrize("kind,target", [
    ("LinearRegression", "y1"), ("LinearRegression", "y3"),
    ("SGDRegressor", "y1"), ("Ridge", "y1")])
def test_rewrite_regressors(kind, target):
    estimator, onx = _converted(kind, target)
    before = onx.SerializeToString()
    new = rewrite_ml_linear_ops(onx)
    assert onx.SerializeToString() == before
    onnx.checker.check_model(new, full_check=True)
    _check_no_ml_linear(new)
    assert all(op.domain != ML for op in new.opset_import)
    assert any(op.domain == "" for op in new.opset_import)

    expected, = _run(onx)
    got, = _run(new)
    assert got.shape == expected.shape and got.dtype == np.float32
    assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert_allclose(got.reshape(len(X), -1),
                    estimator.predict(X).reshape(len(X), -1), rtol=1e-4, atol=1e-4)

    weights = _new_weights(onx, new)
    assert weights == ["coefficient", "intercepts"]
    assert trainable_initializers(onx) == []  # coefficients in attributes
    assert trainable_initializers(new) == weights
    inits = {i.name: numpy_helper.to_array(i) for i in new.graph.initializer}
    n_targets = 3 if target == "y3" else 1
    assert inits["coefficient"].shape == (4, n_targets)
    assert inits["intercepts"].shape == (1, n_targets)
    assert_allclose(inits["coefficient"], np.asarray(estimator.coef_).reshape(
        n_targets, 4).T, rtol=1e-6)


@pytest.mark.parametrize("zipmap", [False, True])
@pytest.mark.parametrize("target", ["binary", "multi", "multi_str", "binary_str"])
def test_rewrite_logistic_regression(target, zipmap):
    estimator, onx = _converted("LogisticRegression", target, zipmap)
    before = onx.SerializeToString()
    new = rewrite_ml_linear_ops(onx)
    assert onx.SerializeToString() == before
    onnx.checker.check_model(new, full_check=True)
    _check_no_ml_linear(new)
    assert [o.name for o in new.graph.output] == [o.name for o in onx.graph.output]
    for old, out in zip(onx.graph.output, new.graph.output):
        assert old.type == out.type
    assert any(op.domain == ML for op in new.opset_import) == zipmap

    (label0, proba0), (label1, proba1) = _run(onx), _run(new)
    classes = list(estimator.classes_)
    proba0, proba1 = _proba(proba0, classes), _proba(proba1, classes)
    assert label1.dtype == label0.dtype and label1.shape == (len(X),)
    np.testing.assert_array_equal(label1, label0)
    np.testing.assert_array_equal(label1, estimator.predict(X))
    assert proba1.shape == (len(X), len(classes)) and proba1.dtype == np.float32
    assert_allclose(proba1, proba0, rtol=1e-5, atol=1e-6)
    assert_allclose(proba1, estimator.predict_proba(X), atol=1e-5)

    weights = _new_weights(onx, new)
    assert weights == ["coefficient", "intercepts"]
    # with ZipMap the model has no float output: train its probability graph
    trained_on = probability_graph(new)[0] if zipmap else new
    assert trainable_initializers(trained_on) == weights
    inits = {i.name: numpy_helper.to_array(i) for i in new.graph.initializer}
    n_columns = 1 if len(classes) == 2 else len(classes)
    assert inits["coefficient"].shape == (4, n_columns)
    assert inits["intercepts"].shape == (1, n_columns)


@pytest.mark.parametrize("target", ["binary", "multi"])
def test_rewritten_probabilities_are_differentiable(target):
    # the backward graph of sum(proba * G) matches central finite differences
    _, onx = _converted("LogisticRegression", target, False)
    model, name = probability_graph(rewrite_ml_linear_ops(onx))
    wrt = trainable_initializers(model)
    grads = build_gradient_models(model, wrt)
    forward = _session(grads.forward_model)
    backward = _session(grads.backward_model)
    inference = _session(grads.inference_model)
    weights = {i.name: numpy_helper.to_array(i).copy()
               for i in model.graph.initializer if i.name in wrt}
    feeds = {"X": X, **weights}
    saved = dict(zip([o.name for o in grads.forward_model.graph.output],
                     forward.run(None, feeds)))
    G = RNG.randn(*saved[name].shape).astype(np.float32)
    backward_feeds = {grads.grad_output_names[0]: G}
    backward_feeds.update({n: feeds[n] if n in feeds else saved[n]
                           for n in grads.backward_inputs})
    got = dict(zip(grads.grad_names, backward.run(None, backward_feeds)))
    eps = 1e-2
    for w in wrt:
        expected = np.zeros(weights[w].shape)
        for index in np.ndindex(weights[w].shape):
            for sign in (1, -1):
                moved = {k: v.copy() for k, v in weights.items()}
                moved[w][index] += sign * eps
                value, = inference.run(None, {"X": X, **moved})
                expected[index] += sign * (value.astype(np.float64) * G).sum() / (2 * eps)
        assert_allclose(got[f"{w}_grad"], expected, atol=2e-3)


def test_binary_untied():
    estimator, onx = _converted("LogisticRegression", "binary", False)
    new = rewrite_ml_linear_ops(onx, tie_binary=False)
    onnx.checker.check_model(new, full_check=True)
    inits = {i.name: numpy_helper.to_array(i) for i in new.graph.initializer}
    assert inits["coefficient"].shape == (4, 2)
    (label0, proba0), (label1, proba1) = _run(onx), _run(new)
    np.testing.assert_array_equal(label1, label0)
    assert_allclose(proba1, proba0, rtol=1e-5, atol=1e-6)


def test_without_linear_ops_returns_a_copy():
    _, onx = _converted("MLPClassifier", "multi", False)
    new = rewrite_ml_linear_ops(onx)
    assert new is not onx
    assert new.SerializeToString() == onx.SerializeToString()
    # copy=False: the model itself when there is nothing to rewrite, a new
    # model when there is
    assert rewrite_ml_linear_ops(onx, copy=False) is onx
    _, linear = _converted("LogisticRegression", "multi", False)
    before = linear.SerializeToString()
    rewritten = rewrite_ml_linear_ops(linear, copy=False)
    assert rewritten is not linear and linear.SerializeToString() == before
    assert "LinearClassifier" not in {n.op_type for n in rewritten.graph.node}


def test_kept_output_copies_every_other_field():
    """prediction_graph copies only what it keeps: the model's and the
    graph's other fields (metadata, doc strings, functions, producer)
    come along, the caller's model is not modified."""
    _, onx = _converted("MLPClassifier", "multi", False)
    onx.doc_string = "model doc"
    onx.graph.doc_string = "graph doc"
    onx.model_version = 7
    entry = onx.metadata_props.add()
    entry.key, entry.value = "k", "v"
    onx.functions.add().CopyFrom(helper.make_function(
        "custom", "f", ["a"], ["b"], [helper.make_node("Neg", ["a"], ["b"])],
        [helper.make_opsetid("", 17)]))
    before = onx.SerializeToString()
    new = prediction_graph(onx, "probabilities")
    assert onx.SerializeToString() == before
    assert new.doc_string == "model doc" and new.graph.doc_string == "graph doc"
    assert new.model_version == 7 and new.producer_name == onx.producer_name
    assert [(e.key, e.value) for e in new.metadata_props] == [("k", "v")]
    assert [f.name for f in new.functions] == ["f"]
    assert new.graph.name == onx.graph.name
    assert [o.name for o in new.graph.output] == ["probabilities"]


# --------------------------------------------------------------------------
# rewrite_ml_linear_ops on hand-made graphs (onnxruntime's semantics)
# --------------------------------------------------------------------------
def _ml_model(node, outputs, input_type=TensorProto.FLOAT, opsets=(("", 17),),
              initializers=(), n_features=4):
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("X", input_type, [None, n_features])],
        outputs, list(initializers))
    opset_imports = [helper.make_opsetid(d, v) for d, v in opsets]
    opset_imports.append(helper.make_opsetid(ML, 1))
    model = helper.make_model(graph, opset_imports=opset_imports)
    model.ir_version = 8
    return model


def _classifier(coefficients, intercepts, labels, post_transform, input_type=TensorProto.FLOAT):
    is_string = isinstance(labels[0], str)
    kw = {"classlabels_strings" if is_string else "classlabels_ints": labels}
    node = helper.make_node("LinearClassifier", ["X"], ["label", "scores"], domain=ML,
                            coefficients=list(np.ravel(coefficients)),
                            intercepts=list(intercepts), post_transform=post_transform,
                            **kw)
    outputs = [helper.make_tensor_value_info(
        "label", TensorProto.STRING if is_string else TensorProto.INT64, [None]),
        helper.make_tensor_value_info("scores", TensorProto.FLOAT, [None, None])]
    return _ml_model(node, outputs, input_type)


def _compare(model, x=X):
    new = rewrite_ml_linear_ops(model)
    onnx.checker.check_model(new, full_check=True)
    _check_no_ml_linear(new)
    expected, got = _run(model, x), _run(new, x)
    for e, g in zip(expected, got):
        assert e.shape == g.shape and e.dtype == g.dtype
        if e.dtype == np.float32:
            assert_allclose(g, e, rtol=1e-5, atol=1e-6)
        else:
            np.testing.assert_array_equal(g, e)
    return new


@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"])
@pytest.mark.parametrize("labels", [[3, 7], ["a", "b"]])
def test_one_coefficient_row(post, labels):
    # onnxruntime writes (-z, z), through a sigmoid only when LOGISTIC
    new = _compare(_classifier(RNG.randn(4), [0.2], labels, post))
    assert trainable_initializers(new) == ["coefficient", "intercepts"]


@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"])
def test_several_rows(post):
    coefficients = RNG.randn(3, 4)
    coefficients[1] = 0  # a score exactly 0 (SOFTMAX_ZERO leaves it out)
    new = _compare(_classifier(coefficients, [0.1, 0.0, -0.3], [10, 20, 30], post))
    assert trainable_initializers(new) == ["coefficient", "intercepts"]


def test_double_input_is_cast():
    model = _classifier(RNG.randn(2, 4), [0.1, -0.1], ["u", "v"], "SOFTMAX",
                        input_type=TensorProto.DOUBLE)
    new = _compare(model, X.astype(np.float64))
    assert new.graph.node[0].op_type == "Cast"


def test_regressor_layout_without_intercepts_and_ml_only_opset():
    coefficients = RNG.randn(2, 4)  # (targets, n_features), rows contiguous
    node = helper.make_node("LinearRegressor", ["X"], ["Y"], domain=ML,
                            coefficients=list(coefficients.ravel()), targets=2)
    model = _ml_model(node, [helper.make_tensor_value_info("Y", TensorProto.FLOAT,
                                                           [None, 2])], opsets=())
    assert_allclose(_run(model)[0], X @ coefficients.T, rtol=1e-5, atol=1e-5)
    new = _compare(model)
    assert [(o.domain, o.version) for o in new.opset_import] == [("", 13)]
    inits = {i.name: numpy_helper.to_array(i) for i in new.graph.initializer}
    assert_allclose(inits["intercepts"], np.zeros((1, 2)))


def test_new_names_are_unique():
    taken = numpy_helper.from_array(np.ones((1, 1), dtype=np.float32), "coefficient")
    node = helper.make_node("LinearRegressor", ["X"], ["matmul"], domain=ML,
                            coefficients=[1.0, 2.0, 3.0, 4.0], intercepts=[0.5])
    add = helper.make_node("Add", ["matmul", "coefficient"], ["Y"])
    graph = helper.make_graph(
        [node, add], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None, 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, 1])], [taken])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(ML, 1)])
    model.ir_version = 8
    new = _compare(model)
    names = [i.name for i in new.graph.initializer]
    assert names == ["coefficient", "coefficient_1", "intercepts"]
    outputs = [o for n in new.graph.node for o in n.output]
    assert len(outputs) == len(set(outputs))


def test_unsupported_post_transform():
    with pytest.raises(NotImplementedError, match="PROBIT"):
        rewrite_ml_linear_ops(_classifier(RNG.randn(2, 4), [0.0, 0.0], [0, 1], "PROBIT"))
    node = helper.make_node("LinearRegressor", ["X"], ["Y"], domain=ML,
                            coefficients=[1.0, 2.0, 3.0, 4.0], post_transform="LOGISTIC")
    model = _ml_model(node, [helper.make_tensor_value_info("Y", TensorProto.FLOAT,
                                                           [None, 1])])
    before = model.SerializeToString()
    with pytest.raises(NotImplementedError, match="LOGISTIC"):
        rewrite_ml_linear_ops(model)
    assert model.SerializeToString() == before


def test_inconsistent_attributes():
    with pytest.raises(ValueError, match="class labels"):
        rewrite_ml_linear_ops(_classifier(RNG.randn(3, 4), [0.0] * 3, [0, 1], "NONE"))
    with pytest.raises(ValueError, match="features"):
        rewrite_ml_linear_ops(_classifier(RNG.randn(2, 5), [0.0] * 2, [0, 1], "NONE"))


# --------------------------------------------------------------------------
# probability_graph / prediction_graph
# --------------------------------------------------------------------------
@pytest.mark.parametrize("zipmap", [False, True])
@pytest.mark.parametrize("kind,target", [
    ("MLPClassifier", "binary"), ("MLPClassifier", "multi"),
    ("MLPClassifier", "multi_str"), ("LogisticRegression", "binary"),
    ("LogisticRegression", "multi")])
def test_probability_graph(kind, target, zipmap):
    estimator, onx = _converted(kind, target, zipmap)
    source = rewrite_ml_linear_ops(onx) if kind == "LogisticRegression" else onx
    before = source.SerializeToString()
    proba_model, name = probability_graph(source)
    assert source.SerializeToString() == before
    onnx.checker.check_model(proba_model, full_check=True)
    n_classes = len(estimator.classes_)

    assert [o.name for o in proba_model.graph.output] == [name]
    out_type = proba_model.graph.output[0].type.tensor_type
    assert out_type.elem_type == TensorProto.FLOAT
    assert [d.dim_value for d in out_type.shape.dim] == [0, n_classes]
    produced = {o for n in source.graph.node for o in n.output}
    assert name in produced  # named as in the original graph
    ops = {n.op_type for n in proba_model.graph.node}
    assert not ops & LABEL_OPS, ops
    assert all(op.domain != ML for op in proba_model.opset_import)
    init_names = {i.name for i in proba_model.graph.initializer}
    assert "classes" not in init_names and "shape_tensor" not in init_names

    got, = _run(proba_model)
    assert got.shape == (len(X), n_classes)
    assert_allclose(got, estimator.predict_proba(X), atol=1e-5)

    weights = trainable_initializers(proba_model)
    if kind == "MLPClassifier":
        assert weights == ["coefficient", "intercepts", "coefficient1", "intercepts1"]
    else:
        assert weights == ["coefficient", "intercepts"]


def test_probability_graph_without_probabilities():
    _, onx = _converted("MLPClassifier", "multi", False)
    labels_only = prediction_graph(onx, "label")
    with pytest.raises(ValueError, match="no float probability tensor"):
        probability_graph(labels_only)


def test_prediction_graph():
    estimator, onx = _converted("MLPClassifier", "multi_str", True)
    before = onx.SerializeToString()
    labels = prediction_graph(onx, "output_label")
    assert onx.SerializeToString() == before
    onnx.checker.check_model(labels, full_check=True)
    assert [o.name for o in labels.graph.output] == ["output_label"]
    assert "ZipMap" not in {n.op_type for n in labels.graph.node}
    np.testing.assert_array_equal(_run(labels)[0], estimator.predict(X))

    logits = prediction_graph(onx, "add_result1")  # an intermediate value
    onnx.checker.check_model(logits, full_check=True)
    assert {n.op_type for n in logits.graph.node} == {"Cast", "MatMul", "Add", "Relu"}
    assert [i.name for i in logits.graph.initializer] == [
        "coefficient", "intercepts", "coefficient1", "intercepts1"]
    assert _run(logits)[0].shape == (len(X), 3)

    with pytest.raises(ValueError, match="no float tensor output"):
        prediction_graph(onx)
    with pytest.raises(ValueError, match="not a value of the graph"):
        prediction_graph(onx, "nope")


def test_prediction_graph_of_a_regressor():
    estimator, onx = _converted("LinearRegression", "y3")
    new = prediction_graph(rewrite_ml_linear_ops(onx))
    assert [o.name for o in new.graph.output] == ["variable"]
    assert_allclose(_run(new)[0], estimator.predict(X), rtol=1e-4, atol=1e-4)
