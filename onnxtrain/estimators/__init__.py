"""scikit-learn estimators training ONNX graphs."""
from ._inputs import GraphInputs
from .forward_backward import (OrtGradientForwardBackwardClassifier,
                               OrtGradientForwardBackwardOptimizer)
from .loss_output import OrtGradientOptimizer

__all__ = ["GraphInputs", "OrtGradientForwardBackwardClassifier",
           "OrtGradientForwardBackwardOptimizer", "OrtGradientOptimizer"]
