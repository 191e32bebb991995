"""onnxtrain.neural_network where scikit-learn's own test_mlp.py pins
behaviour beyond the formulas: sparse X, divergence, coefs_ / intercepts_
assigned or edited by the user, the stratified split's error, and the
script that runs scikit-learn's suite against onnxtrain."""
import importlib.util
import os
import warnings

import numpy as np
import onnxruntime
import pytest
import scipy.sparse
from numpy.testing import assert_allclose, assert_array_equal
from sklearn import neural_network as skl_nn
from sklearn.exceptions import ConvergenceWarning

from onnxtrain.neural_network import MLPClassifier, MLPRegressor

#: scikit-learn's own MLP overflows on the diverging fits these tests compare.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SGD = dict(solver="sgd", learning_rate="constant", learning_rate_init=0.05,
           momentum=0, alpha=0, max_iter=5, random_state=0)


def _data(n=40, classes=None):
    rng = np.random.RandomState(0)
    X = rng.rand(n, 4)
    X[X < 0.5] = 0  # sparse-looking
    if classes is None:
        return X, X @ np.array([1.0, -2.0, 0.5, 3.0]) + 0.25
    return X, np.asarray(classes)[(X.sum(axis=1) > 1).astype(int)]


def _fit_quietly(est, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return est.fit(*args, **kwargs)


# ------------------------------------------------------------- sparse X

@pytest.mark.parametrize("fmt", ["csr", "csc"])
def test_sparse_fit_predict_equal_dense(fmt):
    X, y = _data()
    Xs = scipy.sparse.csr_matrix(X) if fmt == "csr" else scipy.sparse.csc_matrix(X)
    dense = _fit_quietly(MLPRegressor(hidden_layer_sizes=(5,), **SGD), X, y)
    sparse = _fit_quietly(MLPRegressor(hidden_layer_sizes=(5,), **SGD), Xs, y)
    assert_allclose(sparse.loss_curve_, dense.loss_curve_, rtol=1e-12)
    assert_allclose(sparse.predict(Xs), dense.predict(X), rtol=1e-12)
    assert_array_equal(sparse.predict(Xs), sparse.predict(X))


def test_sparse_partial_fit_and_classifier():
    X, y = _data(classes=["a", "b"])
    dense = MLPClassifier((5,), **SGD).partial_fit(X, y, classes=["a", "b"])
    sparse = MLPClassifier((5,), **SGD).partial_fit(
        scipy.sparse.csr_array(X), y, classes=["a", "b"])
    assert_allclose(sparse.coefs_[0], dense.coefs_[0], rtol=1e-12)
    assert_allclose(sparse.predict_proba(scipy.sparse.csr_matrix(X)),
                    dense.predict_proba(X), rtol=1e-12)
    assert MLPRegressor().__sklearn_tags__().input_tags.sparse


# ---------------------------------------------------------- divergence

def _diverging(early_stopping):
    X, y = _data(n=60)
    return X * 1e3, y * 1e3, dict(hidden_layer_sizes=(20,), activation="identity",
                                  solver="sgd", learning_rate_init=1.0, max_iter=15,
                                  early_stopping=early_stopping, random_state=0)


def test_divergence_raises_scikit_learn_error_after_training():
    X, y, params = _diverging(False)
    est = MLPRegressor(**params)
    with pytest.raises(ValueError, match="Solver produced non-finite parameter "
                                         "weights. The input data may contain"):
        _fit_quietly(est, X, y)
    # the epoch that diverged is recorded, the loop's weights stay finite
    assert not np.isfinite(est.loss_curve_[-1])
    assert np.isfinite(est.loss_curve_[:-1]).all()
    assert est.n_iter_ == len(est.loss_curve_) < params["max_iter"]
    assert all(np.isfinite(c).all() for c in est.coefs_)
    with pytest.raises(ValueError, match="Solver produced non-finite"):
        _fit_quietly(skl_nn.MLPRegressor(**params), X, y)  # scikit-learn agrees


def test_divergence_with_early_stopping_restores_best_weights():
    X, y, params = _diverging(True)
    est = _fit_quietly(MLPRegressor(**params), X, y)
    scores = est.validation_scores_
    assert np.isnan(scores[-1]) and isinstance(scores[-1], float)
    finite = [s for s in scores if np.isfinite(s)]
    assert est.best_validation_score_ == max(finite)
    # the weights are those of the best epoch: the validation rows score it
    rng = np.random.RandomState(0)
    from sklearn.model_selection import train_test_split
    rng.uniform(size=sum(c.size + b.size for c, b in zip(
        est.coefs_, est.intercepts_)))  # the draws of the initial weights
    _, X_val, _, y_val = train_test_split(X, y, random_state=rng, test_size=0.1)
    assert est.score(X_val, y_val) == pytest.approx(est.best_validation_score_,
                                                    rel=1e-9)


def test_divergence_in_the_first_epoch_restores_the_initial_weights():
    X, y = _data(n=60)
    params = dict(hidden_layer_sizes=(20,), activation="identity", solver="sgd",
                  learning_rate_init=10.0, batch_size=5, max_iter=4,
                  early_stopping=True, random_state=0)
    theirs = _fit_quietly(skl_nn.MLPRegressor(**params), X * 1e3, y * 1e3)
    ours = _fit_quietly(MLPRegressor(**params), X * 1e3, y * 1e3)
    assert np.isnan(theirs.validation_scores_).all()
    assert np.isnan(ours.validation_scores_).all()
    for mine, skl in zip(ours.coefs_ + ours.intercepts_,
                         theirs.coefs_ + theirs.intercepts_):
        assert_array_equal(mine, skl)  # both back at the initial draw


# ------------------------------------------------- coefs_ / intercepts_

def _one_sgd_step(X, y, coef, intercept, lr):
    """Plain SGD on 0.5 * mean((X @ coef + b - y)^2), one full batch."""
    residual = X @ coef + intercept - y.reshape(-1, 1)
    return (coef - lr * X.T @ residual / len(X),
            intercept - lr * residual.mean(axis=0))


def test_weights_assigned_before_the_first_partial_fit_are_used():
    X, y = _data(n=20)
    coef, intercept = np.full((4, 1), 0.5), np.array([2.0])
    est = MLPRegressor(hidden_layer_sizes=(), activation="identity", batch_size=20, **SGD)
    est.coefs_ = [0]
    est.intercepts_ = [intercept]
    est.coefs_[0] = coef  # a list item replaced, as scikit-learn's test_fit does
    est.partial_fit(X, y)
    expected = _one_sgd_step(X, y, coef, intercept, SGD["learning_rate_init"])
    assert_allclose(est.coefs_[0], expected[0], rtol=1e-12)
    assert_allclose(est.intercepts_[0], expected[1], rtol=1e-12)


def test_weights_assigned_before_fit_start_a_warm_start_only():
    X, y = _data(n=20)
    coef, intercept = np.full((4, 1), 0.5), np.array([2.0])
    warm = MLPRegressor(hidden_layer_sizes=(), activation="identity", batch_size=20, warm_start=True,
                        **{**SGD, "max_iter": 1})
    warm.coefs_, warm.intercepts_ = [coef], [intercept]
    _fit_quietly(warm, X, y)
    expected = _one_sgd_step(X, y, coef, intercept, SGD["learning_rate_init"])
    assert_allclose(warm.coefs_[0], expected[0], rtol=1e-12)
    cold = MLPRegressor(hidden_layer_sizes=(), activation="identity", batch_size=20,
                        **{**SGD, "max_iter": 1})
    cold.coefs_, cold.intercepts_ = [coef], [intercept]
    _fit_quietly(cold, X, y)  # no warm start: drawn weights, as scikit-learn
    assert not np.allclose(cold.coefs_[0], expected[0])


def test_assigned_weights_of_wrong_shapes_raise_before_any_work():
    X, y = _data(n=20)
    est = MLPRegressor(hidden_layer_sizes=(), warm_start=True, **SGD)
    est.coefs_, est.intercepts_ = [np.zeros((3, 1))], [np.zeros(1)]
    with pytest.raises(ValueError, match=r"coefs_ shapes \[\(3, 1\)\].*X has 4 "
                                         "features and y 1 outputs"):
        est.fit(X, y)
    assert not hasattr(est, "n_iter_")


def test_in_place_edits_reach_predict_and_to_onnx():
    X, y = _data(n=20)
    est = _fit_quietly(MLPRegressor(hidden_layer_sizes=(), activation="identity", **SGD), X, y)
    before = est.predict(X)
    est.intercepts_[0] += 1.0  # an array edited in place
    assert_allclose(est.predict(X), before + 1.0, rtol=1e-12)
    est.coefs_[0][:] = 0.0
    assert_allclose(est.predict(X), np.full(len(X), est.intercepts_[0][0]))
    session = onnxruntime.InferenceSession(est.to_onnx().SerializeToString())
    assert_allclose(session.run(None, {"X": X})[0].ravel(), est.predict(X))
    est.coefs_ = [np.ones((4, 1))]  # a new list
    assert_allclose(est.predict(X), X.sum(axis=1) + est.intercepts_[0][0])
    est.coefs_ = [np.ones((4, 1)), np.ones((1, 1))]
    with pytest.raises(ValueError, match="must hold 1 arrays each, got 2 and 1"):
        est.predict(X)


def test_training_gives_new_lists():
    X, y = _data(n=20)
    est = _fit_quietly(MLPRegressor(hidden_layer_sizes=(3,), **SGD), X, y)
    held = est.coefs_
    copy = [c.copy() for c in held]
    est.partial_fit(X, y)
    assert est.coefs_ is not held
    assert not np.allclose(est.coefs_[0], copy[0])


# ------------------------------------------------------ stratified split

def test_stratified_split_error_names_the_labels():
    X = [[1, 2], [2, 3], [3, 4], [4, 5]]
    with pytest.raises(ValueError, match=r"Classes with too few members are: "
                                         r"\['True'\].*'True' stands for 'b', "
                                         r"'False' for 'a'"):
        MLPClassifier(early_stopping=True).fit(X, ["a", "a", "a", "b"])


# -------------------------------------------------------- counting script

def test_compat_script_rewrites_the_installed_suite():
    path = os.path.join(ROOT, "benchmarks", "compat_suites.py")
    spec = importlib.util.spec_from_file_location("compat_suites", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with open(module.sklearn_test_mlp(), encoding="utf-8") as f:
        source = f.read()
    assert module.IMPORT in source
    for name in module.PRIVATE:  # every excepted test exists
        assert f"def {name}(" in source
