"""scikit-learn estimators training ONNX graphs."""
from .forward_backward import (OrtGradientForwardBackwardClassifier,
                               OrtGradientForwardBackwardOptimizer)
from ._inputs import GraphInputs
from .loss_output import OrtGradientOptimizer

__all__ = ["GraphInputs", "OrtGradientForwardBackwardClassifier",
           "OrtGradientForwardBackwardOptimizer", "OrtGradientOptimizer"]
