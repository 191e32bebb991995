"""Fine-tuning converted scikit-learn models and pipelines (skl2onnx,
float32) from their own weights, with the default choice of the weights
to train: the predictor's coefficients and intercepts, the preprocessing
frozen.

For each model: (a) with a negligible learning rate the estimator predicts
what scikit-learn predicts (the fit starts from the converted weights);
(b) fine-tuning on shifted data improves the held-out score; (c) the graph
``get_trained_onnx`` returns runs in onnxruntime with the estimator's
predictions and keeps the frozen initializers byte for byte.
"""
import functools
import re
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from numpy.testing import assert_allclose, assert_array_equal
from onnx import helper
from sklearn import linear_model as lm
from sklearn.calibration import CalibratedClassifierCV
from sklearn.compose import ColumnTransformer
from sklearn.cross_decomposition import PLSRegression
from sklearn.datasets import load_breast_cancer, load_diabetes, load_iris, load_wine
from sklearn.decomposition import PCA, TruncatedSVD
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
from sklearn.exceptions import ConvergenceWarning
from sklearn.feature_selection import SelectKBest
from sklearn.impute import SimpleImputer
from sklearn.metrics import accuracy_score, r2_score
from sklearn.model_selection import train_test_split
from sklearn.multiclass import OneVsRestClassifier
from sklearn.neural_network import MLPClassifier, MLPRegressor
from sklearn.pipeline import make_pipeline, make_union
from sklearn.preprocessing import (Binarizer, KBinsDiscretizer, MaxAbsScaler,
                                   MinMaxScaler, Normalizer, OneHotEncoder,
                                   PolynomialFeatures, PowerTransformer,
                                   RobustScaler, StandardScaler)
from sklearn.random_projection import GaussianRandomProjection
from sklearn.svm import LinearSVC, LinearSVR
from skl2onnx import to_onnx

from onnxtrain import (OrtGradientForwardBackwardClassifier,
                       OrtGradientForwardBackwardOptimizer)
from onnxtrain.graph import infer_value_types
from onnxtrain.losses import CrossEntropyLearningLoss
from onnxtrain.optim import LearningRateAdam

# --------------------------------------------------------------- the data
_DATA = {}


def _data(name):
    """(X, y) float32, standardized targets for the regression set."""
    if name not in _DATA:
        if name == "diabetes":
            X, y = load_diabetes(return_X_y=True)
            y = (y - y.mean()) / y.std()
            X[:, 1] = X[:, 1] > 0  # sex: 0 or 1 (a OneHotEncoder's category)
        elif name == "cancer":
            X, y = load_breast_cancer(return_X_y=True)
        elif name == "iris":
            X, y = load_iris(return_X_y=True)
        elif name == "iris-str":
            X, y = load_iris(return_X_y=True)
            y = np.array(["setosa", "versicolor", "virginica"])[y]
        else:
            X, y = load_wine(return_X_y=True)
        _DATA[name] = (X.astype(np.float32), y)
    return _DATA[name]


def _with_nan(X, seed=0):
    X = X.copy()
    rng = np.random.RandomState(seed)
    X[rng.rand(*X.shape) < 0.1] = np.nan
    return X


def _mlp_r(**kw):
    return MLPRegressor(hidden_layer_sizes=(8,), max_iter=300, random_state=0, **kw)


def _mlp_c(**kw):
    return MLPClassifier(hidden_layer_sizes=(8,), max_iter=300, random_state=0, **kw)


def _columns(n):
    half = n // 2
    return ColumnTransformer([("std", StandardScaler(), list(range(half))),
                              ("mm", MinMaxScaler(), list(range(half, n)))])


