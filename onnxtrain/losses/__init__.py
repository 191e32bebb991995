"""Training losses and penalties: the small graphs computing a batch's loss
and its gradient with respect to the prediction (:mod:`.learning_losses`),
the expressions they share with onnxblock's losses (:mod:`.emitters`) and the
weight penalties (:mod:`.penalties`)."""
from .learning_losses import (AbsoluteLearningLoss, BaseLearningLoss,
                              CrossEntropyLearningLoss, ElasticLearningLoss,
                              NegLogLearningLoss, PoissonLearningLoss,
                              SquareLearningLoss, resolve_learning_loss)

__all__ = ["BaseLearningLoss", "SquareLearningLoss", "AbsoluteLearningLoss",
           "ElasticLearningLoss", "NegLogLearningLoss",
           "CrossEntropyLearningLoss", "PoissonLearningLoss",
           "resolve_learning_loss"]
