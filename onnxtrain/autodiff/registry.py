"""The VJP rule registry: one rule per (domain, op type).

A rule is a function ``rule(ctx, *grad_outputs)`` receiving a
:class:`~onnxtrain.autodiff.context.VJPContext` and one gradient name per
node output (None when no gradient reaches that output). It returns one
gradient name per node input (None: no gradient), as a tuple, or a single
name for a one-input node.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

__all__ = ["VJPRule", "register_vjp", "register_nondifferentiable",
           "get_vjp_rule", "is_nondifferentiable", "registered_vjp_ops",
           "nondifferentiable_ops"]


@dataclass(frozen=True)
class VJPRule:
    """A registered rule.

    Attributes
    ----------
    op_type, domain : str
        The op the rule differentiates.
    fn : callable
        ``fn(ctx, *grad_outputs) -> grad_inputs``.
    unbroadcast : bool
        True for multidirectional-broadcasting ops (Add, Mul...): every
        gradient the rule returns has the shape of output 0 and the backward
        pass reduces it to the input's shape with ``sum_to``.
    saved_outputs : tuple of int or callable
        Optional outputs the rule reads (Dropout's mask): the backward pass
        names them when the model leaves them out. A callable takes the
        node and returns the indices (LayerNormalization's statistics, only
        when the node may output them in float32).
    """

    op_type: str
    domain: str
    fn: Callable
    unbroadcast: bool = False
    saved_outputs: object = ()

    def saved_output_indices(self, node):
        """Indices of the optional outputs of ``node`` the rule reads."""
        if callable(self.saved_outputs):
            return tuple(self.saved_outputs(node))
        return self.saved_outputs


_RULES: dict = {}
_NONDIFFERENTIABLE: set = set()


def _normalize_domain(domain):
    return "" if domain in ("", "ai.onnx") else domain


def register_vjp(op_type, domain="", unbroadcast=False, saved_outputs=()):
    """Decorator registering the VJP rule of ``op_type`` in ``domain``.

    ``saved_outputs``: indices of optional outputs the rule reads (or a
    function of the node returning them); the backward pass gives them
    names when a node leaves them out.

    Raises
    ------
    ValueError
        If a rule (or a non-differentiable declaration) already exists.
    """
    key = (_normalize_domain(domain), op_type)

    def decorator(fn):
        if key in _RULES or key in _NONDIFFERENTIABLE:
            raise ValueError(f"A VJP rule for {key} is already registered.")
        _RULES[key] = VJPRule(op_type, key[0], fn, unbroadcast,
                              saved_outputs if callable(saved_outputs)
                              else tuple(saved_outputs))
        return fn

    return decorator


def register_nondifferentiable(*op_types, domain=""):
    """Declare ops whose outputs carry no gradient (Shape, ArgMax...).

    Raises
    ------
    ValueError
        If one of them already has a rule or a declaration.
    """
    for op_type in op_types:
        key = (_normalize_domain(domain), op_type)
        if key in _RULES or key in _NONDIFFERENTIABLE:
            raise ValueError(f"{key} is already registered.")
        _NONDIFFERENTIABLE.add(key)


def get_vjp_rule(op_type, domain=""):
    """The :class:`VJPRule` of an op, or None."""
    return _RULES.get((_normalize_domain(domain), op_type))


def is_nondifferentiable(op_type, domain=""):
    """True if the op was declared non-differentiable."""
    return (_normalize_domain(domain), op_type) in _NONDIFFERENTIABLE


def registered_vjp_ops():
    """Sorted list of ``(domain, op_type)`` with a VJP rule."""
    return sorted(_RULES)


def nondifferentiable_ops():
    """Sorted list of ``(domain, op_type)`` declared non-differentiable."""
    return sorted(_NONDIFFERENTIABLE)
