"""VJP rules, one module per op family; importing registers them."""
from . import (activations, control_flow, conv, deform_conv,  # noqa: F401
               elementwise, functions, indexing, linalg, nn, nondifferentiable,
               normalization, pooling, quantization, recurrent, reductions,
               sampling, selection, shape, spectral, trigonometric)
