"""The epoch loop of the estimators, under its released name:
:class:`EpochLoop` is :class:`~onnxtrain.training.run.TrainingRun`, the
owner of one fit, whose methods are the loop (``fit_loop``,
``run_epochs``, ``run_single_epoch``, ``train_step``)."""
from __future__ import annotations

import numbers

from .run import TrainingRun

__all__ = ["EpochLoop", "validation_period"]

#: The name the epoch loop was released under.
EpochLoop = TrainingRun


def validation_period(validation_every, max_iter):
    """Epochs between two validation losses (never 0).

    An int >= 1 is used as is; a float in (0, 1) is a fraction of
    ``max_iter``: ``max(1, int(validation_every * max_iter))``.

    Raises
    ------
    ValueError
        Non-positive values or floats >= 1 that are not integers.
    """
    value = validation_every
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        if value >= 1:
            return int(value)
    elif isinstance(value, numbers.Real) and 0 < value < 1:
        return max(1, int(value * max_iter))
    raise ValueError(f"validation_every must be an int >= 1 or a float in (0, 1), "
                     f"got {validation_every!r}.")
