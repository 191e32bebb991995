"""scikit-learn estimators training ONNX graphs."""
from .forward_backward import (OrtGradientForwardBackwardClassifier,
                               OrtGradientForwardBackwardOptimizer)
from .loss_output import OrtGradientOptimizer

__all__ = ["OrtGradientForwardBackwardClassifier",
           "OrtGradientForwardBackwardOptimizer", "OrtGradientOptimizer"]
