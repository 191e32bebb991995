"""Optimization: the update rules (:mod:`.update_rules`, optax-shaped
init/update), the links that change the gradients before a rule
(:mod:`.links`: clipping, weight decay, penalty) and their chains
(:mod:`.chains`), the seed's learning-rate objects that adapt them to its
graph layout (:mod:`.learning_rates`) and the weight initializers
(:mod:`.initializers`)."""
from .chains import LearningRateChain, chain
from .learning_rates import (BaseLearningRate, LearningRateAdam,
                             LearningRateAdamW, LearningRateSGD,
                             LearningRateSGDNesterov, check_learning_rate,
                             resolve_learning_rate)
from .links import (AddDecayedWeights, AddPenalty, ClipByGlobalNorm,
                    ClipByValue, DecoupledWeightDecay, GradientLink)
from .update_rules import ChainedRule

__all__ = ["BaseLearningRate", "LearningRateSGD", "LearningRateSGDNesterov",
           "LearningRateAdam", "LearningRateAdamW", "check_learning_rate",
           "resolve_learning_rate", "chain", "LearningRateChain",
           "ChainedRule", "GradientLink", "ClipByGlobalNorm", "ClipByValue",
           "AddDecayedWeights", "DecoupledWeightDecay", "AddPenalty"]
