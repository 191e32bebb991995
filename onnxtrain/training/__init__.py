"""Training loop and callbacks shared by onnxtrain's estimators."""
from .callbacks import (Callback, Checkpoint, EarlyStopping, EpochScoring,
                        LRScheduler)
from .loop import EpochLoop
from .run import FitHooks, FitSettings, TrainingRun

__all__ = ["Callback", "Checkpoint", "EarlyStopping", "EpochLoop",
           "EpochScoring", "FitHooks", "FitSettings", "LRScheduler",
           "TrainingRun"]