#: name -> (dataset, factory, skl2onnx options[, the predictor's weights
#: when not named coef*/intercept*]); a dataset ending in
#: '-nan' has 10% of its values missing (the pipeline imputes them).
#: skl2onnx refuses a LinearSVC in a pipeline without options naming it.
MODELS = {
    # regressors
    "LinearRegression": ("diabetes", lm.LinearRegression, None),
    "Ridge": ("diabetes", lambda: lm.Ridge(alpha=0.1), None),
    "Lasso": ("diabetes", lambda: lm.Lasso(alpha=0.001), None),
    "ElasticNet": ("diabetes", lambda: lm.ElasticNet(alpha=0.001), None),
    "BayesianRidge": ("diabetes", lm.BayesianRidge, None),
    "HuberRegressor": ("diabetes", lm.HuberRegressor, None),
    "LinearSVR": ("diabetes", lambda: LinearSVR(random_state=0), None),
    "Scaler+SGDRegressor": ("diabetes", lambda: make_pipeline(
        StandardScaler(), lm.SGDRegressor(random_state=0)), None),
    "Scaler+Ridge": ("diabetes", lambda: make_pipeline(StandardScaler(), lm.Ridge()), None),
    "MinMax+LinearRegression": ("diabetes", lambda: make_pipeline(
        MinMaxScaler(), lm.LinearRegression()), None),
    "PCA+LinearRegression": ("diabetes", lambda: make_pipeline(
        PCA(6, random_state=0), lm.LinearRegression()), None),
    "Imputer+Scaler+Ridge": ("diabetes-nan", lambda: make_pipeline(
        SimpleImputer(), StandardScaler(), lm.Ridge()), None),
    "ColumnTransformer+Ridge": ("diabetes", lambda: make_pipeline(
        _columns(10), lm.Ridge()), None),
    "Normalizer+Ridge": ("diabetes", lambda: make_pipeline(
        Normalizer(), lm.Ridge(0.01)), None),
    "OneHotEncoder+Scaler+Ridge": ("diabetes", lambda: make_pipeline(
        ColumnTransformer([("sex", OneHotEncoder(categories=[[0, 1]]), [1]),
                           ("std", StandardScaler(), [0] + list(range(2, 10)))]),
        lm.Ridge()), None),
    "Binarizer+Ridge": ("diabetes", lambda: make_pipeline(Binarizer(), lm.Ridge()), None),
    "RobustScaler+MaxAbsScaler+Ridge": ("diabetes", lambda: make_pipeline(
        RobustScaler(), MaxAbsScaler(), lm.Ridge()), None),
    "SelectKBest+Ridge": ("diabetes", lambda: make_pipeline(SelectKBest(k=5), lm.Ridge()),
                          None),
    "FeatureUnion(Scaler,SVD)+Ridge": ("diabetes", lambda: make_pipeline(
        make_union(StandardScaler(), TruncatedSVD(3, random_state=0)), lm.Ridge()), None),
    "PolynomialFeatures+Ridge": ("diabetes", lambda: make_pipeline(
        PolynomialFeatures(2), lm.Ridge()), None),
    "PLSRegression": ("diabetes", lambda: PLSRegression(3), None,
                      ["Ma_MatMulcst", "Ad_Addcst"]),
    "ARDRegression": ("diabetes", lm.ARDRegression, None),
    "KBinsDiscretizer+Ridge": ("diabetes", lambda: make_pipeline(
        KBinsDiscretizer(n_bins=3, encode="onehot-dense", strategy="uniform"),
        lm.Ridge()), None),
    "PowerTransformer+Ridge": ("diabetes", lambda: make_pipeline(
        PowerTransformer(), lm.Ridge()), None),
    "Scaler+MLPRegressor": ("diabetes", lambda: make_pipeline(
        StandardScaler(), _mlp_r()), None),
    "PCA+MLPRegressor": ("diabetes", lambda: make_pipeline(
        PCA(6, random_state=0), _mlp_r()), None),
    # binary classifiers
    "LogisticRegression-bin": ("cancer", lambda: make_pipeline(
        StandardScaler(), lm.LogisticRegression()), None),
    "LogisticRegression-bin-nozipmap": ("cancer", lambda: make_pipeline(
        StandardScaler(), lm.LogisticRegression()), {"zipmap": False}),
    "SGDClassifier-bin": ("cancer", lambda: make_pipeline(
        StandardScaler(), lm.SGDClassifier(loss="log_loss", random_state=0)), None),
    "MLPClassifier-bin": ("cancer", lambda: make_pipeline(StandardScaler(), _mlp_c()), None),
    "LinearSVC-bin": ("cancer", lambda: make_pipeline(StandardScaler(), LinearSVC()),
                      {LinearSVC: {}}),
    "RidgeClassifier-bin": ("cancer", lambda: make_pipeline(
        StandardScaler(), lm.RidgeClassifier()), None),
    "PCA+LogisticRegression-bin": ("cancer", lambda: make_pipeline(
        StandardScaler(), PCA(5, random_state=0), lm.LogisticRegression()), None),
    "Imputer+LogisticRegression-bin": ("cancer-nan", lambda: make_pipeline(
        SimpleImputer(), StandardScaler(), lm.LogisticRegression()), {"zipmap": False}),
    "Perceptron-bin": ("cancer", lambda: make_pipeline(
        StandardScaler(), lm.Perceptron(random_state=0)), None),
    "CalibratedClassifierCV(LogisticRegression)": ("cancer", lambda: make_pipeline(
        StandardScaler(), CalibratedClassifierCV(lm.LogisticRegression(), cv=3)),
        None),
    # multiclass classifiers
    "LogisticRegression-multi": ("iris", lm.LogisticRegression, None),
    "LogisticRegression-multi-nozipmap": ("iris", lm.LogisticRegression, {"zipmap": False}),
    "Scaler+LogisticRegression-wine": ("wine", lambda: make_pipeline(
        StandardScaler(), lm.LogisticRegression()), None),
    "SGDClassifier-multi": ("iris", lambda: make_pipeline(
        StandardScaler(), lm.SGDClassifier(loss="log_loss", random_state=0)), None),
    "MLPClassifier-multi": ("iris", lambda: make_pipeline(StandardScaler(), _mlp_c()), None),
    "MinMax+MLPClassifier-wine": ("wine", lambda: make_pipeline(MinMaxScaler(), _mlp_c()),
                                  {"zipmap": False}),
    "LinearDiscriminantAnalysis": ("wine", lambda: make_pipeline(
        StandardScaler(), LinearDiscriminantAnalysis()), None),
    "GaussianRandomProjection+LogisticRegression": ("wine", lambda: make_pipeline(
        StandardScaler(), GaussianRandomProjection(5, random_state=0),
        lm.LogisticRegression()), None),
    "OneVsRest(LogisticRegression)": ("iris", lambda: make_pipeline(
        StandardScaler(), OneVsRestClassifier(lm.LogisticRegression())), None),
    "LogisticRegression-string-labels": ("iris-str", lm.LogisticRegression, None),
    "LinearSVC-multi": ("iris", lambda: make_pipeline(StandardScaler(), LinearSVC()),
                        {LinearSVC: {}}),
    "RidgeClassifier-multi": ("wine", lambda: make_pipeline(
        StandardScaler(), lm.RidgeClassifier()), None),
    "ColumnTransformer+LogisticRegression": ("wine", lambda: make_pipeline(
        _columns(13), lm.LogisticRegression()), None),
    "Imputer+Normalizer+LogisticRegression": ("iris-nan", lambda: make_pipeline(
        SimpleImputer(), Normalizer(), lm.LogisticRegression()), None),
    "PCA+MLPClassifier": ("wine", lambda: make_pipeline(
        StandardScaler(), PCA(5, random_state=0), _mlp_c()), None),
}


