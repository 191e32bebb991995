"""scikit-learn estimators training ONNX graphs."""
from .forward_backward import OrtGradientForwardBackwardOptimizer

__all__ = ["OrtGradientForwardBackwardOptimizer"]
