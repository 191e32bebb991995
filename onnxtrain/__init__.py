"""onnxtrain: train ONNX graphs on the plain onnxruntime package.

Main entry points: the scikit-learn estimators
:class:`OrtGradientForwardBackwardOptimizer` (regression),
:class:`OrtGradientForwardBackwardClassifier` and
:class:`OrtGradientOptimizer` (graphs computing their own loss); the
forward/backward engine :class:`OrtGradientForwardBackward`
(:class:`onnxtrain.runtime.ForwardBackwardEngine`); the autodiff
(:mod:`onnxtrain.autodiff`); the onnxruntime-training compatible
:mod:`onnxtrain.onnxblock`, :mod:`onnxtrain.onnxblock.artifacts` and
:mod:`onnxtrain.api`.
"""
__version__ = "0.1.0"

from ._utils.moved import install as _install_moved, moved_attribute

_install_moved()  # before any import of a former module path

from .assembly.models import add_loss_output, get_train_initializer, to_onnx
from .assembly.rewrite import prediction_graph, probability_graph, rewrite_ml_linear_ops
from .estimators import (GraphInputs, OrtGradientForwardBackwardClassifier,
                         OrtGradientForwardBackwardOptimizer, OrtGradientOptimizer)
from .exceptions import (ConvergenceError, ConvergenceWarning, DeviceError,
                         MissingVJPRuleError)
from .losses import (AbsoluteLearningLoss, CrossEntropyLearningLoss,
                     ElasticLearningLoss, NegLogLearningLoss, PoissonLearningLoss,
                     SquareLearningLoss)
from .losses.penalties import ElasticLearningPenalty, NoLearningPenalty
from .optim import (LearningRateAdam, LearningRateAdamW, LearningRateSGD,
                    LearningRateSGDNesterov)
from .runtime import OrtGradientForwardBackward

__all__ = [
    "AbsoluteLearningLoss", "ConvergenceError", "ConvergenceWarning",
    "CrossEntropyLearningLoss", "DeviceError", "ElasticLearningLoss",
    "ElasticLearningPenalty", "GraphInputs", "LearningRateAdam", "LearningRateAdamW",
    "LearningRateSGD", "LearningRateSGDNesterov", "MissingVJPRuleError",
    "NegLogLearningLoss", "NoLearningPenalty", "OrtGradientForwardBackward",
    "OrtGradientForwardBackwardClassifier", "OrtGradientForwardBackwardOptimizer",
    "OrtGradientOptimizer", "PoissonLearningLoss", "SquareLearningLoss",
    "add_loss_output", "get_train_initializer", "prediction_graph",
    "probability_graph", "rewrite_ml_linear_ops", "to_onnx", "__version__"]


def __getattr__(name):
    """``onnxtrain.models`` and the other former module paths
    (:data:`onnxtrain._utils.moved.MOVED`) as attributes."""
    return moved_attribute(__name__, name)
