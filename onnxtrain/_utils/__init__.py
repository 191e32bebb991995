"""Private helpers below every layer: they import nothing of onnxtrain but
:mod:`onnxtrain.exceptions`."""