@functools.lru_cache(maxsize=None)
def _case(name):
    """(scikit-learn model, its ONNX graph, is a regressor, (X_train,
    X_test, y_train, y_test)); callers must not modify them."""
    data, factory, options = MODELS[name][:3]
    X, y = _data(data.replace("-nan", ""))
    if data.endswith("-nan"):
        X = _with_nan(X)
    regressor = data == "diabetes" or data == "diabetes-nan"
    X_tr, X_te, y_tr, y_te = train_test_split(
        X, y, test_size=0.3, random_state=0, stratify=None if regressor else y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        skl = factory().fit(X_tr, y_tr)
    onx = to_onnx(skl, X_tr[:1], options=options, target_opset=17)
    return skl, onx, regressor, (X_tr, X_te, y_tr, y_te)


#: Shift of the fine-tuning data: the targets (standardized) for the
#: regressors, every feature by this many standard deviations for the
#: classifiers.
SHIFT = 0.5


def _shifted(X, y, regressor):
    if regressor:
        return X, y + SHIFT
    return X + SHIFT * np.nanstd(X, axis=0), y


def _estimator(skl, onx, regressor, **params):
    if regressor:
        return OrtGradientForwardBackwardOptimizer(onx, **params)
    if not hasattr(skl, "predict_proba"):  # decision scores, not probabilities
        params.setdefault("learning_loss", CrossEntropyLearningLoss(from_logits=True))
    return OrtGradientForwardBackwardClassifier(onx, **params)


def _score(regressor, y, predicted):
    return r2_score(y, predicted) if regressor else accuracy_score(y, predicted)


#: The fine-tune: Adam, a few epochs of small batches.
FINE_TUNE = dict(learning_rate=LearningRateAdam(0.01), max_iter=10,
                 batch_size=16, random_state=0, shuffle=True)
#: What the predictor's weights are called by skl2onnx and the rewrite of
#: its linear ops (the estimators choose them by structure, not by name).
_WEIGHT_NAME = re.compile(r"^(coef|coefficient|intercept|intercepts)(\d*|_\d+)$")


def _is_weight(name, key):
    """Whether ``key`` is one of the predictor's weights of model ``name``
    (a fourth entry of its MODELS row names them when the converter does
    not call them so)."""
    named = MODELS[name][3] if len(MODELS[name]) > 3 else None
    return key in named if named else bool(_WEIGHT_NAME.match(key))


@pytest.mark.parametrize("name", list(MODELS))
def test_starts_from_the_converted_weights(name):
    """(a) Default settings, a negligible learning rate: the predictions
    are scikit-learn's, and only the predictor's weights are trained."""
    skl, onx, regressor, (X_tr, X_te, y_tr, y_te) = _case(name)
    est = _estimator(skl, onx, regressor, learning_rate=1e-9, max_iter=1)
    est.fit(X_tr, y_tr)
    expected = skl.predict(X_te)
    if regressor:
        assert_allclose(est.predict(X_te).ravel(), expected, rtol=1e-4,
                        atol=1e-4 * np.abs(expected).max())
    else:
        assert_array_equal(est.predict(X_te), expected)
        if hasattr(skl, "predict_proba"):
            # the converted graph's float32 probabilities (scikit-learn's,
            # in float64, differ from them by up to 1e-4)
            converted = _as_array(_outputs(onx, X_te)[1], est.classes_)
            assert_allclose(est.predict_proba(X_te), converted, rtol=1e-4,
                            atol=1e-6)
    assert est.weights_to_train_
    assert all(_is_weight(name, w) for w in est.weights_to_train_), \
        est.weights_to_train_
    assert not set(est.weights_to_train_) & set(est.frozen_weights_)


def _outputs(model, X):
    sess = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: X})


