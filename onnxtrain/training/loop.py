"""The epoch loop of the estimators, under its released name:
:class:`EpochLoop` is :class:`~onnxtrain.training.run.TrainingRun`, the
owner of one fit, whose methods are the loop (``fit_loop``,
``run_epochs``, ``run_single_epoch``, ``train_step``)."""
from __future__ import annotations

from .run import TrainingRun

__all__ = ["EpochLoop"]

#: The name the epoch loop was released under.
EpochLoop = TrainingRun
