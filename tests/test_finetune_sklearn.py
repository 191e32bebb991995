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
import onnxruntime as ort
import pytest
from numpy.testing import assert_allclose, assert_array_equal
from onnx import numpy_helper
from sklearn import linear_model as lm
from sklearn.compose import ColumnTransformer
from sklearn.datasets import load_breast_cancer, load_diabetes, load_iris, load_wine
from sklearn.decomposition import PCA
from sklearn.exceptions import ConvergenceWarning
from sklearn.impute import SimpleImputer
from sklearn.metrics import accuracy_score, r2_score
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier, MLPRegressor
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import MinMaxScaler, Normalizer, StandardScaler
from sklearn.svm import LinearSVC, LinearSVR
from skl2onnx import to_onnx

from onnxtrain import (OrtGradientForwardBackwardClassifier,
                       OrtGradientForwardBackwardOptimizer)
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
        elif name == "cancer":
            X, y = load_breast_cancer(return_X_y=True)
        elif name == "iris":
            X, y = load_iris(return_X_y=True)
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


#: name -> (dataset, factory, skl2onnx options); a dataset ending in
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
    "Normalizer+Ridge": ("diabetes", lambda: make_pipeline(Normalizer(), lm.Ridge(0.01)), None),
    "Scaler+MLPRegressor": ("diabetes", lambda: make_pipeline(StandardScaler(), _mlp_r()), None),
    "PCA+MLPRegressor": ("diabetes", lambda: make_pipeline(PCA(6, random_state=0), _mlp_r()), None),
    # binary classifiers
    "LogisticRegression-bin": ("cancer", lambda: make_pipeline(
        StandardScaler(), lm.LogisticRegression()), None),
    "LogisticRegression-bin-nozipmap": ("cancer", lambda: make_pipeline(
        StandardScaler(), lm.LogisticRegression()), {"zipmap": False}),
    "SGDClassifier-bin": ("cancer", lambda: make_pipeline(
        StandardScaler(), lm.SGDClassifier(loss="log_loss", random_state=0)), None),
    "MLPClassifier-bin": ("cancer", lambda: make_pipeline(StandardScaler(), _mlp_c()), None),
    "LinearSVC-bin": ("cancer", lambda: make_pipeline(StandardScaler(), LinearSVC()), {LinearSVC: {}}),
    "RidgeClassifier-bin": ("cancer", lambda: make_pipeline(
        StandardScaler(), lm.RidgeClassifier()), None),
    "PCA+LogisticRegression-bin": ("cancer", lambda: make_pipeline(
        StandardScaler(), PCA(5, random_state=0), lm.LogisticRegression()), None),
    "Imputer+LogisticRegression-bin": ("cancer-nan", lambda: make_pipeline(
        SimpleImputer(), StandardScaler(), lm.LogisticRegression()), {"zipmap": False}),
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
    "LinearSVC-multi": ("iris", lambda: make_pipeline(StandardScaler(), LinearSVC()), {LinearSVC: {}}),
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
    data, factory, options = MODELS[name]
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
_WEIGHT_NAME = re.compile(r"^(coef|coefficient|intercept|intercepts)\d*$")


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
    assert all(_WEIGHT_NAME.match(w) for w in est.weights_to_train_), \
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
        if not _WEIGHT_NAME.match(key):  # PCA's mean, MinMaxScaler's scales...
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
