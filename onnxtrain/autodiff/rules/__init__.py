"""VJP rules, one module per op family; importing registers them."""
from . import (activations, elementwise, linalg, nondifferentiable,  # noqa: F401
               reductions, shape)
