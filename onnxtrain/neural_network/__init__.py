"""scikit-learn's multi-layer perceptrons trained on onnxruntime.

``from onnxtrain.neural_network import MLPRegressor, MLPClassifier`` replaces
``from sklearn.neural_network import ...``: the same parameters, the same
initial weights and loss curves, training on onnxruntime (CPU or CUDA), and
``to_onnx()`` for the trained inference graph.
"""
from ._multilayer_perceptron import MLPClassifier, MLPRegressor

__all__ = ["MLPClassifier", "MLPRegressor"]