def _as_array(probabilities, classes):
    """ZipMap's list of dicts, or a tensor, as an (n, n_classes) array."""
    if isinstance(probabilities, list):
        return np.array([[row[c] for c in classes] for row in probabilities])
    return np.asarray(probabilities)


@pytest.mark.parametrize("name", list(MODELS))
def test_fine_tune_improves_and_keeps_the_preprocessing(name):
    """(b) Fine-tuning on shifted data improves the held-out score; (c) the
    trained graph runs in onnxruntime with the estimator's predictions and
    keeps every other initializer and preprocessing node byte for byte."""
    skl, onx, regressor, (X_tr, X_te, y_tr, y_te) = _case(name)
    X_new, y_new = _shifted(X_tr, y_tr, regressor)
    X_test, y_test = _shifted(X_te, y_te, regressor)
    est = _estimator(skl, onx, regressor, **FINE_TUNE).fit(X_new, y_new)
    before = _score(regressor, y_test, skl.predict(X_test))
    after = _score(regressor, y_test, est.predict(X_test))
    assert after > before, (before, after)

    trained = est.get_trained_onnx()
    outputs = _outputs(trained, X_test)
    if regressor:
        assert_allclose(outputs[0].ravel(), est.predict(X_test).ravel(),
                        rtol=1e-5, atol=1e-5)
    else:
        assert_array_equal(np.asarray(outputs[0]).ravel(), est.predict(X_test))
        if hasattr(skl, "predict_proba"):
            assert_allclose(_as_array(outputs[1], est.classes_),
                            est.predict_proba(X_test), rtol=1e-5, atol=1e-6)
    original = {i.name: i for i in onx.graph.initializer}
    after_fit = {i.name: i for i in trained.graph.initializer}
    for key in original:
        if not _is_weight(name, key):  # PCA's mean, MinMaxScaler's scales...
            assert after_fit[key].SerializeToString() == \
                original[key].SerializeToString(), key
    # the ai.onnx.ml preprocessing (Scaler, Imputer, Normalizer...) holds its
    # constants in attributes
    kept = {n.SerializeToString() for n in trained.graph.node}
    predictor = {o for n in onx.graph.node if n.op_type in (
        "LinearClassifier", "LinearRegressor") for o in n.output}
    for node in onx.graph.node:
        if node.domain == "ai.onnx.ml" and node.op_type != "ZipMap" and \
                not predictor & set(node.input) and node.output[0] not in predictor:
            assert node.SerializeToString() in kept, node.op_type


