"""Former name of :mod:`onnxtrain.autodiff.gradient_graphs` (kept so that
``from onnxtrain.autodiff.models import ...`` goes on working)."""
from .gradient_graphs import (GradientModels, build_fused_model,  # noqa: F401
                              build_gradient_models)

__all__ = ["GradientModels", "build_gradient_models", "build_fused_model"]
