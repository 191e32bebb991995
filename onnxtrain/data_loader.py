"""Mini-batch iteration over a dataset (onnxcustom's
``onnxcustom.training.data_loader``): see
:class:`onnxtrain.runtime.data_loader.OrtDataLoader`."""
from .runtime.data_loader import OrtDataLoader

__all__ = ["OrtDataLoader"]