@pytest.mark.parametrize("name", [n for n in MODELS if any(
    k in n for k in ("Scaler", "Imputer", "ColumnTransformer", "Normalizer",
                     "OneHot", "Binarizer", "SelectKBest", "Polynomial",
                     "LinearSVC", "RidgeClassifier"))])
def test_ml_op_shapes_are_onnxruntime_shapes(name):
    """The shapes infer_value_types gives the ai.onnx.ml outputs are those
    onnxruntime computes (every static dim, the rank), also where skl2onnx
    declares another (a binary RidgeClassifier's (N, 2) probabilities)."""
    _, onx, _, (_, X_te, _, _) = _case(name)
    types = infer_value_types(onx)
    model = onnx.ModelProto()
    model.CopyFrom(onx)
    names = [o for n in onx.graph.node if n.domain == "ai.onnx.ml"
             and n.op_type != "ZipMap" for o in n.output]
    declared = {o.name for o in model.graph.output}
    model.graph.output.extend(
        helper.make_tensor_value_info(o, types[o][0], None)
        for o in names if o not in declared)
    sess = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"])
    values = dict(zip([o.name for o in sess.get_outputs()],
                      sess.run(None, {"X": X_te[:7]})))
    for o in names:
        shape = types[o][1]
        assert shape is not None and len(shape) == values[o].ndim, (o, shape)
        for dim, size in zip(shape, values[o].shape):
            assert not isinstance(dim, int) or dim == size, (o, shape, values[o].shape)


# ----------------------------------------------- the weights and the start

def test_frozen_weights_say_why():
    _, pca, _, (X_tr, _, y_tr, _) = _case("PCA+LinearRegression")
    est = OrtGradientForwardBackwardOptimizer(pca, max_iter=1).fit(X_tr, y_tr)
    assert est.weights_to_train_ == ["coefficient", "intercepts"]
    assert sorted(est.frozen_weights_) == ["mean", "transform_matrix"]
    assert "preprocessing constant" in est.frozen_weights_["mean"]
    assert "Sub node" in est.frozen_weights_["mean"]
    assert "MatMul node" in est.frozen_weights_["transform_matrix"]
    skl, sgd, _, (X_tr, _, y_tr, _) = _case("SGDClassifier-bin")
    est = OrtGradientForwardBackwardClassifier(sgd, max_iter=1).fit(X_tr, y_tr)
    assert est.weights_to_train_ == ["coef", "intercept"]
    assert "arithmetic constant" in est.frozen_weights_["unity"]


