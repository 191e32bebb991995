"""onnxtrain: train ONNX graphs on the plain onnxruntime package.

Main entry points: :class:`OrtGradientForwardBackwardOptimizer` (a
scikit-learn estimator), :class:`OrtGradientForwardBackward` (the
forward/backward engine) and :mod:`onnxtrain.autodiff`.
"""
__version__ = "0.1.0"

from .estimators import OrtGradientForwardBackwardOptimizer
from .exceptions import (ConvergenceError, ConvergenceWarning, DeviceError,
                         MissingVJPRuleError)
from .losses import SquareLearningLoss
from .models import get_train_initializer, to_onnx
from .optim import LearningRateSGD
from .penalties import NoLearningPenalty
from .runtime import OrtGradientForwardBackward

__all__ = ["ConvergenceError", "ConvergenceWarning", "DeviceError",
           "LearningRateSGD", "MissingVJPRuleError", "NoLearningPenalty",
           "OrtGradientForwardBackward", "OrtGradientForwardBackwardOptimizer",
           "SquareLearningLoss", "get_train_initializer", "to_onnx",
           "__version__"]
