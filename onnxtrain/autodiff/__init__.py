"""Reverse-mode automatic differentiation of ONNX graphs.

Rules live in a registry keyed by (domain, op type) (:func:`register_vjp`,
:func:`register_nondifferentiable`); :func:`backward` builds the gradient
nodes; :func:`build_gradient_models` (split form) and
:func:`build_fused_model` (fused form) assemble models from them.
"""
from . import rules  # importing registers the rules
from .backward import BackwardGraph, backward, trainable_initializers
from .context import VJPContext, sum_to
from .gradient_graphs import (GradientModels, build_fused_model,
                              build_gradient_models, weights_as_inputs)
from .registry import (get_vjp_rule, is_nondifferentiable,
                       nondifferentiable_ops, register_nondifferentiable,
                       register_vjp, registered_vjp_ops)

__all__ = ["BackwardGraph", "GradientModels", "VJPContext", "backward",
           "build_fused_model", "build_gradient_models", "get_vjp_rule",
           "is_nondifferentiable", "nondifferentiable_ops",
           "register_nondifferentiable", "register_vjp", "registered_vjp_ops",
           "rules", "sum_to", "trainable_initializers", "weights_as_inputs"]