def test_explicit_weights_to_train_win():
    """A list trains what it names, preprocessing included; the others
    are frozen 'not in weights_to_train'."""
    _, onx, _, (X_tr, _, y_tr, _) = _case("PCA+LinearRegression")
    X_new, y_new = _shifted(X_tr, y_tr, True)
    names = ["mean", "coefficient"]
    est = OrtGradientForwardBackwardOptimizer(
        onx, weights_to_train=names, **FINE_TUNE).fit(X_new, y_new)
    assert est.weights_to_train_ == names
    assert est.frozen_weights_ == {"transform_matrix": "not in weights_to_train",
                                   "intercepts": "not in weights_to_train"}
    trained = {i.name: i for i in est.get_trained_onnx().graph.initializer}
    original = {i.name: i for i in onx.graph.initializer}
    assert trained["mean"].SerializeToString() != original["mean"].SerializeToString()
    assert trained["transform_matrix"].SerializeToString() == \
        original["transform_matrix"].SerializeToString()


def test_a_graph_without_layers_trains_its_constants():
    """Elementwise weights only (Y = X * w + b, one element each): no
    predictor layer, so nothing is taken for an arithmetic constant."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["X", "w"], ["m"]),
         helper.make_node("Add", ["m", "b"], ["Y"])], "g",
        [helper.make_tensor_value_info("X", onnx.TensorProto.FLOAT, [None, 1])],
        [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, [None, 1])],
        [onnx.numpy_helper.from_array(np.array([0.5], np.float32), "w"),
         onnx.numpy_helper.from_array(np.array([0.0], np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    X = np.linspace(-1, 1, 40, dtype=np.float32).reshape(-1, 1)
    est = OrtGradientForwardBackwardOptimizer(
        model, learning_rate=LearningRateAdam(0.05), max_iter=60, batch_size=8)
    est.fit(X, 3 * X.ravel() + 1)
    assert est.weights_to_train_ == ["w", "b"] and est.frozen_weights_ == {}
    assert_allclose([w.item() for w in est.get_state()], [3, 1], atol=0.05)


def test_init_random_is_the_cold_start():
    """init='random' draws the weights to train as scikit-learn's MLP
    (onnxcustom's warm_start=False on a skl2onnx graph); the default starts
    from the graph's; another value is refused before any work."""
    from onnxtrain.initializers import glorot_uniform_weights
    skl, onx, _, (X_tr, _, y_tr, _) = _case("Scaler+MLPRegressor")
    cold = OrtGradientForwardBackwardOptimizer(
        onx, learning_rate=1e-9, max_iter=1, init="random", random_state=3)
    cold.fit(X_tr, y_tr)
    model = cold._full_model()
    drawn = glorot_uniform_weights(model, cold.weights_to_train_, 3)
    for name, value in zip(cold.weights_to_train_, cold.get_state()):
        assert_allclose(value, drawn[name], atol=1e-6, err_msg=name)
    assert r2_score(y_tr, cold.predict(X_tr)) < 0.5 * skl.score(X_tr, y_tr)
    with pytest.raises(ValueError, match="'init' parameter"):
        OrtGradientForwardBackwardOptimizer(onx, init="zeros").fit(X_tr, y_tr)


def test_nan_is_data_only_when_the_graph_imputes():
    _, imputing, _, (X_tr, X_te, y_tr, _) = _case("Imputer+Scaler+Ridge")
    assert np.isnan(X_tr).any()
    est = OrtGradientForwardBackwardOptimizer(imputing, max_iter=1).fit(X_tr, y_tr)
    assert np.isfinite(est.predict(X_te)).all()
    X_inf = X_tr.copy()
    X_inf[0, 0] = np.inf
    with pytest.raises(ValueError, match="infinity"):
        OrtGradientForwardBackwardOptimizer(imputing, max_iter=1).fit(X_inf, y_tr)
    _, plain, _, _ = _case("Scaler+Ridge")
    with pytest.raises(ValueError, match="NaN"):
        OrtGradientForwardBackwardOptimizer(plain, max_iter=1).fit(X_tr, y_tr)


def test_models_without_trainable_weights_name_their_op():
    """Trees and kernel SVMs keep their parameters in attributes: the
    refusal, before any step, names the node holding them."""
    from sklearn.ensemble import RandomForestRegressor
    from sklearn.svm import SVC
    X, y = _data("diabetes")
    forest = to_onnx(RandomForestRegressor(3, max_depth=2, random_state=0).fit(X, y),
                     X[:1], target_opset=17)
    with pytest.raises(ValueError, match="attributes of TreeEnsembleRegressor node"):
        OrtGradientForwardBackwardOptimizer(forest, max_iter=1).fit(X, y)
    X, y = _data("iris")
    with warnings.catch_warnings():  # skl2onnx reads SVC's deprecated probA_
        warnings.simplefilter("ignore", FutureWarning)
        svc = to_onnx(SVC().fit(X, y), X[:1], target_opset=17)
    with pytest.raises(ValueError, match="attributes of SVMClassifier node"):
        OrtGradientForwardBackwardClassifier(svc, max_iter=1).fit(X, y)


# ------------------------------------------------------- the graph's labels
def _labelled(zipmap, labels):
    """A LogisticRegression on iris with class names ``labels`` (fitted on
    them: the graph's columns are their sorted order), its graph, the
    features and the integer classes."""
    X, y = _data("iris")
    skl = lm.LogisticRegression(max_iter=500).fit(X, np.asarray(labels)[y])
    onx = to_onnx(skl, X[:1], options={"zipmap": zipmap}, target_opset=17)
    return skl, onx, X, y


@pytest.mark.parametrize("zipmap", [False, True])
def test_classes_are_the_graph_labels_in_column_order(zipmap):
    """The graph carries its labels (ZipMap, label output): ``classes_`` are
    those, in column order, whatever ``y`` holds of them, and ``predict``
    equals the label output of the trained graph."""
    skl, onx, X, y = _labelled(zipmap, ["setosa", "versicolor", "virginica"])
    names = np.array(["setosa", "versicolor", "virginica"])[y]
    # fine-tuning data holding two of the three classes only
    subset = y != 0
    est = OrtGradientForwardBackwardClassifier(
        onx, learning_rate=1e-9, max_iter=1).fit(X[subset], names[subset])
    assert_array_equal(est.classes_, ["setosa", "versicolor", "virginica"])
    assert_array_equal(est.predict(X), skl.predict(X))
    label = _outputs(est.get_trained_onnx(), X)[0]
    assert_array_equal(est.predict(X), label)


def test_graph_labels_keep_their_order_and_type():
    """Integer labels in an order of the graph's own (not sorted): y's
    labels map to the graph's columns by value, not by their sorted order,
    and ``classes_`` take y's integer type."""
    skl, onx, X, y = _labelled(False, [0, 1, 2])
    onx = onnx.ModelProto.FromString(onx.SerializeToString())
    node = next(n for n in onx.graph.node if n.op_type == "LinearClassifier")
    next(a for a in node.attribute if a.name == "classlabels_ints").ints[:] = [30, 10, 20]
    renamed = np.array([30, 10, 20])
    labels = renamed[y].astype(np.int32)
    est = OrtGradientForwardBackwardClassifier(
        onx, learning_rate=1e-9, max_iter=1).fit(X, labels)
    assert_array_equal(est.classes_, [30, 10, 20])
    assert est.classes_.dtype == np.int32
    assert_array_equal(est.predict(X), renamed[skl.predict(X)])
    assert_array_equal(est.predict(X), _outputs(est.get_trained_onnx(), X)[0])
    # a partial_fit naming every class, fed one class at a time
    est = OrtGradientForwardBackwardClassifier(onx, learning_rate=1e-9)
    est.partial_fit(X[y == 1], labels[y == 1], classes=[20, 10, 30])
    assert_array_equal(est.classes_, [30, 10, 20])
    assert_array_equal(est.predict(X), renamed[skl.predict(X)])


def test_labels_the_graph_does_not_know_are_refused():
    """A label outside the graph's, or of another type, is an error naming
    the graph's labels, and a fitted estimator keeps its state."""
    _, onx, X, y = _labelled(False, ["cat", "dog", "eel"])
    names = np.array(["cat", "dog", "eel"])[y]
    est = OrtGradientForwardBackwardClassifier(
        onx, learning_rate=1e-9, max_iter=1).fit(X, names)
    before = est.predict_proba(X)
    with pytest.raises(ValueError, match=r"\['fish'\].*\['cat', 'dog', 'eel'\]"):
        est.fit(X, np.where(names == "eel", "fish", names))
    with pytest.raises(ValueError, match="numeric labels.*string labels"):
        est.fit(X, y)
    assert_array_equal(est.classes_, ["cat", "dog", "eel"])
    assert_array_equal(est.predict_proba(X), before)


@pytest.mark.parametrize("zipmap", [False, True])
def test_a_graph_without_class_names_takes_those_of_y(zipmap):
    """skl2onnx's nocl=True leaves the names out: the label output looks up
    the column indices 0..C-1, which name no class of y's strings; the
    classes are then y's (sorted), as for a graph without labels."""
    X, y = _data("iris")
    names = np.array(["setosa", "versicolor", "virginica"])[y]
    skl = lm.LogisticRegression(max_iter=500).fit(X, names)
    onx = to_onnx(skl, X[:1], options={"zipmap": zipmap, "nocl": True}, target_opset=17)
    est = OrtGradientForwardBackwardClassifier(
        onx, learning_rate=1e-9, max_iter=1).fit(X, names)
    assert_array_equal(est.classes_, ["setosa", "versicolor", "virginica"])
    assert_array_equal(est.predict(X), skl.predict(X))


def test_labels_partly_among_a_graphs_column_indices_are_refused():
    """A graph labelled 0, 1, 2 (or converted with nocl=True: the same
    table) and y labelled 1, 2, 3: which naming was meant cannot be told,
    refused rather than matching columns to y's sorted labels."""
    _, onx, X, y = _labelled(False, [0, 1, 2])
    with pytest.raises(ValueError, match=r"labels \[3\] that the graph does not know"):
        OrtGradientForwardBackwardClassifier(onx, learning_rate=1e-9, max_iter=1).fit(
            X, np.where(y == 0, 3, y))


def test_an_integer_output_that_is_no_argmax_lookup_is_not_the_labels():
    """Only a lookup at the column of the highest probability (an ArgMax)
    gives the labels: another int64 output reading a constant table of C
    values leaves the classes to y."""
    _, onx, X, y = _labelled(False, [0, 1, 2])
    onx = onnx.ModelProto.FromString(onx.SerializeToString())
    graph = onx.graph
    graph.initializer.append(onnx.numpy_helper.from_array(
        np.array([7, 8, 9], dtype=np.int64), "other_table"))
    graph.initializer.append(onnx.numpy_helper.from_array(
        np.array([2], dtype=np.int64), "other_index"))
    graph.node.append(helper.make_node("Gather", ["other_table", "other_index"],
                                       ["other"], axis=0))
    graph.output.append(helper.make_tensor_value_info("other", onnx.TensorProto.INT64, [1]))
    assert graph.output[0].name == "label"
    del graph.output[0]  # the graph's own label output gone
    est = OrtGradientForwardBackwardClassifier(
        onx, learning_rate=1e-9, max_iter=1).fit(X, y + 20)
    assert_array_equal(est.classes_, [20, 21, 22])
