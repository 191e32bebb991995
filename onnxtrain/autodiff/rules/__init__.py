"""VJP rules, one module per op family; importing registers them."""
from . import (activations, control_flow, conv, deform_conv,
               elementwise, functions, indexing, layer_norm, linalg, nn,
               nondifferentiable, normalization, pooling, quantization,
               recurrent, reductions, sampling, selection, shape, spectral,
               trigonometric)

__all__ = ["activations", "control_flow", "conv", "deform_conv", "elementwise",
           "functions", "indexing", "layer_norm", "linalg", "nn",
           "nondifferentiable", "normalization", "pooling", "quantization",
           "recurrent", "reductions", "sampling", "selection", "shape",
           "spectral", "trigonometric"]
