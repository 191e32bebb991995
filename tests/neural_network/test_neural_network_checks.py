"""scikit-learn's estimator checks on onnxtrain's MLPs, for both families of
solvers (mini-batches on the training loop, and L-BFGS)."""
import warnings

from sklearn.exceptions import ConvergenceWarning
from sklearn.utils.estimator_checks import parametrize_with_checks

from onnxtrain.neural_network import MLPClassifier, MLPRegressor

#: Small networks: the checks fit hundreds of times. 50 epochs at 0.01 reach
#: the scores check_regressors_train / check_classifiers_train ask for
#: (R² > 0.5, accuracy > 0.83); scikit-learn's own MLPs run them at 100
#: epochs of (100,) units.
ESTIMATORS = [
    MLPRegressor(hidden_layer_sizes=(10,), max_iter=50, learning_rate_init=0.01),
    MLPClassifier(hidden_layer_sizes=(10,), max_iter=50, learning_rate_init=0.01),
    MLPRegressor(hidden_layer_sizes=(10,), solver="lbfgs", max_iter=50),
    MLPClassifier(hidden_layer_sizes=(10,), solver="lbfgs", max_iter=50)]

#: check name -> reason, per estimator class. Every check passes: sparse
#: input is accepted (densified) as the tags say, and
#: check_sample_weight_equivalence_on_dense_data passes for every solver.
EXPECTED_FAILED = {"MLPRegressor": {}, "MLPClassifier": {}}


def _expected_failed(estimator):
    return EXPECTED_FAILED[type(estimator).__name__]


@parametrize_with_checks(ESTIMATORS, expected_failed_checks=_expected_failed)
def test_sklearn_compatible_estimator(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        check(estimator)
