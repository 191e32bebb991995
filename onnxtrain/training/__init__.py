"""Training loop and callbacks shared by onnxtrain's estimators."""
from .callbacks import (Callback, Checkpoint, EarlyStopping, EpochScoring,
                        LRScheduler)
from .loop import EpochLoop

__all__ = ["Callback", "Checkpoint", "EarlyStopping", "EpochLoop",
           "EpochScoring", "LRScheduler"]
