"""Penalties on the weights (regularization)."""
from __future__ import annotations

from sklearn.base import BaseEstimator, clone

__all__ = ["BaseLearningPenalty", "NoLearningPenalty", "resolve_learning_penalty"]


class BaseLearningPenalty(BaseEstimator):
    """A penalty added to the loss; its gradient joins the weights' gradient."""


class NoLearningPenalty(BaseLearningPenalty):
    """No penalty."""


_PENALTIES = {"": NoLearningPenalty, "none": NoLearningPenalty,
              "NoLearningPenalty": NoLearningPenalty}


def resolve_learning_penalty(value):
    """A new penalty object from None, a name or a penalty object.

    Raises
    ------
    ValueError
        Unknown name (the message lists the accepted ones).
    TypeError
        Any other type.
    """
    if value is None:
        return NoLearningPenalty()
    if isinstance(value, BaseLearningPenalty):
        return clone(value)
    if isinstance(value, str):
        if value not in _PENALTIES:
            raise ValueError(f"Unknown learning_penalty {value!r}; accepted: "
                             f"None, {sorted(k for k in _PENALTIES if k)}.")
        return _PENALTIES[value]()
    raise TypeError(f"learning_penalty must be None, a str or a penalty object, "
                    f"not {type(value).__name__}.")
