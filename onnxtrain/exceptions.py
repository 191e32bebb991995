"""Exceptions and warnings raised by onnxtrain."""
from sklearn.exceptions import ConvergenceWarning

__all__ = ["ConvergenceError", "ConvergenceWarning", "MissingVJPRuleError",
           "DeviceError", "InvalidModelError"]


class ConvergenceError(RuntimeError):
    """Training produced a non-finite loss; the last finite weights are kept
    (when those predict non-finite values on the training rows, the
    estimator goes back to its state before the call, or is no longer
    fitted when it was trained in place)."""


class MissingVJPRuleError(NotImplementedError):
    """A node on the path from the weights to the outputs has no VJP rule."""


class DeviceError(RuntimeError):
    """The requested device is unknown or its execution provider is missing."""


class InvalidModelError(ValueError):
    """An ONNX model given by the user cannot be loaded or run: bytes or a
    file that do not parse, external data that cannot be read, a graph
    onnx's checker refuses, an opset beyond the installed onnxruntime."""
