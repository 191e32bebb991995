"""VJP rules, one module per op family; importing registers them."""
from . import (activations, conv, elementwise, functions,  # noqa: F401
               indexing, linalg, nn, nondifferentiable, normalization,
               pooling, reductions, sampling, selection, shape, trigonometric)
