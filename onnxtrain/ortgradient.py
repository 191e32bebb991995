"""onnxcustom's ``onnxcustom.training.ortgradient``: the forward/backward
factory whose instances take the weights as inputs (see
:class:`onnxtrain.runtime.ortgradient.OrtGradientForwardBackward`)."""
from .runtime.ortgradient import (OrtGradientForwardBackward,
                                  OrtGradientForwardBackwardFunction)

__all__ = ["OrtGradientForwardBackward", "OrtGradientForwardBackwardFunction"]
