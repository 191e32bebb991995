"""Optimization: the update rules (:mod:`.update_rules`, optax-shaped
init/update), the seed's learning-rate objects that adapt them to its graph
layout (:mod:`.learning_rates`) and the weight initializers
(:mod:`.initializers`)."""
from .learning_rates import (BaseLearningRate, LearningRateAdam,
                             LearningRateAdamW, LearningRateSGD,
                             LearningRateSGDNesterov, check_learning_rate,
                             resolve_learning_rate)

__all__ = ["BaseLearningRate", "LearningRateSGD", "LearningRateSGDNesterov",
           "LearningRateAdam", "LearningRateAdamW", "check_learning_rate",
           "resolve_learning_rate"]
